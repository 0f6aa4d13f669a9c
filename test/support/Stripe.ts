import { Context, Effect, Layer, Option, Redacted } from "effect"
import { createServer, type IncomingMessage } from "node:http"
import type { AddressInfo } from "node:net"
import Stripe from "stripe"
import type { AppConfigShape } from "../../src/AppConfig.js"
import { randomBase62 } from "../../src/Domain/Ids.js"
import { call } from "./Http.js"
import { TestServer, TestServerLive } from "./TestServer.js"

/** The webhook signing secret test servers are started with. */
export const WEBHOOK_SECRET = "whsec_test_nenas_0123456789abcdef"

export const webhookOverrides: Partial<AppConfigShape> = {
  stripeWebhookSecret: Option.some(Redacted.make(WEBHOOK_SECRET))
}

export interface SignOptions {
  readonly secret?: string
  /** Unix seconds; default the server clock's now. */
  readonly timestamp?: number
}

/** A `Stripe-Signature` header for `payload`, made as Stripe makes it. */
export const sign = (payload: string, options: SignOptions = {}) =>
  Effect.gen(function*() {
    const { clock } = yield* TestServer
    return Stripe.webhooks.generateTestHeaderString({
      payload,
      secret: options.secret ?? WEBHOOK_SECRET,
      timestamp: options.timestamp ?? Math.floor(clock.unsafeCurrentTimeMillis() / 1000)
    })
  })

/** Delivers an event to the webhook receiver, signed unless a signature is given. */
export const deliverEvent = (event: object, options: SignOptions & { readonly signature?: string } = {}) =>
  Effect.gen(function*() {
    const body = JSON.stringify(event)
    const signature = options.signature ?? (yield* sign(body, options))
    return yield* call("POST", "/billing/stripe/webhook", {
      body,
      headers: { "content-type": "application/json", "stripe-signature": signature }
    })
  })

const envelope = (type: string, object: Record<string, unknown>) => ({
  id: `evt_${randomBase62(24)}`,
  object: "event",
  api_version: Stripe.API_VERSION,
  created: Math.floor(Date.now() / 1000),
  livemode: false,
  pending_webhooks: 1,
  type,
  data: { object }
})

export interface SessionFacts {
  readonly transactionId: string
  readonly sessionId?: string
  readonly paymentIntentId?: string
  readonly amountSen: number
  readonly paymentStatus?: "paid" | "unpaid" | "no_payment_required"
  /** The metadata the session was created with, beyond `transaction_id`. */
  readonly metadata?: Readonly<Record<string, string>>
}

const sessionObject = (facts: SessionFacts, status: string) => ({
  id: facts.sessionId ?? `cs_test_${randomBase62(24)}`,
  object: "checkout.session",
  mode: "payment",
  status,
  payment_status: facts.paymentStatus ?? "paid",
  amount_subtotal: facts.amountSen,
  amount_total: facts.amountSen,
  currency: "myr",
  client_reference_id: facts.transactionId,
  metadata: { ...facts.metadata, transaction_id: facts.transactionId },
  payment_intent: facts.paymentIntentId ?? null
})

export interface DisputeFacts {
  readonly disputeId: string
  readonly chargeId: string
  readonly paymentIntentId: string
  readonly amountSen: number
}

const disputeObject = (facts: DisputeFacts, status: string) => ({
  id: facts.disputeId,
  object: "dispute",
  amount: facts.amountSen,
  currency: "myr",
  charge: facts.chargeId,
  payment_intent: facts.paymentIntentId,
  status
})

/** Stripe-shaped events, as the webhook receiver gets them. */
export const events = {
  checkoutCompleted: (facts: SessionFacts) => envelope("checkout.session.completed", sessionObject(facts, "complete")),
  asyncPaymentSucceeded: (facts: SessionFacts) =>
    envelope("checkout.session.async_payment_succeeded", sessionObject(facts, "complete")),
  asyncPaymentFailed: (facts: SessionFacts) =>
    envelope("checkout.session.async_payment_failed", sessionObject({ ...facts, paymentStatus: "unpaid" }, "complete")),
  checkoutExpired: (facts: SessionFacts) =>
    envelope("checkout.session.expired", sessionObject({ ...facts, paymentStatus: "unpaid" }, "expired")),
  /** `amountRefundedSen` is the charge's cumulative refunded amount, as Stripe reports it. */
  chargeRefunded: (
    facts: { chargeId: string; paymentIntentId: string; amountSen: number; amountRefundedSen: number }
  ) =>
    envelope("charge.refunded", {
      id: facts.chargeId,
      object: "charge",
      amount: facts.amountSen,
      amount_refunded: facts.amountRefundedSen,
      refunded: facts.amountRefundedSen === facts.amountSen,
      currency: "myr",
      payment_intent: facts.paymentIntentId,
      status: "succeeded"
    }),
  /** A dispute, or with `warning_needs_response` an inquiry. */
  disputeCreated: (facts: DisputeFacts & { status?: "needs_response" | "warning_needs_response" }) =>
    envelope("charge.dispute.created", disputeObject(facts, facts.status ?? "needs_response")),
  fundsWithdrawn: (facts: DisputeFacts) =>
    envelope("charge.dispute.funds_withdrawn", disputeObject(facts, "needs_response")),
  fundsReinstated: (facts: DisputeFacts) => envelope("charge.dispute.funds_reinstated", disputeObject(facts, "won")),
  disputeClosed: (facts: DisputeFacts & { status: "won" | "lost" | "warning_closed" }) =>
    envelope("charge.dispute.closed", disputeObject(facts, facts.status)),
  other: (type: string) => envelope(type, { id: `obj_${randomBase62(12)}`, object: "unknown" })
}

