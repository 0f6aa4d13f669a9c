import { Effect } from "effect"
import { realSleep } from "./RealTime.js"
import { query } from "./TestServer.js"

/**
 * One call's money as the database keeps it: its log row, its `usage` ledger
 * entries and its hold, read once the call has settled (a call running over
 * 1 s is first written `pending`).
 */

export interface CallLog {
  readonly status: string
  readonly upstream_model: string
  readonly error_code: string | null
  readonly usage_source: string
  readonly input_tokens: number
  readonly output_tokens: number
  readonly reasoning_tokens: number
  readonly cached_tokens: number
  readonly search_count: number
  readonly content_pages: number
  readonly cost_micro_myr: string
}

export interface CallBooks {
  readonly log: CallLog
  /** Each `usage` entry's amount (negative: a charge). */
  readonly ledger: ReadonlyArray<number>
  readonly hold: ReadonlyArray<{ readonly status: string; readonly amount: number; readonly captured: number | null }>
}

/** The books of the call `requestId` once its log row has left `pending` (waits up to 15 s). */
export const booksOf = (requestId: string) =>
  Effect.gen(function*() {
    const deadline = Date.now() + 15_000
    for (;;) {
      const logs = yield* query<CallLog & Record<string, unknown>>(
        `SELECT status, upstream_model, error_code, usage_source, input_tokens, output_tokens, reasoning_tokens, cached_tokens,
                search_count, content_pages, cost_micro_myr
         FROM request_logs WHERE request_id = $1`,
        [requestId]
      )
      const log = logs[0]
      if (log !== undefined && log.status !== "pending") {
        const ledger = yield* query<{ amount_micro_myr: string }>(
          "SELECT amount_micro_myr FROM ledger_entries WHERE type = 'usage' AND request_id = $1",
          [requestId]
        )
        const hold = yield* query<{ status: string; amount_micro_myr: string; captured_micro_myr: string | null }>(
          "SELECT status, amount_micro_myr, captured_micro_myr FROM reservations WHERE request_id = $1",
          [requestId]
        )
        return {
          log,
          ledger: ledger.map((row) => Number(row.amount_micro_myr)),
          hold: hold.map((row) => ({
            status: row.status,
            amount: Number(row.amount_micro_myr),
            captured: row.captured_micro_myr === null ? null : Number(row.captured_micro_myr)
          }))
        } satisfies CallBooks
      }
      if (Date.now() > deadline) throw new Error(`the call ${requestId} was never settled`)
      yield* realSleep(50)
    }
  })
