import { HttpApiBuilder, HttpServerResponse } from "@effect/platform"
import { Clock, DateTime, Duration, Effect } from "effect"
import { NenasApi } from "../Api.js"
import { CurrentAccount } from "../Auth/Api.js"
import { InvalidRequest, NotFound } from "../Domain/Errors.js"
import { KeysRepo } from "../Keys/Repo.js"
import { type Environment, type LogCursor, type LogFilter, type LogRow, RequestLogReads, type SeriesRow } from "../Logs/Reads.js"
import { Spending } from "../Wallet/Spending.js"
import { responseIdOf, StoredResponses } from "../Responses/Store.js"
import { conversationLines } from "../Responses/View.js"
import type { Granularity, LogEntry, LogsExportParams, SeriesPoint, UsageCounters, UsageExportParams } from "./Api.js"
import { logsCsv, usageCsv } from "./Export.js"

const USAGE_DEFAULT_RANGE = Duration.days(7)
/** Overview totals and series: the last 30 local days, today included. */
const OVERVIEW_DAYS = 30

/** The `attempts` column as read (its JSON keys camel-cased by the client, or not): `latencyMs` either way. */
const attemptsOf = (attempts: LogRow["attempts"] | null): typeof LogEntry.Type["attempts"] =>
  (attempts ?? []).map((a) => {
    const raw = a as { readonly latencyMs?: number; readonly latency_ms?: number }
    return { target: a.target, outcome: a.outcome, latencyMs: raw.latencyMs ?? raw.latency_ms ?? 0 }
  })

const toLogEntry = (row: LogRow, stored: ReadonlySet<string>): typeof LogEntry.Type => ({
  requestId: row.requestId,
  apiKeyId: row.apiKeyId,
  publicModel: row.publicModel,
  endpoint: row.endpoint,
  stream: row.stream,
  status: row.status,
  routingCategory: row.routingCategory,
  errorCode: row.errorCode,
  environment: row.environment,
  metadata: row.metadata,
  user: row.endUser,
  inputTokens: row.inputTokens,
  outputTokens: row.outputTokens,
  reasoningTokens: row.reasoningTokens,
  cachedTokens: row.cachedTokens,
  usageSource: row.usageSource,
  searchCount: row.searchCount,
  contentPages: row.contentPages,
  costMicroMyr: row.costMicroMyr,
  latencyMs: row.latencyMs,
  attempts: attemptsOf(row.attempts),
  createdAt: row.createdAt.toISOString(),
  storedResponseId: stored.has(responseIdOf(row.requestId)) ? responseIdOf(row.requestId) : null
})

/** A page's last row as an opaque `cursor`: its position in the order of logs. */
const encodeCursor = (cursor: LogCursor): string =>
  Buffer.from(`${cursor.atMicros}.${cursor.requestId}`).toString("base64url")

const decodeCursor = (cursor: string) => {
  const [, atMicros, requestId] = /^(-?\d{1,20})\.(.{1,255})$/s.exec(Buffer.from(cursor, "base64url").toString()) ?? []
  return atMicros === undefined || requestId === undefined
    ? Effect.fail(new InvalidRequest({ message: "'cursor' is not a cursor this API returned.", param: "cursor" }))
    : Effect.succeed({ atMicros, requestId })
}

/** The usage counters of some buckets, summed (integers: exact). */
const countersOf = (rows: ReadonlyArray<SeriesRow>): typeof UsageCounters.Type => {
  const sum = (field: "requests" | "inputTokens" | "outputTokens" | "reasoningTokens" | "searchCount" | "contentPages" | "costMicroMyr") =>
    rows.reduce((total, row) => total + row[field], 0)
  return {
    requests: sum("requests"),
    inputTokens: sum("inputTokens"),
    outputTokens: sum("outputTokens"),
    reasoningTokens: sum("reasoningTokens"),
    searchCount: sum("searchCount"),
    contentPages: sum("contentPages"),
    costMicroMyr: sum("costMicroMyr")
  }
}

const pad2 = (n: number) => String(n).padStart(2, "0")

/** A UTC offset in ISO 8601 form: `+08:00`, `-04:00`, `+00:00`. */
const isoOffset = (seconds: number): string => {
  const minutes = Math.abs(Math.round(seconds / 60))
  return `${seconds < 0 ? "-" : "+"}${pad2(Math.floor(minutes / 60))}:${pad2(minutes % 60)}`
}

const toSeriesPoint = (row: SeriesRow): typeof SeriesPoint.Type => ({
  bucket: `${row.localStart}${isoOffset(row.offsetSeconds)}`,
  requests: row.requests,
  costMicroMyr: row.costMicroMyr,
  inputTokens: row.inputTokens,
  outputTokens: row.outputTokens,
  reasoningTokens: row.reasoningTokens
})

/** PostgreSQL holds no instant before 4714 BC, which a JavaScript date can name; years 1–9999 are plenty. */
const EARLIEST = Date.parse("0001-01-01T00:00:00Z")
const LATEST = Date.parse("9999-12-31T23:59:59.999Z")

