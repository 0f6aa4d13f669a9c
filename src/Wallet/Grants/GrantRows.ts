import type { SqlClient, SqlError } from "@effect/sql"
import { Effect } from "effect"
import { now } from "../../Domain/Time.js"
import { holderDead } from "../Instances/Instances.js"
import { lockWallet } from "../Lock.js"

// Hand-cast SQL (docs/performance.md, "Hand-cast SQL on the call path"): a grant's growth on a call's path, and every settlement flush.

/**
 * The `credit_grants` rows (docs/money.md, "Credit grants"): what each instance holds of a
 * wallet to lend to calls in memory (`Grants/GrantPool.ts`). A grant grows under the
 * wallet's lock (available → granted); charges against it and what it hands
 * back are written with the settlement batches (`Settlement/Settle.ts`).
 */

/** Where instances ask each other to hand back their grants for an account (the payload). */
export const GRANT_CHANNEL = "nenas_grants"
/** Where instances are told a monthly limit was set on keys (a key's, or its member's): `<account id> <key id>…` (`GrantPool.report`). */
export const KEY_LIMIT_CHANNEL = "nenas_key_limits"

/** A grant's growth, decided under the wallet's lock from what it holds. */
export type GrantSizing = (wallet: { readonly availableMicroMyr: number; readonly heldMicroMyr: number }) => number

/** The grant to grow: the row is created when `create`, and must exist otherwise. */
export interface GrantToGrow {
  readonly id: string
  readonly accountId: string
  readonly create: boolean
}

/** Other instances asked to hand back their grants for an account. */
export interface GrantsAsked {
  /** How many grants other instances hold for the account. */
  readonly others: number
  /** The database's time of the request: a grant row touched after it has answered. */
  readonly askedAt: Date
}

export interface GrantStatements {
  readonly growGrant: (grant: GrantToGrow, size: GrantSizing) => Effect.Effect<number | "missing", SqlError.SqlError>
  readonly returnDeadGrants: Effect.Effect<number, SqlError.SqlError>
  readonly askForGrants: (accountId: string) => Effect.Effect<GrantsAsked, SqlError.SqlError>
  readonly unansweredGrants: (accountId: string, askedAt: Date) => Effect.Effect<number, SqlError.SqlError>
  /** Tells every instance a limit was set on the keys: each hands back the account's grants, writing the keys' holds of them. */
  readonly askForKeyHolds: (
    accountId: string,
    apiKeyIds: ReadonlyArray<string>
  ) => Effect.Effect<GrantsAsked, SqlError.SqlError>
}

/** The grant statements of the process `holder`. */
export const grantStatements = (sql: SqlClient.SqlClient, holder: string): GrantStatements => {
  const growGrant = (grant: GrantToGrow, size: GrantSizing) =>
    // eslint-disable-next-line nenas/no-gen-in-arrow -- a grant's growth or return, not a call's
    sql.withTransaction(Effect.gen(function*() {
      const wallet = yield* lockWallet(sql, grant.accountId)
      if (wallet.suspendedAt !== null) return 0
      const rows = yield* sql<{ amountMicroMyr: number }>`
        SELECT amount_micro_myr FROM credit_grants WHERE id = ${grant.id} FOR UPDATE
      `
      const held = rows[0]?.amountMicroMyr
      if (held === undefined && !grant.create) return "missing" as const
      const growth = Math.floor(size({ availableMicroMyr: wallet.availableMicroMyr, heldMicroMyr: held ?? 0 }))
      if (growth <= 0 || growth > wallet.availableMicroMyr) return 0
      const at = yield* now
      yield* sql`
        UPDATE wallets
        SET available_micro_myr = available_micro_myr - ${growth}, granted_micro_myr = granted_micro_myr + ${growth},
            updated_at = ${at}
        WHERE account_id = ${grant.accountId}
      `
      yield* held === undefined
        ? sql`
          INSERT INTO credit_grants (id, account_id, holder, amount_micro_myr, created_at, updated_at)
          VALUES (${grant.id}, ${grant.accountId}, ${holder}, ${growth}, ${at}, ${at})
        `
        : sql`UPDATE credit_grants SET amount_micro_myr = amount_micro_myr + ${growth}, updated_at = ${at} WHERE id = ${grant.id}`
      return growth
    }))

  /** Returns one dead process's grant to its wallet; false when it was gone already. */
  const returnGrant = (grant: { readonly id: string; readonly accountId: string }) =>
    // eslint-disable-next-line nenas/no-gen-in-arrow -- a grant's growth or return, not a call's
    sql.withTransaction(Effect.gen(function*() {
      yield* lockWallet(sql, grant.accountId)
      const rows = yield* sql<{ amountMicroMyr: number }>`
        DELETE FROM credit_grants WHERE id = ${grant.id} RETURNING amount_micro_myr
      `
      const amount = rows[0]?.amountMicroMyr
      if (amount === undefined) return false
      yield* sql`
        UPDATE wallets
        SET available_micro_myr = available_micro_myr + ${amount}, granted_micro_myr = granted_micro_myr - ${amount}
        WHERE account_id = ${grant.accountId}
      `
      return true
    }))

  // eslint-disable-next-line nenas/no-gen-in-arrow -- made once, with the statements
  const returnDeadGrants = Effect.gen(function*() {
    const dead = yield* sql<{ id: string; accountId: string }>`
      SELECT id, account_id FROM credit_grants WHERE ${holderDead(sql, "holder", holder)} LIMIT 500
    `
    let returned = 0
    for (const grant of dead) if (yield* returnGrant(grant)) returned++
    // What a dead process's calls held of its grants went back with them.
    yield* sql`DELETE FROM key_grant_holds WHERE ${holderDead(sql, "holder", holder)}`
    return returned
  })

  const ask = (accountId: string, channel: string, payload: string) =>
    sql<{ others: number; askedAt: Date }>`
      SELECT (SELECT count(*)::int FROM credit_grants WHERE account_id = ${accountId} AND holder <> ${holder}) AS others,
             now() AS asked_at, pg_notify(${channel}, ${payload})
    `.pipe(Effect.map((rows): GrantsAsked => rows[0] ?? { others: 0, askedAt: new Date(0) }))

  const askForGrants = (accountId: string) => ask(accountId, GRANT_CHANNEL, accountId)
  const askForKeyHolds = (accountId: string, apiKeyIds: ReadonlyArray<string>) =>
    ask(accountId, KEY_LIMIT_CHANNEL, [accountId, ...apiKeyIds].join(" "))

  const unansweredGrants = (accountId: string, askedAt: Date) =>
    sql<{ unanswered: number }>`
      SELECT count(*)::int AS unanswered FROM credit_grants
      WHERE account_id = ${accountId} AND holder <> ${holder} AND updated_at < ${askedAt}
    `.pipe(Effect.map((rows) => rows[0]?.unanswered ?? 0))

  return { growGrant, returnDeadGrants, askForGrants, unansweredGrants, askForKeyHolds }
}
