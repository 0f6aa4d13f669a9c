import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, TestClock } from "effect"
import { microMyr } from "../../src/Domain/Money.js"
import { WalletRepo } from "../../src/Wallet/Repo.js"
import type { Reservation, ReserveInput } from "../../src/Wallet/Repo.js"
import * as InMemoryWalletRepo from "../../src/Wallet/InMemoryWalletRepo.js"

/** The in-memory WalletRepo keeps the SQL one's rules: no PostgreSQL here. */

const ACCOUNT = "acc_memory"

const funded = (amountMicroMyr: number) => {
  const store = InMemoryWalletRepo.makeStore()
  store.open(ACCOUNT)
  const repo = InMemoryWalletRepo.make(store, "instance-a")
  return { store, repo, funding: repo.post(topUp(amountMicroMyr)) }
}

const topUp = (amountMicroMyr: number, key = "topup:pt_1") => ({
  accountId: ACCOUNT,
  type: "topup" as const,
  amountMicroMyr,
  effectKey: key,
  description: "Top-up",
  paymentTransactionId: "pt_1"
})

const hold = (amountMicroMyr: number, requestId: string, limit: number | null = null): ReserveInput => ({
  accountId: ACCOUNT,
  apiKeyId: "key_1",
  requestId,
  amountMicroMyr: microMyr(amountMicroMyr),
  monthlySpendLimitMicroMyr: limit,
  memberId: null,
  memberMonthlySpendLimitMicroMyr: null
})