/** A request the Stripe double received: method, path and the form-decoded body. */
export interface StripeRequest {
  readonly method: string
  readonly path: string
  readonly form: Readonly<Record<string, string>>
  readonly idempotencyKey: string | undefined
}

/** A PaymentIntent the double made: every one is a real charge of the saved card. */
export interface DoubleIntent {
  readonly id: string
  readonly object: "payment_intent"
  readonly amount: number
  readonly amount_received: number
  readonly currency: string
  readonly customer: string | null
  readonly payment_method: string | null
  readonly status: "succeeded"
  readonly created: number
  readonly metadata: Readonly<Record<string, string>>
}

/**
 * A local stand-in for Stripe's API, reached by the real `stripe` SDK through
 * `STRIPE_API_URL`: Checkout Sessions, customers, SetupIntents (each saves a
 * Visa ending 4242) and off-session PaymentIntents (each pays). As Stripe
 * does, a POST repeated with an Idempotency-Key it remembers answers the first
 * result, until it forgets the key (after 24 hours; `forgetIdempotencyKeys`).
 */
export class StripeDouble extends Context.Tag("test/StripeDouble")<StripeDouble, {
  readonly url: string
  readonly requests: Array<StripeRequest>
  /** The PaymentIntents made, in order. */
  readonly paymentIntents: Array<DoubleIntent>
  /** The next `n` session creations answer this HTTP status with a Stripe error body. */
  readonly failNext: (n: number, status: number) => void
  /** The next `n` PaymentIntent creations are made (or replayed) but their answers lost: the connection is cut. */
  readonly loseAnswers: (n: number) => void
  /** Forgets every idempotency key, as Stripe does 24 hours after a key's first use. */
  readonly forgetIdempotencyKeys: () => void
  /**
   * A Checkout Session paid, as Stripe pays it: a PaymentIntent by a Mastercard ending 4444, attached to the
   * session's customer when it asked `setup_future_usage`. The intent's id (for the session's event).
   */
  readonly payCheckout: (sessionId: string) => string
}>() {}

const readBody = (request: IncomingMessage) =>
  new Promise<string>((resolve, reject) => {
    let body = ""
    request.setEncoding("utf8")
    request.on("data", (chunk: string) => body += chunk)
    request.on("end", () => resolve(body))
    request.on("error", reject)
  })

/** `metadata[key]` form fields as an object. */
const metadataOf = (form: Readonly<Record<string, string>>) =>
  Object.fromEntries(
    Object.entries(form).flatMap(([field, value]) => {
      const key = /^metadata\[(.+)\]$/.exec(field)?.[1]
      return key === undefined ? [] : [[key, value]]
    })
  )

