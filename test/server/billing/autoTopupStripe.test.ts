import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { newId } from "../../../src/Domain/Ids.js"
import { expectClientError } from "../../support/ErrorBody.js"
import { call } from "../../support/Http.js"
import { deliverEvent, events, StripeDouble, testServerWithStripe, topUp } from "../../support/Stripe.js"
import { query, TestServer, TestServerLive } from "../../support/TestServer.js"
import { developer } from "../../support/Wallet.js"
import { eventually } from "../../support/WebhookReceiver.js"

/**
 * Auto top-up against Stripe, through the real SDK and the
 * Stripe stand-in: never a charge for a suspended account or one whose auto
 * top-up was turned off after the attempt was queued; an attempt claimed again
 * after its claimer made the PaymentIntent and died finds that intent, even
 * once Stripe has forgotten the idempotency key, and is credited once.
 */

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

const setAutoTopup = (token: string, enabled: boolean) =>
  Effect.map(
    call("PUT", "/dashboard/billing/settings", {
      token,
      json: { auto_topup: { enabled, threshold_myr: 5, amount_myr: 10 } }
    }),
    (reply) => {
      expect(reply.status, reply.text).toBe(200)
      expect(reply.body.auto_topup.enabled).toBe(enabled)
    }
  )

/**
 * An attempt as a settlement crossing the threshold queues it (`queueAutoTopups`). The worker knows nothing
 * else of when it was queued: a row it has not claimed yet is an attempt queued before what the test did.
 */
const queueAttempt = (accountId: string) =>
  Effect.gen(function*() {
    const { clock } = yield* TestServer
    const id = newId("atu")
    yield* query(
      "INSERT INTO auto_topups (id, account_id, amount_sen, status, created_at) VALUES ($1, $2, 1000, 'queued', $3)",
      [id, accountId, new Date(clock.unsafeCurrentTimeMillis() - 1000)]
    )
    return id
  })

interface AttemptRow {
  readonly status: string
  readonly failure_code: string | null
  readonly transaction_id: string | null
  readonly payment_intent_id: string | null
  readonly [column: string]: unknown
}

const attempt = (id: string) =>
  Effect.map(
    query<AttemptRow>("SELECT status, failure_code, transaction_id, payment_intent_id FROM auto_topups WHERE id = $1", [
      id
    ]),
    (rows) => rows[0]
  )

const ledger = (accountId: string) =>
  Effect.map(
    query<{ type: string; amount: string }>(
      "SELECT type, amount_micro_myr::text AS amount FROM ledger_entries WHERE account_id = $1 ORDER BY created_at, id",
      [accountId]
    ),
    (rows) => rows.map((row) => [row.type, Number(row.amount)])
  )

const customerOf = (accountId: string) =>
  Effect.map(
    query<{ customer_id: string }>("SELECT customer_id FROM billing_cards WHERE account_id = $1", [accountId]),
    (rows) => rows[0]?.customer_id
  )

/** The charges the Stripe stand-in made for the account's customer. */
const chargesOf = (accountId: string) =>
  Effect.gen(function*() {
    const stripe = yield* StripeDouble
    const customer = yield* customerOf(accountId)
    return stripe.paymentIntents.filter((intent) => intent.customer === customer)
  })

/** Waits for the worker to finish the attempt without a charge, and checks that nothing was charged or credited. */
const expectDropped = (accountId: string, id: string, code: string, ledgerBefore: ReadonlyArray<unknown>) =>
  Effect.gen(function*() {
    const row = yield* eventually(
      "attempt finished",
      attempt(id),
      (r) => r?.status !== "queued" && r?.status !== "charging"
    )
    expect(row).toMatchObject({ status: "failed", failure_code: code, payment_intent_id: null })
    expect(yield* chargesOf(accountId)).toEqual([])
    const stripe = yield* StripeDouble
    expect(stripe.requests.filter((r) => r.idempotencyKey === `auto_topup_${id}`)).toEqual([])
    expect(yield* ledger(accountId)).toEqual(ledgerBefore)
    if (row?.transaction_id != null) {
      const [transaction] = yield* query<{ status: string }>("SELECT status FROM payment_transactions WHERE id = $1", [
        row.transaction_id
      ])
      expect(transaction?.status).toBe("failed")
    }
  })

