import { describe, expect, layer } from "@effect/vitest"
import { Context, Effect, Layer, Option, Redacted } from "effect"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { AppConfig } from "../../src/AppConfig.js"
import { CardProcessor } from "../../src/Billing/CardProcessor.js"

/**
 * The auto top-up's Stripe calls through the real `stripe` SDK,
 * against a local stand-in for Stripe's API: a customer per account, a
 * Checkout Session in setup mode, the saved card read from its SetupIntent,
 * and off-session PaymentIntents that succeed, are declined, or need the
 * cardholder (Stripe answers those two with a `402` card error).
 */
interface Seen {
  readonly method: string
  readonly path: string
  readonly form: Readonly<Record<string, string>>
  readonly idempotencyKey: string | undefined
}

class StripeCards extends Context.Tag("test/StripeCards")<StripeCards, {
  readonly url: string
  readonly seen: Array<Seen>
  /** The next PaymentIntent creations answer as these test cards' outcomes would, in order. */
  readonly outcomes: Array<"pays" | "card_declined" | "authentication_required" | "server_error">
}>() {}

const StripeCardsLive = Layer.scoped(
  StripeCards,
  Effect.gen(function*() {
    const seen: Array<Seen> = []
    const outcomes: Array<"pays" | "card_declined" | "authentication_required" | "server_error"> = []
    const server = createServer((request, response) => {
      let body = ""
      request.setEncoding("utf8")
      request.on("data", (chunk: string) => body += chunk)
      request.on("end", () => {
        const url = new URL(request.url ?? "/", "http://stripe.test")
        const key = request.headers["idempotency-key"]
        seen.push({
          method: request.method ?? "",
          path: url.pathname,
          form: Object.fromEntries(new URLSearchParams(request.method === "GET" ? url.search : body)),
          idempotencyKey: typeof key === "string" ? key : undefined
        })
        const answer = (status: number, json: unknown) => {
          response.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(json))
        }
        const route = `${request.method} ${url.pathname}`
        if (route === "POST /v1/customers") return answer(200, { id: "cus_double_1", object: "customer" })
        if (route === "POST /v1/checkout/sessions") {
          return answer(200, {
            id: "cs_test_setup_1",
            object: "checkout.session",
            mode: "setup",
            url: "https://checkout.stripe.test/c/setup/1"
          })
        }
        if (route === "GET /v1/setup_intents/seti_double_1") {
          return answer(200, {
            id: "seti_double_1",
            object: "setup_intent",
            payment_method: {
              id: "pm_double_1",
              object: "payment_method",
              card: { brand: "visa", last4: "4242", exp_month: 12, exp_year: 2034 }
            }
          })
        }
        if (route === "POST /v1/payment_intents") {
          const outcome = outcomes.shift() ?? "pays"
          if (outcome === "pays") {
            return answer(200, { id: "pi_double_ok", object: "payment_intent", status: "succeeded" })
          }
          if (outcome === "server_error") {
            return answer(500, { error: { type: "api_error", message: "Stripe double failure" } })
          }
          return answer(402, {
            error: {
              type: "card_error",
              code: outcome,
              message: outcome === "card_declined"
                ? "Your card was declined."
                : "This payment requires authentication.",
              payment_intent: {
                id: `pi_double_${outcome}`,
                object: "payment_intent",
                status: "requires_payment_method"
              }
            }
          })
        }
        answer(404, { error: { type: "invalid_request_error", message: `Unrecognized request URL (${route})` } })
      })
    })
    yield* Effect.acquireRelease(
      Effect.async<void>((resume) => void server.listen(0, "127.0.0.1", () => resume(Effect.void))),
      () => Effect.async<void>((resume) => void server.close(() => resume(Effect.void)))
    )
    return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen, outcomes }
  })
)

const CardsOnStripe = Layer.unwrapEffect(
  Effect.map(StripeCards, (double) =>
    CardProcessor.layer.pipe(Layer.provide(AppConfig.layerWith({
      stripeSecretKey: Option.some(Redacted.make("sk_test_nenas_cards")),
      stripeApiUrl: Option.some(double.url),
      dashboardUrl: "http://127.0.0.1:9/app"
    }))))
).pipe(Layer.provideMerge(StripeCardsLive))

