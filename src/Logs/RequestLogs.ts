import { SqlClient } from "@effect/sql"
import type { SqlError, Statement } from "@effect/sql"
import { Context, Effect, Layer } from "effect"
import type { LoggedGuardrails } from "../Guardrails/Api.js"

// Hand-cast SQL (docs/performance.md, "Hand-cast SQL on the call path"): the log writes run with every settlement flush.

/** What a call's row says when it opens: who called, which route, how much input. */
export interface OpenLog {
  readonly requestId: string
  readonly accountId: string
  readonly apiKeyId: string
  readonly publicModel: string
  readonly upstreamModel: string
  readonly routingCategory: string
  readonly endpoint: string
  readonly stream: boolean
  readonly inputTokens: number
  /** The key's environment; absent in a row parked by an older version (the key's current one is used). */
  readonly environment?: "live" | "test" | undefined
  /** The caller's `metadata` (tags) and chat `user`, shown and filtered on the dashboard. */
  readonly metadata?: Readonly<Record<string, string>> | null | undefined
  readonly endUser?: string | null | undefined
  /** What the guardrails did to the input (docs/api/guardrails.md, "Logs"); absent: no policy. */
  readonly guardrails?: LoggedGuardrails | null | undefined
  /** What the response cache did (docs/api/cache.md, "Logs and usage"); absent: the call did not ask it. */
  readonly cache?: LoggedCache | undefined
}

/** A call's row on the response cache: hit (replaying `sourceRequestId`, saving what that call cost), miss or bypass. */
export interface LoggedCache {
  readonly status: "hit" | "miss" | "bypass"
  readonly sourceRequestId: string | null
  readonly savedMicroMyr: number
}

/** One attempt of a call at one upstream target (Providers/Fallback.ts), as its row keeps it. */
export interface LoggedAttempt {
  readonly target: string
  readonly outcome: string
  readonly latencyMs: number
}

/** A call answered on a team's own provider key (docs/api/provider-keys.md, "Billing"): which, and the fee billed. */
export interface LoggedOwnKey {
  readonly providerKeyId: string
  readonly feeMicroMyr: number
}

/** What a finished call writes to its row: the fields the dashboard reads, and the pages read. */
export interface LoggedUsage {
  readonly inputTokens: number
  readonly outputTokens: number
  readonly reasoningTokens: number
  readonly cachedTokens: number
  readonly usageSource: "provider" | "estimated"
  readonly searchCount: number
  readonly contentPages: number
  readonly costMicroMyr: number
  readonly latencyMs: number
  /** Each upstream attempt, in order; absent or empty: none was recorded (a test key, a call refused before it ran). */
  readonly attempts?: ReadonlyArray<LoggedAttempt> | undefined
  /** What the guardrails did, input and output; absent: what the row opened with. */
  readonly guardrails?: LoggedGuardrails | null | undefined
  /** The team's own provider key that answered; absent: nenas's upstream. */
  readonly ownKey?: LoggedOwnKey | undefined
}

/** What a settlement writes: the usage, and the model that answered (a fallback's) and the error that cut it short. */
export interface SettledUsage extends LoggedUsage {
  readonly answeredBy?: string | undefined
  readonly errorCode?: string | null | undefined
}

/** One row as a batch writes it: a call still running (`pending`), or its final state. */
export interface LogWrite extends OpenLog, LoggedUsage {
  readonly reservationId: string | null
  readonly status: "pending" | "succeeded" | "failed" | "billed"
  readonly errorCode: string | null
  readonly createdAt: Date
  readonly completedAt: Date | null
}

/** How a row stands: its hold, its status, its error and its times. */
export interface RowState {
  readonly reservationId: string | null
  readonly status: LogWrite["status"]
  readonly errorCode: string | null
  readonly createdAt: Date
  readonly completedAt: Date | null
}

/**
 * A row from its parts, field by field (`upstreamModel`: the model that
 * answered, when a fallback did). An object literal, not spreads: Node 20
 * builds a spread that adds fields its source lacks on a slow path, about
 * 1 µs an object, and what it allocates survives scavenges (`npm run bench:spreads`).
 */
