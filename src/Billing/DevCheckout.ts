import * as HttpClient from "@effect/platform/HttpClient"
import * as HttpClientRequest from "@effect/platform/HttpClientRequest"
import { Clock, Effect, Redacted } from "effect"
import Stripe from "stripe"
import type { AppConfigShape } from "../AppConfig.js"
import { BillingError } from "../Domain/Errors.js"
import { randomBase62 } from "../Domain/Ids.js"
import { simulatedPaymentIntent } from "./CardProcessor.js"
import { CURRENCY, SAVE_CARD_METADATA, SIMULATED_SAVING_PREFIX } from "./PaymentProcessor.js"
import type { PaymentTransaction } from "./Repo.js"

export type CheckoutOutcome = "checkout.session.completed" | "checkout.session.expired"

/** A Stripe event as the simulated checkout sends it, around `object`. */
const simulatedEvent = <O>(type: string, created: number, object: O) => ({
  id: `evt_sim_${randomBase62(24)}`,
  object: "event",
  api_version: Stripe.API_VERSION,
  created,
  livemode: false,
  pending_webhooks: 1,
  type,
  data: { object }
})

/** The Checkout Session Stripe would send for this transaction, paid or expired. */
export const sessionEvent = (
  transaction: PaymentTransaction,
  sessionId: string,
  type: CheckoutOutcome,
  created: number,
  cardNumber: string | null
) => {
  const paid = type === "checkout.session.completed"
  const saving = sessionId.startsWith(SIMULATED_SAVING_PREFIX)
  return simulatedEvent(type, created, {
    id: sessionId,
    object: "checkout.session",
    mode: "payment",
    status: paid ? "complete" : "expired",
    payment_status: paid ? "paid" : "unpaid",
    amount_subtotal: transaction.amountSen + transaction.taxSen,
    amount_total: transaction.amountSen + transaction.taxSen,
    currency: CURRENCY,
    client_reference_id: transaction.id,
    metadata: {
      transaction_id: transaction.id,
      account_id: transaction.accountId,
      ...(saving ? { [SAVE_CARD_METADATA]: "true" } : {})
    },
    payment_intent: paid ? simulatedPaymentIntent(sessionId, saving ? cardNumber : null) : null,
    livemode: false
  })
}

/** Stripe's `charge.refunded` for a simulated payment: `amountRefundedSen` is the charge's cumulative refund, gross. */
export const refundEvent = (transaction: PaymentTransaction, amountRefundedSen: number, created: number) =>
  simulatedEvent("charge.refunded", created, {
    id: transaction.chargeId ?? `ch_sim_${transaction.id}`,
    object: "charge",
    amount: transaction.amountSen + transaction.taxSen,
    amount_refunded: amountRefundedSen,
    currency: CURRENCY,
    payment_intent: transaction.paymentIntentId,
    refunded: amountRefundedSen === transaction.amountSen + transaction.taxSen,
    livemode: false
  })

/** Where this process's own webhook receiver listens. */
const receiverUrl = (config: AppConfigShape) => {
  const host = ["0.0.0.0", "::", ""].includes(config.host) ? "127.0.0.1" : config.host
  return `http://${host.includes(":") ? `[${host}]` : host}:${config.port}/billing/stripe/webhook`
}

/**
 * Signs the event with the webhook secret as Stripe does and POSTs it to the
 * webhook receiver over HTTP: the same path a real Stripe delivery takes.
 */
export const deliver = (
  client: HttpClient.HttpClient,
  config: AppConfigShape,
  secret: Redacted.Redacted<string>,
  event: object
) =>
  Effect.gen(function*() {
    const payload = JSON.stringify(event)
    const signature = Stripe.webhooks.generateTestHeaderString({
      payload,
      secret: Redacted.value(secret),
      timestamp: Math.floor((yield* Clock.currentTimeMillis) / 1000)
    })
    const response = yield* client.execute(
      HttpClientRequest.post(receiverUrl(config)).pipe(
        HttpClientRequest.setHeader("stripe-signature", signature),
        HttpClientRequest.bodyText(payload, "application/json")
      )
    )
    const body = yield* response.text
    if (response.status !== 200) {
      yield* Effect.logWarning(
        `simulated checkout: the webhook receiver answered ${response.status}: ${body.slice(0, 2000)}`
      )
      return yield* Effect.fail(
        new BillingError({ message: `The webhook receiver answered HTTP ${response.status}; see the service's log.` })
      )
    }
    return JSON.parse(body) as { received: boolean; processed: boolean }
  }).pipe(
    Effect.scoped,
    Effect.catchTags({
      // The client's messages name the receiver's URL: logged, not answered.
      RequestError: (error) =>
        Effect.zipRight(
          Effect.logWarning(`simulated checkout: ${error.message}`),
          Effect.fail(new BillingError({ message: "The webhook receiver was unreachable; see the service's log." }))
        ),
      ResponseError: (error) =>
        Effect.zipRight(
          Effect.logWarning(`simulated checkout: ${error.message}`),
          Effect.fail(new BillingError({ message: "The webhook receiver failed; see the service's log." }))
        )
    })
  )

