import { expect, layer } from "@effect/vitest"
import { Effect, Layer, Option, Redacted } from "effect"
import pg from "pg"
import { newId } from "../../../src/Domain/Ids.js"
import { call } from "../../support/Http.js"
import { deliverEvent, events, StripeDouble, StripeDoubleLive } from "../../support/Stripe.js"
import { query, TestServer } from "../../support/TestServer.js"
import { TwoInstancesLive } from "../../support/TwoInstances.js"
import { developer } from "../../support/Wallet.js"
import { eventually } from "../../support/WebhookReceiver.js"

/**
 * Two instances and one auto top-up attempt: the instance that claimed it
 * stalls (its database reads wait) past its lease, the other claims it again,
 * then both go on. The state check and the claim to charge are one statement,
 * so only the claim that still holds the attempt charges: one PaymentIntent
 * request, never two.
 */

const Two = Layer.unwrapEffect(Effect.map(StripeDouble, (double) =>
  TwoInstancesLive("autotopup-race", {
    stripeSecretKey: Option.some(Redacted.make("sk_test_nenas_double")),
    stripeApiUrl: Option.some(double.url),
    outboxPollMs: 50
  }))).pipe(Layer.provideMerge(StripeDoubleLive))

/** Saves a card as Stripe would: a setup-mode Checkout Session, then its `checkout.session.completed`. */
const saveCard = (token: string) =>
  Effect.gen(function*() {
    const started = yield* call("POST", "/dashboard/billing/card", { token })
    expect(started.status, started.text).toBe(200)
    const saved = yield* deliverEvent({
      ...events.other("checkout.session.completed"),
      data: {
        object: {
          id: started.body.session_id,
          object: "checkout.session",
          mode: "setup",
          status: "complete",
          payment_status: "no_payment_required",
          setup_intent: `seti_${newId("x").slice(-16)}`
        }
      }
    })
    expect(saved.body, saved.text).toEqual({ received: true, processed: true })
  })

const attempt = (id: string) =>
  Effect.map(
    query<{ status: string; claimed_until: Date | null; payment_intent_id: string | null }>(
      "SELECT status, claimed_until, payment_intent_id FROM auto_topups WHERE id = $1",
      [id]
    ),
    (rows) => rows[0]
  )

/** Holds `billing_cards` locked on a connection of the test's own: a worker that claimed an attempt waits on its first read. */
const stallCardReads = Effect.acquireRelease(
  Effect.flatMap(TestServer, ({ databaseUrl }) =>
    Effect.promise(async () => {
      const client = new pg.Client({ connectionString: databaseUrl })
      await client.connect()
      await client.query("BEGIN")
      await client.query("LOCK TABLE billing_cards IN ACCESS EXCLUSIVE MODE")
      return client
    })),
  (client) => Effect.promise(() => client.query("ROLLBACK").then(() => client.end(), () => client.end()))
)

layer(Two, { excludeTestServices: true, timeout: 120_000 })("auto top-up claimed by two instances", (it) => {
  it.effect("the first claimer stalls past its lease and the other claims it again: the card is charged once", () =>
    Effect.gen(function*() {
      const stripe = yield* StripeDouble
      const { clock } = yield* TestServer
      const { accountId, token } = yield* developer("auto-race@example.com")
      yield* saveCard(token)
      const settings = yield* call("PUT", "/dashboard/billing/settings", {
        token,
        json: { auto_topup: { enabled: true, threshold_myr: 5, amount_myr: 10 } }
      })
      expect(settings.status, settings.text).toBe(200)

      yield* Effect.scoped(Effect.gen(function*() {
        const lock = yield* stallCardReads
        const id = newId("atu")
        yield* query(
          "INSERT INTO auto_topups (id, account_id, amount_sen, status, created_at) VALUES ($1, $2, 1000, 'queued', $3)",
          [id, accountId, new Date(clock.unsafeCurrentTimeMillis() - 1000)]
        )
        const first = yield* eventually("claimed", attempt(id), (row) => row?.status === "charging")
        // The claimer's lease lapses while it waits; the other instance, free, claims the attempt again.
        clock.advance("61 seconds")
        yield* eventually(
          "claimed again",
          attempt(id),
          (row) => row?.claimed_until?.getTime() !== first?.claimed_until?.getTime()
        )
        yield* Effect.promise(() => lock.query("COMMIT"))
        const key = `auto_topup_${id}`
        yield* eventually(
          "charged",
          Effect.sync(() => stripe.requests.filter((r) => r.idempotencyKey === key).length),
          (n) => n >= 1
        )
        yield* eventually("the intent recorded", attempt(id), (row) => row?.payment_intent_id != null)
        // Time for a second charge to be made, if one were coming.
        yield* Effect.sleep("1500 millis")
        expect(
          stripe.requests.filter((r) =>
            r.method === "POST" && r.path === "/v1/payment_intents" && r.idempotencyKey === key
          )
        ).toHaveLength(1)
        expect(stripe.paymentIntents.filter((intent) => intent.metadata?.["auto_topup_id"] === id)).toHaveLength(1)
        const transactions = yield* query<{ status: string }>(
          "SELECT status FROM payment_transactions WHERE account_id = $1 AND checkout_session_id IS NULL",
          [accountId]
        )
        expect(transactions.map((t) => t.status), "one pending payment, not one per claimer").toEqual(["pending"])
      }))
    }))
})