export const logRow = (
  log: OpenLog,
  usage: LoggedUsage,
  state: RowState,
  upstreamModel = log.upstreamModel
): LogWrite => ({
  requestId: log.requestId,
  accountId: log.accountId,
  apiKeyId: log.apiKeyId,
  publicModel: log.publicModel,
  upstreamModel,
  routingCategory: log.routingCategory,
  endpoint: log.endpoint,
  stream: log.stream,
  environment: log.environment,
  metadata: log.metadata,
  endUser: log.endUser,
  inputTokens: usage.inputTokens,
  outputTokens: usage.outputTokens,
  reasoningTokens: usage.reasoningTokens,
  cachedTokens: usage.cachedTokens,
  usageSource: usage.usageSource,
  searchCount: usage.searchCount,
  contentPages: usage.contentPages,
  costMicroMyr: usage.costMicroMyr,
  latencyMs: usage.latencyMs,
  attempts: usage.attempts,
  guardrails: usage.guardrails ?? log.guardrails,
  ownKey: usage.ownKey,
  cache: log.cache,
  reservationId: state.reservationId,
  status: state.status,
  errorCode: state.errorCode,
  createdAt: state.createdAt,
  completedAt: state.completedAt
})

const noUsage = (log: OpenLog, latencyMs: number, attempts: ReadonlyArray<LoggedAttempt> | undefined): LoggedUsage => ({
  inputTokens: log.inputTokens,
  outputTokens: 0,
  reasoningTokens: 0,
  cachedTokens: 0,
  // The input tokens are our count: no provider reported usage for a call that is running, failed or was refused.
  usageSource: "estimated",
  searchCount: 0,
  contentPages: 0,
  costMicroMyr: 0,
  latencyMs,
  attempts
})

/** The row of a call still running. */
export const pendingRow = (log: OpenLog, reservationId: string | null, createdAt: Date): LogWrite =>
  logRow(log, noUsage(log, 0, undefined), {
    reservationId,
    status: "pending",
    errorCode: null,
    createdAt,
    completedAt: null
  })

/** The row of a call that failed, or was refused before it ran: cost 0. */
export const failedRow = (
  log: OpenLog,
  reservationId: string | null,
  createdAt: Date,
  errorCode: string,
  latencyMs: number,
  completedAt: Date,
  attempts?: ReadonlyArray<LoggedAttempt>
): LogWrite =>
  logRow(log, noUsage(log, latencyMs, attempts), { reservationId, status: "failed", errorCode, createdAt, completedAt })

/** A row's attempts as its `attempts` column keeps them (`[{target, outcome, latency_ms}]`); null when none. */
const attemptsJson = (row: LogWrite): string | null =>
  row.attempts === undefined || row.attempts.length === 0
    ? null
    : JSON.stringify(row.attempts.map((a) => ({ target: a.target, outcome: a.outcome, latency_ms: a.latencyMs })))

/**
 * The one writer of `request_logs`
 * (docs/money.md, "Request lifecycle and logs"). Calls' rows are written in
 * batches, inside the wallet's settlement transaction: a short call once, in
 * its final state; a call still running after a second as `pending` first. A
 * row in its final state is never moved back, except that a late charge bills a
 * call the sweeper had failed.
 */
