import { SqlClient, type SqlError, SqlSchema } from "@effect/sql"
import { Context, Effect, Layer, Option, Schema } from "effect"
import type { Account, Identity } from "../Domain/Account.js"
import { newId } from "../Domain/Ids.js"
import { makeTestLayer } from "../Domain/TestLayer.js"
import { now } from "../Domain/Time.js"
import { MembersRepo } from "../Members/Repo.js"
import { WalletRepo } from "../Wallet/Repo.js"

const AccountRow = Schema.Struct({
  id: Schema.String,
  issuer: Schema.NullOr(Schema.String),
  subject: Schema.String,
  email: Schema.NullOr(Schema.String),
  suspendedAt: Schema.NullOr(Schema.DateFromSelf)
})

const IdentityKey = Schema.Struct({ issuer: Schema.String, subject: Schema.String })

const toAccount = (row: typeof AccountRow.Type): Account => ({
  id: row.id,
  issuer: row.issuer,
  subject: row.subject,
  email: row.email,
  suspended: row.suspendedAt !== null
})

export class AccountsRepo extends Context.Tag("nenas/AccountsRepo")<AccountsRepo, {
  /**
   * The account of a signed-in developer, keyed by issuer and subject; created, with an empty
   * wallet, on first sign-in. An account made before issuers were recorded is claimed by the
   * first verified sign-in with its subject (from the provider configured now).
   */
  readonly signIn: (identity: Identity) => Effect.Effect<Account>
  /**
   * Locks the account's row until the caller's SQL transaction ends, so that
   * decisions about one account (its suspension) read their facts one at a time.
   * This and the two below keep `SqlError` a failure: they run inside `Payments.apply`,
   * whose Stripe webhook handler counts a failed SQL statement before it dies.
   */
  readonly lock: (accountId: string) => Effect.Effect<{ readonly suspended: boolean }, SqlError.SqlError>
  /** Refuses the account's model calls; an account already suspended keeps its first suspension time. */
  readonly suspend: (accountId: string) => Effect.Effect<void, SqlError.SqlError>
  /** Lifts a suspension; an account not suspended is left as it is. */
  readonly reinstate: (accountId: string) => Effect.Effect<void, SqlError.SqlError>
}>() {
  static readonly layer = Layer.effect(
    AccountsRepo,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const wallets = yield* WalletRepo
      const members = yield* MembersRepo
      const find = SqlSchema.findOne({
        Request: IdentityKey,
        Result: AccountRow,
        execute: (identity) =>
          sql`
            SELECT id, issuer, subject, email, suspended_at FROM accounts
            WHERE issuer = ${identity.issuer} AND subject = ${identity.subject}
          `
      })
      // A concurrent claim waits on the row and then finds its issuer set: it claims nothing and finds the account.
      const claimLegacy = SqlSchema.findOne({
        Request: IdentityKey,
        Result: AccountRow,
        execute: (identity) =>
          sql`
            UPDATE accounts SET issuer = ${identity.issuer}
            WHERE issuer IS NULL AND subject = ${identity.subject}
            RETURNING id, issuer, subject, email, suspended_at
          `
      })
      const insert = SqlSchema.findAll({
        Request: Schema.Struct({
          id: Schema.String,
          issuer: Schema.String,
          subject: Schema.String,
          email: Schema.NullOr(Schema.String),
          name: Schema.NullOr(Schema.String)
        }),
        Result: Schema.Struct({ id: Schema.String }),
        execute: (account) =>
          sql`
            INSERT INTO accounts (id, issuer, subject, email, name)
            VALUES (${account.id}, ${account.issuer}, ${account.subject}, ${account.email}, ${account.name})
            ON CONFLICT (issuer, subject) DO NOTHING
            RETURNING id
          `
      })
      const create = (identity: Identity) =>
        sql.withTransaction(Effect.gen(function*() {
          const id = newId("acct")
          const inserted = yield* insert({ ...identity, id })
          // Inside this transaction: the account never exists without its wallet and its owner.
          if (inserted.length > 0) yield* Effect.zipRight(wallets.open(id), members.addOwner(id, identity))
        }))
      const lockRow = SqlSchema.findOne({
        Request: Schema.String,
        Result: Schema.Struct({ suspended: Schema.Boolean }),
        execute: (accountId) =>
          sql`SELECT suspended_at IS NOT NULL AS suspended FROM accounts WHERE id = ${accountId} FOR NO KEY UPDATE`
      })
      return AccountsRepo.of({
        signIn: (identity) =>
          Effect.gen(function*() {
            const existing = yield* find(identity)
            if (Option.isSome(existing)) return toAccount(existing.value)
            const claimed = yield* claimLegacy(identity)
            if (Option.isSome(claimed)) {
              yield* members.claimOwner(claimed.value.id, identity)
              return toAccount(claimed.value)
            }
            const claimedMeanwhile = yield* find(identity)
            if (Option.isSome(claimedMeanwhile)) return toAccount(claimedMeanwhile.value)
            yield* create(identity)
            const created = yield* find(identity)
            if (Option.isNone(created)) return yield* Effect.dieMessage("account vanished after creation")
            return toAccount(created.value)
          }).pipe(Effect.orDie, Effect.withSpan("AccountsRepo.signIn")),
        // The lock an UPDATE of the row takes: inserts referencing the account (its key) are not held up.
        lock: (accountId) =>
          lockRow(accountId).pipe(
            Effect.map((row) => ({ suspended: Option.isSome(row) && row.value.suspended })),
            Effect.catchTag("ParseError", Effect.die),
            Effect.withSpan("AccountsRepo.lock")
          ),
        suspend: (accountId) =>
          Effect.flatMap(now, (at) =>
            sql`
              UPDATE accounts SET suspended_at = COALESCE(suspended_at, ${at}) WHERE id = ${accountId}
            `).pipe(Effect.asVoid, Effect.withSpan("AccountsRepo.suspend")),
        reinstate: (accountId) =>
          sql`UPDATE accounts SET suspended_at = NULL WHERE id = ${accountId}`.pipe(
            Effect.asVoid,
            Effect.withSpan("AccountsRepo.reinstate")
          )
      })
    })
  )
  /** Only the members a test gives; any other dies when used. */
  static readonly Test = makeTestLayer(AccountsRepo)
}
