import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema, OpenApi } from "@effect/platform"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import { AuthenticationError, BillingError, InternalError, InvalidRequest, NotFound, RateLimitExceeded, wire } from "../Domain/Errors.js"
import { PageParams } from "../Domain/Page.js"
import { SqlString, StrictUrlParams } from "../Domain/Strict.js"
import { LedgerEntry, LedgerType, Wallet } from "../Wallet/Api.js"

export const TOPUP_OPTIONS_SEN = [1000, 2500, 5000, 10000, 25000, 50000] as const

export const CheckoutRequest = Schema.Struct({
  amount_sen: Schema.Literal(...TOPUP_OPTIONS_SEN),
  /** Keep the paying card for auto top-up (`setup_future_usage: off_session`). */
  save_card: Schema.optional(Schema.Boolean)
}).annotations({ identifier: "CheckoutRequest" })

export const CheckoutResponse = Schema.Struct({
  url: Schema.String,
  session_id: Schema.String,
  transaction_id: Schema.String
})

export const Balance = Schema.Struct({
  wallet: Wallet,
  balance_myr: Schema.Number,
  reserved_myr: Schema.Number,
  lifetime_topup_myr: Schema.Number,
  lifetime_spend_myr: Schema.Number,
  topup_options_sen: Schema.Array(Schema.Int),
  /** True while a payment dispute is open: live model calls answer permission_denied until it closes. */
  account_suspended: Schema.Boolean
})

export const TransactionsParams = StrictUrlParams({ ...PageParams.fields, type: Schema.optional(LedgerType) })

export const TransactionsPage = Schema.Struct({
  ledger: Schema.Array(LedgerEntry),
  page: Schema.Int,
  limit: Schema.Int
})

export const WebhookAck = Schema.Struct({ received: Schema.Boolean, processed: Schema.Boolean })

export class BillingApi extends HttpApiGroup.make("billing")
  .add(
    HttpApiEndpoint.post("checkout", "/dashboard/billing/checkout")
      .setPayload(CheckoutRequest)
      .addSuccess(CheckoutResponse)
      .addError(wire(BillingError))
      .addError(wire(RateLimitExceeded))
  )
  .add(HttpApiEndpoint.get("balance", "/dashboard/billing/balance").addSuccess(Balance))
  .add(
    HttpApiEndpoint.get("transactions", "/dashboard/billing/transactions")
      .setUrlParams(TransactionsParams)
      .addSuccess(TransactionsPage)
  )
  .addError(wire(InvalidRequest))
  .middleware(DashboardAuth)
  .annotate(OpenApi.Description, "The prepaid wallet: Stripe Checkout top-ups, balance and ledger.")
{}

/** Stripe's events; the body is verified raw against `Stripe-Signature`, so no payload schema. */
export class WebhooksApi extends HttpApiGroup.make("webhooks")
  .add(
    HttpApiEndpoint.post("stripe", "/billing/stripe/webhook")
      .addSuccess(WebhookAck)
      .addError(wire(AuthenticationError))
      .addError(wire(InvalidRequest))
      .addError(wire(InternalError))
  )
  .annotate(OpenApi.Description, "Payment processor events: payments, refunds and chargebacks.")
{}

const Html = HttpApiSchema.Text({ contentType: "text/html; charset=utf-8" })
const SessionPath = Schema.Struct({ session_id: SqlString })

/**
 * The simulated hosted checkout (only while Stripe is not configured): a page
 * with Pay and Cancel, each delivering a Stripe-signed event to the webhook
 * receiver, as Stripe would.
 */
export class DevCheckoutApi extends HttpApiGroup.make("devCheckout")
  .add(HttpApiEndpoint.get("page", "/dev/checkout/:session_id").setPath(SessionPath).addSuccess(Html))
  .add(HttpApiEndpoint.post("pay", "/dev/checkout/:session_id/pay").setPath(SessionPath).addSuccess(Html))
  .add(HttpApiEndpoint.post("cancel", "/dev/checkout/:session_id/cancel").setPath(SessionPath).addSuccess(Html))
  .add(HttpApiEndpoint.get("setupPage", "/dev/checkout/setup/:session_id").setPath(SessionPath).addSuccess(Html))
  .add(
    HttpApiEndpoint.post("setupSave", "/dev/checkout/setup/:session_id/save")
      .setPath(SessionPath)
      // The page's form posts `card_number` form-encoded; read by the handler (the API's payloads are JSON).
      .addSuccess(Html)
      .addError(wire(InvalidRequest))
  )
  .addError(wire(NotFound))
  .addError(wire(BillingError))
  .annotate(OpenApi.Description, "Development only: the simulated Stripe Checkout page.")
{}
