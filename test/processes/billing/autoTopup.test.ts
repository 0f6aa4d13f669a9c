import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { call, createKey } from "../../support/Http.js"
import { modelCall } from "../../support/Models.js"
import { deliverEvent, events, simulatedTopUp } from "../../support/Stripe.js"
import { query } from "../../support/TestServer.js"
import { ASK, Instances, on, outcome } from "../../support/TwoInstances.js"
import { developer } from "../../support/Wallet.js"
import { eventually, TwoInstancesWithReceiver } from "../../support/WebhookReceiver.js"

/**
 * Auto top-up on two instances with the simulated checkout: a card
 * saved through the setup page, charged off-session once per crossing under a
 * burst on both instances and credited once (on `payment_intent.succeeded`,
 * through the receiver); Stripe's declined and authentication-required test
 * cards turn it off and tell the developer; a refund never charges.
 */

const Two = TwoInstancesWithReceiver("autotopup")

/** Saves a card through the simulated setup page, as the browser would post its form. */
const saveCard = (token: string, cardNumber: string) =>
  Effect.gen(function*() {
    const started = yield* call("POST", "/dashboard/billing/card", { token })
    expect(started.status, started.text).toBe(200)
    const path = new URL(started.body.url as string).pathname
    expect((yield* call("GET", path)).text).toContain("card_number")
    const saved = yield* call("POST", `${path}/save`, {
      body: `card_number=${cardNumber}`,
      headers: { "content-type": "application/x-www-form-urlencoded" }
    })
    expect(saved.status, saved.text).toBe(200)
    return saved
  })

const balanceMicro = (token: string) =>
  Effect.map(
    call("GET", "/dashboard/billing/balance", { token }),
    (reply) => (reply.body.wallet.availableMicroMyr as number) + (reply.body.wallet.reservedMicroMyr as number)
  )

const attempts = (accountId: string) =>
  query<{ status: string; failure_code: string | null; amount_sen: number }>(
    "SELECT status, failure_code, amount_sen FROM auto_topups WHERE account_id = $1 ORDER BY created_at",
    [accountId]
  )

const topupEntries = (accountId: string) =>
  query<{ amount: string }>(
    "SELECT amount_micro_myr::text AS amount FROM ledger_entries WHERE account_id = $1 AND type = 'topup' ORDER BY created_at",
    [accountId]
  )

/** A developer with RM 10, a key, one call's price measured, and a card saved. */
const ready = (email: string, cardNumber: string) =>
  Effect.gen(function*() {
    const { a } = yield* Instances
    const { accountId, token } = yield* on(a)(developer(email))
    const sessionId = (yield* on(a)(simulatedTopUp(token, 1000))).sessionId
    const key = yield* on(a)(createKey(token, { name: "burst" }))
    const start = yield* on(a)(balanceMicro(token))
    expect(outcome(yield* on(a)(modelCall(key.full_key, "/v1/responses", ASK)))).toBe("200")
    const balance = yield* on(a)(balanceMicro(token))
    yield* on(a)(saveCard(token, cardNumber))
    return { accountId, token, key: key.full_key, price: start - balance, balance, sessionId }
  })

const burst = (key: string) =>
  Effect.gen(function*() {
    const { a, b } = yield* Instances
    const one = (base: string) =>
      Effect.forEach(Array.from({ length: 8 }), () => on(base)(modelCall(key, "/v1/responses", ASK)), {
        concurrency: 4
      })
    const replies = yield* Effect.all([one(a), one(b)], { concurrency: 2 })
    expect(replies.flat().map(outcome).filter((o) => o !== "200")).toEqual([])
  })

const enable = (token: string, thresholdMicro: number) =>
  Effect.map(
    call("PUT", "/dashboard/billing/settings", {
      token,
      json: { auto_topup: { enabled: true, threshold_myr: thresholdMicro / 1e6, amount_myr: 10 } }
    }),
    (reply) => {
      expect(reply.status, reply.text).toBe(200)
      return reply.body
    }
  )

