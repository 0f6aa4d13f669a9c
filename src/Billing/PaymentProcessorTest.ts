import { Effect, Layer, Redacted } from "effect"
import { BillingError } from "../Domain/Errors.js"
import { randomBase62 } from "../Domain/Ids.js"
import type { CheckoutInput, CheckoutSession } from "./PaymentProcessor.js"
import { CURRENCY, PaymentProcessor } from "./PaymentProcessor.js"

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

export const make = () => {
  const calls: Array<CheckoutInput> = []
  const sessions = new Map<string, CheckoutInput & CheckoutSession>()
  const byTransaction = new Map<string, string>()
  const state: MemoryCheckout = { calls, sessions, unreachable: false }
  const createCheckout = (input: CheckoutInput) =>
    Effect.suspend(() => {
      calls.push(input)
      if (state.unreachable) {
        return Effect.fail(
          new BillingError({
            message: "The payment processor did not create a checkout session; nothing was charged."
          })
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

export type TestCheckout = ReturnType<typeof make>

/** The event Stripe sends when the session's payment completes, with the metadata the real checkout set. */
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
      amount_total: session.amountSen,
      currency: CURRENCY
    }
  }
})

/** The checkout as the `PaymentProcessor`, verifying webhooks with `webhookSecret` (Stripe's, not the simulated one). */
export const layer = (checkout: TestCheckout, webhookSecret: string): Layer.Layer<PaymentProcessor> =>
  Layer.succeed(PaymentProcessor, {
    simulated: false,
    webhookSecret: Redacted.make(webhookSecret),
    createCheckout: checkout.createCheckout
  })