layer(testServerWithStripe(), { excludeTestServices: true, timeout: 120_000 })("auto top-up on Stripe", (it) => {
  it.effect("a suspended (disputed) account is never charged: the attempt fails as account_suspended, no PaymentIntent", () =>
    Effect.gen(function*() {
      const { accountId, token } = yield* developer("stripe-auto-suspended@example.com")
      const payment = yield* topUp(token, 1000)
      yield* saveCard(token)
      yield* setAutoTopup(token, true)
      const facts = {
        disputeId: "dp_auto_1",
        chargeId: payment.chargeId,
        paymentIntentId: payment.paymentIntentId,
        amountSen: 1000
      }
      for (const event of [events.disputeCreated(facts), events.fundsWithdrawn(facts)]) {
        const reply = yield* deliverEvent(event)
        expect(reply.status, reply.text).toBe(200)
      }
      const [account] = yield* query<{ suspended: boolean }>(
        "SELECT suspended_at IS NOT NULL AS suspended FROM accounts WHERE id = $1",
        [accountId]
      )
      expect(account?.suspended).toBe(true)
      const before = yield* ledger(accountId)
      expect(before).toEqual([["topup", 10_000_000], ["chargeback", -10_000_000]])
      const id = yield* queueAttempt(accountId)
      yield* expectDropped(accountId, id, "account_suspended", before)
    }))

  it.effect("auto top-up turned off, or the card removed, after the attempt was queued: not charged", () =>
    Effect.gen(function*() {
      const { accountId, token } = yield* developer("stripe-auto-off@example.com")
      yield* saveCard(token)
      yield* setAutoTopup(token, true)
      yield* setAutoTopup(token, false)
      const turnedOff = yield* queueAttempt(accountId)
      yield* expectDropped(accountId, turnedOff, "auto_topup_disabled", [])
      // Nothing told: the developer turned it off.
      const told = yield* query("SELECT type FROM outbox_events WHERE account_id = $1 AND type = 'auto_topup.failed'", [
        accountId
      ])
      expect(told).toEqual([])

      yield* setAutoTopup(token, true)
      const forgot = yield* call("DELETE", "/dashboard/billing/card", { token })
      expect(forgot.status, forgot.text).toBe(200)
      const cardRemoved = yield* queueAttempt(accountId)
      yield* expectDropped(accountId, cardRemoved, "auto_topup_disabled", [])
    }))

  it.effect("claimed again after its claimer made the PaymentIntent and died, once Stripe forgot the key: finds it, no second charge, credited once", () =>
    Effect.gen(function*() {
      const stripe = yield* StripeDouble
      const { clock } = yield* TestServer
      const { accountId, token } = yield* developer("stripe-auto-reclaim@example.com")
      yield* saveCard(token)
      yield* setAutoTopup(token, true)
      // The first claim's charge is made, but no answer of it (nor of the SDK's two retries) comes back.
      stripe.loseAnswers(3)
      const id = yield* queueAttempt(accountId)
      const key = `auto_topup_${id}`
      yield* eventually(
        "the lost answers",
        Effect.sync(() => stripe.requests.filter((r) => r.idempotencyKey === key).length),
        (n) => n >= 3
      )
      yield* Effect.sleep("300 millis")
      const [made] = yield* chargesOf(accountId)
      expect(yield* chargesOf(accountId)).toHaveLength(1)
      const lost = yield* attempt(id)
      expect(lost).toMatchObject({ status: "charging", payment_intent_id: null })
      // A day later Stripe has forgotten the key; the claimer's lease has long lapsed.
      stripe.forgetIdempotencyKeys()
      clock.advance("61 seconds")
      const found = yield* eventually("claimed again", attempt(id), (r) => r?.payment_intent_id != null)
      expect(found?.payment_intent_id).toBe(made?.id)
      expect(found?.status).toBe("charging")
      expect(yield* chargesOf(accountId)).toHaveLength(1)
      expect(stripe.requests.filter((r) => r.method === "POST" && r.path === "/v1/payment_intents").length).toBe(3)
      expect(yield* ledger(accountId)).toEqual([])

      const succeeded = (eventId: string) => ({
        ...events.other("payment_intent.succeeded"),
        id: eventId,
        data: { object: made }
      })
      const paid = yield* deliverEvent(succeeded("evt_auto_reclaim_1"))
      expect(paid.body, paid.text).toEqual({ received: true, processed: true })
      const again = yield* deliverEvent(succeeded("evt_auto_reclaim_2"))
      expect(again.body, again.text).toEqual({ received: true, processed: false })
      expect(yield* ledger(accountId)).toEqual([["topup", 10_000_000]])
      expect(yield* attempt(id)).toMatchObject({ status: "succeeded", payment_intent_id: made?.id })
      const [transaction] = yield* query<{ status: string; payment_intent_id: string }>(
        "SELECT status, payment_intent_id FROM payment_transactions WHERE id = $1",
        [found?.transaction_id]
      )
      expect(transaction).toEqual({ status: "succeeded", payment_intent_id: made?.id })
      // The worker leaves it alone now: still one charge.
      clock.advance("2 hours")
      yield* Effect.sleep("600 millis")
      expect(yield* chargesOf(accountId)).toHaveLength(1)
    }))
})