layer(Two, { excludeTestServices: true, timeout: 180_000 })("auto top-up on two instances", (it) => {
  it.effect("a burst on both instances below the threshold: exactly one charge, credited once, on payment_intent.succeeded", () =>
    Effect.gen(function*() {
      const { a, b } = yield* Instances
      const dev = yield* ready("auto-ok@example.com", "4242424242424242")
      const settings = yield* on(b)(enable(dev.token, dev.balance - Math.round(3.5 * dev.price)))
      expect(settings.card).toEqual({ brand: "visa", last4: "4242", exp_month: 12, exp_year: 2034 })
      expect(settings.auto_topup).toMatchObject({ enabled: true, amount_myr: 10, max_per_day: 3 })
      yield* burst(dev.key)
      const done = yield* eventually(
        "charged",
        attempts(dev.accountId),
        (rows) => rows.length >= 1 && rows.every((r) => r.status === "succeeded")
      )
      yield* Effect.sleep("500 millis")
      expect(yield* attempts(dev.accountId)).toEqual(done)
      expect(done.length).toBe(1)
      expect(yield* topupEntries(dev.accountId)).toEqual([{ amount: "10000000" }, { amount: "10000000" }])
      const payments = yield* query<{ status: string; payment_intent_id: string }>(
        "SELECT status, payment_intent_id FROM payment_transactions WHERE account_id = $1 AND checkout_session_id IS NULL",
        [dev.accountId]
      )
      expect(payments.map((p) => p.status)).toEqual(["succeeded"])
      expect(payments[0]!.payment_intent_id).toMatch(/^pi_sim_/)
      const told = yield* query<{ payload: { data: { automatic: boolean } } }>(
        "SELECT payload FROM outbox_events WHERE account_id = $1 AND type = 'topup.succeeded' ORDER BY created_at",
        [dev.accountId]
      )
      expect(told.map((e) => e.payload.data.automatic)).toEqual([false, true])
      // payment_intent.succeeded delivered again (as Stripe may, with a new event id) credits nothing more.
      const [paid] = yield* query<{ id: string; transaction_id: string; payment_intent_id: string }>(
        "SELECT id, transaction_id, payment_intent_id FROM auto_topups WHERE account_id = $1",
        [dev.accountId]
      )
      const again = yield* on(a)(deliverEvent({
        id: "evt_redelivered_1",
        object: "event",
        type: "payment_intent.succeeded",
        data: {
          object: {
            id: paid!.payment_intent_id,
            object: "payment_intent",
            amount: 1000,
            amount_received: 1000,
            currency: "myr",
            status: "succeeded",
            metadata: { transaction_id: paid!.transaction_id, account_id: dev.accountId, auto_topup_id: paid!.id }
          }
        }
      }))
      expect(again.status, again.text).toBe(200)
      expect(again.body).toEqual({ received: true, processed: false })
      expect((yield* topupEntries(dev.accountId)).length).toBe(2)
    }))

  for (
    const [card, code] of [["4000000000000002", "card_declined"], [
      "4000002500003155",
      "authentication_required"
    ]] as const
  ) {
    it.effect(`the ${code} card turns auto top-up off and tells the developer: banner, email, auto_topup.failed with action_url`, () =>
      Effect.gen(function*() {
        const { a, b } = yield* Instances
        const dev = yield* ready(`auto-${code}@example.com`, card)
        yield* on(a)(enable(dev.token, dev.balance - Math.round(3.5 * dev.price)))
        yield* burst(dev.key)
        const rows = yield* eventually(
          "refused",
          attempts(dev.accountId),
          (r) => r.length >= 1 && r.every((x) => x.status === "failed")
        )
        expect(rows).toEqual([{ status: "failed", failure_code: code, amount_sen: 1000 }])
        const settings = (yield* on(b)(call("GET", "/dashboard/billing/settings", { token: dev.token }))).body
        expect(settings.auto_topup.enabled).toBe(false)
        expect(settings.auto_topup.action_url).toBe(`${a}/app/billing?card=update`)
        const banners = (yield* on(b)(call("GET", "/dashboard/alerts", { token: dev.token }))).body.banners as Array<
          { kind: string; action_url: string }
        >
        expect(banners.find((x) => x.kind === "auto_topup_failed")?.action_url).toBe(`${a}/app/billing?card=update`)
        const failed = yield* query<{ payload: { data: { reason: string; action_url: string } } }>(
          "SELECT payload FROM outbox_events WHERE account_id = $1 AND type = 'auto_topup.failed'",
          [dev.accountId]
        )
        expect(failed.map((e) => e.payload.data)).toEqual([
          expect.objectContaining({ reason: code, action_url: `${a}/app/billing?card=update` })
        ])
        const mail = yield* eventually(
          "email",
          query<{ subject: string; status: string }>(
            "SELECT subject, status FROM outbox_emails WHERE account_id = $1",
            [dev.accountId]
          ),
          (m) => m.length >= 1 && m.every((x) => x.status === "kept")
        )
        expect(mail.map((m) => m.subject)).toEqual(["Auto top-up failed and is now off"])
        // No money moved: one top-up, the first.
        expect((yield* topupEntries(dev.accountId)).length).toBe(1)
        // Off: more usage below the threshold charges nothing.
        yield* burst(dev.key)
        yield* Effect.sleep("300 millis")
        expect((yield* attempts(dev.accountId)).length).toBe(1)
      }))
  }

  it.effect("a refund that takes the balance below the threshold never triggers a charge", () =>
    Effect.gen(function*() {
      const { a } = yield* Instances
      const dev = yield* ready("auto-refund@example.com", "4242424242424242")
      yield* on(a)(enable(dev.token, dev.balance - 1_000_000))
      const refunded = yield* on(a)(deliverEvent(events.chargeRefunded({
        chargeId: "ch_sim_refund_1",
        paymentIntentId: `pi_sim_${dev.sessionId.slice(-24)}`,
        amountSen: 1000,
        amountRefundedSen: 500
      })))
      expect(refunded.status, refunded.text).toBe(200)
      expect(refunded.body.processed).toBe(true)
      expect(yield* on(a)(balanceMicro(dev.token))).toBeLessThan(dev.balance - 1_000_000)
      yield* Effect.sleep("500 millis")
      expect(yield* attempts(dev.accountId)).toEqual([])
    }))

  it.effect("a dispute's suspension and its lifting are announced: account.suspended, then account.reinstated, once each", () =>
    Effect.gen(function*() {
      const { a } = yield* Instances
      const { accountId, token } = yield* on(a)(developer("auto-dispute@example.com"))
      const sessionId = (yield* on(a)(simulatedTopUp(token, 1000))).sessionId
      const facts = {
        disputeId: "dp_sim_1",
        chargeId: "ch_sim_dispute_1",
        paymentIntentId: `pi_sim_${sessionId.slice(-24)}`,
        amountSen: 1000
      }
      for (
        const event of [
          events.disputeCreated(facts),
          events.fundsWithdrawn(facts),
          events.fundsReinstated(facts),
          events.disputeClosed({ ...facts, status: "won" })
        ]
      ) {
        const reply = yield* on(a)(deliverEvent(event))
        expect(reply.status, reply.text).toBe(200)
      }
      const announced = yield* query<{ type: string }>(
        "SELECT type FROM outbox_events WHERE account_id = $1 AND type LIKE 'account.%' ORDER BY created_at",
        [accountId]
      )
      expect(announced.map((e) => e.type)).toEqual(["account.suspended", "account.reinstated"])
    }))

  it.effect("enabling needs a saved card, a threshold and an amount; forgetting the card turns it off", () =>
    Effect.gen(function*() {
      const { a } = yield* Instances
      const { token } = yield* on(a)(developer("auto-rules@example.com"))
      const noCard = yield* on(a)(
        call("PUT", "/dashboard/billing/settings", {
          token,
          json: { auto_topup: { enabled: true, threshold_myr: 5, amount_myr: 10 } }
        })
      )
      expect(noCard.status).toBe(400)
      expect(noCard.body.error.param).toBe("auto_topup.enabled")
      yield* on(a)(saveCard(token, "4242424242424242"))
      const noAmount = yield* on(a)(
        call("PUT", "/dashboard/billing/settings", { token, json: { auto_topup: { enabled: true, threshold_myr: 5 } } })
      )
      expect(noAmount.body.error.param).toBe("auto_topup.amount_myr")
      const badAmount = yield* on(a)(
        call("PUT", "/dashboard/billing/settings", {
          token,
          json: { auto_topup: { enabled: true, threshold_myr: 5, amount_myr: 7 } }
        })
      )
      expect(badAmount.status).toBe(400)
      const unknownCard = yield* on(a)(call("POST", "/dashboard/billing/card", { token }))
      const path = new URL(unknownCard.body.url as string).pathname
      const refused = yield* on(a)(
        call("POST", `${path}/save`, {
          body: "card_number=1234123412341234",
          headers: { "content-type": "application/x-www-form-urlencoded" }
        })
      )
      expect(refused.status).toBe(400)
      expect((yield* on(a)(enable(token, 5_000_000))).auto_topup.enabled).toBe(true)
      const forgot = yield* on(a)(call("DELETE", "/dashboard/billing/card", { token }))
      expect(forgot.body).toMatchObject({ card: null, auto_topup: { enabled: false, disabled_reason: null } })
    }))
})
