import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { microMyr } from "../../../src/Domain/Money.js"
import { call, devToken, type Reply } from "../../support/Http.js"
import { StripeDouble, TestServerWithStripe, topUp, webhookOverrides } from "../../support/Stripe.js"
import { query, TestServer, TestServerLive } from "../../support/TestServer.js"
import { developer, walletInstance } from "../../support/Wallet.js"

/**
 * The dashboard's billing endpoints (docs/money.md, "The money rules";
 * docs/money.md, "Payments (Stripe)";
 * docs/api/dashboard.md, "Dashboard API details"): Stripe Checkout through a
 * local double of Stripe's API, the balance and the ledger, and the simulated
 * checkout used when Stripe is not configured.
 */

const TOPUP_OPTIONS = [1000, 2500, 5000, 10000, 25000, 50000] as const

const ERROR_KEYS = ["message", "type", "code", "param", "request_id", "guidance", "action_url", "retryable"] as const

/** The spec's error body with this status and code; `name` labels every assertion. */
const expectError = (
  reply: Reply,
  name: string,
  expected: { readonly status: number; readonly code: string; readonly type: string; readonly param?: string | null }
) => {
  expect(reply.status, `${name}: status (${reply.text})`).toBe(expected.status)
  expect(reply.headers.get("content-type") ?? "", `${name}: content-type`).toContain("application/json")
  expect(reply.body?.type, `${name}: body.type (${reply.text})`).toBe("error")
  const error = reply.body.error
  for (const key of ERROR_KEYS) expect(Object.keys(error), `${name}: error.${key} present`).toContain(key)
  expect(error.code, `${name}: error.code`).toBe(expected.code)
  expect(error.type, `${name}: error.type`).toBe(expected.type)
  expect(error.message, `${name}: error.message`).toBeTypeOf("string")
  expect(error.message.length, `${name}: error.message non-empty`).toBeGreaterThan(0)
  expect(error.guidance, `${name}: error.guidance`).toBeTypeOf("string")
  expect(error.request_id, `${name}: x-request-id equals error.request_id`).toBe(reply.headers.get("x-request-id"))
  if (expected.param !== undefined) expect(error.param, `${name}: error.param`).toBe(expected.param)
  return error
}

const expectInvalid = (reply: Reply, name: string, param: string | null) => {
  const error = expectError(reply, name, { status: 400, code: "invalid_request", type: "invalid_request_error", param })
  expect(error.retryable, `${name}: retryable`).toBe(false)
}

const checkout = (token: string, json: unknown) => call("POST", "/dashboard/billing/checkout", { token, json })
const balance = (token: string) =>
  Effect.map(call("GET", "/dashboard/billing/balance", { token }), (reply) => {
    expect(reply.status, reply.text).toBe(200)
    return reply.body
  })
interface Entry {
  readonly id: string
  readonly type: string
  readonly amountMicroMyr: number
  readonly balanceAfterMicroMyr: number
  readonly description: string
  readonly createdAt: string
}

const ledger = (token: string, query = "") =>
  Effect.map(call("GET", `/dashboard/billing/transactions${query}`, { token }), (reply) => {
    expect(reply.status, reply.text).toBe(200)
    return reply.body as { ledger: Array<Entry>; page: number; limit: number }
  })

/** No `SST_RATE_BPS`: each option costs what it credits. */
const UNTAXED_OPTIONS = {
  topup_options: TOPUP_OPTIONS.map((amount) => ({ amount_sen: amount, tax_sen: 0, total_sen: amount })),
  sst_rate_bps: 0
}

const EMPTY_WALLET = { availableMicroMyr: 0, reservedMicroMyr: 0, lifetimeTopupMicroMyr: 0, lifetimeSpendMicroMyr: 0 }

const transactionStatus = (transactionId: string) =>
  Effect.map(
    query<{ status: string }>("SELECT status FROM payment_transactions WHERE id = $1", [transactionId]),
    (rows) => rows[0]?.status
  )

