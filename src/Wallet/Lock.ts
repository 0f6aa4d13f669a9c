import type { SqlClient, SqlError } from "@effect/sql"
import { Effect } from "effect"
import type { Wallet as WalletSchema } from "./Api.js"

// Hand-cast SQL (docs/performance.md, "Hand-cast SQL on the call path"): the wallet lock is taken by every money movement, per call and per flush.

type Wallet = typeof WalletSchema.Type

/** The wallet row as a movement sees it under its lock: grants apart, and whether the account is suspended. */
export interface LockedWallet extends Wallet {
  readonly grantedMicroMyr: number
  readonly suspendedAt: Date | null
}

/** Locks the wallet row: every movement of one account queues here. */
export const lockWallet = (
  sql: SqlClient.SqlClient,
  accountId: string
): Effect.Effect<LockedWallet, SqlError.SqlError> =>
  sql<LockedWallet>`
    SELECT w.available_micro_myr, w.reserved_micro_myr, w.granted_micro_myr, w.lifetime_topup_micro_myr,
           w.lifetime_spend_micro_myr, a.suspended_at
    FROM wallets w JOIN accounts a ON a.id = w.account_id
    WHERE w.account_id = ${accountId}
    FOR UPDATE OF w
  `.pipe(Effect.flatMap((rows) =>
    rows[0] === undefined ? Effect.dieMessage(`no wallet for account ${accountId}`) : Effect.succeed(rows[0])
  ))