describe("WalletRepo.Test", () => {
  it.effect("a reservation moves available to reserved; a capture bills at most it, returns the rest, and bills once", () =>
    Effect.gen(function*() {
      const { funding, repo, store } = funded(10_000)
      yield* funding
      const reservation = yield* repo.reserve(hold(3_000, "req_1"))
      expect(yield* repo.wallet(ACCOUNT)).toMatchObject({ availableMicroMyr: 7_000, reservedMicroMyr: 3_000 })
      const first = yield* repo.capture(reservation.id, microMyr(5_000), "call")
      expect(first.chargedMicroMyr).toBe(3_000)
      const again = yield* repo.capture(reservation.id, microMyr(1_000), "call")
      expect(again).toEqual(first)
      expect(yield* repo.release(reservation.id)).toBe(false)
      expect(yield* repo.wallet(ACCOUNT)).toMatchObject({ availableMicroMyr: 7_000, reservedMicroMyr: 0, lifetimeSpendMicroMyr: 3_000 })
      expect(store.invariant(ACCOUNT).violations).toEqual([])
    }))

  it.effect("a release returns the hold whole, once; a capture after it bills late, from what the wallet holds", () =>
    Effect.gen(function*() {
      const { funding, repo, store } = funded(1_000)
      yield* funding
      const reservation = yield* repo.reserve(hold(600, "req_1"))
      expect(yield* repo.release(reservation.id)).toBe(true)
      expect(yield* repo.release(reservation.id)).toBe(false)
      expect(yield* repo.wallet(ACCOUNT)).toMatchObject({ availableMicroMyr: 1_000, reservedMicroMyr: 0 })
      const late = yield* repo.capture(reservation.id, microMyr(400), "late")
      expect(late.chargedMicroMyr).toBe(400)
      expect(yield* repo.wallet(ACCOUNT)).toMatchObject({ availableMicroMyr: 600, lifetimeSpendMicroMyr: 400 })
      expect(store.invariant(ACCOUNT).violations).toEqual([])
    }))

  it.effect("refusals: more than available, a suspended account, a key's monthly limit, a hold that is not positive", () =>
    Effect.gen(function*() {
      const { funding, repo, store } = funded(1_000)
      yield* funding
      const over = yield* Effect.flip(repo.reserve(hold(1_001, "req_1")))
      expect(over._tag).toBe("InsufficientBalance")
      expect(over.message).toBe("This request may cost up to RM 0.001001, and the wallet holds RM 0.001000 available.")
      expect(yield* repo.reserveQuickly(hold(1_001, "req_2"))).toBeUndefined()

      const spent = yield* repo.reserve(hold(300, "req_3", 500))
      yield* repo.capture(spent.id, microMyr(300), "call")
      yield* repo.reserve(hold(100, "req_4", 500))
      const limited = yield* Effect.flip(repo.reserve(hold(101, "req_5", 500)))
      expect(limited._tag).toBe("SpendLimitExceeded")
      expect(limited.message).toContain("it has spent RM 0.000300 this month, RM 0.000100 is held for calls in flight")
      // A new month in BUSINESS_TIMEZONE starts the count again (what is held still counts).
      yield* TestClock.adjust("40 days")
      yield* repo.reserve(hold(400, "req_6", 500))

      store.suspend(ACCOUNT, true)
      expect((yield* Effect.flip(repo.reserve(hold(1, "req_7"))))._tag).toBe("PermissionDenied")
      expect(yield* repo.reserveQuickly(hold(1, "req_8"))).toBeUndefined()
      expect(Exit.isFailure(yield* Effect.exit(repo.reserve(hold(0, "req_9"))))).toBe(true)
      expect(store.invariant(ACCOUNT).violations).toEqual([])
    }))

  it.effect("a payment's effect is posted once; a debit may leave the wallet negative and asks for grants back", () =>
    Effect.gen(function*() {
      const { funding, repo, store } = funded(5_000)
      expect(yield* funding).toBe(true)
      expect(yield* repo.post(topUp(5_000))).toBe(false)
      expect(yield* repo.post({ ...topUp(0), effectKey: "zero" })).toBe(false)
      const debit = { ...topUp(-8_000, "chargeback:dp_1"), type: "chargeback" as const }
      expect(yield* repo.post(debit)).toBe(true)
      expect(yield* repo.post(debit)).toBe(false)
      expect(yield* repo.wallet(ACCOUNT)).toMatchObject({ availableMicroMyr: -3_000, lifetimeTopupMicroMyr: 5_000 })
      expect(store.grantRequests).toEqual([ACCOUNT])
      const entries = yield* repo.ledger(ACCOUNT, { page: 1, limit: 10 })
      expect(entries.map((e) => [e.type, e.amountMicroMyr, e.balanceAfterMicroMyr])).toEqual([
        ["chargeback", -8_000, -3_000],
        ["topup", 5_000, 5_000]
      ])
      expect((yield* repo.ledger(ACCOUNT, { page: 2, limit: 1, type: undefined })).map((e) => e.type)).toEqual(["topup"])
      expect((yield* repo.ledger(ACCOUNT, { page: 1, limit: 10, type: "topup" })).length).toBe(1)
      expect((yield* Effect.flip(repo.reserve(hold(1, "req_1"))))._tag).toBe("InsufficientBalance")
      expect(store.invariant(ACCOUNT).violations).toEqual([])
    }))

  it.effect("grants: sized under the wallet's lock, missing when not created, returned when their instance dies", () =>
    Effect.gen(function*() {
      const { funding, repo, store } = funded(9_000)
      yield* funding
      const other = InMemoryWalletRepo.make(store, "instance-b")
      expect(yield* repo.growGrant({ id: "gr_a", accountId: ACCOUNT, create: false }, () => 100)).toBe("missing")
      expect(yield* repo.growGrant({ id: "gr_a", accountId: ACCOUNT, create: true }, ({ availableMicroMyr }) => availableMicroMyr / 3)).toBe(3_000)
      expect(yield* repo.growGrant({ id: "gr_a", accountId: ACCOUNT, create: false }, ({ heldMicroMyr }) => heldMicroMyr)).toBe(3_000)
      expect(yield* repo.growGrant({ id: "gr_a", accountId: ACCOUNT, create: false }, () => 3_001)).toBe(0)
      expect(yield* repo.wallet(ACCOUNT)).toMatchObject({ availableMicroMyr: 3_000, grantedMicroMyr: 6_000 })
      expect(store.invariant(ACCOUNT).violations).toEqual([])
      expect(yield* other.returnDeadGrants).toBe(0)
      store.kill("instance-a")
      expect(yield* other.returnDeadGrants).toBe(1)
      expect(yield* repo.wallet(ACCOUNT)).toMatchObject({ availableMicroMyr: 9_000, grantedMicroMyr: 0 })
      expect(store.invariant(ACCOUNT).violations).toEqual([])
    }))

  it.effect("the Layer serves the store as WalletRepo, and a wallet that was never opened is a defect", () =>
    Effect.gen(function*() {
      const repo = yield* WalletRepo
      const exit = yield* Effect.exit(repo.reserve(hold(1, "req_1")))
      expect(Exit.isFailure(exit) && exit.cause._tag === "Die").toBe(true)
      expect(yield* repo.openHolds).toBe(0)
    }).pipe(Effect.provide(InMemoryWalletRepo.layer())))

  it.effect("a race of 400 fibers reserving against one wallet: never negative, at least the affordable ones held, exact totals", () =>
    Effect.gen(function*() {
      const { funding, repo, store } = funded(100_000)
      yield* funding
      const lowest: Array<number> = []
      const quickly = (input: ReserveInput) =>
        Effect.flatMap(repo.reserveQuickly(input), (r) => r === undefined ? Effect.fail("refused") : Effect.succeed(r))
      // Each fiber yields between steps, so holds, captures and releases interleave.
      const call = (i: number) =>
        Effect.gen(function*() {
          yield* Effect.yieldNow()
          const input = hold(700, `req_${i}`)
          const reserved = yield* Effect.either<Reservation, unknown, never>(i % 2 === 0 ? repo.reserve(input) : quickly(input))
          lowest.push((yield* repo.wallet(ACCOUNT)).availableMicroMyr)
          if (reserved._tag === "Left") return { held: false, charged: 0 }
          yield* Effect.yieldNow()
          if (i % 5 === 0) {
            yield* repo.release(reserved.right.id)
            return { held: true, charged: 0 }
          }
          return { held: true, charged: (yield* repo.capture(reserved.right.id, microMyr(500), `call ${i}`)).chargedMicroMyr }
        })
      const calls = yield* Effect.forEach(Array.from({ length: 400 }, (_, i) => i), call, { concurrency: "unbounded" })
      const total = calls.reduce((sum, c) => sum + c.charged, 0)
      expect(Math.min(...lowest)).toBeGreaterThanOrEqual(0)
      // 100,000 affords 142 holds of 700 at once: at least those were held, and the rest of the 400 contended.
      expect(calls.filter((c) => c.held).length).toBeGreaterThanOrEqual(142)
      expect(calls.filter((c) => !c.held).length).toBeGreaterThan(0)
      const wallet = yield* repo.wallet(ACCOUNT)
      expect(wallet.reservedMicroMyr).toBe(0)
      expect(wallet.lifetimeSpendMicroMyr).toBe(total)
      expect(wallet.availableMicroMyr).toBe(100_000 - total)
      expect(store.entries.filter((e) => e.type === "usage").length).toBe(calls.filter((c) => c.charged > 0).length)
      expect(yield* repo.openHolds).toBe(0)
      expect(store.invariant(ACCOUNT).violations).toEqual([])
    }))
})