layer(TestServerWithStripe, { excludeTestServices: true })("billing with Stripe", (it) => {
  describe("POST /dashboard/billing/checkout", () => {
    it.effect("creates a Stripe Checkout session and credits nothing yet", () =>
      Effect.gen(function*() {
        const stripe = yield* StripeDouble
        const { baseUrl } = yield* TestServer
        const { token } = yield* developer("billing-checkout@example.com")
        const before = stripe.requests.length
        const reply = yield* checkout(token, { amount_sen: 2500 })
        expect(reply.status, reply.text).toBe(200)
        const { session_id, transaction_id, url } = reply.body
        expect(session_id).toBeTypeOf("string")
        expect(transaction_id).toBeTypeOf("string")
        expect(url).toBeTypeOf("string")
        expect(transaction_id.length).toBeGreaterThan(0)
        // The double's session: its id and its hosted page.
        expect(session_id).toMatch(/^cs_test_/)
        expect(url).toBe(`https://checkout.stripe.test/c/pay/${session_id}`)

        const sent = stripe.requests.slice(before)
        expect(sent).toHaveLength(1)
        const [request] = sent
        expect(request!.method).toBe("POST")
        expect(request!.path).toBe("/v1/checkout/sessions")
        expect(request!.form).toMatchObject({
          mode: "payment",
          "line_items[0][quantity]": "1",
          "line_items[0][price_data][currency]": "myr",
          "line_items[0][price_data][unit_amount]": "2500",
          client_reference_id: transaction_id,
          "metadata[transaction_id]": transaction_id
        })
        const successUrl = request!.form["success_url"]
        const cancelUrl = request!.form["cancel_url"]
        expect(successUrl).toBeTypeOf("string")
        expect(cancelUrl).toBeTypeOf("string")
        expect(successUrl!.startsWith(baseUrl)).toBe(true)
        expect(cancelUrl!.startsWith(baseUrl)).toBe(true)
        expect(successUrl).not.toBe(cancelUrl)
        expect(request!.idempotencyKey).toBeTypeOf("string")
        expect(request!.idempotencyKey!.length).toBeGreaterThan(0)

        const wallet = yield* balance(token)
        expect(wallet.wallet).toEqual(EMPTY_WALLET)
        expect(wallet.balance_myr).toBe(0)
        expect((yield* ledger(token)).ledger).toEqual([])
        expect(yield* transactionStatus(transaction_id)).toBe("pending")
      }))

    it.effect("each checkout is its own transaction, sent with its own idempotency key", () =>
      Effect.gen(function*() {
        const stripe = yield* StripeDouble
        const { token } = yield* developer("billing-two-checkouts@example.com")
        const before = stripe.requests.length
        const first = yield* checkout(token, { amount_sen: 1000 })
        const second = yield* checkout(token, { amount_sen: 1000 })
        expect(first.status, first.text).toBe(200)
        expect(second.status, second.text).toBe(200)
        expect(second.body.transaction_id).not.toBe(first.body.transaction_id)
        expect(second.body.session_id).not.toBe(first.body.session_id)
        const sent = stripe.requests.slice(before)
        expect(sent).toHaveLength(2)
        expect(sent[0]!.idempotencyKey).not.toBe(sent[1]!.idempotencyKey)
        expect(sent.map((r) => r.form["client_reference_id"])).toEqual([
          first.body.transaction_id,
          second.body.transaction_id
        ])
      }))

    it.effect("every allowed amount is accepted and sent to Stripe as its unit_amount", () =>
      Effect.gen(function*() {
        const stripe = yield* StripeDouble
        const { token } = yield* developer("billing-amounts@example.com")
        for (const amount of TOPUP_OPTIONS) {
          const before = stripe.requests.length
          const reply = yield* checkout(token, { amount_sen: amount })
          expect(reply.status, `${amount}: ${reply.text}`).toBe(200)
          const sent = stripe.requests.slice(before)
          expect(sent, `${amount}: one request to Stripe`).toHaveLength(1)
          expect(sent[0]!.form["line_items[0][price_data][unit_amount]"]).toBe(String(amount))
          expect(sent[0]!.form["client_reference_id"]).toBe(reply.body.transaction_id)
        }
        expect((yield* balance(token)).wallet).toEqual(EMPTY_WALLET)
      }))

    it.effect("a processor that keeps failing answers 502 billing_error, credits nothing, and a later checkout works", () =>
      Effect.gen(function*() {
        const stripe = yield* StripeDouble
        const { accountId, token } = yield* developer("billing-processor-down@example.com")
        const before = stripe.requests.length
        stripe.failNext(5, 500)
        const reply = yield* checkout(token, { amount_sen: 1000 })
        const error = expectError(reply, "Stripe 500", { status: 502, code: "billing_error", type: "billing_error" })
        expect(error.retryable).toBe(true)
        expect(error.message).not.toContain("sk_test_nenas_double")
        const attempts = stripe.requests.slice(before)
        // The SDK retried, each time with the same idempotency key: Stripe creates at most one session.
        expect(attempts.length).toBeGreaterThan(1)
        expect(new Set(attempts.map((r) => r.idempotencyKey)).size).toBe(1)
        expect(attempts[0]!.idempotencyKey).toBeTypeOf("string")
        stripe.failNext(0, 500)

        expect((yield* balance(token)).wallet).toEqual(EMPTY_WALLET)
        expect((yield* ledger(token)).ledger).toEqual([])
        const transactions = yield* query<{ id: string; status: string }>(
          "SELECT id, status FROM payment_transactions WHERE account_id = $1",
          [accountId]
        )
        expect(transactions.map((t) => t.status)).toEqual(["failed"])
        expect(transactions[0]!.id).toBe(attempts[0]!.form["client_reference_id"])

        const later = yield* checkout(token, { amount_sen: 1000 })
        expect(later.status, later.text).toBe(200)
        expect(later.body.transaction_id).not.toBe(transactions[0]!.id)
        expect(yield* transactionStatus(later.body.transaction_id)).toBe("pending")
      }))

    it.effect("a request Stripe refuses (400) answers 502 billing_error", () =>
      Effect.gen(function*() {
        const stripe = yield* StripeDouble
        const { token } = yield* developer("billing-processor-400@example.com")
        const before = stripe.requests.length
        stripe.failNext(1, 400)
        const reply = yield* checkout(token, { amount_sen: 2500 })
        expectError(reply, "Stripe 400", { status: 502, code: "billing_error", type: "billing_error" })
        // A 400 is not retried.
        expect(stripe.requests.slice(before)).toHaveLength(1)
        expect((yield* balance(token)).wallet).toEqual(EMPTY_WALLET)
        const again = yield* checkout(token, { amount_sen: 2500 })
        expect(again.status, again.text).toBe(200)
      }))

    describe("invalid amounts answer 400 invalid_request and reach no processor", () => {
      const cases: ReadonlyArray<{ name: string; json?: unknown; raw?: string; param: string | null }> = [
        { name: "999 sen (not an option)", json: { amount_sen: 999 }, param: "amount_sen" },
        { name: "0", json: { amount_sen: 0 }, param: "amount_sen" },
        { name: "-1000", json: { amount_sen: -1000 }, param: "amount_sen" },
        { name: "1000.5", json: { amount_sen: 1000.5 }, param: "amount_sen" },
        { name: "100000 (above the largest option)", json: { amount_sen: 100000 }, param: "amount_sen" },
        { name: "\"1000\" as a string", json: { amount_sen: "1000" }, param: "amount_sen" },
        { name: "null", json: { amount_sen: null }, param: "amount_sen" },
        { name: "missing field", json: { amount_myr: 10 }, param: "amount_sen" },
        { name: "empty object", json: {}, param: "amount_sen" },
        // Whole-body problems name no field (as everywhere in the API: see validation.test.ts).
        { name: "non-JSON body", raw: "amount_sen=1000", param: null },
        { name: "malformed JSON", raw: "{\"amount_sen\":", param: null },
        { name: "array body", json: [{ amount_sen: 1000 }], param: null }
      ]
      for (const c of cases) {
        it.effect(c.name, () =>
          Effect.gen(function*() {
            const stripe = yield* StripeDouble
            const token = yield* devToken("billing-invalid@example.com")
            const before = stripe.requests.length
            const reply = c.raw === undefined
              ? yield* checkout(token, c.json)
              : yield* call("POST", "/dashboard/billing/checkout", {
                token,
                body: c.raw,
                headers: { "content-type": "application/json" }
              })
            expectInvalid(reply, c.name, c.param)
            expect(stripe.requests.length, `${c.name}: nothing sent to Stripe`).toBe(before)
          }))
      }

      it.effect("no pending transaction was left by the invalid requests", () =>
        Effect.gen(function*() {
          const { accountId } = yield* developer("billing-invalid@example.com")
          const rows = yield* query("SELECT id FROM payment_transactions WHERE account_id = $1", [accountId])
          expect(rows).toEqual([])
        }))
    })

    it.effect("a body that is not an object is reported without the schema's internal name", () =>
      Effect.gen(function*() {
        // As for POST /dashboard/api-keys (keys.test.ts): "Expected a JSON object", never a type name.
        const token = yield* devToken("billing-invalid@example.com")
        const array = yield* checkout(token, [])
        expectInvalid(array, "array body", null)
        expect(array.body.error.message).toBe("Invalid request: Expected a JSON object, actual []")
        const string = yield* checkout(token, "x")
        expectInvalid(string, "string body", null)
        expect(string.body.error.message).not.toContain("CheckoutRequest")
        expect(string.body.error.message).toContain("Expected a JSON object")
      }))

    it.effect("without a valid session token: 401 authentication_error, nothing sent to Stripe", () =>
      Effect.gen(function*() {
        const stripe = yield* StripeDouble
        const before = stripe.requests.length
        const missing = yield* call("POST", "/dashboard/billing/checkout", { json: { amount_sen: 1000 } })
        expectError(missing, "no token", { status: 401, code: "authentication_error", type: "authentication_error" })
        const garbage = yield* checkout("not-a-session-token", { amount_sen: 1000 })
        expectError(garbage, "garbage token", {
          status: 401,
          code: "authentication_error",
          type: "authentication_error"
        })
        const balanceReply = yield* call("GET", "/dashboard/billing/balance", { token: "garbage.token.here" })
        expectError(balanceReply, "balance, garbage token", {
          status: 401,
          code: "authentication_error",
          type: "authentication_error"
        })
        const ledgerReply = yield* call("GET", "/dashboard/billing/transactions")
        expectError(ledgerReply, "transactions, no token", {
          status: 401,
          code: "authentication_error",
          type: "authentication_error"
        })
        expect(stripe.requests.length).toBe(before)
      }))
  })

  describe("GET /dashboard/billing/balance", () => {
    it.effect("a new account: zeros and the top-up options", () =>
      Effect.gen(function*() {
        const { token } = yield* developer("billing-balance-new@example.com")
        expect(yield* balance(token)).toEqual({
          wallet: EMPTY_WALLET,
          balance_myr: 0,
          reserved_myr: 0,
          lifetime_topup_myr: 0,
          lifetime_spend_myr: 0,
          topup_options_sen: [...TOPUP_OPTIONS],
          ...UNTAXED_OPTIONS,
          account_suspended: false
        })
      }))

    it.scoped("follows top-ups, reservations and captures, in micro-MYR and in MYR", () =>
      Effect.gen(function*() {
        const { accountId, token } = yield* developer("billing-balance@example.com")
        yield* topUp(token, 1000)
        const topped = yield* balance(token)
        expect(topped).toEqual({
          wallet: {
            availableMicroMyr: 10_000_000,
            reservedMicroMyr: 0,
            lifetimeTopupMicroMyr: 10_000_000,
            lifetimeSpendMicroMyr: 0
          },
          balance_myr: 10,
          reserved_myr: 0,
          lifetime_topup_myr: 10,
          lifetime_spend_myr: 0,
          topup_options_sen: [...TOPUP_OPTIONS],
          ...UNTAXED_OPTIONS,
          account_suspended: false
        })
        for (
          const field of ["availableMicroMyr", "reservedMicroMyr", "lifetimeTopupMicroMyr", "lifetimeSpendMicroMyr"]
        ) {
          expect(Number.isInteger(topped.wallet[field]), field).toBe(true)
        }

        const instance = yield* walletInstance(yield* Effect.scope)
        const reservation = yield* instance.wallet.reserve({
          accountId,
          apiKeyId: "key_x",
          requestId: "req_x",
          amountMicroMyr: microMyr(1_234_567),
          monthlySpendLimitMicroMyr: null,
          memberId: null,
          memberMonthlySpendLimitMicroMyr: null
        })
        const reserved = yield* balance(token)
        expect(reserved.wallet).toEqual({
          availableMicroMyr: 8_765_433,
          reservedMicroMyr: 1_234_567,
          lifetimeTopupMicroMyr: 10_000_000,
          lifetimeSpendMicroMyr: 0
        })
        expect(reserved.reserved_myr).toBe(1.234567)
        expect(reserved.balance_myr).toBe(8.765433)
        expect(reserved.lifetime_topup_myr).toBe(10)

        const captured = yield* instance.wallet.capture(reservation.id, microMyr(234_567), "test usage")
        expect(captured.chargedMicroMyr).toBe(234_567)
        const spent = yield* balance(token)
        expect(spent.wallet).toEqual({
          availableMicroMyr: 9_765_433,
          reservedMicroMyr: 0,
          lifetimeTopupMicroMyr: 10_000_000,
          lifetimeSpendMicroMyr: 234_567
        })
        expect(spent.balance_myr).toBe(9.765433)
        expect(spent.reserved_myr).toBe(0)
        expect(spent.lifetime_spend_myr).toBe(0.234567)
        expect((yield* instance.invariant(accountId)).violations).toEqual([])
      }))

    it.scoped("a negative balance (a debit larger than the wallet) is reported as a negative number", () =>
      Effect.gen(function*() {
        const { accountId, token } = yield* developer("billing-balance-negative@example.com")
        yield* topUp(token, 1000)
        const instance = yield* walletInstance(yield* Effect.scope)
        const posted = yield* instance.wallet.post({
          accountId,
          type: "adjustment",
          amountMicroMyr: -12_500_001,
          effectKey: `test-negative-${accountId}`,
          description: "test debit"
        })
        expect(posted).toBe(true)
        const reply = yield* balance(token)
        expect(reply.wallet.availableMicroMyr).toBe(-2_500_001)
        expect(reply.balance_myr).toBe(-2.500001)
        expect(reply.lifetime_topup_myr).toBe(10)
      }))
  })

  describe("GET /dashboard/billing/transactions", () => {
    /** Five entries, oldest first: top-ups of RM 10 and 25, +RM 5 and -RM 1 adjustments, a top-up of RM 50. */
    const seedLedger = (email: string) =>
      Effect.gen(function*() {
        const { accountId, token } = yield* developer(email)
        const instance = yield* walletInstance(yield* Effect.scope)
        const adjust = (amountMicroMyr: number, description: string) =>
          instance.wallet.post({
            accountId,
            type: "adjustment",
            amountMicroMyr,
            effectKey: `test-${description}-${accountId}`,
            description
          })
        yield* topUp(token, 1000)
        yield* topUp(token, 2500)
        expect(yield* adjust(5_000_000, "goodwill credit")).toBe(true)
        expect(yield* adjust(-1_000_000, "correction")).toBe(true)
        yield* topUp(token, 5000)
        return { accountId, token }
      })

    it.scoped("newest first, with every field, and the default page", () =>
      Effect.gen(function*() {
        const { token } = yield* seedLedger("billing-ledger@example.com")
        const reply = yield* ledger(token)
        expect(reply.page).toBe(1)
        expect(reply.limit).toBe(50)
        const entries = reply.ledger
        expect(entries.map((e) => [e.type, e.amountMicroMyr, e.balanceAfterMicroMyr])).toEqual([
          ["topup", 50_000_000, 89_000_000],
          ["adjustment", -1_000_000, 39_000_000],
          ["adjustment", 5_000_000, 40_000_000],
          ["topup", 25_000_000, 35_000_000],
          ["topup", 10_000_000, 10_000_000]
        ])
        for (const entry of entries) {
          expect(Object.keys(entry).sort()).toEqual(
            ["amountMicroMyr", "balanceAfterMicroMyr", "createdAt", "description", "id", "payment", "type"]
          )
          expect(entry.id).toBeTypeOf("string")
          expect(entry.description).toBeTypeOf("string")
          expect(entry.description.length).toBeGreaterThan(0)
          expect(new Date(entry.createdAt).toISOString()).toBe(entry.createdAt)
        }
        expect(new Set(entries.map((e) => e.id)).size).toBe(5)
        expect(entries[1]!.description).toBe("correction")
        expect(entries[2]!.description).toBe("goodwill credit")
        // Newest first also in time.
        const times = entries.map((e) => Date.parse(e.createdAt))
        expect([...times].sort((a, b) => b - a)).toEqual(times)
        // The last balanceAfter is the wallet.
        expect((yield* balance(token)).wallet.availableMicroMyr).toBe(entries[0]!.balanceAfterMicroMyr)

        const echoed = yield* ledger(token, "?page=1&limit=200")
        expect(echoed.page).toBe(1)
        expect(echoed.limit).toBe(200)
        expect(echoed.ledger).toEqual(entries)
      }))

    it.scoped("pages are slices of the newest-first list; type filters", () =>
      Effect.gen(function*() {
        const { token } = yield* seedLedger("billing-ledger-pages@example.com")
        const all: Array<Entry> = (yield* ledger(token)).ledger
        expect(all).toHaveLength(5)

        const page2 = yield* ledger(token, "?limit=2&page=2")
        expect(page2.page).toBe(2)
        expect(page2.limit).toBe(2)
        expect(page2.ledger).toEqual(all.slice(2, 4))
        expect((yield* ledger(token, "?limit=2&page=1")).ledger).toEqual(all.slice(0, 2))
        expect((yield* ledger(token, "?limit=2&page=3")).ledger).toEqual(all.slice(4))
        expect((yield* ledger(token, "?limit=2&page=4")).ledger).toEqual([])

        const topups = yield* ledger(token, "?type=topup")
        expect(topups.ledger).toEqual(all.filter((e) => e.type === "topup"))
        expect(topups.ledger.map((e) => e.amountMicroMyr)).toEqual([50_000_000, 25_000_000, 10_000_000])
        const adjustments = yield* ledger(token, "?type=adjustment")
        expect(adjustments.ledger.map((e) => e.amountMicroMyr)).toEqual([-1_000_000, 5_000_000])
        expect((yield* ledger(token, "?type=topup&limit=1&page=2")).ledger).toEqual([topups.ledger[1]])
        expect((yield* ledger(token, "?type=refund")).ledger).toEqual([])
      }))

    describe("invalid parameters answer 400 naming the parameter", () => {
      const cases: ReadonlyArray<{ query: string; param: string }> = [
        { query: "limit=201", param: "limit" },
        { query: "limit=0", param: "limit" },
        { query: "limit=-1", param: "limit" },
        { query: "limit=2.5", param: "limit" },
        { query: "limit=ten", param: "limit" },
        { query: "page=0", param: "page" },
        { query: "page=-1", param: "page" },
        { query: "page=x", param: "page" },
        { query: "type=bogus", param: "type" },
        { query: "type=TOPUP", param: "type" }
      ]
      for (const c of cases) {
        it.effect(c.query, () =>
          Effect.gen(function*() {
            const token = yield* devToken("billing-ledger-invalid@example.com")
            const reply = yield* call("GET", `/dashboard/billing/transactions?${c.query}`, { token })
            expectInvalid(reply, c.query, c.param)
          }))
      }
    })
  })

  it.scoped("another developer sees neither this developer's balance nor ledger", () =>
    Effect.gen(function*() {
      const alice = yield* developer("billing-alice@example.com")
      const bob = yield* developer("billing-bob@example.com")
      yield* topUp(alice.token, 2500)
      const instance = yield* walletInstance(yield* Effect.scope)
      yield* instance.wallet.post({
        accountId: alice.accountId,
        type: "adjustment",
        amountMicroMyr: 1_000_000,
        effectKey: `test-isolation-${alice.accountId}`,
        description: "alice only"
      })
      yield* instance.wallet.reserve({
        accountId: alice.accountId,
        apiKeyId: "key_alice",
        requestId: "req_alice",
        amountMicroMyr: microMyr(500_000),
        monthlySpendLimitMicroMyr: null,
        memberId: null,
        memberMonthlySpendLimitMicroMyr: null
      })
      // Bob starts a checkout of his own, which is never paid.
      expect((yield* checkout(bob.token, { amount_sen: 1000 })).status).toBe(200)

      const bobs = yield* balance(bob.token)
      expect(bobs.wallet).toEqual(EMPTY_WALLET)
      expect(bobs.balance_myr).toBe(0)
      expect(bobs.reserved_myr).toBe(0)
      for (const q of ["", "?type=topup", "?type=adjustment", "?limit=200"]) {
        expect((yield* ledger(bob.token, q)).ledger, `bob's ledger${q}`).toEqual([])
      }

      const alices = yield* balance(alice.token)
      expect(alices.wallet).toEqual({
        availableMicroMyr: 25_500_000,
        reservedMicroMyr: 500_000,
        lifetimeTopupMicroMyr: 25_000_000,
        lifetimeSpendMicroMyr: 0
      })
      expect((yield* ledger(alice.token)).ledger.map((e) => e.type)).toEqual(["adjustment", "topup"])
    }))

  it.effect("the simulated checkout page does not exist while Stripe is configured", () =>
    Effect.gen(function*() {
      const { token } = yield* developer("billing-no-dev-checkout@example.com")
      const created = yield* checkout(token, { amount_sen: 1000 })
      expect(created.status, created.text).toBe(200)
      const sessionId = created.body.session_id as string
      for (const id of [sessionId, "cs_sim_anything", "anything"]) {
        const page = yield* call("GET", `/dev/checkout/${id}`)
        expectError(page, `GET /dev/checkout/${id}`, { status: 404, code: "not_found", type: "invalid_request_error" })
        const pay = yield* call("POST", `/dev/checkout/${id}/pay`)
        expectError(pay, `POST /dev/checkout/${id}/pay`, {
          status: 404,
          code: "not_found",
          type: "invalid_request_error"
        })
        const cancel = yield* call("POST", `/dev/checkout/${id}/cancel`)
        expectError(cancel, `POST /dev/checkout/${id}/cancel`, {
          status: 404,
          code: "not_found",
          type: "invalid_request_error"
        })
      }
      expect((yield* balance(token)).wallet).toEqual(EMPTY_WALLET)
      expect(yield* transactionStatus(created.body.transaction_id)).toBe("pending")
    }))
})

