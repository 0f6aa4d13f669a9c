import { expect, layer } from "@effect/vitest"
import { Effect, Either, Layer, Option, Redacted } from "effect"
import { AppConfig } from "../src/AppConfig.js"
import { DatabaseLive } from "../src/Database/Database.js"
import { microMyr } from "../src/Domain/Money.js"
import { CallBilling } from "../src/Models/Billing.js"
import type { LoggedUsage, OpenLog } from "../src/Models/RequestLogs.js"
import { RequestLogs } from "../src/Models/RequestLogs.js"
import { ReservationLeases } from "../src/Wallet/Leases.js"
import { WalletRepo } from "../src/Wallet/Repo.js"
import { ReservationSweeper } from "../src/Wallet/Sweeper.js"
import { violations, walletOf } from "./support/Models.js"
import { topUp, webhookOverrides } from "./support/Stripe.js"
import { query, TestServer, TestServerLive } from "./support/TestServer.js"
import { developer } from "./support/Wallet.js"

/** `CallBilling` and the wallet's parts on the test server's database, as the service composes them. */
const billing = Effect.gen(function*() {
  const { clock, databaseUrl } = yield* TestServer
  const config = AppConfig.layerWith({ databaseUrl: Option.some(Redacted.make(databaseUrl)) })
  const layer = CallBilling.layer.pipe(
    Layer.provideMerge(Layer.mergeAll(WalletRepo.layer, RequestLogs.layer, ReservationSweeper.layer.pipe(Layer.provide(WalletRepo.layer)))),
    Layer.provideMerge(ReservationLeases.layer()),
    Layer.provideMerge(DatabaseLive),
    Layer.provideMerge(config),
    Layer.provide(Layer.setClock(clock))
  )
  const context = yield* Layer.build(layer)
  return {
    billing: context.unsafeMap.get(CallBilling.key) as CallBilling["Type"],
    sweeper: context.unsafeMap.get(ReservationSweeper.key) as ReservationSweeper["Type"],
    leases: context.unsafeMap.get(ReservationLeases.key) as ReservationLeases["Type"]
  }
})

let sequence = 0
const call = (accountId: string, amount: number, limit: number | null = null) => {
  const requestId = `req_billing_${++sequence}_${Date.now()}`
  const input = {
    accountId,
    apiKeyId: "key_billing",
    requestId,
    amountMicroMyr: microMyr(amount),
    monthlySpendLimitMicroMyr: limit
  }
  const log: OpenLog = {
    requestId,
    accountId,
    apiKeyId: "key_billing",
    reservationId: null,
    publicModel: "svc/nenas-flash",
    upstreamModel: "gpt-4.1-mini",
    routingCategory: "general",
    endpoint: "/v1/chat/completions",
    stream: false,
    inputTokens: 10
  }
  return { input, log, requestId }
}

const usage = (cost: number): LoggedUsage => ({
  inputTokens: 10,
  outputTokens: 20,
  reasoningTokens: 0,
  cachedTokens: 0,
  usageSource: "provider",
  searchCount: 0,
  contentPages: 0,
  costMicroMyr: cost,
  latencyMs: 5
})

const logOf = (requestId: string) =>
  Effect.map(
    query<{ status: string; cost: string; reservation_id: string | null }>(
      "SELECT status, cost_micro_myr AS cost, reservation_id FROM request_logs WHERE request_id = $1",
      [requestId]
    ),
    (rows) => rows[0] === undefined ? undefined : { status: rows[0].status, cost: Number(rows[0].cost), reservationId: rows[0].reservation_id }
  )

const usageEntries = (requestId: string) =>
  Effect.map(
    query<{ amount: string }>("SELECT amount_micro_myr AS amount FROM ledger_entries WHERE type = 'usage' AND request_id = $1", [requestId]),
    (rows) => rows.map((row) => Number(row.amount))
  )

const RM10 = 10_000_000

