import type { SqlClient, SqlError } from "@effect/sql"
import { Effect } from "effect"
import type { LogWrite, RequestLogs } from "../../Logs/RequestLogs.js"
import type { StoredWrite } from "../../Responses/Store.js"
import type { CallHold } from "../CallHold.js"
import { lockWallet } from "../Lock.js"
import { settleBatch } from "../Settlement/Settle.js"
import type { SettleItem } from "../Settlement/SettleBatch.js"

// Hand-cast SQL (docs/performance.md, "Hand-cast SQL on the call path"): on a call's path (paying before answering), agreeing with the settlement statements.

/**
 * Paying for a call before answering it (docs/money.md, "Faults"), when its hold may
 * have been taken back: this instance stalled, and another's sweeper may have
 * judged it dead, released its reservation and returned its grant. One
 * transaction sees what the hold still covers and what the wallet holds; the
 * charge itself is a batch of one (`Settlement/Settle.ts`: the rules exist once).
 */

/** What to do when neither the hold nor the wallet covers the call: refuse it (not answered yet), or bill what the wallet can pay. */
export type WhenShort = "refuse" | "bill what it can"

export type PaidNow =
  | { readonly _tag: "Paid"; readonly chargedMicroMyr: number; readonly shortfallMicroMyr: number }
  | { readonly _tag: "Refused"; readonly availableMicroMyr: number }

export interface PayNowInput {
  readonly hold: CallHold
  /** The call's cost, at most its hold. */
  readonly amountMicroMyr: number
  readonly description: string
  /** The call's billed row; its cost becomes what was charged. */
  readonly log: LogWrite
  /** The call's failed row, written instead when it is refused. */
  readonly refusedLog: LogWrite
  /** The call's stored response (`store`), written with its payment; nothing is stored for a refused call. */
  readonly stored?: StoredWrite | undefined
  readonly whenShort: WhenShort
  readonly at: Date
  readonly holder: string
}

/** What the hold still covers of `amount`, read under the locks every movement takes, in their order: reservation, wallet, grant. */
const lockCovered = (sql: SqlClient.SqlClient, hold: CallHold, amount: number) =>
  Effect.gen(function*() {
    const { source } = hold
    let covered = 0
    if (source._tag === "Reservation") {
      const rows = yield* sql<{ status: string }>`
        SELECT status FROM reservations WHERE id = ${source.reservation.id} FOR UPDATE
      `
      // Open: it holds the call's maximum. Captured already: billing it again bills nothing more.
      if (rows[0]?.status === "open" || rows[0]?.status === "captured") covered = amount
    }
    const accountId = source._tag === "Reservation" ? source.reservation.accountId : hold.log.accountId
    const wallet = yield* lockWallet(sql, accountId)
    // A retry after a commit whose answer was lost: the call is paid already.
    const paid = yield* sql<{ chargedMicroMyr: number }>`
      SELECT -amount_micro_myr AS charged_micro_myr FROM ledger_entries WHERE type = 'usage' AND request_id = ${hold.log.requestId}
    `
    if (paid[0] !== undefined) return { covered: amount, available: 0, paid: paid[0].chargedMicroMyr }
    if (source._tag === "Grant") {
      const rows = yield* sql<{ amountMicroMyr: number }>`
        SELECT amount_micro_myr FROM credit_grants WHERE id = ${source.grant.id} FOR UPDATE
      `
      covered = Math.min(amount, rows[0]?.amountMicroMyr ?? 0)
    }
    return { covered, available: Math.max(wallet.availableMicroMyr, 0), paid: undefined }
  })

const itemOf = (input: PayNowInput): SettleItem | undefined => {
  const { description, hold, log } = input
  const amountMicroMyr = input.amountMicroMyr
  switch (hold.source._tag) {
    case "Reservation":
      return { _tag: "Capture", reservationId: hold.source.reservation.id, amountMicroMyr, description, log }
    case "Grant": {
      const { accountId, id: grantId } = hold.source.grant
      const { apiKeyId, requestId } = hold.log
      return { _tag: "GrantCharge", grantId, accountId, apiKeyId, requestId, amountMicroMyr, description, log }
    }
    case "None":
      return undefined
  }
}

/** Bills the call now, in one transaction: from its hold while it still covers it, else from the wallet. */
export const payNow = (
  sql: SqlClient.SqlClient,
  input: PayNowInput
): Effect.Effect<PaidNow, SqlError.SqlError, SqlClient.SqlClient | RequestLogs> =>
  sql.withTransaction(Effect.gen(function*() {
    const { available, covered, paid } = yield* lockCovered(sql, input.hold, input.amountMicroMyr)
    if (paid !== undefined) {
      return {
        _tag: "Paid",
        chargedMicroMyr: paid,
        shortfallMicroMyr: Math.max(0, input.amountMicroMyr - paid)
      } as const
    }
    const batch = { returns: [], close: [], at: input.at, holder: input.holder }
    const short = Math.max(0, input.amountMicroMyr - covered - available)
    if (short > 0 && input.whenShort === "refuse") {
      const { source } = input.hold
      yield* source._tag === "Reservation"
        ? settleBatch({
          ...batch,
          items: [{ _tag: "Release", reservationId: source.reservation.id, log: input.refusedLog }],
          logs: []
        })
        : settleBatch({ ...batch, items: [], logs: [input.refusedLog] })
      return { _tag: "Refused", availableMicroMyr: available } as const
    }
    const item = itemOf(input)
    const outcome = yield* settleBatch({
      ...batch,
      items: item === undefined ? [] : [item],
      logs: item === undefined ? [input.log] : [],
      stored: input.stored === undefined ? [] : [input.stored]
    })
    const charged = outcome.items[0]?.chargedMicroMyr ?? 0
    return {
      _tag: "Paid",
      chargedMicroMyr: charged,
      shortfallMicroMyr: Math.max(0, input.amountMicroMyr - charged)
    } as const
  }))
