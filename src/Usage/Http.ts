import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Duration, Effect } from "effect"
import { NenasApi } from "../Api.js"
import { AuditLog } from "../Audit/Repo.js"
import { CurrentAccount } from "../Auth/Api.js"
import { InvalidRequest } from "../Domain/Errors.js"
import { now } from "../Domain/Time.js"
import { requireAccountKey } from "../Keys/AccountKey.js"
import { KeysRepo } from "../Keys/Repo.js"
import { checkRange, dateOf } from "../Logs/Range.js"
import { type Environment, RequestLogReads, type SeriesRow } from "../Logs/Reads.js"
import { Spending } from "../Wallet/Spending.js"
import type { Granularity, SeriesPoint, UsageCounters, UsageExportParams } from "./Api.js"
import { usageCsv } from "./UsageCsv.js"

const USAGE_DEFAULT_RANGE = Duration.days(7)
/** Overview totals and series: the last 30 local days, today included. */
const OVERVIEW_DAYS = 30

/** The usage counters of some buckets, summed (integers: exact). */
const countersOf = (rows: ReadonlyArray<SeriesRow>): typeof UsageCounters.Type => {
  const sum = (
    field:
      | "requests"
      | "inputTokens"
      | "outputTokens"
      | "reasoningTokens"
      | "searchCount"
      | "contentPages"
      | "costMicroMyr"
      | "cacheHits"
      | "cacheSavedMicroMyr"
      | "byokCalls"
      | "byokFeeMicroMyr"
  ) => rows.reduce((total, row) => total + row[field], 0)
  return {
    requests: sum("requests"),
    inputTokens: sum("inputTokens"),
    outputTokens: sum("outputTokens"),
    reasoningTokens: sum("reasoningTokens"),
    searchCount: sum("searchCount"),
    contentPages: sum("contentPages"),
    costMicroMyr: sum("costMicroMyr"),
    cacheHits: sum("cacheHits"),
    cacheSavedMicroMyr: sum("cacheSavedMicroMyr"),
    byokCalls: sum("byokCalls"),
    byokFeeMicroMyr: sum("byokFeeMicroMyr")
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
  reasoningTokens: row.reasoningTokens,
  cacheHits: row.cacheHits,
  cacheSavedMicroMyr: row.cacheSavedMicroMyr,
  byokCalls: row.byokCalls,
  byokFeeMicroMyr: row.byokFeeMicroMyr
})

export const UsageLive = HttpApiBuilder.group(NenasApi, "usage", (handlers) =>
  Effect.gen(function*() {
    const requestLogs = yield* RequestLogReads
    const audit = yield* AuditLog
    const keys = yield* KeysRepo
    const spending = yield* Spending
    /** Every call this instance answered is written before a read. */
    const settled = spending.settled

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
            })
        })
      )

    const series = (...args: Parameters<typeof seriesRows>) =>
      Effect.map(seriesRows(...args), (rows) => rows.map(toSeriesPoint))

    /** A usage read's range (default: the last 7 days), checked, once this instance's calls are written. */
    const usageRange = (accountId: string, params: Omit<typeof UsageExportParams.Type, "format">) =>
      Effect.gen(function*() {
        const given = { from: dateOf(params.from), to: dateOf(params.to) }
        const to = given.to ?? (yield* now)
        const from = given.from ?? new Date(to.getTime() - Duration.toMillis(USAGE_DEFAULT_RANGE))
        yield* checkRange(given, { from, to })
        yield* requireAccountKey(keys, accountId, params.api_key_id)
        yield* settled
        return { from, to }
      })

    return handlers
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
              groups: (yield* requestLogs.tagTotals(
                { accountId: account.id, from, to, apiKeyId: urlParams.api_key_id, environment: urlParams.environment },
                urlParams.group_by_tag
              )).map(({ value, ...totals }) => ({ tag_value: value, ...totals }))
            })
          }
        }))
      .handle("groupingTags", () =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          return { tag_keys: yield* requestLogs.groupingTags(account.id) }
        }))
      .handle("setGroupingTags", ({ payload }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const tagKeys = [...new Set(payload.tag_keys)]
          yield* audit.within(requestLogs.setGroupingTags(account.id, tagKeys), () => ({
            action: "usage.grouping_tags_updated",
            targetType: "usage",
            targetId: null,
            details: { tag_keys: tagKeys }
          }))
          return { tag_keys: yield* requestLogs.groupingTags(account.id) }
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
          const days = yield* requestLogs.localDays(at, OVERVIEW_DAYS)
          yield* settled
          // One read of the 30 local days: the last is today, and the totals are their sum.
          const { wallet, daily, keyCounts } = yield* Effect.all({
            wallet: spending.balance(account.id),
            daily: seriesRows(account.id, days.first, days.tomorrow, "day"),
            keyCounts: keys.counts(account.id, at)
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