describe("saved cards on Stripe, through the real SDK", () => {
  layer(CardsOnStripe, { timeout: 60_000 })((it) => {
    it.effect("a customer once per account, a setup-mode Checkout Session, the saved card read from its SetupIntent", () =>
      Effect.gen(function*() {
        const cards = yield* CardProcessor
        const { seen } = yield* StripeCards
        expect(yield* cards.ensureCustomer("acct_1", "me@example.com", null)).toBe("cus_double_1")
        expect(yield* cards.ensureCustomer("acct_1", "me@example.com", "cus_known")).toBe("cus_known")
        const customers = seen.filter((r) => r.path === "/v1/customers")
        expect(customers).toHaveLength(1)
        expect(customers[0]).toMatchObject({
          idempotencyKey: "customer-acct_1",
          form: { "metadata[account_id]": "acct_1", email: "me@example.com" }
        })

        const session = yield* cards.createSetupCheckout({
          accountId: "acct_1",
          customerId: "cus_double_1",
          setupId: "cset_1"
        })
        expect(session).toEqual({ sessionId: "cs_test_setup_1", url: "https://checkout.stripe.test/c/setup/1" })
        expect(seen.find((r) => r.path === "/v1/checkout/sessions")).toMatchObject({
          idempotencyKey: "setup-cset_1",
          form: { mode: "setup", currency: "myr", customer: "cus_double_1", "metadata[card_setup_id]": "cset_1" }
        })

        expect(yield* cards.savedCard("seti_double_1")).toEqual({
          paymentMethodId: "pm_double_1",
          brand: "visa",
          last4: "4242",
          expMonth: 12,
          expYear: 2034
        })
        expect(seen.find((r) => r.path === "/v1/setup_intents/seti_double_1")?.form).toMatchObject({
          "expand[0]": "payment_method"
        })
      }))

    it.effect("an off-session charge: accepted, declined, authentication required, each with its attempt's idempotency key", () =>
      Effect.gen(function*() {
        const cards = yield* CardProcessor
        const double = yield* StripeCards
        double.outcomes.push("pays", "card_declined", "authentication_required")
        const charge = (attempt: string) =>
          cards.charge({
            customerId: "cus_double_1",
            paymentMethodId: "pm_double_1",
            amountSen: 5000,
            idempotencyKey: `auto_topup_${attempt}`,
            metadata: { account_id: "acct_1", auto_topup_id: attempt }
          })
        expect(yield* charge("atu_1")).toEqual({ _tag: "Accepted", paymentIntentId: "pi_double_ok" })
        expect(yield* charge("atu_2")).toMatchObject({
          _tag: "Refused",
          code: "card_declined",
          paymentIntentId: "pi_double_card_declined"
        })
        expect(yield* charge("atu_3")).toMatchObject({
          _tag: "Refused",
          code: "authentication_required",
          paymentIntentId: "pi_double_authentication_required"
        })
        const intents = double.seen.filter((r) => r.path === "/v1/payment_intents")
        expect(intents.map((r) => r.idempotencyKey)).toEqual([
          "auto_topup_atu_1",
          "auto_topup_atu_2",
          "auto_topup_atu_3"
        ])
        expect(intents[0]?.form).toMatchObject({
          amount: "5000",
          currency: "myr",
          customer: "cus_double_1",
          payment_method: "pm_double_1",
          off_session: "true",
          confirm: "true",
          "metadata[auto_topup_id]": "atu_1"
        })
      }))

    it.effect("Stripe failing (a 500, after the SDK's retries) is a BillingError: nothing charged, nothing taken as refused", () =>
      Effect.gen(function*() {
        const cards = yield* CardProcessor
        const double = yield* StripeCards
        double.outcomes.push("server_error", "server_error", "server_error")
        const before = double.seen.length
        const failed = yield* Effect.flip(cards.charge({
          customerId: "cus_double_1",
          paymentMethodId: "pm_double_1",
          amountSen: 5000,
          idempotencyKey: "auto_topup_atu_9",
          metadata: {}
        }))
        expect(failed._tag).toBe("BillingError")
        // The SDK's retries reuse the attempt's idempotency key: one payment at most, however often it is sent.
        const retries = double.seen.slice(before).filter((r) => r.path === "/v1/payment_intents")
        expect(retries.length).toBe(3)
        expect(new Set(retries.map((r) => r.idempotencyKey))).toEqual(new Set(["auto_topup_atu_9"]))
      }))
  })
})
