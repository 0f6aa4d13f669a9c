import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import { InvalidRequest, NotFound, wire } from "../Domain/Errors.js"
import { ADMINS, allowRoles, EVERY_ROLE } from "../Domain/Roles.js"
import { Rfc3339DateTime, SqlString, StrictUrlParams } from "../Domain/Strict.js"
import { Csv, Environment, ExportFormat } from "../Logs/Api.js"
import { Wallet } from "../Wallet/Api.js"

export const Granularity = Schema.Literal("hour", "day")

/** The range and filters of usage, shared by the series and its export. */
const UsageFilterFields = {
  from: Schema.optional(Rfc3339DateTime),
  to: Schema.optional(Rfc3339DateTime),
  granularity: Schema.optionalWith(Granularity, { default: () => "day" as const }),
  api_key_id: Schema.optional(SqlString),
  environment: Schema.optional(Environment)
}

export const UsageParams = StrictUrlParams({
  ...UsageFilterFields,
  /** Also total the range per value of this `metadata` key (`groups`). */
  group_by_tag: Schema.optional(SqlString.pipe(Schema.minLength(1), Schema.maxLength(64)))
})

export const SeriesPoint = Schema.Struct({
  bucket: Schema.String,
  requests: Schema.Int,
  costMicroMyr: Schema.Int,
  inputTokens: Schema.Int,
  outputTokens: Schema.Int,
  reasoningTokens: Schema.Int,
  /** Calls the response cache answered, and what they would have cost (docs/api/cache.md, "Logs and usage"). */
  cacheHits: Schema.Int,
  cacheSavedMicroMyr: Schema.Int,
  /** Calls answered on the team's own provider keys, and their fees, within `requests` and `costMicroMyr`. */
  byokCalls: Schema.Int,
  byokFeeMicroMyr: Schema.Int
}).annotations({ identifier: "SeriesPoint" })

export const TagGroup = Schema.Struct({
  /** The tag's value; null for calls without the tag. */
  tag_value: Schema.NullOr(Schema.String),
  requests: Schema.Int,
  costMicroMyr: Schema.Int,
  inputTokens: Schema.Int,
  outputTokens: Schema.Int,
  reasoningTokens: Schema.Int
}).annotations({ identifier: "TagGroup" })

export const UsageSeries = Schema.Struct({
  from: Schema.String,
  to: Schema.String,
  granularity: Granularity,
  series: Schema.Array(SeriesPoint),
  /** With `group_by_tag`: the range's totals per value of that tag, costliest first (up to 100). */
  groups: Schema.optional(Schema.Array(TagGroup))
})

export const UsageCounters = Schema.Struct({
  requests: Schema.Int,
  inputTokens: Schema.Int,
  outputTokens: Schema.Int,
  reasoningTokens: Schema.Int,
  searchCount: Schema.Int,
  contentPages: Schema.Int,
  costMicroMyr: Schema.Int,
  cacheHits: Schema.Int,
  cacheSavedMicroMyr: Schema.Int,
  /** Calls answered on the team's own provider keys, and their fees (docs/api/provider-keys.md, "Billing"). */
  byokCalls: Schema.Int,
  byokFeeMicroMyr: Schema.Int
}).annotations({ identifier: "UsageCounters" })

export const Overview = Schema.Struct({
  wallet: Wallet,
  today_usage: UsageCounters,
  total_usage: UsageCounters,
  daily_series: Schema.Array(SeriesPoint),
  api_key_count: Schema.Int,
  active_api_key_count: Schema.Int
})

export const UsageExportParams = StrictUrlParams({
  format: Schema.optionalWith(ExportFormat, { default: () => "csv" as const }),
  ...UsageFilterFields
})

/** The tag keys usage is rolled up by (`group_by_tag` on them reads rollups; on any other key, the logs). */
export const GroupingTags = Schema.Struct({
  tag_keys: Schema.Array(SqlString.pipe(Schema.minLength(1), Schema.maxLength(64))).pipe(Schema.maxItems(3))
}).annotations({ identifier: "GroupingTags", examples: [{ tag_keys: ["team", "feature"] }] })

export class UsageApi extends HttpApiGroup.make("usage")
  .add(
    HttpApiEndpoint.get("usage", "/dashboard/usage").setUrlParams(UsageParams).addSuccess(UsageSeries)
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(HttpApiEndpoint.get("overview", "/dashboard/overview").addSuccess(Overview).pipe(allowRoles(...EVERY_ROLE)))
  .add(
    HttpApiEndpoint.get("exportUsage", "/dashboard/usage/export").setUrlParams(UsageExportParams).addSuccess(Csv)
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.get("groupingTags", "/dashboard/usage/grouping-tags").addSuccess(GroupingTags)
      .annotate(
        OpenApi.Description,
        "The tag keys (at most 3) whose usage is rolled up: `group_by_tag` on them stays fast at any history."
      )
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.put("setGroupingTags", "/dashboard/usage/grouping-tags").setPayload(GroupingTags).addSuccess(
      GroupingTags
    )
      .annotate(
        OpenApi.Description,
        "Replaces the grouping tag keys; a key added is rolled up from the account's logs before this answers."
      )
      .pipe(allowRoles(...ADMINS))
  )
  .addError(wire(InvalidRequest))
  .addError(wire(NotFound))
  .middleware(DashboardAuth)
  .annotate(OpenApi.Description, "Usage time series, grouping tags and the dashboard overview.")
{}
