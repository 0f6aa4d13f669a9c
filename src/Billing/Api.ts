import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as HttpApiSchema from "@effect/platform/HttpApiSchema"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import {
  AuthenticationError,
  BillingError,
  InternalError,
  InvalidRequest,
  NotFound,
  RateLimitExceeded,
  wire
} from "../Domain/Errors.js"
import { withHeader } from "../Domain/OpenApiDocument.js"
import { PageParams } from "../Domain/Page.js"
import { allowRoles, EVERY_ROLE, PAYERS, SETTINGS_MAKERS } from "../Domain/Roles.js"
import { SqlString, StrictUrlParams } from "../Domain/Strict.js"
import { LedgerEntry, LedgerType, Wallet } from "../Wallet/Api.js"

export const TOPUP_OPTIONS_SEN = [1000, 2500, 5000, 10000, 25000, 50000] as const

export const CheckoutRequest = Schema.Struct({
  amount_sen: Schema.Literal(...TOPUP_OPTIONS_SEN),
  /** Keep the paying card for auto top-up (`setup_future_usage: off_session`). */
  save_card: Schema.optional(Schema.Boolean)
}).annotations({ identifier: "CheckoutRequest" })

/** A top-up's money: what the wallet is credited, the service tax on top, and what the buyer pays. */
const TaxedTopup = {
  amount_sen: Schema.Int,
  tax_sen: Schema.Int,
  total_sen: Schema.Int
}

export const CheckoutResponse = Schema.Struct({
  url: Schema.String,
  session_id: Schema.String,
  transaction_id: Schema.String,
  ...TaxedTopup
})

export const TopupOption = Schema.Struct(TaxedTopup).annotations({ identifier: "TopupOption" })

export const Balance = Schema.Struct({
  wallet: Wallet,
  balance_myr: Schema.Number,
  reserved_myr: Schema.Number,
  lifetime_topup_myr: Schema.Number,
  lifetime_spend_myr: Schema.Number,
  topup_options_sen: Schema.Array(Schema.Int),
  /** Each option with the service tax charged on top (`SST_RATE_BPS`), and what it costs in all. */
  topup_options: Schema.Array(TopupOption),
  /** Service tax on top-ups, in basis points (800 = 8%); 0 when none is charged. */
  sst_rate_bps: Schema.Int,
  /** True while a payment dispute is open: live model calls answer permission_denied until it closes. */
  account_suspended: Schema.Boolean
})

export const TransactionsParams = StrictUrlParams({ ...PageParams.fields, type: Schema.optional(LedgerType) })

/** A ledger entry, with the payment it moved money for (a top-up's amount, service tax and total). */
export const TransactionEntry = Schema.Struct({
  ...LedgerEntry.fields,
  payment: Schema.NullOr(Schema.Struct({ transaction_id: Schema.String, ...TaxedTopup }))
}).annotations({ identifier: "TransactionEntry" })

export const TransactionsPage = Schema.Struct({
  ledger: Schema.Array(TransactionEntry),
  page: Schema.Int,
  limit: Schema.Int
})

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

export const WebhookAck = Schema.Struct({ received: Schema.Boolean, processed: Schema.Boolean })

export class BillingApi extends HttpApiGroup.make("billing")
  .add(
    HttpApiEndpoint.post("checkout", "/dashboard/billing/checkout")
      .setPayload(CheckoutRequest)
      .addSuccess(CheckoutResponse)
      .addError(wire(BillingError))
      .addError(wire(RateLimitExceeded))
      .pipe(allowRoles(...PAYERS))
  )
  .add(
    HttpApiEndpoint.get("balance", "/dashboard/billing/balance").addSuccess(Balance)
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.get("transactions", "/dashboard/billing/transactions")
      .setUrlParams(TransactionsParams)
      .addSuccess(TransactionsPage)
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.get("settings", "/dashboard/billing/settings").addSuccess(BillingSettings)
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.put("updateSettings", "/dashboard/billing/settings")
      .setPayload(UpdateBillingSettings)
      .addSuccess(BillingSettings)
      .annotate(OpenApi.Description, "Changes the fields given; `low_balance_threshold_myr: null` removes the alert.")
      .pipe(allowRoles(...SETTINGS_MAKERS))
  )
  .add(
    HttpApiEndpoint.post("saveCard", "/dashboard/billing/card")
      .addSuccess(Schema.Struct({ session_id: Schema.String, url: Schema.String }))
      .addError(wire(BillingError))
      .addError(wire(RateLimitExceeded))
      .annotate(
        OpenApi.Description,
        "Starts a Stripe Checkout Session in `mode: setup`; the card it saves pays auto top-ups off-session. " +
          "Limited per client address with checkout creation (`IP_CHECKOUTS_PER_MINUTE`)."
      ).pipe(allowRoles(...PAYERS))
  )
  .add(
    HttpApiEndpoint.del("forgetCard", "/dashboard/billing/card")
      .addSuccess(BillingSettings)
      .annotate(OpenApi.Description, "Forgets the saved card and turns auto top-up off.")
      .pipe(allowRoles(...PAYERS))
  )
  .addError(wire(InvalidRequest))
  .middleware(DashboardAuth)
  .annotate(
    OpenApi.Description,
    "The prepaid wallet: Stripe Checkout top-ups, balance, ledger, low-balance alert and auto top-up settings, the saved card."
  )
{}

/** Stripe's events; the body is verified raw against `Stripe-Signature`, so no payload schema. */
export class StripeWebhookApi extends HttpApiGroup.make("stripeWebhook")
  .add(
    HttpApiEndpoint.post("stripe", "/billing/stripe/webhook")
      .addSuccess(WebhookAck)
      // Checked by hand against the raw body (a missing one answers 401, not a schema's 400).
      .annotate(
        OpenApi.Transform,
        withHeader({
          name: "Stripe-Signature",
          required: true,
          description: "Stripe's signature of the raw body (`t=…,v1=…`), made with the webhook's signing secret."
        })
      )
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
  .add(
    HttpApiEndpoint.post("refund", "/dev/checkout/:session_id/refund")
      .setPath(SessionPath)
      .setPayload(Schema.Struct({ amount_sen: Schema.Int.pipe(Schema.between(1, 100_000_000)) }))
      .addSuccess(Schema.Struct({ charge_id: Schema.String, amount_refunded_sen: Schema.Int }))
      .addError(wire(InvalidRequest))
      .annotate(
        OpenApi.Description,
        "Refunds `amount_sen` more of a paid session, gross (tax included), as Stripe's `charge.refunded` " +
          "reports it: the cumulative refund is capped at what was paid."
      )
  )
  .addError(wire(NotFound))
  .addError(wire(BillingError))
  .annotate(OpenApi.Description, "Development only: the simulated Stripe Checkout page, and refunds of its payments.")
{}