export const StripeDoubleLive = Layer.scoped(
  StripeDouble,
  Effect.gen(function*() {
    const requests: Array<StripeRequest> = []
    const paymentIntents: Array<DoubleIntent> = []
    const remembered = new Map<string, unknown>()
    let failures = 0
    let failureStatus = 500
    let lost = 0
    const notFound = (message: string) => ({ status: 404, json: { error: { type: "invalid_request_error", message } } })
    const sessions = new Map<string, Readonly<Record<string, string>>>()
    interface CheckoutIntent {
      readonly id: string
      readonly object: "payment_intent"
      readonly status: "succeeded"
      readonly customer: string | null
      readonly payment_method: string
    }
    const checkoutIntents = new Map<string, CheckoutIntent>()
    const paymentMethod = (id: string) => ({
      id,
      object: "payment_method",
      card: { brand: "mastercard", last4: "4444", exp_month: 3, exp_year: 2031 }
    })
    const sessionOf = (form: Readonly<Record<string, string>>) => {
      const id = `cs_test_${randomBase62(24)}`
      sessions.set(id, form)
      return {
        id,
        object: "checkout.session",
        mode: form["mode"] ?? "payment",
        status: "open",
        payment_status: "unpaid",
        // Every line's unit amount (the credit, and the service tax when charged), as Stripe totals them.
        amount_total: Object.entries(form)
          .filter(([field]) => /^line_items\[\d+\]\[price_data\]\[unit_amount\]$/.test(field))
          .reduce((sum, [, value]) => sum + Number(value), 0),
        currency: form["line_items[0][price_data][currency]"] ?? form["currency"],
        client_reference_id: form["client_reference_id"] ?? null,
        customer: form["customer"] ?? null,
        metadata: metadataOf(form),
        success_url: form["success_url"],
        cancel_url: form["cancel_url"],
        url: `https://checkout.stripe.test/c/pay/${id}`
      }
    }
    const intentOf = (form: Readonly<Record<string, string>>): DoubleIntent => {
      const intent: DoubleIntent = {
        id: `pi_${randomBase62(24)}`,
        object: "payment_intent",
        amount: Number(form["amount"]),
        amount_received: Number(form["amount"]),
        currency: form["currency"] ?? "myr",
        customer: form["customer"] ?? null,
        payment_method: form["payment_method"] ?? null,
        status: "succeeded",
        created: Math.floor(Date.now() / 1000),
        metadata: metadataOf(form)
      }
      paymentIntents.push(intent)
      return intent
    }
    /** A POST's answer, made once per idempotency key while the key is remembered. */
    const once = (key: string | undefined, make: () => unknown) => {
      if (key === undefined) return make()
      if (!remembered.has(key)) remembered.set(key, make())
      return remembered.get(key)
    }
    const route = (
      method: string,
      url: URL,
      form: Readonly<Record<string, string>>,
      key: string | undefined
    ): { status: number; json: unknown } => {
      const path = url.pathname
      if (method === "POST" && path === "/v1/checkout/sessions") {
        if (failures > 0) {
          failures--
          return { status: failureStatus, json: { error: { type: "api_error", message: "Stripe double failure" } } }
        }
        return { status: 200, json: sessionOf(form) }
      }
      if (method === "POST" && path === "/v1/customers") {
        return {
          status: 200,
          json: once(key, () => ({ id: `cus_${randomBase62(14)}`, object: "customer", metadata: metadataOf(form) }))
        }
      }
      if (method === "GET" && path.startsWith("/v1/setup_intents/")) {
        const id = path.slice("/v1/setup_intents/".length)
        return {
          status: 200,
          json: {
            id,
            object: "setup_intent",
            status: "succeeded",
            payment_method: {
              id: `pm_${id.slice(-12)}`,
              object: "payment_method",
              card: { brand: "visa", last4: "4242", exp_month: 12, exp_year: 2034 }
            }
          }
        }
      }
      if (method === "POST" && path === "/v1/payment_intents") {
        return {
          status: 200,
          json: once(key, () => intentOf(form))
        }
      }
      const checkoutIntent = method === "GET"
        ? checkoutIntents.get(path.slice("/v1/payment_intents/".length))
        : undefined
      if (checkoutIntent !== undefined) {
        const expanded = url.searchParams.get("expand[0]") === "payment_method"
        return {
          status: 200,
          json: {
            ...checkoutIntent,
            payment_method: expanded ? paymentMethod(checkoutIntent.payment_method) : checkoutIntent.payment_method
          }
        }
      }
      if (method === "GET" && path.startsWith("/v1/payment_intents/")) {
        const found = paymentIntents.find((intent) => intent.id === path.slice("/v1/payment_intents/".length))
        return found === undefined ? notFound("No such payment_intent") : { status: 200, json: found }
      }
      if (method === "GET" && path === "/v1/payment_intents") {
        // Newest first, as Stripe lists, filtered by customer and `created[gte]`, paged by `starting_after`.
        const since = Number(url.searchParams.get("created[gte]") ?? 0)
        const customer = url.searchParams.get("customer")
        const matching = paymentIntents.filter((intent) =>
          intent.created >= since && (customer === null || intent.customer === customer)
        ).reverse()
        const after = url.searchParams.get("starting_after")
        const from = after === null ? 0 : matching.findIndex((intent) => intent.id === after) + 1
        const limit = Number(url.searchParams.get("limit") ?? 10)
        const page = matching.slice(from, from + limit)
        return {
          status: 200,
          json: { object: "list", url: "/v1/payment_intents", has_more: from + limit < matching.length, data: page }
        }
      }
      return notFound(`Unrecognized request URL (${method}: ${path})`)
    }
    const server = createServer(async (request, response) => {
      const body = await readBody(request)
      const url = new URL(request.url ?? "/", "http://stripe.test")
      const form = Object.fromEntries(new URLSearchParams(request.method === "GET" ? url.search : body))
      const header = request.headers["idempotency-key"]
      const idempotencyKey = typeof header === "string" ? header : undefined
      requests.push({ method: request.method ?? "", path: request.url ?? "", form, idempotencyKey })
      const answer = route(request.method ?? "", url, form, idempotencyKey)
      if (lost > 0 && request.method === "POST" && url.pathname === "/v1/payment_intents") {
        lost--
        request.socket.destroy()
        return
      }
      response.setHeader("content-type", "application/json")
      response.writeHead(answer.status).end(JSON.stringify(answer.json))
    })
    yield* Effect.acquireRelease(
      Effect.async<void>((resume) => {
        server.listen(0, "127.0.0.1", () => resume(Effect.void))
      }),
      () =>
        Effect.async<void>((resume) => {
          server.closeAllConnections()
          server.close(() => resume(Effect.void))
        })
    )
    const { port } = server.address() as AddressInfo
    return {
      url: `http://127.0.0.1:${port}`,
      requests,
      paymentIntents,
      failNext: (n, status) => {
        failures = n
        failureStatus = status
      },
      loseAnswers: (n) => {
        lost = n
      },
      forgetIdempotencyKeys: () => remembered.clear(),
      payCheckout: (sessionId) => {
        const form = sessions.get(sessionId)
        if (form === undefined) throw new Error(`no session ${sessionId}`)
        const id = `pi_${randomBase62(24)}`
        const saving = form["payment_intent_data[setup_future_usage]"] === "off_session"
        const customer = saving ? form["customer"] ?? null : null
        checkoutIntents.set(id, {
          id,
          object: "payment_intent",
          status: "succeeded",
          customer,
          payment_method: `pm_${randomBase62(14)}`
        })
        return id
      }
    }
  })
)

