import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { randomBase62 } from "../../src/Domain/Ids.js"
import { call } from "../support/Http.js"
import { deliverEvent, events, webhookOverrides } from "../support/Stripe.js"
import { query, TestServerLive } from "../support/TestServer.js"
import { developer, walletInstance } from "../support/Wallet.js"

/**
 * Webhook storm: signed Stripe events for many accounts, every kind the
 * receiver handles, each delivered 1–3 times, shuffled, 16 at once. The
 * balances must equal a model of Stripe's money computed here, independently
 * of the service, and the ledger invariant must hold for every account.
 */
const SMOKE = process.env["RELIABILITY_SMOKE"] === "1"
const ACCOUNTS = SMOKE ? 10 : 50
const TARGET_EVENTS = SMOKE ? 200 : 1000
const CONCURRENCY = 16
const SEN = 10_000
const AMOUNTS = [1000, 2500, 5000, 10000] as const

/** A seeded generator, so that a failing storm can be replayed. */
const seed = Number(process.env["STORM_SEED"] ?? Date.now() % 1_000_000)
let state = seed
const random = () => {
  state = (state * 1_103_515_245 + 12_345) % 2_147_483_648
  return state / 2_147_483_648
}
const pick = <A>(items: ReadonlyArray<A>): A => items[Math.floor(random() * items.length)] as A

interface Payment {
  readonly transactionId: string
  readonly sessionId: string
  readonly paymentIntentId: string
  readonly chargeId: string
  readonly amountSen: number
}

/** One payment's story: the events Stripe sends, and what it leaves in the wallet (micro-MYR) and in top-ups. */
interface Story {
  readonly events: ReadonlyArray<object>
  readonly balance: number
  readonly topup: number
}

const SCENARIOS = [
  "paid",
  "asyncPaid",
  "asyncFailed",
  "expired",
  "partialRefund",
  "fullRefund",
  "inquiry",
  "disputeWon",
  "disputeLost",
  "withdrawnReinstated",
  "refundThenLost"
] as const

const story = (kind: typeof SCENARIOS[number], p: Payment): Story => {
  const amount = p.amountSen * SEN
  const dispute = {
    disputeId: `dp_${randomBase62(24)}`,
    chargeId: p.chargeId,
    paymentIntentId: p.paymentIntentId,
    amountSen: p.amountSen
  }
  const refunded = (sen: number) => events.chargeRefunded({ ...p, amountRefundedSen: sen })
  const paid = events.checkoutCompleted(p)
  switch (kind) {
    case "paid":
      return { events: [paid], balance: amount, topup: amount }
    case "asyncPaid":
      return {
        events: [events.checkoutCompleted({ ...p, paymentStatus: "unpaid" }), events.asyncPaymentSucceeded(p)],
        balance: amount,
        topup: amount
      }
    case "asyncFailed":
      return {
        events: [events.checkoutCompleted({ ...p, paymentStatus: "unpaid" }), events.asyncPaymentFailed(p)],
        balance: 0,
        topup: 0
      }
    case "expired":
      return { events: [events.checkoutExpired(p)], balance: 0, topup: 0 }
    case "partialRefund": {
      const first = Math.floor(p.amountSen / 4)
      const second = Math.floor(p.amountSen / 2)
      // Cumulative refunded amounts: whichever arrives last, the larger one is what was refunded.
      return { events: [paid, refunded(first), refunded(second)], balance: amount - second * SEN, topup: amount }
    }
    case "fullRefund":
      return { events: [paid, refunded(p.amountSen)], balance: 0, topup: amount }
    case "inquiry":
      return {
        events: [
          paid,
          events.disputeCreated({ ...dispute, status: "warning_needs_response" }),
          events.disputeClosed({ ...dispute, status: "warning_closed" })
        ],
        balance: amount,
        topup: amount
      }
    case "disputeWon":
      return {
        events: [paid, events.disputeCreated(dispute), events.disputeClosed({ ...dispute, status: "won" })],
        balance: amount,
        topup: amount
      }
    case "disputeLost":
      return {
        events: [
          paid,
          events.disputeCreated(dispute),
          events.fundsWithdrawn(dispute),
          events.disputeClosed({ ...dispute, status: "lost" })
        ],
        balance: 0,
        topup: amount
      }
    case "withdrawnReinstated":
      return {
        events: [
          paid,
          events.disputeCreated({ ...dispute, status: "warning_needs_response" }),
          events.fundsWithdrawn(dispute),
          events.fundsReinstated(dispute),
          events.disputeClosed({ ...dispute, status: "won" })
        ],
        balance: amount,
        topup: amount
      }
    case "refundThenLost": {
      // A refund and a lost dispute on one payment: the balance may go below 0 (docs/money.md, "The money rules").
      const part = Math.floor(p.amountSen / 5)
      return {
        events: [
          paid,
          refunded(part),
          events.disputeCreated(dispute),
          events.disputeClosed({ ...dispute, status: "lost" })
        ],
        balance: -part * SEN,
        topup: amount
      }
    }
  }
}

