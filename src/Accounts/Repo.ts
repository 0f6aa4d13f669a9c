import { SqlClient, type SqlError } from "@effect/sql"
import { Clock, Context, Effect, Layer } from "effect"
import type { Account, Identity } from "../Domain/Account.js"
import { newId } from "../Domain/Ids.js"
import { WalletRepo } from "../Wallet/Repo.js"

interface AccountRow {
  readonly id: string
  readonly issuer: string | null
  readonly subject: string
  readonly email: string | null
  readonly suspendedAt: Date | null
}

const toAccount = (row: AccountRow): Account => ({
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
  readonly signIn: (identity: Identity) => Effect.Effect<Account, SqlError.SqlError>
  /**
   * Locks the account's row until the caller's SQL transaction ends, so that
   * decisions about one account (its suspension) read their facts one at a time.
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
      const find = (identity: Identity) =>
        sql<AccountRow>`
          SELECT id, issuer, subject, email, suspended_at FROM accounts
          WHERE issuer = ${identity.issuer} AND subject = ${identity.subject}
        `.pipe(Effect.map((rows) => rows[0]))
      // A concurrent claim waits on the row and then finds its issuer set: it claims nothing and finds the account.
      const claimLegacy = (identity: Identity) =>
        sql<AccountRow>`
          UPDATE accounts SET issuer = ${identity.issuer}
          WHERE issuer IS NULL AND subject = ${identity.subject}
          RETURNING id, issuer, subject, email, suspended_at
        `.pipe(Effect.map((rows) => rows[0]))
      const create = (identity: Identity) =>
        sql.withTransaction(Effect.gen(function*() {
          const id = newId("acct")
          const inserted = yield* sql<{ id: string }>`
            INSERT INTO accounts (id, issuer, subject, email, name)
            VALUES (${id}, ${identity.issuer}, ${identity.subject}, ${identity.email}, ${identity.name})
            ON CONFLICT (issuer, subject) DO NOTHING
            RETURNING id
          `
          // Inside this transaction: the account never exists without its wallet.
          if (inserted.length > 0) yield* wallets.open(id)
        }))
      return AccountsRepo.of({
        signIn: (identity) =>
          Effect.gen(function*() {
            const existing = yield* find(identity)
            if (existing !== undefined) return toAccount(existing)
            const claimed = yield* claimLegacy(identity)
            if (claimed !== undefined) return toAccount(claimed)
            const claimedMeanwhile = yield* find(identity)
            if (claimedMeanwhile !== undefined) return toAccount(claimedMeanwhile)
            yield* create(identity)
            const created = yield* find(identity)
            if (created === undefined) return yield* Effect.dieMessage("account vanished after creation")
            return toAccount(created)
          }),
        // The lock an UPDATE of the row takes: inserts referencing the account (its key) are not held up.
        lock: (accountId) =>
          Effect.map(
            sql<{ suspended: boolean }>`SELECT suspended_at IS NOT NULL AS suspended FROM accounts WHERE id = ${accountId} FOR NO KEY UPDATE`,
            (rows) => ({ suspended: rows[0]?.suspended === true })
          ),
        suspend: (accountId) =>
          Effect.flatMap(Clock.currentTimeMillis, (ms) =>
            sql`
              UPDATE accounts SET suspended_at = COALESCE(suspended_at, ${new Date(ms)}) WHERE id = ${accountId}
            `).pipe(Effect.asVoid),
        reinstate: (accountId) => Effect.asVoid(sql`UPDATE accounts SET suspended_at = NULL WHERE id = ${accountId}`)
      })
    })
  )
}
