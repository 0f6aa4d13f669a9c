import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

// Hand-cast SQL (docs/performance.md, "Hand-cast SQL on the call path"): it checks what the settlement statements write, in their form.

export interface InvariantReport {
  readonly accountId: string
  readonly availableMicroMyr: number
  readonly reservedMicroMyr: number
  readonly ledgerSumMicroMyr: number
  /** Empty when the wallet and its ledger agree. */
  readonly violations: ReadonlyArray<string>
}

/**
 * The ledger invariant (docs/money.md, "The ledger invariant") for one account,
 * read in one snapshot: available + reserved + granted = the sum of the ledger
 * (what credit grants hold is kept apart from what calls hold); granted = the
 * sum of the account's grants; lifetime top-up = the sum of `topup` entries;
 * lifetime spend = minus the sum of `usage` entries; reserved = the sum of open
 * reservations; each entry's balance after = the running sum up to it.
 */
export const checkInvariant = (accountId: string) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    return yield* sql.withTransaction(Effect.gen(function*() {
      yield* sql`SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY`
      const [row] = yield* sql<{
        available: number
        reserved: number
        granted: number
        grantSum: number
        lifetimeTopup: number
        lifetimeSpend: number
        ledgerSum: number
        topupSum: number
        usageSum: number
        openSum: number
        brokenRunningBalances: number
      }>`
        SELECT w.available_micro_myr AS available, w.reserved_micro_myr AS reserved, w.granted_micro_myr AS granted,
               COALESCE((SELECT SUM(amount_micro_myr) FROM credit_grants WHERE account_id = w.account_id), 0)::bigint AS grant_sum,
               w.lifetime_topup_micro_myr AS lifetime_topup, w.lifetime_spend_micro_myr AS lifetime_spend,
               COALESCE((SELECT SUM(amount_micro_myr) FROM ledger_entries WHERE account_id = w.account_id), 0)::bigint AS ledger_sum,
               COALESCE((SELECT SUM(amount_micro_myr) FROM ledger_entries WHERE account_id = w.account_id AND type = 'topup'), 0)::bigint AS topup_sum,
               COALESCE((SELECT SUM(amount_micro_myr) FROM ledger_entries WHERE account_id = w.account_id AND type = 'usage'), 0)::bigint AS usage_sum,
               COALESCE((SELECT SUM(amount_micro_myr) FROM reservations WHERE account_id = w.account_id AND status = 'open'), 0)::bigint AS open_sum,
               (SELECT COUNT(*) FROM (
                  SELECT balance_after_micro_myr,
                         SUM(amount_micro_myr) OVER (ORDER BY seq) AS running
                  FROM ledger_entries WHERE account_id = w.account_id
                ) entries WHERE balance_after_micro_myr <> running)::bigint AS broken_running_balances
        FROM wallets w WHERE w.account_id = ${accountId}
      `
      if (row === undefined) return yield* Effect.dieMessage(`no wallet for account ${accountId}`)
      const violations: Array<string> = []
      const expect = (what: string, actual: number, expected: number) => {
        if (actual !== expected) violations.push(`${what}: ${actual}, expected ${expected}`)
      }
      expect("available + reserved + granted", row.available + row.reserved + row.granted, row.ledgerSum)
      expect("granted", row.granted, row.grantSum)
      expect("lifetime top-up", row.lifetimeTopup, row.topupSum)
      expect("lifetime spend", row.lifetimeSpend, -row.usageSum)
      expect("reserved", row.reserved, row.openSum)
      expect("entries whose balance after is not the running sum", row.brokenRunningBalances, 0)
      return {
        accountId,
        availableMicroMyr: row.available,
        reservedMicroMyr: row.reserved,
        ledgerSumMicroMyr: row.ledgerSum,
        violations
      } satisfies InvariantReport
    }))
  })
