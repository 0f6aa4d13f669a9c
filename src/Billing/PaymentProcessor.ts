import { mkdir, readFile, writeFile } from "node:fs/promises"
import { join } from "node:path"
import { Context, Effect, Layer, Option, Redacted } from "effect"
import Stripe from "stripe"
import { AppConfig, type AppConfigShape } from "../AppConfig.js"
import { BillingError } from "../Domain/Errors.js"
import { randomBase62 } from "../Domain/Ids.js"

export interface CheckoutInput {
  readonly transactionId: string
  readonly accountId: string
  readonly amountSen: number
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
 * Where top-ups are paid: Stripe Checkout, or the simulated checkout of
 * DESIGN.md when Stripe is not configured. Either way payments arrive as
 * Stripe-signed events at the webhook receiver, verified with `webhookSecret`.
 */
export class PaymentProcessor extends Context.Tag("nenas/PaymentProcessor")<PaymentProcessor, {
  readonly simulated: boolean
  readonly webhookSecret: Redacted.Redacted<string>
  readonly createCheckout: (input: CheckoutInput) => Effect.Effect<CheckoutSession, BillingError>
}>() {}

export const CURRENCY = "myr"

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

const returnUrls = (config: AppConfigShape) => ({
  success_url: `${config.dashboardUrl}/billing?checkout=success&session_id={CHECKOUT_SESSION_ID}`,
  cancel_url: `${config.dashboardUrl}/billing?checkout=cancelled`
})

/** Stripe's own message can name its API host or our account's details: logged in full, answered in generic words. */
const stripeFailure = (error: unknown) =>
  Effect.zipRight(
    Effect.logWarning("Stripe did not create a checkout session", error),
    Effect.fail(new BillingError({ message: "The payment processor did not create a checkout session; nothing was charged." }))
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
        : input.email === null ? {} : { customer_email: input.email }
      return Effect.tryPromise({
        try: () =>
          stripe.checkout.sessions.create({
            mode: "payment",
            line_items: [{
              quantity: 1,
              price_data: {
                currency: CURRENCY,
                unit_amount: input.amountSen,
                product_data: { name: `nenas wallet top-up, RM ${(input.amountSen / 100).toFixed(2)}` }
              }
            }],
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
        return yield* Effect.dieMessage("STRIPE_WEBHOOK_SECRET must be set with STRIPE_SECRET_KEY: webhooks could not be verified.")
      }
      return makeStripe(config, config.stripeSecretKey.value, config.stripeWebhookSecret.value)
    }
    if (config.production) {
      return yield* Effect.dieMessage("STRIPE_SECRET_KEY must be set when NODE_ENV=production: the simulated checkout is refused.")
    }
    const secret = Option.isSome(config.stripeWebhookSecret)
      ? config.stripeWebhookSecret.value
      : Redacted.make(yield* devWebhookSecret(config.dataDir))
    return makeSimulated(config, secret)
  })
)
