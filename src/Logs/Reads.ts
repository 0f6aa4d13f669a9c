import { SqlClient, type SqlError, SqlSchema, type Statement } from "@effect/sql"
import { Context, Data, Effect, Layer, Schema } from "effect"
import type { ParseError } from "effect/ParseResult"
import { AppConfig } from "../AppConfig.js"
import { MicroMyr } from "../Domain/Money.js"
import { makeTestLayer } from "../Domain/TestLayer.js"
import { LoggedGuardrails } from "../Guardrails/Api.js"
import type { LoggedAttempt, LogWrite } from "./RequestLogs.js"
import { logUsage, rolledUsage, rollupsFit, type UsageScope } from "./Rollups.js"
import { groupingTags, setGroupingTags, type TagTotal, tagTotals } from "./TagRollups.js"

export type LogStatus = LogWrite["status"]

export type Environment = "live" | "test"

/** The width of a usage series' buckets. */
export type Granularity = "hour" | "day"

/** How many buckets one usage series may have, by granularity (31 days hourly, a leap year daily). */
export const MAX_BUCKETS: Readonly<Record<Granularity, number>> = { hour: 744, day: 366 }

/** An upstream attempt as the `attempts` column keeps it (its JSON keys camel-cased by the client, or not). */
const StoredAttempt = Schema.transform(
  Schema.Struct({
    target: Schema.String,
    outcome: Schema.String,
    latencyMs: Schema.optional(Schema.Number),
    latency_ms: Schema.optional(Schema.Number)
  }),
  Schema.Struct({ target: Schema.String, outcome: Schema.String, latencyMs: Schema.Number }),
  {
    strict: true,
    decode: (stored): LoggedAttempt => ({
      target: stored.target,
      outcome: stored.outcome,
      latencyMs: stored.latencyMs ?? stored.latency_ms ?? 0
    }),
    encode: (attempt) => attempt
  }
)

/** A log row as the dashboard reads it: the usage a finished call wrote (`LoggedUsage`), and what called. */
export const LogRow = Schema.Struct({
  requestId: Schema.String,
  apiKeyId: Schema.String,
  publicModel: Schema.String,
  endpoint: Schema.String,
  stream: Schema.Boolean,
  status: Schema.Literal("pending", "succeeded", "failed", "billed"),
  routingCategory: Schema.NullOr(Schema.String),
  errorCode: Schema.NullOr(Schema.String),
  inputTokens: Schema.Int,
  outputTokens: Schema.Int,
  reasoningTokens: Schema.Int,
  cachedTokens: Schema.Int,
  usageSource: Schema.Literal("provider", "estimated"),
  searchCount: Schema.Int,
  contentPages: Schema.Int,
  costMicroMyr: MicroMyr,
  latencyMs: Schema.Int,
  environment: Schema.Literal("live", "test"),
  /** Read as text and parsed here: the client would camel-case the keys of a JSON value (`cost_center` → `costCenter`). */
  metadata: Schema.NullOr(Schema.parseJson(Schema.Record({ key: Schema.String, value: Schema.String }))),
  endUser: Schema.NullOr(Schema.String),
  /** Each upstream attempt, in order; null: none was recorded. */
  attempts: Schema.NullOr(Schema.Array(StoredAttempt)),
  /** Read as text, as `metadata` is. */
  guardrails: Schema.NullOr(Schema.parseJson(LoggedGuardrails)),
  cache: Schema.NullOr(Schema.Literal("hit", "miss", "bypass")),
  cacheSourceRequestId: Schema.NullOr(Schema.String),
  cacheSavedMicroMyr: Schema.Int,
  providerKeyId: Schema.NullOr(Schema.String),
  byokFeeMicroMyr: Schema.Int,
  createdAt: Schema.DateFromSelf,
  /** Where the row stands in the order of logs: `created_at` in microseconds since the epoch, as a string. */
  atMicros: Schema.String
})
export type LogRow = typeof LogRow.Type

/** The last row of a page: the next page starts after it (keyset paging). */
export interface LogCursor {
  readonly atMicros: string
  readonly requestId: string
}

/** Which page: `offset` rows in, or the rows after `after`; up to `limit` rows (and one more, to tell if more follow). */
export interface LogPage {
  readonly limit: number
  readonly offset: number
  readonly after?: LogCursor | undefined
}

export interface LogFilter {
  readonly status?: LogStatus | undefined
  readonly apiKeyId?: string | undefined
  readonly endpoint?: string | undefined
  readonly environment?: Environment | undefined
  /** Calls tagged with this metadata key (and, if given, this value). */
  readonly tag?: { readonly key: string; readonly value?: string | undefined } | undefined
  /** Calls of this chat `user`. */
  readonly endUser?: string | undefined
  /** Calls where a guardrail rule of this action matched. */
  readonly guardrail?: "blocked" | "redacted" | "flagged" | undefined
  /** Inclusive. */
  readonly from?: Date | undefined
  /** Exclusive. */
  readonly to?: Date | undefined
}

