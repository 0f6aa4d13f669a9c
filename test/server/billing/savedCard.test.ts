import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { call } from "../../support/Http.js"
import { deliverEvent, events, StripeDouble, TestServerWithStripe, webhookOverrides } from "../../support/Stripe.js"
import { TestServerLive } from "../../support/TestServer.js"
import { developer } from "../../support/Wallet.js"

/**
 * A top-up that saves its card
 * (docs/api/alerts.md, "Never run dry: alerts, auto top-up and webhooks"):
 * `POST /dashboard/billing/checkout` with `save_card: true` makes a Checkout
 * Session with the account's customer and `setup_future_usage: off_session`;
 * its paid `checkout.session.completed` keeps the card that paid, and the
 * settings show it. Without `save_card` nothing is saved.
 */

const settingsCard = (token: string) =>
  Effect.map(call("GET", "/dashboard/billing/settings", { token }), (reply) => {
    expect(reply.status, reply.text).toBe(200)
    return reply.body.card as unknown
  })

layer(TestServerWithStripe, { excludeTestServices: true, timeout: 60_000 })(
  "a top-up saving its card, on Stripe",
  (it) => {
    it.effect("save_card: the session has a customer and setup_future_usage; the paying card is saved", () =>
      Effect.gen(function*() {
        const stripe = yield* StripeDouble
        const { token } = yield* developer("topup-saves-card@example.com")
        const checkout = yield* call("POST", "/dashboard/billing/checkout", {
          token,
          json: { amount_sen: 2500, save_card: true }
        })
        expect(checkout.status, checkout.text).toBe(200)
        const created = stripe.requests.filter((r) => r.method === "POST" && r.path === "/v1/checkout/sessions").at(-1)
        const customers = stripe.requests.filter((r) => r.method === "POST" && r.path === "/v1/customers")
        expect(customers.length).toBe(1)
        expect(created?.form).toMatchObject({
          mode: "payment",
          "payment_intent_data[setup_future_usage]": "off_session",
          "metadata[save_card]": "true"
        })
        expect(created?.form["customer"]).toMatch(/^cus_/)
        expect(created?.form["customer_email"]).toBeUndefined()
        expect(yield* settingsCard(token)).toBeNull()

        const paymentIntentId = stripe.payCheckout(checkout.body.session_id as string)
        const delivered = yield* deliverEvent(events.checkoutCompleted({
          transactionId: checkout.body.transaction_id as string,
          sessionId: checkout.body.session_id as string,
          paymentIntentId,
          amountSen: 2500,
          metadata: { save_card: "true" }
        }))
        expect(delivered.body, delivered.text).toEqual({ received: true, processed: true })
        expect(yield* settingsCard(token)).toEqual({ brand: "mastercard", last4: "4444", exp_month: 3, exp_year: 2031 })
        // Stripe's event saved it: the audit log says so, once, as the service's doing.
        const trail = yield* call("GET", "/dashboard/audit-log?action=billing.card_saved", { token })
        expect(trail.body.entries.map((e: { member_id: string | null; details: unknown }) => [e.member_id, e.details]))
          .toEqual([
            [null, { brand: "mastercard", last4: "4444" }]
          ])
        const balance = yield* call("GET", "/dashboard/billing/balance", { token })
        expect(balance.body.balance_myr).toBe(25)
      }))

    it.effect("without save_card: no customer, no setup_future_usage, and no card saved", () =>
      Effect.gen(function*() {
        const stripe = yield* StripeDouble
        const { token } = yield* developer("topup-keeps-no-card@example.com")
        const checkout = yield* call("POST", "/dashboard/billing/checkout", { token, json: { amount_sen: 1000 } })
        expect(checkout.status, checkout.text).toBe(200)
        const created = stripe.requests.filter((r) => r.method === "POST" && r.path === "/v1/checkout/sessions").at(-1)
        expect(created?.form["payment_intent_data[setup_future_usage]"]).toBeUndefined()
        expect(created?.form["customer"]).toBeUndefined()
        const paymentIntentId = stripe.payCheckout(checkout.body.session_id as string)
        const delivered = yield* deliverEvent(events.checkoutCompleted({
          transactionId: checkout.body.transaction_id as string,
          sessionId: checkout.body.session_id as string,
          paymentIntentId,
          amountSen: 1000
        }))
        expect(delivered.body, delivered.text).toEqual({ received: true, processed: true })
        expect(yield* settingsCard(token)).toBeNull()
      }))
  }
)

layer(TestServerLive(webhookOverrides), { excludeTestServices: true, timeout: 60_000 })(
  "a top-up saving its card, simulated",
  (it) => {
    it.effect("save_card: the page asks for a card; paying with it saves that card", () =>
      Effect.gen(function*() {
        const { token } = yield* developer("sim-topup-saves-card@example.com")
        const checkout = yield* call("POST", "/dashboard/billing/checkout", {
          token,
          json: { amount_sen: 1000, save_card: true }
        })
        expect(checkout.status, checkout.text).toBe(200)
        const path = new URL(checkout.body.url as string).pathname
        expect((yield* call("GET", path)).text).toContain("card_number")
        const paid = yield* call("POST", `${path}/pay`, {
          body: "card_number=5555555555554444",
          headers: { "content-type": "application/x-www-form-urlencoded" }
        })
        expect(paid.status, paid.text).toBe(200)
        expect(paid.text).toContain("is in your wallet")
        expect(yield* settingsCard(token)).toEqual({
          brand: "mastercard",
          last4: "4444",
          exp_month: 12,
          exp_year: 2034
        })
      }))

    it.effect("without save_card the page asks for no card and none is saved", () =>
      Effect.gen(function*() {
        const { token } = yield* developer("sim-topup-no-card@example.com")
        const checkout = yield* call("POST", "/dashboard/billing/checkout", { token, json: { amount_sen: 1000 } })
        const path = new URL(checkout.body.url as string).pathname
        expect((yield* call("GET", path)).text).not.toContain("card_number")
        const paid = yield* call("POST", `${path}/pay`)
        expect(paid.status, paid.text).toBe(200)
        expect(yield* settingsCard(token)).toBeNull()
      }))
  }
)
