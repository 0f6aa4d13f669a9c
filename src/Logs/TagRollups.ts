import { type SqlClient, SqlSchema } from "@effect/sql"
import { Effect, Schema } from "effect"
import { MicroMyr } from "../Domain/Money.js"
import { partBuckets, type UsageScope, wholeBuckets } from "./Rollups.js"

/** A range's totals for one value of a tag (null: calls without the tag). */
export const TagTotal = Schema.Struct({
  value: Schema.NullOr(Schema.String),
  requests: Schema.Int,
  costMicroMyr: MicroMyr,
  inputTokens: Schema.Int,
  outputTokens: Schema.Int,
  reasoningTokens: Schema.Int
})
export type TagTotal = typeof TagTotal.Type

const TagKey = Schema.Struct({ tagKey: Schema.String })
const Count = Schema.Struct({ count: Schema.Int })

const KEY = "account_id, tag_key, bucket, tagged, tag_value, api_key_id, environment"
const COUNTERS = "requests, input_tokens, output_tokens, reasoning_tokens, cost_micro_myr"

/** `usage_tag_rollups` rows from the logs `where` selects, for their accounts' grouping tags `tags`. */
const fromLogs = (sql: SqlClient.SqlClient, where: ReturnType<SqlClient.SqlClient["and"]>) =>
  sql`
  INSERT INTO usage_tag_rollups (${sql.literal(KEY)}, ${sql.literal(COUNTERS)})
  SELECT l.account_id, g.tag_key, date_bin('30 minutes', l.created_at, timestamptz '1970-01-01 00:00:00+00'),
    COALESCE(l.metadata ? g.tag_key, false), COALESCE(l.metadata ->> g.tag_key, ''), l.api_key_id, l.environment,
    count(*), sum(l.input_tokens), sum(l.output_tokens), sum(l.reasoning_tokens), sum(l.cost_micro_myr)
  FROM request_logs l JOIN grouping_tags g ON g.account_id = l.account_id
  WHERE ${where}
  GROUP BY 1, 2, 3, 4, 5, 6, 7
`

/** The tag keys the account's usage is rolled up by, in the order they were marked. */
export const groupingTags = (sql: SqlClient.SqlClient, accountId: string) =>
  SqlSchema.findAll({
    Request: Schema.String,
    Result: TagKey,
    execute: (id) => sql`SELECT tag_key FROM grouping_tags WHERE account_id = ${id} ORDER BY created_at, tag_key`
  })(accountId).pipe(Effect.map((rows) => rows.map((row) => row.tagKey)))

/**
 * Makes `keys` the account's grouping tags: the rollups of keys no longer
 * marked go, and a newly marked key's are computed from the account's logs.
 * While that runs, writers of logs wait (`SHARE` lock), so that every log is
 * counted once: before the mark, by this backfill; after it, by the triggers.
 */
export const setGroupingTags = (sql: SqlClient.SqlClient, accountId: string, keys: ReadonlyArray<string>) =>
  sql.withTransaction(Effect.gen(function*() {
    const current = yield* groupingTags(sql, accountId)
    const added = keys.filter((key) => !current.includes(key))
    const removed = current.filter((key) => !keys.includes(key))
    if (removed.length > 0) {
      yield* sql`DELETE FROM grouping_tags WHERE account_id = ${accountId} AND tag_key = ANY(${removed}::text[])`
      yield* sql`DELETE FROM usage_tag_rollups WHERE account_id = ${accountId} AND tag_key = ANY(${removed}::text[])`
    }
    if (added.length === 0) return
    yield* sql`LOCK TABLE request_logs IN SHARE MODE`
    yield* sql`
      INSERT INTO grouping_tags (account_id, tag_key)
      SELECT ${accountId}, unnest(${added}::text[])
    `
    yield* fromLogs(sql, sql.and([sql`l.account_id = ${accountId}`, sql`g.tag_key = ANY(${added}::text[])`]))
  }))

/** Every tag rollup again from `request_logs`, while writers of logs wait; returns the rows written. */
export const rebuildTagRollups = (sql: SqlClient.SqlClient) =>
  sql.withTransaction(Effect.gen(function*() {
    yield* sql`LOCK TABLE request_logs IN SHARE MODE`
    yield* sql`DELETE FROM usage_tag_rollups`
    yield* fromLogs(sql, sql.and([]))
    const rows = yield* SqlSchema.findAll({
      Request: Schema.Void,
      Result: Count,
      execute: () => sql`SELECT count(*)::int AS count FROM usage_tag_rollups`
    })(undefined)
    return rows[0]?.count ?? 0
  }))

/**
 * A range's totals per value of `key`, costliest first (100 at most): for a
 * grouping tag, whole buckets from `usage_tag_rollups` and the part-buckets at
 * either end from the logs; for any other key, all from the logs.
 */
export const tagTotals = (sql: SqlClient.SqlClient, scope: UsageScope, key: string) =>
  Effect.gen(function*() {
    const rolled = (yield* groupingTags(sql, scope.accountId)).includes(key)
    const { from, to, wholeFrom, wholeTo } = wholeBuckets(scope)
    const filters = [
      ...(scope.apiKeyId === undefined ? [] : [sql`api_key_id = ${scope.apiKeyId}`]),
      ...(scope.environment === undefined ? [] : [sql`environment = ${scope.environment}`])
    ]
    const logs = (range: ReturnType<SqlClient.SqlClient["and"]>) =>
      sql`
      SELECT metadata ->> ${key}::text AS value, 1 AS requests, input_tokens, output_tokens, reasoning_tokens, cost_micro_myr
      FROM request_logs WHERE ${sql.and([sql`account_id = ${scope.accountId}`, range, ...filters])}
    `
    const rows = rolled
      ? sql`
        SELECT CASE WHEN tagged THEN tag_value END AS value, ${sql.literal(COUNTERS)} FROM usage_tag_rollups
        WHERE ${
        sql.and([
          sql`account_id = ${scope.accountId}`,
          sql`tag_key = ${key}`,
          sql`bucket >= ${wholeFrom}::timestamptz`,
          sql`bucket < ${wholeTo}::timestamptz`,
          ...filters
        ])
      }
        UNION ALL ${logs(partBuckets(sql, scope))}`
      : logs(sql`created_at >= ${from}::timestamptz AND created_at < ${to}::timestamptz`)
    return yield* SqlSchema.findAll({
      Request: Schema.Void,
      Result: TagTotal,
      execute: () =>
        sql`
      SELECT value, sum(requests)::int AS requests, sum(cost_micro_myr)::bigint AS cost_micro_myr,
        sum(input_tokens)::bigint AS input_tokens, sum(output_tokens)::bigint AS output_tokens,
        sum(reasoning_tokens)::bigint AS reasoning_tokens
      FROM (${rows}) t
      GROUP BY value ORDER BY sum(cost_micro_myr) DESC, sum(requests) DESC, value LIMIT 100
    `
    })(undefined)
  })
