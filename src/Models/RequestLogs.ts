import { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Clock, Context, Effect, Layer } from "effect"
import type { LogRow } from "../Usage/Repo.js"
import { ReservationLeases } from "../Wallet/Leases.js"

export interface OpenLog {
  readonly requestId: string
  readonly accountId: string
  readonly apiKeyId: string
  readonly reservationId: string | null
  readonly publicModel: string
  readonly upstreamModel: string
  readonly routingCategory: string
  readonly endpoint: string
  readonly stream: boolean
  readonly inputTokens: number
}

/** What a finished call writes to its row: the fields the dashboard reads, and the pages read. */
export interface LoggedUsage extends
  Pick<
    LogRow,
    | "inputTokens"
    | "outputTokens"
    | "reasoningTokens"
    | "cachedTokens"
    | "usageSource"
    | "searchCount"
    | "costMicroMyr"
    | "latencyMs"
  >
{
  readonly contentPages: number
}

/**
 * One row per model call (DESIGN.md, Request lifecycle): `pending` while its
 * reservation is held (written in the reservation's transaction), then
 * `billed` in the capture's transaction, or `succeeded` for a call with
 * nothing to charge (test keys); or `failed` at cost 0.
 */
export class RequestLogs extends Context.Tag("nenas/RequestLogs")<RequestLogs, {
  readonly open: (log: OpenLog) => Effect.Effect<void, SqlError.SqlError>
  /** The call's usage and cost: `billed` in the capture's transaction, or `succeeded` when there is nothing to charge. */
  readonly complete: (requestId: string, usage: LoggedUsage, status: "succeeded" | "billed") => Effect.Effect<void, SqlError.SqlError>
  readonly fail: (requestId: string, errorCode: string, latencyMs: number) => Effect.Effect<void, SqlError.SqlError>
  /** A call refused before it ran (a wallet refusal): one `failed` row. */
  readonly refused: (log: OpenLog, errorCode: string, latencyMs: number) => Effect.Effect<void, SqlError.SqlError>
}>() {
  static readonly layer = Layer.effect(
    RequestLogs,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      // The row names this process, so that the sweeper can close it if the process dies mid-call.
      const { holder } = yield* ReservationLeases
      const now = Effect.map(Clock.currentTimeMillis, (ms) => new Date(ms))
      const insert = (log: OpenLog, status: "pending" | "failed", errorCode: string | null, latencyMs: number) =>
        Effect.flatMap(now, (at) =>
          sql`
            INSERT INTO request_logs (request_id, account_id, api_key_id, reservation_id, public_model, upstream_model,
              routing_category, endpoint, status, input_tokens, stream, error_code, latency_ms, created_at, completed_at, holder)
            VALUES (${log.requestId}, ${log.accountId}, ${log.apiKeyId}, ${log.reservationId}, ${log.publicModel},
              ${log.upstreamModel}, ${log.routingCategory}, ${log.endpoint}, ${status}, ${log.inputTokens}, ${log.stream},
              ${errorCode}, ${latencyMs}, ${at}, ${status === "failed" ? at : null}, ${holder})
          `)
      return {
        open: (log) => Effect.asVoid(insert(log, "pending", null, 0)),
        refused: (log, errorCode, latencyMs) => Effect.asVoid(insert(log, "failed", errorCode, latencyMs)),
        complete: (requestId, usage, status) =>
          Effect.flatMap(now, (at) => sql`
            UPDATE request_logs
            SET status = ${status}, input_tokens = ${usage.inputTokens}, output_tokens = ${usage.outputTokens},
                reasoning_tokens = ${usage.reasoningTokens}, cached_tokens = ${usage.cachedTokens},
                usage_source = ${usage.usageSource}, search_count = ${usage.searchCount},
                content_pages = ${usage.contentPages}, cost_micro_myr = ${usage.costMicroMyr},
                latency_ms = ${usage.latencyMs}, completed_at = ${at}
            WHERE request_id = ${requestId}
              -- A late capture (the sweeper released the call, taking its process for dead) bills it after all.
              AND (status = 'pending' OR (${status} = 'billed' AND status = 'failed'))
          `).pipe(Effect.asVoid),
        fail: (requestId, errorCode, latencyMs) =>
          Effect.flatMap(now, (at) =>
            sql`
              UPDATE request_logs
              SET status = 'failed', cost_micro_myr = 0, error_code = ${errorCode}, latency_ms = ${latencyMs}, completed_at = ${at}
              WHERE request_id = ${requestId} AND status = 'pending'
            `).pipe(Effect.asVoid)
      }
    })
  )
}
