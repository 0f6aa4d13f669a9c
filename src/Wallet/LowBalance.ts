import type { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Effect } from "effect"
import { microMyr, myrAsSet, myrDown, myrUp, toMyrNumber } from "../Domain/Money.js"
import { DASHBOARD_URL, emit } from "../Outbox/Events.js"
import type { WalletRow } from "./Settlement/SettleRows.js"

/**
 * Low-balance alerts (docs/api/alerts.md, "Alerts"). The balance here is what the ledger sums to
 * (available + reserved + granted): at rest, what the dashboard shows. A
 * crossing is a settlement that takes it from at or above the threshold to
 * below it; the wallet is locked for the settlement, so on any number of
 * instances exactly one transaction sees each crossing, and it writes the
 * alert (webhook and email) in that transaction. Re-arming needs no state: a
 * top-up above the threshold makes the next usage below it a new crossing.
 */
export const totalOf = (
  wallet: Pick<WalletRow, "availableMicroMyr" | "reservedMicroMyr" | "grantedMicroMyr">
): number => wallet.availableMicroMyr + wallet.reservedMicroMyr + wallet.grantedMicroMyr

/** Whether going from `before` to `after` crosses below `threshold` (null: no threshold). */
export const crossedBelow = (threshold: number | null, before: number, after: number): boolean =>
  threshold !== null && before >= threshold && after < threshold

/** The wallets' balances as locked, before a settlement moves them. */
export const balancesBefore = (wallets: ReadonlyMap<string, WalletRow>): ReadonlyMap<string, number> =>
  new Map([...wallets].map(([accountId, wallet]) => [accountId, totalOf(wallet)]))

/** Writes a `balance.low` event and its email for every wallet the settlement took below its threshold. */
export const announceCrossings = (
  before: ReadonlyMap<string, number>,
  wallets: ReadonlyMap<string, WalletRow>,
  at: Date
): Effect.Effect<void, SqlError.SqlError, SqlClient.SqlClient> =>
  Effect.forEach([...wallets.values()], (wallet) => {
    const was = before.get(wallet.accountId)
    const now = totalOf(wallet)
    const threshold = wallet.lowBalanceThresholdMicroMyr
    if (was === undefined || threshold === null || !crossedBelow(threshold, was, now)) return Effect.void
    return emit({
      accountId: wallet.accountId,
      type: "balance.low",
      at,
      data: {
        account_id: wallet.accountId,
        balance_myr: toMyrNumber(microMyr(now)),
        threshold_myr: toMyrNumber(microMyr(threshold))
      },
      email: {
        // Rounded, a balance just below its threshold would read as the threshold: down for it, up for "below".
        subject: `Your nenas balance is below RM ${myrUp(microMyr(threshold))}`,
        body:
          `Your prepaid balance is now RM ${myrDown(microMyr(now))}, below the RM ${
            myrAsSet(microMyr(threshold))
          } you set.\n` +
          `When it reaches zero, live API calls answer 402 insufficient_balance.\n\n` +
          `Top up, or turn on auto top-up: ${DASHBOARD_URL}/billing\n`
      }
    })
  }, { discard: true })