/** The service configured for real Stripe, whose API is the double above; `overrides` as `TestServerLive`'s. */
export const testServerWithStripe = (overrides: Partial<AppConfigShape> = {}) =>
  Layer.unwrapEffect(Effect.map(StripeDouble, (double) =>
    TestServerLive({
      ...webhookOverrides,
      stripeSecretKey: Option.some(Redacted.make("sk_test_nenas_double")),
      stripeApiUrl: Option.some(double.url),
      ...overrides
    }))).pipe(Layer.provideMerge(StripeDoubleLive))

export const TestServerWithStripe = testServerWithStripe()

/**
 * Tops up a developer's wallet through the real path: a checkout, then the
 * signed `checkout.session.completed` Stripe would send. Returns the ids the
 * payment's later events (refunds, disputes) refer to.
 */
export const topUp = (token: string, amountSen: number) =>
  Effect.gen(function*() {
    const checkout = yield* call("POST", "/dashboard/billing/checkout", { token, json: { amount_sen: amountSen } })
    if (checkout.status !== 200) throw new Error(`checkout failed: ${checkout.status} ${checkout.text}`)
    const payment = {
      transactionId: checkout.body.transaction_id as string,
      sessionId: checkout.body.session_id as string,
      paymentIntentId: `pi_${randomBase62(24)}`,
      chargeId: `ch_${randomBase62(24)}`,
      // What Stripe charged: the amount and, with `SST_RATE_BPS`, the service tax on top.
      amountSen: (checkout.body.total_sen as number | undefined) ?? amountSen
    }
    const delivered = yield* deliverEvent(events.checkoutCompleted(payment))
    if (delivered.status !== 200 || delivered.body.processed !== true) {
      throw new Error(`top-up was not applied: ${delivered.status} ${delivered.text}`)
    }
    return payment
  })

/**
 * Tops up through the simulated checkout (no Stripe secret key): a checkout,
 * then its development pay page. The checkout's session and transaction ids.
 */
export const simulatedTopUp = (token: string, amountSen = 1000) =>
  Effect.gen(function*() {
    const checkout = yield* call("POST", "/dashboard/billing/checkout", { token, json: { amount_sen: amountSen } })
    if (checkout.status !== 200) return yield* Effect.dieMessage(`checkout: ${checkout.status} ${checkout.text}`)
    const paid = yield* call("POST", `/dev/checkout/${checkout.body.session_id}/pay`)
    if (paid.status !== 200) return yield* Effect.dieMessage(`simulated payment: ${paid.status} ${paid.text}`)
    return { sessionId: checkout.body.session_id as string, transactionId: checkout.body.transaction_id as string }
  })
