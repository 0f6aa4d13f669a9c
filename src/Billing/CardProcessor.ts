import { Context, Effect, Layer, Option } from "effect"
import type Stripe from "stripe"
import { AppConfig, type AppConfigShape } from "../AppConfig.js"
import { BillingError } from "../Domain/Errors.js"
import { randomBase62 } from "../Domain/Ids.js"
import { type CheckoutSession, CURRENCY, makeStripeClient } from "./PaymentProcessor.js"

/** A card saved for payments off-session, as the dashboard shows it. */
export interface SavedCard {
  readonly paymentMethodId: string
  readonly brand: string
  readonly last4: string
  readonly expMonth: number
  readonly expYear: number
}

export interface OffSessionCharge {
  readonly customerId: string
  readonly paymentMethodId: string
  readonly amountSen: number
  /** One per attempt: a retried call after a lost answer is the same payment. */
  readonly idempotencyKey: string
  readonly metadata: Readonly<Record<string, string>>
}

/** What an earlier claim of an attempt may have paid: its intent if known, else the customer's intents since `since`. */
export interface ChargeLookup {
  readonly customerId: string
  readonly paymentIntentId: string | null
  /** The metadata the charge was made with: what tells the attempt's intent among the customer's. */
  readonly metadata: Readonly<Record<string, string>>
  readonly since: Date
}

/** A charge's outcome: Stripe confirms it (credited on `payment_intent.succeeded`), or refuses it with a code. */
export type ChargeOutcome =
  | { readonly _tag: "Accepted"; readonly paymentIntentId: string }
  | {
    readonly _tag: "Refused"
    readonly code: string
    readonly message: string
    readonly paymentIntentId: string | null
  }

/**
 * Cards saved for auto top-up
 * (docs/api/alerts.md, "Never run dry: alerts, auto top-up and webhooks"): a
 * Stripe customer per account, a Checkout Session in `mode: setup` to save a
 * card, and off-session PaymentIntents (`off_session: true, confirm: true`).
 * Without Stripe, the simulated processor answers as Stripe's test cards do:
 * 4242 4242 4242 4242 pays, 4000 0000 0000 0002 is declined,
 * 4000 0025 0000 3155 requires authentication.
 */
export class CardProcessor extends Context.Tag("nenas/CardProcessor")<CardProcessor, {
  readonly ensureCustomer: (
    accountId: string,
    email: string | null,
    known: string | null
  ) => Effect.Effect<string, BillingError>
  readonly createSetupCheckout: (
    input: { accountId: string; customerId: string; setupId: string }
  ) => Effect.Effect<CheckoutSession, BillingError>
  readonly savedCard: (setupIntentId: string) => Effect.Effect<SavedCard, BillingError>
  /** The card that paid a top-up Checkout saving it (`setup_future_usage: off_session`). */
  readonly paymentCard: (paymentIntentId: string) => Effect.Effect<SavedCard, BillingError>
  readonly charge: (input: OffSessionCharge) => Effect.Effect<ChargeOutcome, BillingError>
  /** The PaymentIntent an earlier claim made, and where it stands; none when no charge was made. */
  readonly findCharge: (input: ChargeLookup) => Effect.Effect<ChargeOutcome | undefined, BillingError>
}>() {
  static readonly layer = Layer.effect(
    CardProcessor,
    Effect.map(AppConfig, (config) =>
      Option.match(config.stripeSecretKey, {
        onNone: () => simulated(config),
        onSome: (key) => stripeCards(config, makeStripeClient(key, config.stripeApiUrl))
      }))
  )
}

const failed = (what: string) => (error: unknown) =>
  Effect.zipRight(
    Effect.logWarning(`Stripe: ${what} failed`, error),
    Effect.fail(new BillingError({ message: `The payment processor did not ${what}; nothing was charged.` }))
  )

/** Slack for the clocks of Stripe and this service when listing intents made since an attempt was queued. */
const CLOCK_SLACK_S = 600
/** A customer has a few automatic payments a day: more intents than this since one attempt is refused, not guessed at. */
const MAX_LISTED = 1000