export const SeriesRow = Schema.Struct({
  /** The bucket's start in local time, `YYYY-MM-DDTHH:MM:SS`. */
  localStart: Schema.String,
  /** The zone's offset from UTC at the bucket's start, in seconds. */
  offsetSeconds: Schema.Int,
  requests: Schema.Int,
  costMicroMyr: MicroMyr,
  inputTokens: Schema.Int,
  outputTokens: Schema.Int,
  reasoningTokens: Schema.Int,
  searchCount: Schema.Int,
  contentPages: Schema.Int,
  cacheHits: Schema.Int,
  cacheSavedMicroMyr: Schema.Int,
  byokCalls: Schema.Int,
  byokFeeMicroMyr: Schema.Int
})
export type SeriesRow = typeof SeriesRow.Type

export interface SeriesQuery {
  /** Inclusive. */
  readonly from: Date
  /** Exclusive; after `from`. */
  readonly to: Date
  readonly granularity: Granularity
  readonly apiKeyId?: string | undefined
  readonly environment?: Environment | undefined
}

/** Local day boundaries around an instant, as instants. */
export const LocalDays = Schema.Struct({
  /** The start of the day `days - 1` days before today. */
  first: Schema.DateFromSelf,
  today: Schema.DateFromSelf,
  tomorrow: Schema.DateFromSelf
})
export type LocalDays = typeof LocalDays.Type

const Count = Schema.Struct({ count: Schema.Int })
const Total = Schema.Struct({ total: Schema.Int })

export class TooManyBuckets extends Data.TaggedError("TooManyBuckets")<{ readonly limit: number }> {}

/** The rule action a `?guardrail=` filter looks for. */
const GUARDRAIL_ACTIONS = { blocked: "block", redacted: "redact", flagged: "flag" } as const

const logColumns = `request_id, api_key_id, public_model, endpoint, stream, status, routing_category, error_code,
  input_tokens, output_tokens, reasoning_tokens, cached_tokens, usage_source, search_count, content_pages,
  cost_micro_myr, latency_ms, environment, metadata::text AS metadata, end_user, attempts, guardrails::text AS guardrails, cache, cache_source_request_id,
  cache_saved_micro_myr, provider_key_id, byok_fee_micro_myr, created_at, (extract(epoch FROM created_at) * 1000000)::bigint::text AS at_micros`

/**
 * Reads of request logs for the dashboard (`RequestLogs` is their one writer).
 * Local times (day and hour buckets) are in the business time zone; buckets
 * are computed on local timestamps, so a day bucket starts at local midnight.
 * Rows are decoded; a failed read is a defect.
 */
