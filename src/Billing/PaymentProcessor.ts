import { Context, Effect, Layer, Option, Redacted } from "effect"
import { mkdir, readFile, writeFile } from "node:fs/promises"
import { join } from "node:path"
import Stripe from "stripe"
import { AppConfig, type AppConfigShape } from "../AppConfig.js"
import { BillingError } from "../Domain/Errors.js"
import { randomBase62 } from "../Domain/Ids.js"

export interface CheckoutInput {
  readonly transactionId: string
  readonly accountId: string
  /** What the wallet is credited. */
  readonly amountSen: number
  /** Service tax on top (docs/money.md, "Service tax"): a line of its own when not 0. */
  readonly taxSen: number
  readonly taxRateBps: number
  readonly email: string | null
  /** The Stripe customer that keeps the paying card for auto top-up; null when the card is not saved. */
  readonly saveCardFor: string | null
}

/** Session metadata marking a top-up whose paying card is saved once it is paid. */
export const SAVE_CARD_METADATA = "save_card"

/** A simulated session that saves its card: its page asks for a card number, as the setup page does. */
export const SIMULATED_SAVING_PREFIX = "cs_sim_card_"

export interface CheckoutSession {
  readonly sessionId: string
  readonly url: string
}

/**
 * Where top-ups are paid: Stripe Checkout, or the simulated checkout
 * (docs/money.md, "Payments (Stripe)") when Stripe is not configured. Either
 * way payments arrive as Stripe-signed events at the webhook receiver, verified
 * with `webhookSecret`.
 */
export class PaymentProcessor extends Context.Tag("nenas/PaymentProcessor")<PaymentProcessor, {
  readonly simulated: boolean
  readonly webhookSecret: Redacted.Redacted<string>
  readonly createCheckout: (input: CheckoutInput) => Effect.Effect<CheckoutSession, BillingError>
}>() {
  /** Checkout for tests, kept in memory (see `MemoryCheckout`). */
  static readonly inMemory = () => memoryCheckout()

  /** The test Layer: `checkout` (from `PaymentProcessor.inMemory`) as the `PaymentProcessor`, verifying webhooks with `webhookSecret`. */
  static readonly Test = (checkout: TestCheckout, webhookSecret: string): Layer.Layer<PaymentProcessor> =>
    Layer.succeed(PaymentProcessor, {
      simulated: false,
      webhookSecret: Redacted.make(webhookSecret),
      createCheckout: checkout.createCheckout
    })
}

export const CURRENCY = "myr"

/**
 * Checkout for tests, kept in memory and answering as Stripe does: one session
 * per transaction (a repeated create with the same transaction, as Stripe's
 * idempotency key makes it, answers the first session), every call recorded.
 * While `unreachable`, creates fail as the real one fails when Stripe cannot
 * be reached. Refunds and disputes are not made here: Stripe reports them as
 * webhook events, which `completedEvent` and its kin describe.
 */
export interface MemoryCheckout {
  readonly calls: ReadonlyArray<CheckoutInput>
  readonly sessions: ReadonlyMap<string, CheckoutInput & CheckoutSession>
  unreachable: boolean
}

const memoryCheckout = () => {
  const calls: Array<CheckoutInput> = []
  const sessions = new Map<string, CheckoutInput & CheckoutSession>()
  const byTransaction = new Map<string, string>()
  const state: MemoryCheckout = { calls, sessions, unreachable: false }
  const createCheckout = (input: CheckoutInput) =>
    Effect.suspend(() => {
      calls.push(input)
      if (state.unreachable) {
        return Effect.fail(
          new BillingError({ message: "The payment processor did not create a checkout session; nothing was charged." })
        )
      }
      const known = byTransaction.get(input.transactionId)
      const sessionId = known ?? `cs_test_${randomBase62(24)}`
      const session = { ...input, sessionId, url: `https://checkout.stripe.test/c/pay/${sessionId}` }
      if (known === undefined) {
        byTransaction.set(input.transactionId, sessionId)
        sessions.set(sessionId, session)
      }
      return Effect.succeed<CheckoutSession>({ sessionId, url: sessions.get(sessionId)?.url ?? session.url })
    })
  return { state, createCheckout }
}

export type TestCheckout = ReturnType<typeof memoryCheckout>

/** The event Stripe sends when a test checkout's session is paid, with the metadata the real checkout sets. */
export const completedEvent = (session: CheckoutInput & CheckoutSession, paymentIntentId: string) => ({
  id: `evt_${randomBase62(24)}`,
  type: "checkout.session.completed",
  data: {
    object: {
      id: session.sessionId,
      object: "checkout.session",
      client_reference_id: session.transactionId,
      metadata: { transaction_id: session.transactionId, account_id: session.accountId },
      payment_status: "paid",
      payment_intent: paymentIntentId,
      amount_subtotal: session.amountSen + session.taxSen,
      amount_total: session.amountSen + session.taxSen,
      currency: CURRENCY
    }
  }
})

/** The Stripe SDK, pointed at `STRIPE_API_URL` when set (stripe-mock or a test double). */
export const makeStripeClient = (secretKey: Redacted.Redacted, apiUrl: Option.Option<string>): Stripe => {
  const target = Option.map(apiUrl, (url) => new URL(url))
  return new Stripe(Redacted.value(secretKey), {
    maxNetworkRetries: 2,
    timeout: 20_000,
    ...Option.match(target, {
      onNone: () => ({}),
      onSome: (url) => ({
        host: url.hostname,
        port: url.port === "" ? (url.protocol === "http:" ? 80 : 443) : Number(url.port),
        protocol: url.protocol === "http:" ? "http" as const : "https" as const
      })
    })
  })
}

