import type { SqlClient } from "@effect/sql"
import { Effect } from "effect"

// Hand-cast SQL (docs/performance.md, "Hand-cast SQL on the call path"): the rollup statements run beside every flush's log writes (triggers).

/** The width of a rollup bucket (migrations/0011_usage_rollups.ts): 30 minutes, from the Unix epoch. */
export const BUCKET_MS = 30 * 60 * 1000

/** The earliest and latest instants a range without an end reads. */
const EARLIEST = new Date(Date.parse("0001-01-01T00:00:00Z"))
const LATEST = new Date(Date.parse("9999-12-31T23:59:59.999Z"))

/** Which calls a usage read counts: the account's, in `[from, to)`, and the optional filters. */
export interface UsageScope {
  readonly accountId: string
  readonly from?: Date | undefined
  readonly to?: Date | undefined
  readonly apiKeyId?: string | undefined
  readonly environment?: "live" | "test" | undefined
  readonly endpoint?: string | undefined
}

/** The columns of a usage row, as both sources give them. */
const COUNTER_COLUMNS = `requests, pending, succeeded, failed, billed, input_tokens, output_tokens, reasoning_tokens,
  cached_tokens, search_count, content_pages, cost_micro_myr, cache_hits, cache_saved_micro_myr, byok_calls,
  byok_fee_micro_myr`

const LOG_COUNTERS = `1 AS requests, (status = 'pending')::int AS pending, (status = 'succeeded')::int AS succeeded,
  (status = 'failed')::int AS failed, (status = 'billed')::int AS billed, input_tokens, output_tokens,
  reasoning_tokens, cached_tokens, search_count, content_pages, cost_micro_myr, (cache IS NOT DISTINCT FROM 'hit')::int AS cache_hits,
  cache_saved_micro_myr, (provider_key_id IS NOT NULL)::int AS byok_calls, byok_fee_micro_myr`

const filters = (sql: SqlClient.SqlClient, scope: UsageScope) => [
  ...(scope.apiKeyId === undefined ? [] : [sql`api_key_id = ${scope.apiKeyId}`]),
  ...(scope.environment === undefined ? [] : [sql`environment = ${scope.environment}`]),
  ...(scope.endpoint === undefined ? [] : [sql`endpoint = ${scope.endpoint}`])
]

/**
 * A scope's range (unbounded ends made instants) and the whole buckets inside
 * it, `[wholeFrom, wholeTo)`: read from rollups; the rest of the range from the logs.
 */
export const wholeBuckets = (scope: UsageScope) => {
  const from = scope.from ?? EARLIEST
  const to = scope.to ?? LATEST
  const firstWhole = Math.ceil(from.getTime() / BUCKET_MS) * BUCKET_MS
  const endWhole = Math.floor(to.getTime() / BUCKET_MS) * BUCKET_MS
  // Without a whole bucket, every call comes from the logs.
  const [wholeFrom, wholeTo] = firstWhole < endWhole ? [new Date(firstWhole), new Date(endWhole)] : [to, to]
  return { from, to, wholeFrom, wholeTo }
}

/** The parts of a scope's range outside its whole buckets, as a condition on logs' `created_at`. */
export const partBuckets = (sql: SqlClient.SqlClient, scope: UsageScope) => {
  const { from, to, wholeFrom, wholeTo } = wholeBuckets(scope)
  return sql`((created_at >= ${from}::timestamptz AND created_at < ${wholeFrom}::timestamptz)
    OR (created_at >= ${wholeTo}::timestamptz AND created_at < ${to}::timestamptz))`
}

/** Calls in the scope straight from the logs, one row each: `(at, …counters)`. */
export const logUsage = (sql: SqlClient.SqlClient, scope: UsageScope) =>
  sql`
    SELECT created_at AS at, ${sql.literal(LOG_COUNTERS)} FROM request_logs
    WHERE ${
    sql.and([
      sql`account_id = ${scope.accountId}`,
      sql`created_at >= ${scope.from ?? EARLIEST}::timestamptz`,
      sql`created_at < ${scope.to ?? LATEST}::timestamptz`,
      ...filters(sql, scope)
    ])
  }
  `

/**
 * The same sums from the rollups: whole buckets inside the range from
 * `usage_rollups` (stamped with their start), and the calls in the part-buckets
 * at either end from the logs. Its cost does not grow with the account's history.
 */
export const rolledUsage = (sql: SqlClient.SqlClient, scope: UsageScope) => {
  const { wholeFrom, wholeTo } = wholeBuckets(scope)
  return sql`
    SELECT bucket AS at, ${sql.literal(COUNTER_COLUMNS)} FROM usage_rollups
    WHERE ${
    sql.and([
      sql`account_id = ${scope.accountId}`,
      sql`bucket >= ${wholeFrom}::timestamptz`,
      sql`bucket < ${wholeTo}::timestamptz`,
      ...filters(sql, scope)
    ])
  }
    UNION ALL
    SELECT created_at, ${sql.literal(LOG_COUNTERS)} FROM request_logs
    WHERE ${
    sql.and([
      sql`account_id = ${scope.accountId}`,
      partBuckets(sql, scope),
      ...filters(sql, scope)
    ])
  }
  `
}

/**
 * Every rollup again from `request_logs`, in one transaction, while writers of
 * logs wait (`SHARE` lock: a flush that committed before it has folded its
 * deltas in). Idempotent; returns the rows written.
 */
export const rebuildRollups = (sql: SqlClient.SqlClient) =>
  sql.withTransaction(Effect.gen(function*() {
    yield* sql`LOCK TABLE request_logs IN SHARE MODE`
    yield* sql`DELETE FROM usage_rollups`
    const rows = yield* sql<{ count: number }>`
      WITH written AS (INSERT INTO usage_rollups (account_id, bucket, api_key_id, environment, endpoint, ${
      sql.literal(COUNTER_COLUMNS)
    })
      SELECT account_id, date_bin('30 minutes', at, timestamptz '1970-01-01 00:00:00+00'), api_key_id, environment,
        endpoint, count(*), sum(pending), sum(succeeded), sum(failed), sum(billed), sum(input_tokens),
        sum(output_tokens), sum(reasoning_tokens), sum(cached_tokens), sum(search_count), sum(content_pages),
        sum(cost_micro_myr), sum(cache_hits), sum(cache_saved_micro_myr), sum(byok_calls), sum(byok_fee_micro_myr)
      FROM (SELECT created_at AS at, account_id, api_key_id, environment, endpoint, ${sql.literal(LOG_COUNTERS)}
        FROM request_logs) l
      GROUP BY 1, 2, 3, 4, 5
      RETURNING 1)
      SELECT count(*)::int AS count FROM written
    `
    return rows[0]?.count ?? 0
  }))

/**
 * Whether the rollups' 30-minute buckets start every hour and day of `timeZone`
 * (its offsets, a year either side of now, are whole or half hours); if not,
 * usage is read from the logs.
 */
export const rollupsFit = (sql: SqlClient.SqlClient, timeZone: string) =>
  Effect.map(
    sql<{ fits: boolean }>`
      SELECT bool_and((extract(epoch FROM (t AT TIME ZONE ${timeZone}::text) - (t AT TIME ZONE 'UTC'))::int % 1800) = 0) AS fits
      FROM generate_series(now() - interval '1 year', now() + interval '1 year', interval '1 day') t
    `,
    (rows) => rows[0]?.fits === true
  )