export class RequestLogs extends Context.Tag("nenas/RequestLogs")<RequestLogs, {
  /** Writes (or moves forward) each row; one statement. Run it in the caller's transaction. */
  readonly write: (rows: ReadonlyArray<LogWrite>, holder: string) => Effect.Effect<void, SqlError.SqlError>
  /** The cost a `succeeded` row of the reservation's call reported, if any: the sweeper bills it. */
  readonly reportedCost: (reservationId: string) => Effect.Effect<number | undefined, SqlError.SqlError>
  /** Marks that row billed, in the transaction that billed it. */
  readonly markBilled: (reservationId: string) => Effect.Effect<void, SqlError.SqlError>
  /** Fails the pending row of a reservation the sweeper released. */
  readonly failReleased: (reservationId: string) => Effect.Effect<void, SqlError.SqlError>
  /**
   * Closes rows whose call can no longer settle them: its reservation is
   * settled, or it holds none and `gone` (an SQL condition on the row, from
   * the sweeper: its process is dead, or it is older than any call) holds;
   * returns how many.
   */
  readonly closeOrphans: (gone: Statement.Fragment) => Effect.Effect<number, SqlError.SqlError>
}>() {
  static readonly layer = Layer.effect(
    RequestLogs,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient

      const write = (all: ReadonlyArray<LogWrite>, holder: string) => {
        // One statement may move a row once: the newest write of each call wins.
        const rows = [...new Map(all.map((row) => [row.requestId, row])).values()]
        if (rows.length === 0) return Effect.void
        const column = <A>(f: (row: LogWrite) => A) => rows.map(f)
        return Effect.asVoid(sql`
          INSERT INTO request_logs (request_id, account_id, api_key_id, reservation_id, public_model, upstream_model,
            routing_category, endpoint, status, input_tokens, output_tokens, reasoning_tokens, cached_tokens,
            usage_source, search_count, content_pages, cost_micro_myr, latency_ms, stream, error_code,
            created_at, completed_at, holder, environment, metadata, end_user, attempts, guardrails, cache,
            cache_source_request_id, cache_saved_micro_myr, provider_key_id, byok_fee_micro_myr)
          SELECT u.request_id, u.account_id, u.api_key_id, u.reservation_id, u.public_model, u.upstream_model,
            u.routing_category, u.endpoint, u.status, u.input_tokens, u.output_tokens, u.reasoning_tokens,
            u.cached_tokens, u.usage_source, u.search_count, u.content_pages, u.cost_micro_myr, u.latency_ms,
            u.stream, u.error_code, u.created_at, u.completed_at, ${holder}::text,
            COALESCE(u.environment, (SELECT k.environment FROM api_keys k WHERE k.id = u.api_key_id), 'live'),
            u.metadata::jsonb, u.end_user, u.attempts::jsonb, u.guardrails::jsonb, u.cache, u.cache_source_request_id,
            u.cache_saved_micro_myr, u.provider_key_id, u.byok_fee_micro_myr
          FROM unnest(
            ${column((r) => r.requestId)}::text[], ${column((r) => r.accountId)}::text[],
            ${column((r) => r.apiKeyId)}::text[], ${column((r) => r.reservationId)}::text[],
            ${column((r) => r.publicModel)}::text[], ${column((r) => r.upstreamModel)}::text[],
            ${column((r) => r.routingCategory)}::text[], ${column((r) => r.endpoint)}::text[],
            ${column((r) => r.status)}::text[], ${column((r) => r.inputTokens)}::int[],
            ${column((r) => r.outputTokens)}::int[], ${column((r) => r.reasoningTokens)}::int[],
            ${column((r) => r.cachedTokens)}::int[], ${column((r) => r.usageSource)}::text[],
            ${column((r) => r.searchCount)}::int[], ${column((r) => r.contentPages)}::int[],
            ${column((r) => r.costMicroMyr)}::bigint[], ${column((r) => r.latencyMs)}::int[],
            ${column((r) => r.stream)}::boolean[], ${column((r) => r.errorCode)}::text[],
            ${column((r) => r.createdAt.toISOString())}::timestamptz[],
            ${column((r) => r.completedAt?.toISOString() ?? null)}::timestamptz[],
            ${column((r) => r.environment ?? null)}::text[],
            ${column((r) => r.metadata == null ? null : JSON.stringify(r.metadata))}::text[],
            ${column((r) => r.endUser ?? null)}::text[],
            ${column(attemptsJson)}::text[],
            ${column((r) => r.guardrails == null ? null : JSON.stringify(r.guardrails))}::text[],
            ${column((r) => r.cache?.status ?? null)}::text[],
            ${column((r) => r.cache?.sourceRequestId ?? null)}::text[],
            ${column((r) => r.cache?.savedMicroMyr ?? 0)}::bigint[],
            ${column((r) => r.ownKey?.providerKeyId ?? null)}::text[],
            ${column((r) => r.ownKey?.feeMicroMyr ?? 0)}::bigint[]
          ) AS u(request_id, account_id, api_key_id, reservation_id, public_model, upstream_model, routing_category,
            endpoint, status, input_tokens, output_tokens, reasoning_tokens, cached_tokens, usage_source, search_count,
            content_pages, cost_micro_myr, latency_ms, stream, error_code, created_at, completed_at, environment, metadata,
            end_user, attempts, guardrails, cache, cache_source_request_id, cache_saved_micro_myr, provider_key_id,
            byok_fee_micro_myr)
          ON CONFLICT (request_id) DO UPDATE
          SET status = EXCLUDED.status, reservation_id = COALESCE(EXCLUDED.reservation_id, request_logs.reservation_id),
              input_tokens = EXCLUDED.input_tokens, output_tokens = EXCLUDED.output_tokens,
              reasoning_tokens = EXCLUDED.reasoning_tokens, cached_tokens = EXCLUDED.cached_tokens,
              usage_source = EXCLUDED.usage_source, search_count = EXCLUDED.search_count,
              content_pages = EXCLUDED.content_pages, cost_micro_myr = EXCLUDED.cost_micro_myr,
              latency_ms = EXCLUDED.latency_ms, error_code = EXCLUDED.error_code, completed_at = EXCLUDED.completed_at,
              -- The model that answered (a fallback's), and the attempts that led to it.
              upstream_model = EXCLUDED.upstream_model, attempts = COALESCE(EXCLUDED.attempts, request_logs.attempts),
              guardrails = COALESCE(EXCLUDED.guardrails, request_logs.guardrails),
              provider_key_id = EXCLUDED.provider_key_id, byok_fee_micro_myr = EXCLUDED.byok_fee_micro_myr
          WHERE request_logs.status = 'pending'
            -- A late charge (the sweeper released the call, taking its process for dead) bills it after all.
            OR (EXCLUDED.status = 'billed' AND request_logs.status = 'failed')
        `)
      }

      const reportedCost = (reservationId: string) =>
        Effect.map(
          sql<{ costMicroMyr: number }>`
            SELECT cost_micro_myr FROM request_logs WHERE reservation_id = ${reservationId} AND status = 'succeeded'
          `,
          (rows) => rows[0]?.costMicroMyr
        )

      const markBilled = (reservationId: string) =>
        Effect.asVoid(sql`
          UPDATE request_logs SET status = 'billed', completed_at = now()
          WHERE reservation_id = ${reservationId} AND status = 'succeeded'
        `)

      const failReleased = (reservationId: string) =>
        Effect.asVoid(sql`
          UPDATE request_logs SET status = 'failed', cost_micro_myr = 0, error_code = 'internal_error', completed_at = now()
          WHERE reservation_id = ${reservationId} AND status = 'pending'
        `)

      const closeOrphans = (gone: Statement.Fragment) =>
        Effect.gen(function*() {
          const settled = yield* sql`
            UPDATE request_logs l
            SET status = CASE WHEN r.status = 'captured' THEN 'billed' ELSE 'failed' END,
                cost_micro_myr = COALESCE(r.captured_micro_myr, 0),
                error_code = CASE WHEN r.status = 'captured' THEN l.error_code ELSE 'internal_error' END,
                completed_at = now()
            FROM reservations r
            WHERE l.status = 'pending' AND l.reservation_id = r.id AND r.status <> 'open'
            RETURNING l.request_id
          `
          const unheld = yield* sql`
            UPDATE request_logs
            SET status = 'failed', cost_micro_myr = 0, error_code = 'internal_error', completed_at = now()
            WHERE status = 'pending' AND reservation_id IS NULL AND ${gone}
            RETURNING request_id
          `
          return settled.length + unheld.length
        })

      return RequestLogs.of({ write, reportedCost, markBilled, failReleased, closeOrphans })
    })
  )
}