/** Where an intent stands as a charge outcome: paid or under way, or refused (off-session, needing the cardholder is a refusal). */
export const outcomeOfIntent = (intent: {
  readonly id: string
  readonly status: string
  readonly last_payment_error?:
    | { readonly code?: string | undefined; readonly message?: string | undefined }
    | null
    | undefined
}): ChargeOutcome => {
  if (intent.status === "succeeded" || intent.status === "processing" || intent.status === "requires_capture") {
    return { _tag: "Accepted", paymentIntentId: intent.id }
  }
  const code = intent.status === "requires_action"
    ? "authentication_required"
    : intent.last_payment_error?.code ?? "payment_failed"
  return {
    _tag: "Refused",
    code,
    message: intent.last_payment_error?.message ?? `The payment is ${intent.status}.`,
    paymentIntentId: intent.id
  }
}

/** The card of an intent whose `payment_method` was expanded. */
const cardOf = (intent: { readonly payment_method: string | Stripe.PaymentMethod | null }) => {
  const method = intent.payment_method
  if (method === null || typeof method === "string" || method.card === undefined) return Effect.fail("no card")
  return Effect.succeed<SavedCard>({
    paymentMethodId: method.id,
    brand: method.card.brand,
    last4: method.card.last4,
    expMonth: method.card.exp_month,
    expYear: method.card.exp_year
  })
}

const stripeCards = (config: AppConfigShape, stripe: Stripe) =>
  CardProcessor.of({
    ensureCustomer: (accountId, email, known) =>
      known !== null ? Effect.succeed(known) : Effect.tryPromise({
        try: () =>
          stripe.customers.create({ metadata: { account_id: accountId }, ...(email === null ? {} : { email }) }, {
            idempotencyKey: `customer-${accountId}`
          }),
        catch: (error) => error
      }).pipe(Effect.map((customer) => customer.id), Effect.catchAll(failed("create a customer"))),
    createSetupCheckout: ({ accountId, customerId, setupId }) =>
      Effect.tryPromise({
        try: () =>
          stripe.checkout.sessions.create({
            mode: "setup",
            currency: CURRENCY,
            customer: customerId,
            metadata: { account_id: accountId, card_setup_id: setupId },
            success_url: `${config.dashboardUrl}/billing?card=saved`,
            cancel_url: `${config.dashboardUrl}/billing?card=cancelled`
          }, { idempotencyKey: `setup-${setupId}` }),
        catch: (error) => error
      }).pipe(
        Effect.flatMap((session) =>
          session.url ? Effect.succeed({ sessionId: session.id, url: session.url }) : Effect.fail("no url")
        ),
        Effect.catchAll(failed("start saving a card"))
      ),
    savedCard: (setupIntentId) =>
      Effect.tryPromise({
        try: () => stripe.setupIntents.retrieve(setupIntentId, { expand: ["payment_method"] }),
        catch: (error) => error
      }).pipe(Effect.flatMap(cardOf), Effect.catchAll(failed("read the saved card"))),
    paymentCard: (paymentIntentId) =>
      Effect.tryPromise({
        try: () => stripe.paymentIntents.retrieve(paymentIntentId, { expand: ["payment_method"] }),
        catch: (error) => error
      }).pipe(Effect.flatMap(cardOf), Effect.catchAll(failed("read the paying card"))),
    charge: (input) =>
      Effect.tryPromise({
        try: () =>
          stripe.paymentIntents.create({
            amount: input.amountSen,
            currency: CURRENCY,
            customer: input.customerId,
            payment_method: input.paymentMethodId,
            off_session: true,
            confirm: true,
            metadata: { ...input.metadata }
          }, { idempotencyKey: input.idempotencyKey }),
        catch: (error) => error
      }).pipe(
        Effect.map((intent): ChargeOutcome => ({ _tag: "Accepted", paymentIntentId: intent.id })),
        Effect.catchAll((error) => {
          const card = error as { type?: string; code?: string; message?: string; payment_intent?: { id?: string } }
          return card.type === "StripeCardError"
            ? Effect.succeed<ChargeOutcome>({
              _tag: "Refused",
              code: card.code ?? "card_declined",
              message: card.message ?? "The card was declined.",
              paymentIntentId: card.payment_intent?.id ?? null
            })
            : failed("charge the saved card")(error)
        })
      ),
    findCharge: ({ customerId, metadata, paymentIntentId, since }) =>
      Effect.tryPromise({
        try: async () => {
          if (paymentIntentId !== null) return await stripe.paymentIntents.retrieve(paymentIntentId)
          // Listing is consistent at once (search may lag a minute): the intent is there if it was ever made.
          const list = stripe.paymentIntents.list({
            customer: customerId,
            created: { gte: Math.floor(since.getTime() / 1000) - CLOCK_SLACK_S },
            limit: 100
          })
          let listed = 0
          for await (const intent of list) {
            if (Object.entries(metadata).every(([key, value]) => intent.metadata[key] === value)) return intent
            if (++listed >= MAX_LISTED) {
              throw new Error(`more than ${MAX_LISTED} payment intents of customer ${customerId}`)
            }
          }
          return undefined
        },
        catch: (error) => error
      }).pipe(
        Effect.map((intent) => intent === undefined ? undefined : outcomeOfIntent(intent)),
        Effect.catchAll(failed("find an earlier charge"))
      )
  })