const dateOf = (at: DateTime.Utc | undefined): Date | undefined => at === undefined ? undefined : DateTime.toDate(at)

interface Range {
  readonly from?: Date | undefined
  readonly to?: Date | undefined
}

/** The instants a caller gave are within range, and the effective `from` is before `to`. */
const checkRange = (given: Range, { from, to }: Range = given) =>
  Effect.gen(function*() {
    for (const param of ["from", "to"] as const) {
      const at = given[param]?.getTime()
      if (at !== undefined && (at < EARLIEST || at > LATEST)) {
        return yield* new InvalidRequest({ message: `'${param}' must be between 0001-01-01 and 9999-12-31.`, param })
      }
    }
    if (from !== undefined && to !== undefined && from >= to) {
      return yield* new InvalidRequest({ message: "'from' must be earlier than 'to'.", param: "from" })
    }
  })

export const UsageLive = HttpApiBuilder.group(NenasApi, "usage", (handlers) =>
  Effect.gen(function*() {
    const requestLogs = yield* RequestLogReads
    const keys = yield* KeysRepo
    const spending = yield* Spending
    const storedResponses = yield* StoredResponses
    /** Every call this instance answered is written before a read. */
    const settled = spending.settled
    const now = Effect.map(Clock.currentTimeMillis, (ms) => new Date(ms))

    /** Logs of deleted keys stay visible; an id the account never had answers 404. */
    const checkKey = (accountId: string, keyId: string | undefined) =>
      keyId === undefined ? Effect.void : Effect.flatMap(
        Effect.orDie(keys.isAccountKey(accountId, keyId)),
        (found) => found ? Effect.void : Effect.fail(new NotFound({ message: `No API key with id '${keyId}'.`, param: "api_key_id" }))
      )

    const seriesRows = (
      accountId: string,
      from: Date,
      to: Date,
      granularity: typeof Granularity.Type,
      filter: { readonly apiKeyId?: string | undefined; readonly environment?: Environment | undefined } = {}
    ) =>
      requestLogs.series(accountId, { from, to, granularity, ...filter }).pipe(
        Effect.catchTags({
          TooManyBuckets: ({ limit }) =>
            new InvalidRequest({
              message: `A usage series has at most ${limit} ${granularity === "hour" ? "hourly" : "daily"} buckets; ` +
                "narrow the range from 'from' to 'to' or use a coarser granularity.",
              param: "from"
            }),
          SqlError: Effect.die
        })
      )

    const series = (...args: Parameters<typeof seriesRows>) => Effect.map(seriesRows(...args), (rows) => rows.map(toSeriesPoint))

    /** The one tag filter: `tag=key:value` (split at the first colon), or `tag_key` with an optional `tag_value`. */
    const tagFilter = (params: Pick<typeof LogsExportParams.Type, "tag" | "tag_key" | "tag_value">) =>
      Effect.gen(function*() {
        if (params.tag === undefined) {
          return params.tag_key === undefined ? undefined : { key: params.tag_key, value: params.tag_value }
        }
        if (params.tag_key !== undefined) {
          return yield* new InvalidRequest({ message: "Pass either 'tag' or 'tag_key', not both.", param: "tag" })
        }
        const colon = params.tag.indexOf(":")
        const key = params.tag.slice(0, colon)
        if (colon < 1 || key.length > 64 || params.tag.length - colon - 1 > 512) {
          return yield* new InvalidRequest({
            message: "Invalid 'tag': must be key:value, e.g. tag=team:search (a key of 1 to 64 characters, a value of at most 512).",
            param: "tag"
          })
        }
        return { key, value: params.tag.slice(colon + 1) }
      })

    /** The logs' filters from their params, checked. */
    const logFilter = (accountId: string, params: Omit<typeof LogsExportParams.Type, "format">) =>
      Effect.gen(function*() {
        const from = dateOf(params.from)
        const to = dateOf(params.to)
        yield* checkRange({ from, to })
        yield* checkKey(accountId, params.api_key_id)
        if (params.tag_value !== undefined && params.tag_key === undefined) {
          return yield* new InvalidRequest({ message: "'tag_value' needs 'tag_key'.", param: "tag_value" })
        }
        const tag = yield* tagFilter(params)
        return {
          status: params.status,
          apiKeyId: params.api_key_id,
          endpoint: params.endpoint,
          environment: params.environment,
          tag,
          endUser: params.user,
          from,
          to
        } satisfies LogFilter
      })

    /** A usage read's range (default: the last 7 days), checked, once this instance's calls are written. */
    const usageRange = (accountId: string, params: Omit<typeof UsageExportParams.Type, "format">) =>
      Effect.gen(function*() {
        const given = { from: dateOf(params.from), to: dateOf(params.to) }
        const to = given.to ?? (yield* now)
        const from = given.from ?? new Date(to.getTime() - Duration.toMillis(USAGE_DEFAULT_RANGE))
        yield* checkRange(given, { from, to })
        yield* checkKey(accountId, params.api_key_id)
        yield* settled
        return { from, to }
      })

    return handlers
      .handle("logs", ({ urlParams }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const filter = yield* logFilter(account.id, urlParams)
          if (urlParams.cursor !== undefined && urlParams.page > 1) {
            return yield* new InvalidRequest({ message: "Pass either 'cursor' or 'page', not both.", param: "cursor" })
          }
          const after = urlParams.cursor === undefined ? undefined : yield* decodeCursor(urlParams.cursor)
          yield* settled
          const { rows, total } = yield* Effect.orDie(requestLogs.logs(
            account.id,
            filter,
            { limit: urlParams.limit, offset: (urlParams.page - 1) * urlParams.limit, after }
          ))
          const page = rows.slice(0, urlParams.limit)
          const last = page.at(-1)
          const more = rows.length > urlParams.limit
          const responses = page.flatMap((row) => row.endpoint === "/v1/responses" ? [responseIdOf(row.requestId)] : [])
          const stored = yield* Effect.orDie(storedResponses.present(account.id, responses))
          return {
            logs: page.map((row) => toLogEntry(row, stored)),
            total,
            has_more: after === undefined ? urlParams.page * urlParams.limit < total : more,
            next_cursor: more && last !== undefined ? encodeCursor({ atMicros: last.atMicros, requestId: last.requestId }) : null
          }
        }))
      .handle("conversation", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          yield* settled
          const responseId = responseIdOf(path.request_id)
          // A conversation past the bounds shows its newest part, as far as they go.
          const chain = yield* Effect.orDie(storedResponses.chain(account.id, responseId, false))
          if (chain.length === 0) {
            return yield* new NotFound({ message: `No stored conversation for request '${path.request_id}'.`, param: "request_id" })
          }
          return { responseId, lines: conversationLines(chain) }
        }))
      .handle("exportLogs", ({ urlParams }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const filter = yield* logFilter(account.id, urlParams)
          yield* settled
          return HttpServerResponse.stream(logsCsv(requestLogs, account.id, filter), {
            contentType: "text/csv; charset=utf-8",
            headers: { "content-disposition": "attachment; filename=\"nenas-logs.csv\"", "cache-control": "no-store" }
          })
        }))
      .handle("usage", ({ urlParams }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const { from, to } = yield* usageRange(account.id, urlParams)
          return {
            from: from.toISOString(),
            to: to.toISOString(),
            granularity: urlParams.granularity,
            series: yield* series(account.id, from, to, urlParams.granularity, {
              apiKeyId: urlParams.api_key_id,
              environment: urlParams.environment
            }),
            ...(urlParams.group_by_tag === undefined ? {} : {
              groups: (yield* Effect.orDie(requestLogs.tagTotals(
                { accountId: account.id, from, to, apiKeyId: urlParams.api_key_id, environment: urlParams.environment },
                urlParams.group_by_tag
              ))).map(({ value, ...totals }) => ({ tag_value: value, ...totals }))
            })
          }
        }))
      .handle("groupingTags", () =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          return { tag_keys: yield* Effect.orDie(requestLogs.groupingTags(account.id)) }
        }))
      .handle("setGroupingTags", ({ payload }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          yield* Effect.orDie(requestLogs.setGroupingTags(account.id, [...new Set(payload.tag_keys)]))
          return { tag_keys: yield* Effect.orDie(requestLogs.groupingTags(account.id)) }
        }))
      .handle("exportUsage", ({ urlParams }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const { from, to } = yield* usageRange(account.id, urlParams)
          const points = yield* series(account.id, from, to, urlParams.granularity, {
            apiKeyId: urlParams.api_key_id,
            environment: urlParams.environment
          })
          return HttpServerResponse.text(usageCsv(points), {
            contentType: "text/csv; charset=utf-8",
            headers: { "content-disposition": "attachment; filename=\"nenas-usage.csv\"", "cache-control": "no-store" }
          })
        }))
      .handle("overview", () =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const at = yield* now
          const days = yield* Effect.orDie(requestLogs.localDays(at, OVERVIEW_DAYS))
          yield* settled
          // One read of the 30 local days: the last is today, and the totals are their sum.
          const { wallet, daily, keyCounts } = yield* Effect.all({
            wallet: Effect.orDie(spending.balance(account.id)),
            daily: seriesRows(account.id, days.first, days.tomorrow, "day"),
            keyCounts: Effect.orDie(keys.counts(account.id, at))
          }, { concurrency: "unbounded" })
          return {
            wallet,
            today_usage: countersOf(daily.slice(-1)),
            total_usage: countersOf(daily),
            daily_series: daily.map(toSeriesPoint),
            api_key_count: keyCounts.total,
            active_api_key_count: keyCounts.active
          }
        }))
  }))