const escapeHtml = (text: string) =>
  text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;" })[c] ?? c)

const page = (title: string, body: string) =>
  `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${escapeHtml(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font-family:system-ui,sans-serif;max-width:28rem;margin:4rem auto;padding:0 1rem}
button{font-size:1rem;padding:.5rem 1.5rem;margin-right:.5rem}.note{color:#666;font-size:.875rem}</style>
</head><body>${body}</body></html>`

const ringgit = (sen: number) => `RM ${(sen / 100).toFixed(2)}`

export const checkoutPage = (transaction: PaymentTransaction, sessionId: string) => {
  const base = `/dev/checkout/${encodeURIComponent(sessionId)}`
  // A top-up that saves its card asks for one, as the setup page does: Stripe's test cards decide later charges.
  const card = sessionId.startsWith(SIMULATED_SAVING_PREFIX)
    ? `<p><label>Card number <input name="card_number" value="4242424242424242" inputmode="numeric" autocomplete="off"></label></p>
<p class="note">This card is saved for auto top-up.</p>`
    : ""
  const state = transaction.status === "pending"
    ? `<form method="post" action="${base}/pay" style="display:inline">${card}<button type="submit">Pay</button></form>
<form method="post" action="${base}/cancel" style="display:inline"><button type="submit">Cancel</button></form>`
    : `<p>This checkout is ${transaction.status === "succeeded" ? "paid" : "closed"}.</p>`
  return page(
    "nenas: simulated checkout",
    `<h1>Top up ${ringgit(transaction.amountSen)}</h1>
<p>Wallet top-up, transaction <code>${escapeHtml(transaction.id)}</code>.</p>
${
      transaction.taxSen === 0 ? "" : `<table>
<tr><td>Wallet credit</td><td>${ringgit(transaction.amountSen)}</td></tr>
<tr><td>Service tax (SST) ${transaction.taxRateBps / 100}%</td><td>${ringgit(transaction.taxSen)}</td></tr>
<tr><th>Total</th><th>${ringgit(transaction.amountSen + transaction.taxSen)}</th></tr>
</table>`
    }
${state}
<p class="note">Simulated checkout: Stripe is not configured. Pay sends a signed
<code>checkout.session.completed</code> event to this service's webhook receiver.</p>`
  )
}

/** After Pay or Cancel: what the transaction now is, whichever button was pressed. */
export const resultPage = (transaction: PaymentTransaction, returnUrl: string) => {
  const [title, text] = transaction.status === "succeeded"
    ? ["Payment received", `${ringgit(transaction.amountSen)} is in your wallet.`]
    : transaction.status === "failed"
    ? ["Checkout cancelled", "Nothing was charged."]
    : ["Payment pending", "The payment has not been confirmed yet."]
  return page(
    "nenas: checkout",
    `<h1>${title}</h1>
<p>${text}</p>
<p><a href="${escapeHtml(returnUrl)}">Back to the dashboard</a></p>`
  )
}

/** Stripe's `checkout.session.completed` for a setup session: the SetupIntent's id carries the simulated card. */
export const setupEvent = (sessionId: string, accountId: string, setupIntentId: string, created: number) =>
  simulatedEvent("checkout.session.completed", created, {
    id: sessionId,
    object: "checkout.session",
    mode: "setup",
    status: "complete",
    payment_status: "no_payment_required",
    setup_intent: setupIntentId,
    metadata: { account_id: accountId },
    livemode: false
  })

/** The simulated setup page: a card number (Stripe's test cards choose what off-session payments do) and Save. */
export const setupPage = (sessionId: string, open: boolean) =>
  page(
    "nenas: save a card",
    `<h1>Save a card for auto top-up</h1>
${
      open
        ? `<form method="post" action="/dev/checkout/setup/${encodeURIComponent(sessionId)}/save">
<label>Card number <input name="card_number" value="4242424242424242" inputmode="numeric" autocomplete="off"></label>
<p><button type="submit">Save card</button></p></form>`
        : "<p>This card is saved.</p>"
    }
<p class="note">Simulated checkout: Stripe is not configured. Test cards: 4242 4242 4242 4242 pays;
4000 0000 0000 0002 is declined; 4000 0025 0000 3155 requires authentication.</p>`
  )

export const setupResultPage = (returnUrl: string) =>
  page(
    "nenas: card saved",
    `<h1>Card saved</h1>
<p>Auto top-up can now charge this card.</p>
<p><a href="${escapeHtml(returnUrl)}">Back to the dashboard</a></p>`
  )