layer(TestServerLive({ ipCheckoutsPerMinute: 2 }), { excludeTestServices: true, timeout: 60_000 })(
  "saving a card is limited",
  (it) => {
    it.effect("like checkout creation, per client address: 429 with retry_after_seconds, no setup session made", () =>
      Effect.gen(function*() {
        const { accountId, token } = yield* developer("card-limit@example.com")
        const statuses: Array<number> = []
        for (let attempt = 0; attempt < 3; attempt++) {
          const reply = yield* call("POST", "/dashboard/billing/card", { token })
          statuses.push(reply.status)
          if (reply.status === 429) {
            expectClientError(reply, { status: 429, code: "rate_limit_exceeded" })
            expect(reply.body.error.retry_after_seconds).toBeGreaterThanOrEqual(1)
            expect(reply.body.error.retry_after_seconds).toBeLessThanOrEqual(60)
          }
        }
        expect(statuses).toEqual([200, 200, 429])
        const setups = yield* query("SELECT id FROM card_setups WHERE account_id = $1", [accountId])
        expect(setups).toHaveLength(2)
        // One budget with checkouts: alternating the two does not double it.
        const checkout = yield* call("POST", "/dashboard/billing/checkout", { token, json: { amount_sen: 1000 } })
        expect(checkout.status, checkout.text).toBe(429)
      }))
  }
)

layer(testServerWithStripe({ sstRateBps: 800 }), { excludeTestServices: true, timeout: 120_000 })(
  "auto top-up with service tax",
  (it) => {
    it.effect("charged like a checkout, the amount and 8% on top; the wallet credited the amount, with an invoice", () =>
      Effect.gen(function*() {
        const { accountId, token } = yield* developer("stripe-auto-sst@example.com")
        yield* saveCard(token)
        yield* setAutoTopup(token, true)
        const id = yield* queueAttempt(accountId)
        const charged = yield* eventually("charged", attempt(id), (r) => r?.payment_intent_id != null)
        const [made, ...more] = yield* chargesOf(accountId)
        expect(more).toEqual([])
        expect(made).toMatchObject({ amount: 1080, amount_received: 1080 })
        const [transaction] = yield* query<{ amount_sen: number; tax_sen: number }>(
          "SELECT amount_sen, tax_sen FROM payment_transactions WHERE id = $1",
          [charged?.transaction_id]
        )
        expect(transaction).toEqual({ amount_sen: 1000, tax_sen: 80 })
        const paid = yield* deliverEvent({ ...events.other("payment_intent.succeeded"), data: { object: made } })
        expect(paid.body, paid.text).toEqual({ received: true, processed: true })
        expect(yield* ledger(accountId)).toEqual([["topup", 10_000_000]])
        const invoices = yield* call("GET", "/dashboard/billing/invoices", { token })
        expect(
          invoices.body.data.map((
            d: { number: string; net_myr: number; total_myr: number }
          ) => [d.net_myr, d.total_myr])
        )
          .toEqual([[10, 10.8]])
      }))
  }
)