layer(TestServerLive(webhookOverrides), { excludeTestServices: true })("the simulated checkout", (it) => {
  const form = (method: "get" | "post", html: string, action: string) =>
    new RegExp(`<form[^>]*method="${method}"[^>]*action="${action.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}"`).test(html)

  const expectHtml = (reply: Reply, name: string) => {
    expect(reply.status, `${name}: ${reply.text}`).toBe(200)
    expect(reply.headers.get("content-type") ?? "", `${name}: content-type`).toContain("text/html")
  }

  it.scoped("checkout returns the simulated page; Pay credits the wallet exactly once", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      const { accountId, token } = yield* developer("sim-pay@example.com")
      const created = yield* checkout(token, { amount_sen: 1000 })
      expect(created.status, created.text).toBe(200)
      const { session_id, transaction_id, url } = created.body
      expect(session_id).toBeTypeOf("string")
      expect(transaction_id).toBeTypeOf("string")
      expect(url).toBe(`${baseUrl}/dev/checkout/${session_id}`)
      const path = url.slice(baseUrl.length)

      const page = yield* call("GET", path)
      expectHtml(page, "checkout page")
      expect(page.text).toContain("RM 10.00")
      expect(page.text).toContain(transaction_id)
      expect(form("post", page.text, `${path}/pay`)).toBe(true)
      expect(form("post", page.text, `${path}/cancel`)).toBe(true)
      expect(page.text).toMatch(/<button[^>]*>Pay<\/button>/)
      expect(page.text).toMatch(/<button[^>]*>Cancel<\/button>/)
      // Visiting the page pays nothing.
      expect((yield* balance(token)).wallet).toEqual(EMPTY_WALLET)

      const paid = yield* call("POST", `${path}/pay`)
      expectHtml(paid, "pay")
      expect(paid.text).toContain("Payment received")
      const afterPay = yield* balance(token)
      expect(afterPay.balance_myr).toBe(10)
      expect(afterPay.lifetime_topup_myr).toBe(10)
      expect(afterPay.wallet.availableMicroMyr).toBe(10_000_000)
      const entries = (yield* ledger(token)).ledger
      expect(entries.map((e) => [e.type, e.amountMicroMyr, e.balanceAfterMicroMyr])).toEqual([[
        "topup",
        10_000_000,
        10_000_000
      ]])
      expect(yield* transactionStatus(transaction_id)).toBe("succeeded")

      // A second Pay is the same payment: nothing more.
      const again = yield* call("POST", `${path}/pay`)
      expectHtml(again, "second pay")
      expect(again.text).toContain("Payment received")
      expect((yield* balance(token)).wallet.availableMicroMyr).toBe(10_000_000)
      expect((yield* ledger(token)).ledger).toEqual(entries)

      // The page now shows the checkout paid, without the buttons.
      const settledPage = yield* call("GET", path)
      expectHtml(settledPage, "paid page")
      expect(settledPage.text).toContain("paid")
      expect(form("post", settledPage.text, `${path}/pay`)).toBe(false)

      // Cancel after Pay leaves the credit in place.
      const cancelled = yield* call("POST", `${path}/cancel`)
      expectHtml(cancelled, "cancel after pay")
      expect(cancelled.text).toContain("Payment received")
      expect(cancelled.text).not.toContain("Checkout cancelled")
      expect((yield* balance(token)).wallet.availableMicroMyr).toBe(10_000_000)
      expect((yield* ledger(token)).ledger).toEqual(entries)
      expect(yield* transactionStatus(transaction_id)).toBe("succeeded")

      const instance = yield* walletInstance(yield* Effect.scope)
      expect((yield* instance.invariant(accountId)).violations).toEqual([])
    }))

  it.effect("Pays pressed at once still credit once", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      const { token } = yield* developer("sim-concurrent@example.com")
      const created = yield* checkout(token, { amount_sen: 2500 })
      expect(created.status, created.text).toBe(200)
      const path = (created.body.url as string).slice(baseUrl.length)
      const replies = yield* Effect.all(Array.from({ length: 3 }, () => call("POST", `${path}/pay`)), {
        concurrency: 3
      })
      for (const reply of replies) {
        expectHtml(reply, "concurrent pay")
        expect(reply.text).toContain("Payment received")
      }
      expect((yield* balance(token)).wallet.availableMicroMyr).toBe(25_000_000)
      expect((yield* ledger(token)).ledger.map((e) => [e.type, e.amountMicroMyr])).toEqual([["topup", 25_000_000]])
    }))

  it.effect("Cancel fails the transaction and credits nothing", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      const { token } = yield* developer("sim-cancel@example.com")
      yield* Effect.gen(function*() {
        // Paid first, so that a cancelled second checkout has something to leave alone.
        const first = yield* checkout(token, { amount_sen: 2500 })
        expectHtml(yield* call("POST", `${first.body.url.slice(baseUrl.length)}/pay`), "pay first")
      })
      const created = yield* checkout(token, { amount_sen: 5000 })
      expect(created.status, created.text).toBe(200)
      const path = (created.body.url as string).slice(baseUrl.length)
      const before = yield* ledger(token)

      const cancelled = yield* call("POST", `${path}/cancel`)
      expectHtml(cancelled, "cancel")
      expect(cancelled.text).toMatch(/cancelled/i)
      expect(cancelled.text).not.toContain("Payment received")
      expect(yield* transactionStatus(created.body.transaction_id)).toBe("failed")
      const after = yield* balance(token)
      expect(after.balance_myr).toBe(25)
      expect(after.lifetime_topup_myr).toBe(25)
      expect((yield* ledger(token)).ledger).toEqual(before.ledger)

      // The page of a cancelled checkout offers no Pay, and a Pay posted anyway pays nothing.
      const page = yield* call("GET", path)
      expectHtml(page, "cancelled page")
      expect(form("post", page.text, `${path}/pay`)).toBe(false)
      const late = yield* call("POST", `${path}/pay`)
      expectHtml(late, "pay after cancel")
      expect(late.text).not.toContain("Payment received")
      expect(yield* transactionStatus(created.body.transaction_id)).toBe("failed")
      expect((yield* balance(token)).balance_myr).toBe(25)
    }))

  it.effect("an unknown session answers 404 not_found in the error body, never a page", () =>
    Effect.gen(function*() {
      const hostile = "<script>alert(1)</script>"
      for (const id of ["cs_sim_doesnotexist", encodeURIComponent(hostile), "%22%3E%3Cimg%20src%3Dx%3E"]) {
        for (const [method, suffix] of [["GET", ""], ["POST", "/pay"], ["POST", "/cancel"]] as const) {
          const reply = yield* call(method, `/dev/checkout/${id}${suffix}`)
          const name = `${method} /dev/checkout/${id}${suffix}`
          expectError(reply, name, { status: 404, code: "not_found", type: "invalid_request_error" })
          expect(reply.headers.get("content-type") ?? "", name).not.toContain("text/html")
        }
      }
    }))

  it.effect("the session id is HTML-escaped where it appears in a page", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      const { accountId, token } = yield* developer("sim-escape@example.com")
      const created = yield* checkout(token, { amount_sen: 1000 })
      expect(created.status, created.text).toBe(200)
      // A session id with markup in it, as a crafted row would have: the page must not carry it raw.
      const hostile = `cs_sim_"><script>alert(1)</script>`
      const changed = yield* query<{ id: string }>(
        "UPDATE payment_transactions SET checkout_session_id = $1 WHERE id = $2 AND account_id = $3 RETURNING id",
        [hostile, created.body.transaction_id, accountId]
      )
      expect(changed).toHaveLength(1)
      const path = `/dev/checkout/${encodeURIComponent(hostile)}`
      expect(`${baseUrl}${path}`).not.toBe(created.body.url)

      const page = yield* call("GET", path)
      expectHtml(page, "page")
      expect(page.text).not.toContain("<script>")
      expect(page.text).not.toContain(hostile)
      expect(form("post", page.text, `${path}/pay`)).toBe(true)

      // The result page links back with the session id in its URL.
      const paid = yield* call("POST", `${path}/pay`)
      expectHtml(paid, "pay")
      expect(paid.text).toContain("Payment received")
      expect(paid.text).not.toContain("<script>")
      expect(paid.text).not.toContain(hostile)
      expect((yield* balance(token)).balance_myr).toBe(10)
    }))
})