layer(TestServerLive(webhookOverrides), { excludeTestServices: true })("CallBilling", (it) => {
  it.scoped("reserve and capture in one statement each: held, logged pending, then billed, the rest returned", () =>
    Effect.gen(function*() {
      const { billing: b, leases } = yield* billing
      const { accountId, token } = yield* developer("billing-fast@example.com")
      yield* topUp(token, 1000)
      const c = call(accountId, 500_000)
      const reservation = yield* b.reserve(c.input, c.log)
      expect(yield* walletOf(accountId)).toEqual({ available: RM10 - 500_000, reserved: 500_000, spent: 0 })
      expect(yield* logOf(c.requestId)).toEqual({ status: "pending", cost: 0, reservationId: reservation.id })
      expect(yield* leases.renew, "this process renews the reservation it holds").toBe(1)
      expect(yield* b.capture(reservation, microMyr(1234), "Model call", usage(1234))).toBe(1234)
      expect(yield* walletOf(accountId)).toEqual({ available: RM10 - 1234, reserved: 0, spent: 1234 })
      expect(yield* logOf(c.requestId)).toEqual({ status: "billed", cost: 1234, reservationId: reservation.id })
      expect(yield* usageEntries(c.requestId)).toEqual([-1234])
      expect(yield* leases.renew, "a captured reservation is no longer renewed").toBe(0)
      // Capturing again bills nothing more (the transactional path answers what was billed).
      expect(yield* b.capture(reservation, microMyr(9999), "Model call", usage(9999))).toBe(1234)
      expect(yield* usageEntries(c.requestId)).toEqual([-1234])
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.scoped("a cost above the reservation is billed as the reservation, never more", () =>
    Effect.gen(function*() {
      const { billing: b } = yield* billing
      const { accountId, token } = yield* developer("billing-cap@example.com")
      yield* topUp(token, 1000)
      const c = call(accountId, 7_000)
      const reservation = yield* b.reserve(c.input, c.log)
      expect(yield* b.capture(reservation, microMyr(50_000), "Model call", usage(50_000))).toBe(7_000)
      expect(yield* logOf(c.requestId)).toMatchObject({ status: "billed", cost: 7_000 })
      expect(yield* walletOf(accountId)).toEqual({ available: RM10 - 7_000, reserved: 0, spent: 7_000 })
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.scoped("refusals come from the wallet's transaction: insufficient balance, suspension; nothing held or logged", () =>
    Effect.gen(function*() {
      const { billing: b } = yield* billing
      const { accountId, token } = yield* developer("billing-refused@example.com")
      yield* topUp(token, 1000)
      const tooMuch = call(accountId, RM10 + 1)
      const refused = yield* Effect.either(b.reserve(tooMuch.input, tooMuch.log))
      expect(Either.isLeft(refused) && refused.left._tag).toBe("InsufficientBalance")
      yield* query("UPDATE accounts SET suspended_at = now() WHERE id = $1", [accountId])
      const suspended = call(accountId, 1_000)
      const denied = yield* Effect.either(b.reserve(suspended.input, suspended.log))
      expect(Either.isLeft(denied) && denied.left._tag).toBe("PermissionDenied")
      expect(yield* walletOf(accountId)).toEqual({ available: RM10, reserved: 0, spent: 0 })
      expect(yield* logOf(tooMuch.requestId)).toBeUndefined()
      expect(yield* logOf(suspended.requestId)).toBeUndefined()
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.scoped("a key with a monthly spend limit takes the transactional path, which counts the month", () =>
    Effect.gen(function*() {
      const { billing: b } = yield* billing
      const { accountId, token } = yield* developer("billing-limit@example.com")
      yield* topUp(token, 1000)
      const first = call(accountId, 600_000, 1_000_000)
      const reservation = yield* b.reserve(first.input, first.log)
      expect(yield* logOf(first.requestId)).toMatchObject({ status: "pending", reservationId: reservation.id })
      const second = call(accountId, 600_000, 1_000_000)
      const refused = yield* Effect.either(b.reserve(second.input, second.log))
      expect(Either.isLeft(refused) && refused.left._tag).toBe("SpendLimitExceeded")
      yield* b.capture(reservation, microMyr(100_000), "Model call", usage(100_000))
      const third = call(accountId, 600_000, 1_000_000)
      expect((yield* b.reserve(third.input, third.log)).amountMicroMyr).toBe(600_000)
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.scoped("a capture after the sweeper released the call (its process looked dead) still bills it, and its log says so", () =>
    Effect.gen(function*() {
      const { billing: b, sweeper } = yield* billing
      const { clock } = yield* TestServer
      const { accountId, token } = yield* developer("billing-late@example.com")
      yield* topUp(token, 1000)
      const c = call(accountId, 300_000)
      const reservation = yield* b.reserve(c.input, c.log)
      yield* query("UPDATE reservations SET expires_at = $2 WHERE id = $1", [reservation.id, new Date(clock.unsafeCurrentTimeMillis() - 1000)])
      const swept = yield* sweeper.sweep
      expect(swept.released).toBeGreaterThanOrEqual(1)
      expect(yield* logOf(c.requestId)).toMatchObject({ status: "failed", cost: 0 })
      expect(yield* walletOf(accountId)).toEqual({ available: RM10, reserved: 0, spent: 0 })
      expect(yield* b.capture(reservation, microMyr(4_321), "Model call", usage(4_321))).toBe(4_321)
      expect(yield* logOf(c.requestId)).toMatchObject({ status: "billed", cost: 4_321 })
      expect(yield* usageEntries(c.requestId)).toEqual([-4_321])
      expect(yield* walletOf(accountId)).toEqual({ available: RM10 - 4_321, reserved: 0, spent: 4_321 })
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.scoped("one reservation captured 10 times at once (a retry racing its first attempt) is billed once", () =>
    Effect.gen(function*() {
      const { billing: b } = yield* billing
      const { accountId, token } = yield* developer("billing-double@example.com")
      yield* topUp(token, 1000)
      const c = call(accountId, 200_000)
      const reservation = yield* b.reserve(c.input, c.log)
      const charged = yield* Effect.all(
        Array.from({ length: 10 }, (_, i) => b.capture(reservation, microMyr(5_000 + i), "Model call", usage(5_000 + i))),
        { concurrency: "unbounded" }
      )
      // Whichever attempt won, every attempt answers what was billed.
      expect(new Set(charged).size).toBe(1)
      const billed = charged[0] ?? 0
      expect(billed).toBeGreaterThanOrEqual(5_000)
      expect(billed).toBeLessThanOrEqual(5_009)
      expect(yield* usageEntries(c.requestId)).toEqual([-billed])
      expect(yield* logOf(c.requestId)).toMatchObject({ status: "billed", cost: billed })
      expect(yield* walletOf(accountId)).toEqual({ available: RM10 - billed, reserved: 0, spent: billed })
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.scoped("60 concurrent one-statement reservations on a wallet that affords 25: exactly 25 hold, never an overdraft", () =>
    Effect.gen(function*() {
      const { billing: b } = yield* billing
      const { accountId, token } = yield* developer("billing-race@example.com")
      yield* topUp(token, 1000)
      const calls = Array.from({ length: 60 }, () => call(accountId, 400_000))
      const results = yield* Effect.all(calls.map((c) => Effect.either(b.reserve(c.input, c.log))), { concurrency: "unbounded" })
      const held = results.filter(Either.isRight).map((r) => r.right)
      expect(held).toHaveLength(25)
      expect(results.filter(Either.isLeft).every((r) => r.left._tag === "InsufficientBalance")).toBe(true)
      expect(yield* walletOf(accountId)).toEqual({ available: 0, reserved: RM10, spent: 0 })
      const charged = yield* Effect.all(
        held.map((reservation, i) => b.capture(reservation, microMyr(1_000 * (i + 1)), "Model call", usage(1_000 * (i + 1)))),
        { concurrency: "unbounded" }
      )
      const total = charged.reduce((sum, n) => sum + n, 0)
      expect(total).toBe(1_000 * (25 * 26) / 2)
      expect(yield* walletOf(accountId)).toEqual({ available: RM10 - total, reserved: 0, spent: total })
      expect(yield* violations(accountId)).toEqual([])
    }))
})
