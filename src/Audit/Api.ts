import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as HttpApiSchema from "@effect/platform/HttpApiSchema"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import { InvalidRequest, wire } from "../Domain/Errors.js"
import { PageParams } from "../Domain/Page.js"
import { allowRoles, EVERY_ROLE } from "../Domain/Roles.js"
import { Rfc3339DateTime, SqlString, StrictUrlParams } from "../Domain/Strict.js"

/** What an entry records (docs/api/teams.md, "The audit log"): keys, members, invitations, billing settings, the card, webhooks, provider keys. */
export const AuditAction = Schema.Literal(
  "api_key.created",
  "api_key.updated",
  "api_key.rotated",
  "api_key.deleted",
  "member.invited",
  "member.invitation_revoked",
  "member.joined",
  "member.updated",
  "member.removed",
  "billing.settings_updated",
  "billing.card_setup_started",
  "billing.card_saved",
  "billing.card_removed",
  "webhook.created",
  "webhook.updated",
  "webhook.deleted",
  "webhook.secret_rotated",
  "webhook.disabled",
  "webhook.test_sent",
  "webhook.delivery_resent",
  "billing.checkout_created",
  "usage.grouping_tags_updated",
  "response.deleted",
  "billing.profile_updated",
  "guardrails.updated",
  "billing.e_invoice_resubmitted",
  "provider_key.created",
  "provider_key.updated",
  "provider_key.deleted"
)
export type AuditAction = typeof AuditAction.Type

/** The filters of the audit log, shared by the list and its export. */
const AuditFilterFields = {
  action: Schema.optional(AuditAction),
  /** Entries of this member's doing. */
  member_id: Schema.optional(SqlString.pipe(Schema.maxLength(100))),
  /** Entries about this key, member, invitation or webhook. */
  target_id: Schema.optional(SqlString.pipe(Schema.maxLength(100))),
  from: Schema.optional(Rfc3339DateTime),
  to: Schema.optional(Rfc3339DateTime)
}

export const AuditParams = StrictUrlParams({ ...PageParams.fields, ...AuditFilterFields })

export const AuditExportParams = StrictUrlParams({
  format: Schema.optionalWith(Schema.Literal("csv"), { default: () => "csv" as const }),
  ...AuditFilterFields
})

export const AuditEntry = Schema.Struct({
  id: Schema.String,
  /**
   * Who: the member, or null for the service itself (a card saved by Stripe's event) or an API key (a stored
   * response deleted: `details.actor_api_key_id` names the key).
   */
  member_id: Schema.NullOr(Schema.String),
  actor_email: Schema.NullOr(Schema.String),
  action: AuditAction,
  target_type: Schema.Literal(
    "api_key",
    "member",
    "invitation",
    "billing",
    "card",
    "webhook",
    "checkout",
    "usage",
    "response",
    "guardrails",
    "provider_key"
  ),
  target_id: Schema.NullOr(Schema.String),
  /** What changed: the fields given, never a secret. */
  details: Schema.Record({ key: Schema.String, value: Schema.Unknown }),
  /** From which address (the client's, as the rate limits see it) and in which request. */
  client_address: Schema.NullOr(Schema.String),
  request_id: Schema.NullOr(Schema.String),
  created_at: Schema.String
}).annotations({
  identifier: "AuditEntry",
  examples: [{
    id: "aud_01JD4Q8Z7K3M9X2V5B6N8R1T0Y",
    member_id: "mem_01JD4Q8Z7K3M9X2V5B6N8R1T0Z",
    actor_email: "ana@example.com",
    action: "api_key.updated",
    target_type: "api_key",
    target_id: "key_01JD4Q8Z7K3M9X2V5B6N8R1T10",
    details: { monthly_spend_limit_myr: 50, disabled: false },
    client_address: "203.0.113.9",
    request_id: "req_01JD4Q8Z7K3M9X2V5B6N8R1T11",
    created_at: "2026-11-24T21:14:03.000Z"
  }]
})
export type AuditEntry = typeof AuditEntry.Type

export const AuditPage = Schema.Struct({
  entries: Schema.Array(AuditEntry),
  total: Schema.Int,
  has_more: Schema.Boolean
})

/** CSV with a header line, one entry a row; `details` as JSON. */
export const AuditCsv = HttpApiSchema.Text({ contentType: "text/csv; charset=utf-8" })

export class AuditApi extends HttpApiGroup.make("audit")
  .add(
    HttpApiEndpoint.get("list", "/dashboard/audit-log")
      .setUrlParams(AuditParams)
      .addSuccess(AuditPage)
      .annotate(OpenApi.Description, "Who changed what, when and from where, newest first; entries are kept one year.")
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.get("export", "/dashboard/audit-log/export")
      .setUrlParams(AuditExportParams)
      .addSuccess(AuditCsv)
      .annotate(OpenApi.Description, "The audit log's entries under the same filters, as CSV.")
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .addError(wire(InvalidRequest))
  .middleware(DashboardAuth)
  .annotate(
    OpenApi.Description,
    "The account's audit log: every change to keys, members, billing settings, the card, checkouts, grouping tags, webhooks, provider keys and stored responses."
  )
{}