export class RequestLogReads extends Context.Tag("nenas/RequestLogReads")<RequestLogReads, {
  /** One page of logs, newest first (up to `limit + 1` rows: the last shows that more follow), and how many match the filter. */
  readonly logs: (
    accountId: string,
    filter: LogFilter,
    page: LogPage
  ) => Effect.Effect<{ readonly rows: ReadonlyArray<LogRow>; readonly total: number }>
  /** The same rows as `logs`, without the count. */
  readonly rows: (accountId: string, filter: LogFilter, page: LogPage) => Effect.Effect<ReadonlyArray<LogRow>>
  /** The dense series of buckets from the one holding `from` to the one holding the instant before `to`. */
  readonly series: (
    accountId: string,
    query: SeriesQuery
  ) => Effect.Effect<ReadonlyArray<SeriesRow>, TooManyBuckets>
  /** Totals per value of one metadata key over the scope, costliest first, up to 100 (rolled up for grouping tags: `TagRollups.ts`). */
  readonly tagTotals: (scope: UsageScope, key: string) => Effect.Effect<ReadonlyArray<TagTotal>>
  /** The tag keys the account's usage is rolled up by. */
  readonly groupingTags: (accountId: string) => Effect.Effect<ReadonlyArray<string>>
  /** Marks the account's grouping tags (those added backfilled from its logs). */
  readonly setGroupingTags: (accountId: string, keys: ReadonlyArray<string>) => Effect.Effect<void>
  /** The business time zone's days around `at`, the `days`th last of them first. */
  readonly localDays: (at: Date, days: number) => Effect.Effect<LocalDays>
}>() {
  static readonly layer = Layer.effect(
    RequestLogReads,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const timeZone = (yield* AppConfig).businessTimezone
      // Sums come from the rollups when their buckets fit the zone's hours, else straight from the logs.
      const usage = (yield* rollupsFit(sql, timeZone))
        ? (scope: UsageScope) => rolledUsage(sql, scope)
        : (scope: UsageScope) => logUsage(sql, scope)
      /** The rows of `statement`, decoded. */
      const all = <A, I>(
        Result: Schema.Schema<A, I>,
        statement: Effect.Effect<ReadonlyArray<unknown>, SqlError.SqlError>
      ) => SqlSchema.findAll({ Request: Schema.Void, Result, execute: () => statement })(undefined)
      /** The one row of `statement`, decoded (none is a defect). */
      const one = <A, I>(
        Result: Schema.Schema<A, I>,
        statement: Effect.Effect<ReadonlyArray<unknown>, SqlError.SqlError>
      ) =>
        SqlSchema.single({ Request: Schema.Void, Result, execute: () => statement })(undefined).pipe(
          Effect.catchTag("NoSuchElementException", () => Effect.dieMessage("the query returned no row"))
        )
      /** A method's SQL and decoding failures as defects, in a span named after it. */
      const owned = (name: string) => <A>(self: Effect.Effect<A, SqlError.SqlError | ParseError>) =>
        self.pipe(Effect.orDie, Effect.withSpan(`RequestLogReads.${name}`))
      const local = (at: Date) => sql`(${at}::timestamptz AT TIME ZONE ${timeZone}::text)`
      const step = (granularity: Granularity) =>
        sql.literal(granularity === "hour" ? "interval '1 hour'" : "interval '1 day'")

      /** The first and last local bucket starts of a range, as local timestamps. */
      const firstBucket = ({ from, granularity }: SeriesQuery) => sql`date_trunc(${granularity}::text, ${local(from)})`
      const lastBucket = ({ to, granularity }: SeriesQuery) =>
        sql`date_trunc(${granularity}::text, (${to}::timestamptz - interval '1 microsecond') AT TIME ZONE ${timeZone}::text)`
      const bucketCount = (query: SeriesQuery) =>
        one(
          Count,
          sql`
            SELECT (extract(epoch FROM ${lastBucket(query)} - ${firstBucket(query)})
              / extract(epoch FROM ${step(query.granularity)}))::bigint + 1 AS count
          `
        ).pipe(Effect.map((row) => row.count))

      const position = (after: LogCursor) =>
        sql`(timestamptz 'epoch' + ${after.atMicros}::bigint * interval '1 microsecond', ${after.requestId}::text)`
      /**
       * Where a page starts: after its cursor; or at the row `offset` rows in,
       * found by an index-only walk of the keys (not by reading every row before it).
       */
      const start = (where: Statement.Fragment, page: LogPage) =>
        page.after !== undefined
          ? sql`(created_at, request_id) < ${position(page.after)}`
          : page.offset === 0
          ? sql.literal("true")
          : sql`(created_at, request_id) <= (
              SELECT created_at, request_id FROM request_logs WHERE ${where}
              ORDER BY created_at DESC, request_id DESC OFFSET ${page.offset} LIMIT 1
            )`

      const whereOf = (accountId: string, filter: LogFilter) =>
        sql.and([
          sql`account_id = ${accountId}`,
          ...(filter.status === undefined ? [] : [sql`status = ${filter.status}`]),
          ...(filter.apiKeyId === undefined ? [] : [sql`api_key_id = ${filter.apiKeyId}`]),
          ...(filter.endpoint === undefined ? [] : [sql`endpoint = ${filter.endpoint}`]),
          ...(filter.environment === undefined ? [] : [sql`environment = ${filter.environment}`]),
          ...(filter.tag === undefined ? [] : [
            filter.tag.value === undefined
              ? sql`metadata ? ${filter.tag.key}`
              : sql`metadata @> jsonb_build_object(${filter.tag.key}::text, ${filter.tag.value}::text)`
          ]),
          ...(filter.endUser === undefined ? [] : [sql`end_user = ${filter.endUser}`]),
          ...(filter.guardrail === undefined ? [] : [
            sql`guardrails IS NOT NULL AND guardrails @> jsonb_build_object('rules', jsonb_build_array(
              jsonb_build_object('action', ${GUARDRAIL_ACTIONS[filter.guardrail]}::text)))`
          ]),
          ...(filter.from === undefined ? [] : [sql`created_at >= ${filter.from}::timestamptz`]),
          ...(filter.to === undefined ? [] : [sql`created_at < ${filter.to}::timestamptz`])
        ])

      const pageRows = (where: Statement.Fragment, page: LogPage) =>
        all(
          LogRow,
          sql`
            SELECT ${sql.literal(logColumns)} FROM request_logs WHERE ${where} AND ${start(where, page)}
            ORDER BY created_at DESC, request_id DESC
            LIMIT ${page.limit + 1}
          `
        )

      return RequestLogReads.of({
        rows: (accountId, filter, page) => pageRows(whereOf(accountId, filter), page).pipe(owned("rows")),
        logs: (accountId, filter, page) => {
          const where = whereOf(accountId, filter)
          return Effect.all({
            rows: pageRows(where, page),
            // Tags are not rolled up: a tag filter counts its rows.
            total: one(
              Total,
              filter.tag === undefined && filter.endUser === undefined && filter.guardrail === undefined
                ? sql`
                  SELECT COALESCE(sum(${sql.literal(filter.status ?? "requests")}), 0)::int AS total
                  FROM (${usage({ accountId, ...filter })}) u
                `
                : sql`SELECT count(*)::int AS total FROM request_logs WHERE ${where}`
            ).pipe(Effect.map((row) => row.total))
          }, { concurrency: 2 }).pipe(owned("logs"))
        },

        series: (accountId, query) =>
          Effect.gen(function*() {
            const limit = MAX_BUCKETS[query.granularity]
            if ((yield* Effect.orDie(bucketCount(query))) > limit) return yield* new TooManyBuckets({ limit })
            const unit = sql`${query.granularity}::text`
            const scope = {
              accountId,
              from: query.from,
              to: query.to,
              apiKeyId: query.apiKeyId,
              environment: query.environment
            }
            // Buckets and logs meet on local timestamps; a bucket's offset is that of its start instant.
            return yield* all(
              SeriesRow,
              sql`
              WITH buckets AS (
                SELECT generate_series(${firstBucket(query)}, ${lastBucket(query)}, ${
                step(query.granularity)
              }) AS bucket
              ), totals AS (
                SELECT date_trunc(${unit}, at AT TIME ZONE ${timeZone}::text) AS bucket,
                  sum(requests) AS requests,
                  sum(cost_micro_myr) AS cost_micro_myr,
                  sum(input_tokens) AS input_tokens,
                  sum(output_tokens) AS output_tokens,
                  sum(reasoning_tokens) AS reasoning_tokens,
                  sum(search_count) AS search_count,
                  sum(content_pages) AS content_pages,
                  sum(cache_hits) AS cache_hits,
                  sum(cache_saved_micro_myr) AS cache_saved_micro_myr,
                  sum(byok_calls) AS byok_calls,
                  sum(byok_fee_micro_myr) AS byok_fee_micro_myr
                FROM (${usage(scope)}) u
                GROUP BY 1
              )
              SELECT to_char(b.bucket, 'YYYY-MM-DD"T"HH24:MI:SS') AS local_start,
                (extract(epoch FROM b.bucket) - extract(epoch FROM b.bucket AT TIME ZONE ${timeZone}::text))::int AS offset_seconds,
                COALESCE(t.requests, 0)::int AS requests,
                COALESCE(t.cost_micro_myr, 0)::bigint AS cost_micro_myr,
                COALESCE(t.input_tokens, 0)::bigint AS input_tokens,
                COALESCE(t.output_tokens, 0)::bigint AS output_tokens,
                COALESCE(t.reasoning_tokens, 0)::bigint AS reasoning_tokens,
                COALESCE(t.search_count, 0)::bigint AS search_count,
                COALESCE(t.content_pages, 0)::bigint AS content_pages,
                COALESCE(t.cache_hits, 0)::bigint AS cache_hits,
                COALESCE(t.cache_saved_micro_myr, 0)::bigint AS cache_saved_micro_myr,
                COALESCE(t.byok_calls, 0)::bigint AS byok_calls,
                COALESCE(t.byok_fee_micro_myr, 0)::bigint AS byok_fee_micro_myr
              FROM buckets b LEFT JOIN totals t ON t.bucket = b.bucket
              ORDER BY b.bucket
            `
            ).pipe(Effect.orDie)
          }).pipe(Effect.withSpan("RequestLogReads.series")),

        tagTotals: (scope, key) => tagTotals(sql, scope, key).pipe(owned("tagTotals")),
        groupingTags: (accountId) => groupingTags(sql, accountId).pipe(owned("groupingTags")),
        setGroupingTags: (accountId, keys) => setGroupingTags(sql, accountId, keys).pipe(owned("setGroupingTags")),

        localDays: (at, days) =>
          one(
            LocalDays,
            sql`
              SELECT (today - make_interval(days => ${days - 1}::int)) AT TIME ZONE ${timeZone}::text AS first,
                today AT TIME ZONE ${timeZone}::text AS today,
                (today + interval '1 day') AT TIME ZONE ${timeZone}::text AS tomorrow
              FROM (SELECT date_trunc('day', ${local(at)}) AS today) d
            `
          ).pipe(owned("localDays"))
      })
    })
  )

  static readonly Test = makeTestLayer(RequestLogReads)
}
