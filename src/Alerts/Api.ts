import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema, OpenApi } from "@effect/platform"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import { BillingError, InvalidRequest, NotFound, RateLimitExceeded, wire } from "../Domain/Errors.js"

/** Top-up amounts auto top-up may charge, in MYR: the checkout's options. */
export const AUTO_TOPUP_AMOUNTS_MYR = [10, 25, 50, 100, 250, 500] as const

const Myr = Schema.Number.pipe(Schema.finite(), Schema.between(0, 1_000_000))

export const SavedCard = Schema.Struct({
  brand: Schema.String,
  last4: Schema.String,
  exp_month: Schema.Int,
  exp_year: Schema.Int
}).annotations({ identifier: "SavedCard" })

export const BillingSettings = Schema.Struct({
  /** Below this balance (MYR) a usage-driven crossing alerts once: banner, email, `balance.low` webhook. */
  low_balance_threshold_myr: Schema.NullOr(Schema.Number),
  auto_topup: Schema.Struct({
    enabled: Schema.Boolean,
    threshold_myr: Schema.NullOr(Schema.Number),
    amount_myr: Schema.NullOr(Schema.Number),
    max_per_day: Schema.Int,
    /** Why it turned itself off (a declined card, authentication required); null while on. */
    disabled_reason: Schema.NullOr(Schema.String),
    /** Where the card is re-authenticated after such a failure. */
    action_url: Schema.NullOr(Schema.String)
  }),
  card: Schema.NullOr(SavedCard)
}).annotations({ identifier: "BillingSettings" })

export const UpdateBillingSettings = Schema.Struct({
  low_balance_threshold_myr: Schema.optional(Schema.NullOr(Myr)),
  auto_topup: Schema.optional(Schema.Struct({
    enabled: Schema.optional(Schema.Boolean),
    threshold_myr: Schema.optional(Myr),
    amount_myr: Schema.optional(Schema.Literal(...AUTO_TOPUP_AMOUNTS_MYR)),
    max_per_day: Schema.optional(Schema.Int.pipe(Schema.between(1, 3)))
  }))
}).annotations({ identifier: "UpdateBillingSettings" })

export const Banner = Schema.Struct({
  kind: Schema.Literal("balance_low", "auto_topup_failed", "webhook_endpoint_disabled"),
  message: Schema.String,
  action_url: Schema.String
}).annotations({ identifier: "Banner" })

export class AlertsApi extends HttpApiGroup.make("alerts")
  .add(HttpApiEndpoint.get("settings", "/dashboard/billing/settings").addSuccess(BillingSettings))
  .add(
    HttpApiEndpoint.put("updateSettings", "/dashboard/billing/settings")
      .setPayload(UpdateBillingSettings)
      .addSuccess(BillingSettings)
      .annotate(OpenApi.Description, "Changes the fields given; `low_balance_threshold_myr: null` removes the alert.")
  )
  .add(
    HttpApiEndpoint.post("saveCard", "/dashboard/billing/card")
      .addSuccess(Schema.Struct({ session_id: Schema.String, url: Schema.String }))
      .addError(wire(BillingError))
      .addError(wire(RateLimitExceeded))
      .annotate(OpenApi.Description, "Starts a Stripe Checkout Session in `mode: setup`; the card it saves pays auto top-ups off-session. " +
        "Limited per client address with checkout creation (`IP_CHECKOUTS_PER_MINUTE`).")
  )
  .add(
    HttpApiEndpoint.del("forgetCard", "/dashboard/billing/card")
      .addSuccess(BillingSettings)
      .annotate(OpenApi.Description, "Forgets the saved card and turns auto top-up off.")
  )
  .add(
    HttpApiEndpoint.get("banners", "/dashboard/alerts")
      .addSuccess(Schema.Struct({ banners: Schema.Array(Banner) }))
      .annotate(OpenApi.Description, "What the dashboard shows at its top: a low balance, a failed auto top-up, a disabled endpoint.")
  )
  .addError(wire(InvalidRequest))
  .middleware(DashboardAuth)
  .annotate(OpenApi.Description, "Low-balance alerts and auto top-up settings of the signed-in developer.")
{}

export const MailboxMessage = Schema.Struct({
  id: Schema.String,
  to: Schema.String,
  subject: Schema.String,
  body: Schema.String,
  status: Schema.Literal("pending", "sent", "kept", "failed"),
  created_at: Schema.String
}).annotations({ identifier: "MailboxMessage" })

const Html = HttpApiSchema.Text({ contentType: "text/html; charset=utf-8" })

/** The development mailbox (only while `SMTP_URL` is unset, never in production): what alert emails would have said. */
export class DevMailboxApi extends HttpApiGroup.make("devMailbox")
  .add(HttpApiEndpoint.get("page", "/dev/mailbox").addSuccess(Html))
  .add(HttpApiEndpoint.get("messages", "/dev/mailbox/messages").addSuccess(Schema.Struct({ messages: Schema.Array(MailboxMessage) })))
  .addError(wire(NotFound))
  .annotate(OpenApi.Description, "Development only: emails kept instead of sent while SMTP_URL is unset.")
{}