/** Stripe's test cards, by number: what an off-session payment with each does. */
export const TEST_CARDS: Readonly<
  Record<string, { readonly brand: string; readonly outcome: "pays" | "card_declined" | "authentication_required" }>
> = {
  "4242424242424242": { brand: "visa", outcome: "pays" },
  "5555555555554444": { brand: "mastercard", outcome: "pays" },
  "4000000000000002": { brand: "visa", outcome: "card_declined" },
  "4000002500003155": { brand: "visa", outcome: "authentication_required" },
  "4000002760003184": { brand: "visa", outcome: "authentication_required" }
}

/** A simulated test card, by the number its intent's id carries. */
const simulatedCard = (number: string | undefined) => {
  const card = number === undefined ? undefined : TEST_CARDS[number]
  if (number === undefined || card === undefined) {
    return Effect.fail(new BillingError({ message: "Unknown simulated card." }))
  }
  return Effect.succeed<SavedCard>({
    paymentMethodId: `pm_sim_${number}`,
    brand: card.brand,
    last4: number.slice(-4),
    expMonth: 12,
    expYear: 2034
  })
}

/** The simulated processor: the card number rides in the ids it hands out, as nothing else is stored. */
const simulated = (config: AppConfigShape) =>
  CardProcessor.of({
    ensureCustomer: (accountId, _email, known) => Effect.succeed(known ?? `cus_sim_${accountId}`),
    createSetupCheckout: ({ setupId }) => {
      const sessionId = `cs_sim_setup_${setupId.slice(-24)}`
      return Effect.succeed({ sessionId, url: `${config.publicBaseUrl}/dev/checkout/setup/${sessionId}` })
    },
    savedCard: (setupIntentId) => simulatedCard(/^seti_sim_(\d{16})_/.exec(setupIntentId)?.[1]),
    paymentCard: (paymentIntentId) => simulatedCard(/^pi_sim_(\d{16})_/.exec(paymentIntentId)?.[1]),
    charge: (input) => {
      const card = TEST_CARDS[input.paymentMethodId.replace(/^pm_sim_/, "")]
      const paymentIntentId = `pi_sim_${input.idempotencyKey.slice(-24)}`
      if (card === undefined || card.outcome === "pays") return Effect.succeed({ _tag: "Accepted", paymentIntentId })
      return Effect.succeed({
        _tag: "Refused",
        code: card.outcome,
        message: card.outcome === "card_declined"
          ? "Your card was declined."
          : "This payment requires authentication by the cardholder.",
        paymentIntentId
      })
    },
    // Nothing is kept: a repeated simulated charge with the attempt's key is the same payment, credited once.
    findCharge: () => Effect.succeed(undefined)
  })

/** A simulated PaymentIntent id carrying the test card's number, one per session (a second Pay is the same payment). */
export const simulatedPaymentIntent = (sessionId: string, cardNumber: string | null) =>
  `pi_sim_${cardNumber === null ? "" : `${cardNumber}_`}${sessionId.slice(-24)}`

/** A simulated SetupIntent id carrying the test card's number. */
export const simulatedSetupIntent = (cardNumber: string) => `seti_sim_${cardNumber}_${randomBase62(12)}`
