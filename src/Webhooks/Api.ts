import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as HttpApiSchema from "@effect/platform/HttpApiSchema"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import { InvalidRequest, NotFound, RateLimitExceeded, wire } from "../Domain/Errors.js"
import { EVENT_TYPES } from "../Domain/EventTypes.js"
import { ADMINS, allowRoles, EVERY_ROLE } from "../Domain/Roles.js"
import { NoUrlParams, SqlString } from "../Domain/Strict.js"

export const WebhookEventType = Schema.Literal(...EVENT_TYPES)

const Url = Schema.compose(Schema.Trim, SqlString).pipe(Schema.minLength(1), Schema.maxLength(2048))
const Description = SqlString.pipe(Schema.maxLength(200))
const Events = Schema.Array(WebhookEventType).pipe(Schema.minItems(1), Schema.maxItems(EVENT_TYPES.length))

export const WebhookEndpoint = Schema.Struct({
  id: Schema.String,
  /** Whole for owners and admins; for other roles its path and query are masked (`https://host/…`): they can hold a token. */
  url: Schema.String,
  description: Schema.String,
  events: Schema.Array(Schema.String),
  status: Schema.Literal("enabled", "disabled"),
  disabled_reason: Schema.NullOr(Schema.String),
  /** Since when its deliveries fail (null: the last one succeeded); 3 days of failures disable it. */
  failing_since: Schema.NullOr(Schema.String),
  /** The member who made it was removed from the account: it was disabled then, until an owner or admin enables it. */
  created_by_removed: Schema.Boolean,
  created_at: Schema.String,
  updated_at: Schema.String
}).annotations({ identifier: "WebhookEndpoint" })

export const CreateWebhookRequest = Schema.Struct({
  url: Url,
  events: Events,
  description: Schema.optionalWith(Description, { default: () => "" })
}).annotations({ identifier: "CreateWebhookRequest" })

export const CreateWebhookResponse = Schema.Struct({
  endpoint: WebhookEndpoint,
  /** `whsec_…`, the Standard Webhooks signing secret: shown once. */
  secret: Schema.String,
  warning: Schema.String
}).annotations({ identifier: "CreateWebhookResponse" })

export const UpdateWebhookRequest = Schema.Struct({
  url: Schema.optional(Url),
  events: Schema.optional(Events),
  description: Schema.optional(Description),
  /** `false` enables a disabled endpoint again (its failures are forgotten). */
  disabled: Schema.optional(Schema.Boolean)
}).annotations({ identifier: "UpdateWebhookRequest" })

export const WebhookSecret = Schema.Struct({ secret: Schema.String, warning: Schema.String })
export const WebhookTestResponse = Schema.Struct({ event_id: Schema.String })

export const WebhookAttempt = Schema.Struct({
  attempt: Schema.Int,
  attempted_at: Schema.String,
  status_code: Schema.NullOr(Schema.Int),
  latency_ms: Schema.Int,
  ok: Schema.Boolean,
  error: Schema.NullOr(Schema.String),
  /** The answer's first 500 characters. */
  response_excerpt: Schema.String
}).annotations({ identifier: "WebhookAttempt" })

export const WebhookDelivery = Schema.Struct({
  id: Schema.String,
  event_id: Schema.String,
  event_type: Schema.String,
  status: Schema.Literal("pending", "delivered", "failed"),
  attempts: Schema.Int,
  next_attempt_at: Schema.NullOr(Schema.String),
  created_at: Schema.String,
  delivered_at: Schema.NullOr(Schema.String),
  attempt_log: Schema.Array(WebhookAttempt)
}).annotations({ identifier: "WebhookDelivery" })

const Money = Schema.Number
/** The `data` of each event; every delivery's body is `{type, timestamp, data}` (Standard Webhooks). */
/** The account every event is about: its id and name (its first owner's, when given). */
const EventAccount = Schema.Struct({ id: Schema.String, name: Schema.NullOr(Schema.String) })

