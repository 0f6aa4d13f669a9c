import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as HttpApiSchema from "@effect/platform/HttpApiSchema"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import { InvalidRequest, NotFound, wire } from "../Domain/Errors.js"
import { PageParams } from "../Domain/Page.js"
import { allowRoles, EVERY_ROLE } from "../Domain/Roles.js"
import { Rfc3339DateTime, SqlString, StrictUrlParams } from "../Domain/Strict.js"
import { LoggedGuardrails } from "../Guardrails/Api.js"

export const LogStatus = Schema.Literal("pending", "succeeded", "failed", "billed")

/** A key's environment: `test` calls are free, so a cost chart filters them out with `live`. */
export const Environment = Schema.Literal("live", "test")

/** The filters of logs, shared by the list and its export. */
const LogFilterFields = {
  status: Schema.optional(LogStatus),
  api_key_id: Schema.optional(SqlString),
  endpoint: Schema.optional(SqlString),
  environment: Schema.optional(Environment),
  /**
   * `key:value`, split at the first colon
   * (docs/api/dashboard.md, "Dashboard analytics: rollups, paging, tags and export"): calls whose `metadata` has that key with that value.
   */
  tag: Schema.optional(SqlString.pipe(Schema.maxLength(64 + 1 + 512))),
  /** Calls tagged with this `metadata` key; with `tag_value`, with that value too (a key with a colon in it). */
  tag_key: Schema.optional(SqlString.pipe(Schema.minLength(1), Schema.maxLength(64))),
  tag_value: Schema.optional(SqlString.pipe(Schema.maxLength(512))),
  /** Calls of this chat `user`. */
  user: Schema.optional(SqlString.pipe(Schema.maxLength(256))),
  /** Calls where a guardrail rule of this action matched (docs/api/guardrails.md, "Logs"). */
  guardrail: Schema.optional(Schema.Literal("blocked", "redacted", "flagged")),
  from: Schema.optional(Rfc3339DateTime),
  to: Schema.optional(Rfc3339DateTime)
}

export const LogsParams = StrictUrlParams({
  ...PageParams.fields,
  /** A previous page's `next_cursor`: the rows after its last one (keyset paging; then `page` stays 1). */
  cursor: Schema.optional(SqlString.pipe(Schema.maxLength(512))),
  ...LogFilterFields
})

/** The format of an export; CSV is the one there is. */
export const ExportFormat = Schema.Literal("csv")

export const LogsExportParams = StrictUrlParams({
  format: Schema.optionalWith(ExportFormat, { default: () => "csv" as const }),
  ...LogFilterFields
})

export const LogEntry = Schema.Struct({
  requestId: Schema.String,
  apiKeyId: Schema.String,
  publicModel: Schema.String,
  endpoint: Schema.String,
  stream: Schema.Boolean,
  status: LogStatus,
  /** `general`, `reasoning` or `search`; null for a call refused before it was routed. */
  routingCategory: Schema.NullOr(Schema.String),
  /** The error code a failed call answered with. */
  errorCode: Schema.NullOr(Schema.String),
  /** The key's environment at the call: `test` calls are free. */
  environment: Environment,
  /** The call's `metadata` (tags); null when it had none. */
  metadata: Schema.NullOr(Schema.Record({ key: Schema.String, value: Schema.String })),
  /** The call's chat `user`; null when it had none. */
  user: Schema.NullOr(Schema.String),
  inputTokens: Schema.Int,
  outputTokens: Schema.Int,
  reasoningTokens: Schema.Int,
  cachedTokens: Schema.Int,
  usageSource: Schema.Literal("provider", "estimated"),
  searchCount: Schema.Int,
  contentPages: Schema.Int,
  costMicroMyr: Schema.Int,
  latencyMs: Schema.Int,
  /**
   * Each upstream attempt in the order it ran (fallbacks): the target (`upstream/model`), how it ended
   * (`ok`, `refused`, `rate_limited`, `server_error`, `connection_error`, `first_byte_timeout`, `cut_short`,
   * `breaker_open`) and how long it took; empty when none was recorded (a test key, a refused call).
   */
  attempts: Schema.Array(Schema.Struct({ target: Schema.String, outcome: Schema.String, latencyMs: Schema.Int })),
  /** What the key's guardrail policy did: rule names and counts, never a matched value; null: no policy. */
  guardrails: Schema.NullOr(LoggedGuardrails),
  /** What the response cache did (docs/api/cache.md, "Logs and usage"): `hit`, `miss`, `bypass`; null: not asked. */
  cache: Schema.NullOr(Schema.Literal("hit", "miss", "bypass")),
  /** A hit's source: the request whose answer it replayed. */
  cacheSourceRequestId: Schema.NullOr(Schema.String),
  /** What a hit saved: what its source cost. */
  cacheSavedMicroMyr: Schema.Int,
  /** The team's own provider key that answered (docs/api/provider-keys.md, "Billing"); null: nenas's upstream. */
  providerKeyId: Schema.NullOr(Schema.String),
  /** The fee of a call answered on the team's own key: what its tokens cost of `costMicroMyr`; 0 otherwise. */
  byokFeeMicroMyr: Schema.Int,
  createdAt: Schema.String,
  /** The stored response of a `/v1/responses` call made with `store` (30 days); null when none is kept. */
  storedResponseId: Schema.NullOr(Schema.String)
}).annotations({ identifier: "RequestLog" })

/** A stored conversation up to one call's response, as the log detail shows it. */
export const LogConversation = Schema.Struct({
  responseId: Schema.String,
  lines: Schema.Array(Schema.Struct({ kind: Schema.String, role: Schema.String, text: Schema.String }))
}).annotations({ identifier: "LogConversation" })

export const LogsPage = Schema.Struct({
  logs: Schema.Array(LogEntry),
  total: Schema.Int,
  has_more: Schema.Boolean,
  /** Pass as `cursor` for the next page; null on the last page. */
  next_cursor: Schema.NullOr(Schema.String)
})

/** CSV with a header line; money as MYR with 6 decimals (`cost_myr`) and as integer micro-MYR (`cost_micro_myr`). */
export const Csv = HttpApiSchema.Text({ contentType: "text/csv; charset=utf-8" })

export class LogsApi extends HttpApiGroup.make("logs")
  .add(
    HttpApiEndpoint.get("logs", "/dashboard/logs").setUrlParams(LogsParams).addSuccess(LogsPage)
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.get("conversation", "/dashboard/logs/:request_id/conversation")
      .setPath(Schema.Struct({ request_id: Schema.String }))
      .addSuccess(LogConversation)
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.get("exportLogs", "/dashboard/logs/export").setUrlParams(LogsExportParams).addSuccess(Csv)
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .addError(wire(InvalidRequest))
  .addError(wire(NotFound))
  .middleware(DashboardAuth)
  .annotate(
    OpenApi.Description,
    "Request logs: each call, its cost and attempts, its stored conversation, and their CSV export."
  )
{}