/** The credit and, when charged, the service tax as two lines: the buyer sees what the wallet gets. */
const lineItems = (input: CheckoutInput) => {
  const line = (name: string, sen: number) => ({
    quantity: 1,
    price_data: { currency: CURRENCY, unit_amount: sen, product_data: { name } }
  })
  const credit = line(`nenas wallet top-up, RM ${(input.amountSen / 100).toFixed(2)}`, input.amountSen)
  return input.taxSen === 0
    ? [credit]
    : [credit, line(`Service tax (SST) ${input.taxRateBps / 100}%`, input.taxSen)]
}

const returnUrls = (config: AppConfigShape) => ({
  success_url: `${config.dashboardUrl}/billing?checkout=success&session_id={CHECKOUT_SESSION_ID}`,
  cancel_url: `${config.dashboardUrl}/billing?checkout=cancelled`
})

/** Stripe's own message can name its API host or our account's details: logged in full, answered in generic words. */
const stripeFailure = (error: unknown) =>
  Effect.zipRight(
    Effect.logWarning("Stripe did not create a checkout session", error),
    Effect.fail(
      new BillingError({ message: "The payment processor did not create a checkout session; nothing was charged." })
    )
  )

const makeStripe = (config: AppConfigShape, secretKey: Redacted.Redacted, webhookSecret: Redacted.Redacted<string>) => {
  const stripe = makeStripeClient(secretKey, config.stripeApiUrl)
  return PaymentProcessor.of({
    simulated: false,
    webhookSecret,
    createCheckout: (input) => {
      const metadata = {
        transaction_id: input.transactionId,
        account_id: input.accountId,
        ...(input.saveCardFor === null ? {} : { [SAVE_CARD_METADATA]: "true" })
      }
      // Stripe takes a customer or an email, not both: a saved card belongs to the account's customer.
      const payer = input.saveCardFor !== null
        ? { customer: input.saveCardFor }
        : input.email === null
        ? {}
        : { customer_email: input.email }
      return Effect.tryPromise({
        try: () =>
          stripe.checkout.sessions.create({
            mode: "payment",
            line_items: lineItems(input),
            client_reference_id: input.transactionId,
            metadata,
            payment_intent_data: {
              metadata: { transaction_id: input.transactionId, account_id: input.accountId },
              ...(input.saveCardFor === null ? {} : { setup_future_usage: "off_session" as const })
            },
            ...payer,
            ...returnUrls(config)
          }, { idempotencyKey: `checkout-${input.transactionId}` }),
        catch: (error) => error
      }).pipe(
        Effect.flatMap((session) =>
          session.url === null || session.url === undefined
            ? Effect.fail(new Error("the session has no url"))
            : Effect.succeed({ sessionId: session.id, url: session.url })
        ),
        Effect.catchAll(stripeFailure)
      )
    }
  })
}

/** The simulated checkout: a session id whose page lives at `/dev/checkout/<id>`. */
const makeSimulated = (config: AppConfigShape, webhookSecret: Redacted.Redacted<string>) =>
  PaymentProcessor.of({
    simulated: true,
    webhookSecret,
    createCheckout: (input) =>
      Effect.sync(() => {
        // Nothing else is stored of the session: whether it saves its card rides in its id.
        const sessionId = `${input.saveCardFor === null ? "cs_sim_" : SIMULATED_SAVING_PREFIX}${randomBase62(24)}`
        return { sessionId, url: `${config.publicBaseUrl}/dev/checkout/${sessionId}` }
      })
  })

/** The development webhook secret, kept in `DATA_DIR` so that restarts agree with themselves. */
const devWebhookSecret = (dataDir: string) =>
  Effect.promise(async () => {
    const file = join(dataDir, "dev-stripe-webhook-secret")
    try {
      return (await readFile(file, "utf8")).trim()
    } catch {
      const secret = `whsec_dev_${randomBase62(32)}`
      await mkdir(dataDir, { recursive: true })
      await writeFile(file, secret, { mode: 0o600 })
      return secret
    }
  })

/**
 * Stripe when `STRIPE_SECRET_KEY` is set (then `STRIPE_WEBHOOK_SECRET` must be
 * too), else the simulated checkout, which production refuses.
 */
export const PaymentProcessorLive = Layer.effect(
  PaymentProcessor,
  Effect.gen(function*() {
    const config = yield* AppConfig
    if (Option.isSome(config.stripeSecretKey)) {
      if (Option.isNone(config.stripeWebhookSecret)) {
        return yield* Effect.dieMessage(
          "STRIPE_WEBHOOK_SECRET must be set with STRIPE_SECRET_KEY: webhooks could not be verified."
        )
      }
      return makeStripe(config, config.stripeSecretKey.value, config.stripeWebhookSecret.value)
    }
    if (config.production) {
      return yield* Effect.dieMessage(
        "STRIPE_SECRET_KEY must be set when NODE_ENV=production: the simulated checkout is refused."
      )
    }
    const secret = Option.isSome(config.stripeWebhookSecret)
      ? config.stripeWebhookSecret.value
      : Redacted.make(yield* devWebhookSecret(config.dataDir))
    return makeSimulated(config, secret)
  })
)