export const WebhookEventPayloads = Schema.Union(
  Schema.Struct({
    type: Schema.Literal("balance.low"),
    account: EventAccount,
    data: Schema.Struct({ account_id: Schema.String, balance_myr: Money, threshold_myr: Money })
  }),
  Schema.Struct({
    type: Schema.Literal("topup.succeeded"),
    account: EventAccount,
    data: Schema.Struct({
      account_id: Schema.String,
      transaction_id: Schema.String,
      amount_myr: Money,
      automatic: Schema.Boolean
    })
  }),
  Schema.Struct({
    type: Schema.Literal("topup.failed", "auto_topup.failed"),
    account: EventAccount,
    data: Schema.Struct({
      account_id: Schema.String,
      transaction_id: Schema.String,
      amount_myr: Money,
      reason: Schema.String,
      action_url: Schema.NullOr(Schema.String)
    })
  }),
  Schema.Struct({
    type: Schema.Literal("key.limit_reached", "key.expiring"),
    account: EventAccount,
    data: Schema.Struct({
      account_id: Schema.String,
      api_key_id: Schema.String,
      /** key.expiring: when the key expires. */
      expires_at: Schema.optional(Schema.String),
      /** key.limit_reached: the month (YYYY-MM, BUSINESS_TIMEZONE) and the limit reached. */
      month: Schema.optional(Schema.String),
      monthly_spend_limit_myr: Schema.optional(Schema.NullOr(Schema.Number))
    })
  }),
  Schema.Struct({
    type: Schema.Literal("account.suspended", "account.reinstated"),
    account: EventAccount,
    data: Schema.Struct({ account_id: Schema.String, reason: Schema.String })
  }),
  Schema.Struct({
    type: Schema.Literal("invoice.issued"),
    account: EventAccount,
    data: Schema.Struct({
      account_id: Schema.String,
      invoice_id: Schema.String,
      /** `INV-2026-000001`, `RN-…`, `DN-…`. */
      number: Schema.String,
      type: Schema.Literal("invoice", "credit_note", "debit_note", "refund_note"),
      transaction_id: Schema.String,
      net_myr: Money,
      tax_myr: Money,
      total_myr: Money,
      /** A note's invoice number. */
      references: Schema.NullOr(Schema.String)
    })
  }),
  Schema.Struct({
    type: Schema.Literal("e_invoice.validated", "e_invoice.rejected"),
    account: EventAccount,
    data: Schema.Struct({
      account_id: Schema.String,
      invoice_id: Schema.String,
      number: Schema.String,
      type: Schema.Literal("invoice", "credit_note", "debit_note", "refund_note"),
      e_invoice: Schema.Struct({
        /** The e-invoice's own number: the document's, or a consolidated one's (`CON-INV-2026-11-001`). */
        code_number: Schema.String,
        consolidated: Schema.Boolean,
        /** e_invoice.validated: MyInvois' UUID, long id and public validation link. */
        uuid: Schema.optional(Schema.String),
        long_id: Schema.optional(Schema.String),
        validation_url: Schema.optional(Schema.String)
      }),
      /** e_invoice.validated: the document's total. */
      total_myr: Schema.optional(Money),
      /** e_invoice.rejected: MyInvois' reasons. */
      errors: Schema.optional(Schema.Array(
        Schema.Struct({ code: Schema.String, message: Schema.String, target: Schema.NullOr(Schema.String) })
      ))
    })
  }),
  Schema.Struct({
    type: Schema.Literal("webhook.test"),
    account: EventAccount,
    data: Schema.Struct({ endpoint_id: Schema.String, message: Schema.String })
  })
).annotations({ identifier: "WebhookEventPayload" })

const Id = HttpApiSchema.param("id", SqlString)

export class WebhooksApi extends HttpApiGroup.make("webhooks")
  .add(
    HttpApiEndpoint.post("create", "/dashboard/webhooks")
      .setPayload(CreateWebhookRequest)
      .addSuccess(CreateWebhookResponse, { status: 201 })
      .annotate(OpenApi.Description, "Registers an endpoint. Its signing secret is in this answer only.")
      .pipe(allowRoles(...ADMINS))
  )
  .add(
    HttpApiEndpoint.get("list", "/dashboard/webhooks").setUrlParams(NoUrlParams).addSuccess(
      Schema.Struct({ endpoints: Schema.Array(WebhookEndpoint) })
    )
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.get("events", "/dashboard/webhooks/event-types")
      .addSuccess(
        Schema.Struct({ event_types: Schema.Array(WebhookEventType), payload: Schema.optional(WebhookEventPayloads) })
      )
      .annotate(
        OpenApi.Description,
        "The event types an endpoint may subscribe to; `WebhookEventPayload` shows each one's `data`."
      )
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.get("get")`/dashboard/webhooks/${Id}`.addSuccess(WebhookEndpoint).addError(wire(NotFound))
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.patch("update")`/dashboard/webhooks/${Id}`
      .setPayload(UpdateWebhookRequest)
      .addSuccess(WebhookEndpoint)
      .addError(wire(NotFound))
      .pipe(allowRoles(...ADMINS))
  )
  .add(
    HttpApiEndpoint.del("delete")`/dashboard/webhooks/${Id}`.addSuccess(Schema.Struct({ ok: Schema.Literal(true) }))
      .addError(wire(NotFound))
      .pipe(allowRoles(...ADMINS))
  )
  .add(
    HttpApiEndpoint.post("rotate")`/dashboard/webhooks/${Id}/rotate-secret`
      .addSuccess(WebhookSecret)
      .addError(wire(NotFound))
      .annotate(OpenApi.Description, "Replaces the signing secret at once; the new one is in this answer only.")
      .pipe(allowRoles(...ADMINS))
  )
  .add(
    HttpApiEndpoint.post("test")`/dashboard/webhooks/${Id}/test`
      .addSuccess(WebhookTestResponse, { status: 202 })
      .addError(wire(NotFound))
      .addError(wire(RateLimitExceeded))
      .annotate(
        OpenApi.Description,
        "Queues a `webhook.test` event to this endpoint only. Test events and resends: 10 a minute per account."
      )
      .pipe(allowRoles(...ADMINS))
  )
  .add(
    HttpApiEndpoint.get("deliveries")`/dashboard/webhooks/${Id}/deliveries`
      .setUrlParams(NoUrlParams)
      .addSuccess(Schema.Struct({ deliveries: Schema.Array(WebhookDelivery) }))
      .addError(wire(NotFound))
      .annotate(OpenApi.Description, "The endpoint's latest 50 deliveries, newest first, each with every attempt.")
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.post("resend")`/dashboard/webhooks/${Id}/deliveries/${
      HttpApiSchema.param("delivery_id", SqlString)
    }/resend`
      .addSuccess(Schema.Struct({ ok: Schema.Literal(true) }), { status: 202 })
      .addError(wire(NotFound))
      .addError(wire(RateLimitExceeded))
      .annotate(OpenApi.Description, "Sends a delivery again. Test events and resends: 10 a minute per account.")
      .pipe(allowRoles(...ADMINS))
  )
  .addError(wire(InvalidRequest))
  .middleware(DashboardAuth)
  .annotate(
    OpenApi.Description,
    "Webhook endpoints of the signed-in developer: signed as Standard Webhooks (`webhook-id`, `webhook-timestamp`, " +
      "`webhook-signature`), retried with exponential back-off for 3 days, every attempt logged."
  )
{}