const shuffle = <A>(items: Array<A>): Array<A> => {
  for (let i = items.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1))
    const swap = items[i] as A
    items[i] = items[j] as A
    items[j] = swap
  }
  return items
}

layer(TestServerLive(webhookOverrides), { excludeTestServices: true })("reliability: webhook storm", (it) => {
  it.scoped(`${TARGET_EVENTS} events for ${ACCOUNTS} accounts, each delivered 1–3 times, shuffled, ${CONCURRENCY} at once`, () =>
    Effect.gen(function*() {
      const inst = yield* walletInstance(yield* Effect.scope)
      const accounts = yield* Effect.all(
        Array.from({ length: ACCOUNTS }, (_, i) => developer(`storm-${seed}-${i}@example.com`)),
        { concurrency: 8 }
      )
      const expected = new Map(accounts.map((a) => [a.accountId, { balance: 0, topup: 0 }]))
      const all: Array<object> = []
      const kinds = new Map<string, number>()
      let turn = 0
      while (all.length < TARGET_EVENTS) {
        const account = accounts[turn++ % accounts.length]!
        const amountSen = pick(AMOUNTS)
        const checkout = yield* call("POST", "/dashboard/billing/checkout", {
          token: account.token,
          json: { amount_sen: amountSen }
        })
        expect(checkout.status, checkout.text).toBe(200)
        const payment: Payment = {
          transactionId: checkout.body.transaction_id,
          sessionId: checkout.body.session_id,
          paymentIntentId: `pi_${randomBase62(24)}`,
          chargeId: `ch_${randomBase62(24)}`,
          amountSen
        }
        const kind = pick(SCENARIOS)
        kinds.set(kind, (kinds.get(kind) ?? 0) + 1)
        const told = story(kind, payment)
        all.push(...told.events)
        const model = expected.get(account.accountId)!
        model.balance += told.balance
        model.topup += told.topup
      }
      const deliveries = shuffle(
        all.flatMap((event) => Array.from({ length: 1 + Math.floor(random() * 3) }, () => event))
      )

      const started = Date.now()
      const replies = yield* Effect.all(deliveries.map((event) => deliverEvent(event)), { concurrency: CONCURRENCY })
      const seconds = (Date.now() - started) / 1000
      const refused = replies.filter((r) => r.status !== 200)
      expect(refused.map((r) => `${r.status} ${r.text}`)).toEqual([])
      const processed = replies.filter((r) => r.body.processed === true).length
      console.log(
        `webhook storm (seed ${seed}): ${all.length} events, ${deliveries.length} deliveries, ${ACCOUNTS} accounts, ` +
          `${processed} applied, ${seconds.toFixed(1)} s; stories ${JSON.stringify(Object.fromEntries(kinds))}`
      )
      // Each distinct event was recorded once, whatever its number of deliveries.
      const recorded = yield* query<{ n: string }>("SELECT count(*) AS n FROM webhook_events")
      expect(Number(recorded[0]?.n)).toBe(all.length)

      for (const account of accounts) {
        const model = expected.get(account.accountId)!
        const wallet = yield* inst.wallet.wallet(account.accountId)
        expect({ account: account.accountId, available: wallet.availableMicroMyr, topup: wallet.lifetimeTopupMicroMyr })
          .toEqual({
            account: account.accountId,
            available: model.balance,
            topup: model.topup
          })
        expect(wallet.reservedMicroMyr).toBe(0)
        expect((yield* inst.invariant(account.accountId)).violations).toEqual([])
      }
      // Every dispute closed: nobody is left suspended.
      const suspended = yield* query<{ n: string }>("SELECT count(*) AS n FROM accounts WHERE suspended_at IS NOT NULL")
      expect(Number(suspended[0]?.n)).toBe(0)
    }))
})
