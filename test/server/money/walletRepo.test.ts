import { SqlClient } from "@effect/sql"
import { expect, layer } from "@effect/vitest"
import { Cause, Context, Effect, Exit, Layer, Logger, LogLevel, Option, Redacted, Scope } from "effect"
import { AppConfig } from "../../../src/AppConfig.js"
import { DatabaseLive } from "../../../src/Database/Database.js"
import { Listener } from "../../../src/Database/Listener.js"
import { newId } from "../../../src/Domain/Ids.js"
import { microMyr } from "../../../src/Domain/Money.js"
import { GRANT_CHANNEL } from "../../../src/Wallet/Grants/GrantRows.js"
import { checkInvariant } from "../../../src/Wallet/Invariant.js"
import { WalletRepo } from "../../../src/Wallet/Repo.js"
import type { Reservation, ReserveInput } from "../../../src/Wallet/Repo.js"
import { realSleep } from "../../support/RealTime.js"
import { freshDatabase, makeShiftableClock } from "../../support/TestServer.js"
import { WalletRepoLive } from "../../support/Wallet.js"

/**
 * `WalletRepo.layer` on a database of its own: the money rules as the service
 * runs them. Every case opens an account of its own (its keys, requests and
 * effect keys named after it), so cases share the database and nothing else.
 */

const Database = Layer.unwrapScoped(
  Effect.map(
    freshDatabase,
    ({ url }) =>
      DatabaseLive.pipe(Layer.provideMerge(AppConfig.layerWith({ databaseUrl: Option.some(Redacted.make(url)) })))
  )
)

/** The repository, and a LISTEN on the grant channel to hear a debit ask for grants back; warnings and errors logged, not a line per movement. */
const Live = Layer.merge(WalletRepoLive, Listener.layer({ channels: [GRANT_CHANNEL] })).pipe(
  Layer.provideMerge(Database),
  Layer.merge(Logger.minimumLogLevel(LogLevel.Warning))
)

/** An account row, as signing in writes it, with no wallet yet. */
const newAccount = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const accountId = newId("acc")
  yield* sql`INSERT INTO accounts (id, issuer, subject) VALUES (${accountId}, 'test', ${newId("sub")})`
  return accountId
})

/** A new account's wallet, opened and topped up with `amountMicroMyr` (`posted`: whether the top-up was). */
const funded = (amountMicroMyr: number) =>
  Effect.gen(function*() {
    const repo = yield* WalletRepo
    const sql = yield* SqlClient.SqlClient
    const accountId = yield* newAccount
    yield* repo.open(accountId)
    const apiKeyId = newId("key")
    const topUp = (amount: number, key = "topup:1") => ({
      accountId,
      type: "topup" as const,
      amountMicroMyr: amount,
      effectKey: `${accountId}:${key}`,
      description: "Top-up"
    })
    const hold = (amount: number, requestId: string, limit: number | null = null): ReserveInput => ({
      accountId,
      apiKeyId,
      requestId: `${accountId}:${requestId}`,
      amountMicroMyr: microMyr(amount),
      monthlySpendLimitMicroMyr: limit,
      memberId: null,
      memberMonthlySpendLimitMicroMyr: null
    })
    const posted = yield* repo.post(topUp(amountMicroMyr))
    return {
      repo,
      accountId,
      topUp,
      hold,
      posted,
      /** The ledger invariant, read from SQL: empty when it holds. */
      violations: Effect.map(Effect.orDie(checkInvariant(accountId)), (report) => report.violations),
      suspend: sql`UPDATE accounts SET suspended_at = now() WHERE id = ${accountId}`
    }
  })

/** A second instance's repository on the same database (its own instance row and heartbeat); closing `scope` stops it. */
const otherInstance = (scope: Scope.Scope) =>
  Layer.buildWithScope(WalletRepoLive.pipe(Layer.provide(AppConfig.layerWith({ instanceId: newId("test") }))), scope)
    .pipe(
      Effect.map((context) => Context.get(context, WalletRepo))
    )

/** Waits (up to 5 s) until `done` holds. */
const eventually = (done: () => boolean, what: string) =>
  Effect.gen(function*() {
    const since = Date.now()
    while (!done()) {
      if (Date.now() - since > 5_000) return yield* Effect.dieMessage(`never: ${what}`)
      yield* realSleep(20)
    }
  })

layer(Live, { excludeTestServices: true })("WalletRepo on PostgreSQL", (it) => {
  it.effect("a reservation moves available to reserved; a capture bills at most it, returns the rest, and bills once", () =>
    Effect.gen(function*() {
      const { accountId, hold, repo, violations } = yield* funded(10_000)
      const reservation = yield* repo.reserve(hold(3_000, "req_1"))
      expect(yield* repo.wallet(accountId)).toMatchObject({ availableMicroMyr: 7_000, reservedMicroMyr: 3_000 })
      const first = yield* repo.capture(reservation.id, microMyr(5_000), "call")
      expect(first.chargedMicroMyr).toBe(3_000)
      const again = yield* repo.capture(reservation.id, microMyr(1_000), "call")
      expect(again).toEqual(first)
      expect(yield* repo.release(reservation.id)).toBe(false)
      expect(yield* repo.wallet(accountId)).toMatchObject({
        availableMicroMyr: 7_000,
        reservedMicroMyr: 0,
        lifetimeSpendMicroMyr: 3_000
      })
      expect(yield* violations).toEqual([])
    }))

  it.effect("a release returns the hold whole, once; a capture after it bills late, from what the wallet holds", () =>
    Effect.gen(function*() {
      const { accountId, hold, repo, violations } = yield* funded(1_000)
      const reservation = yield* repo.reserve(hold(600, "req_1"))
      expect(yield* repo.release(reservation.id)).toBe(true)
      expect(yield* repo.release(reservation.id)).toBe(false)
      expect(yield* repo.wallet(accountId)).toMatchObject({ availableMicroMyr: 1_000, reservedMicroMyr: 0 })
      const late = yield* repo.capture(reservation.id, microMyr(400), "late")
      expect(late.chargedMicroMyr).toBe(400)
      expect(yield* repo.wallet(accountId)).toMatchObject({ availableMicroMyr: 600, lifetimeSpendMicroMyr: 400 })
      expect(yield* violations).toEqual([])
    }))

  it.effect("refusals: more than available, a suspended account, a key's monthly limit, a hold that is not positive", () => {
    // Entries are dated by the fiber's clock: moved forward, a new month begins.
    const clock = makeShiftableClock()
    return Effect.gen(function*() {
      const { hold, repo, suspend, violations } = yield* funded(1_000)
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
      clock.advance("40 days")
      yield* repo.reserve(hold(400, "req_6", 500))
      expect((yield* Effect.flip(repo.reserve(hold(1, "req_7", 500))))._tag).toBe("SpendLimitExceeded")

      yield* suspend
      expect((yield* Effect.flip(repo.reserve(hold(1, "req_8"))))._tag).toBe("PermissionDenied")
      expect(yield* repo.reserveQuickly(hold(1, "req_9"))).toBeUndefined()
      expect(Exit.isFailure(yield* Effect.exit(repo.reserve(hold(0, "req_10"))))).toBe(true)
      expect(yield* violations).toEqual([])
    }).pipe(Effect.withClock(clock))
  })

  it.effect("a payment's effect is posted once; a debit may leave the wallet negative and asks for grants back", () =>
    Effect.gen(function*() {
      const listener = yield* Listener
      yield* eventually(() => listener.hearing(), "the grant channel heard")
      const heard: Array<string> = []
      yield* listener.on(GRANT_CHANNEL, (payload) => void heard.push(payload))

      const { accountId, hold, posted, repo, topUp, violations } = yield* funded(5_000)
      expect(posted).toBe(true)
      expect(yield* repo.post(topUp(5_000))).toBe(false)
      expect(yield* repo.post(topUp(0, "zero"))).toBe(false)
      const debit = { ...topUp(-8_000, "chargeback:dp_1"), type: "chargeback" as const }
      expect(yield* repo.post(debit)).toBe(true)
      expect(yield* repo.post(debit)).toBe(false)
      expect(yield* repo.wallet(accountId)).toMatchObject({ availableMicroMyr: -3_000, lifetimeTopupMicroMyr: 5_000 })
      // The debit, and only it, announced the account (on commit).
      yield* eventually(() => heard.includes(accountId), "the debit's request for grants")
      yield* realSleep(200)
      expect(heard.filter((payload) => payload === accountId)).toEqual([accountId])

      const entries = yield* repo.ledger(accountId, { page: 1, limit: 10 })
      expect(entries.map((e) => [e.type, e.amountMicroMyr, e.balanceAfterMicroMyr])).toEqual([
        ["chargeback", -8_000, -3_000],
        ["topup", 5_000, 5_000]
      ])
      expect((yield* repo.ledger(accountId, { page: 2, limit: 1, type: undefined })).map((e) => e.type)).toEqual([
        "topup"
      ])
      expect((yield* repo.ledger(accountId, { page: 1, limit: 10, type: "topup" })).length).toBe(1)
      const negative = yield* Effect.flip(repo.reserve(hold(1, "req_1")))
      expect(negative._tag).toBe("InsufficientBalance")
      expect(negative.message).toContain("The wallet's balance is negative (RM -0.003000 available)")
      expect(yield* violations).toEqual([])
    }))

  it.scoped("grants: sized under the wallet's lock, missing when not created, returned when their instance dies", () =>
    Effect.gen(function*() {
      const { accountId, repo: other, violations } = yield* funded(9_000)
      const instanceScope = yield* Scope.make()
      yield* Effect.addFinalizer(() => Scope.close(instanceScope, Exit.void))
      const repo = yield* otherInstance(instanceScope)
      const grant = newId("gr")
      expect(yield* repo.growGrant({ id: grant, accountId, create: false }, () => 100)).toBe("missing")
      expect(
        yield* repo.growGrant({ id: grant, accountId, create: true }, ({ availableMicroMyr }) => availableMicroMyr / 3)
      ).toBe(3_000)
      expect(yield* repo.growGrant({ id: grant, accountId, create: false }, ({ heldMicroMyr }) => heldMicroMyr)).toBe(
        3_000
      )
      expect(yield* repo.growGrant({ id: grant, accountId, create: false }, () => 3_001)).toBe(0)
      expect(yield* repo.wallet(accountId)).toMatchObject({ availableMicroMyr: 3_000, grantedMicroMyr: 6_000 })
      expect(yield* violations).toEqual([])
      expect(yield* other.returnDeadGrants).toBe(0)
      // The instance stops: its row is marked dead at once, and another instance returns what it held.
      yield* Scope.close(instanceScope, Exit.void)
      expect(yield* other.returnDeadGrants).toBe(1)
      expect(yield* other.wallet(accountId)).toMatchObject({ availableMicroMyr: 9_000, grantedMicroMyr: 0 })
      expect(yield* violations).toEqual([])
    }))

  it.effect("a wallet that was never opened: reserving is a defect, the quick reserve refuses, and it reads as empty", () =>
    Effect.gen(function*() {
      const repo = yield* WalletRepo
      const accountId = yield* newAccount
      const input: ReserveInput = {
        accountId,
        apiKeyId: newId("key"),
        requestId: newId("req"),
        amountMicroMyr: microMyr(1),
        monthlySpendLimitMicroMyr: null,
        memberId: null,
        memberMonthlySpendLimitMicroMyr: null
      }
      const openBefore = yield* repo.openHolds
      const exit = yield* Effect.exit(repo.reserve(input))
      expect(Exit.isFailure(exit) && Cause.isDie(exit.cause)).toBe(true)
      expect(Exit.isFailure(exit) && Cause.pretty(exit.cause)).toContain(`no wallet for account ${accountId}`)
      expect(yield* repo.reserveQuickly({ ...input, requestId: newId("req") })).toBeUndefined()
      expect(yield* repo.wallet(accountId)).toEqual({
        availableMicroMyr: 0,
        reservedMicroMyr: 0,
        grantedMicroMyr: 0,
        lifetimeTopupMicroMyr: 0,
        lifetimeSpendMicroMyr: 0
      })
      expect(yield* repo.openHolds).toBe(openBefore)
    }))

  it.effect(
    "a race of 400 fibers reserving against one wallet: never negative, at least the affordable ones held, exact totals",
    () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { accountId, hold, repo, violations } = yield* funded(100_000)
        const openBefore = yield* repo.openHolds
        const lowest: Array<number> = []
        // A refusal is `undefined`; any other failure (a database error) fails the test.
        const exact = (input: ReserveInput) =>
          repo.reserve(input).pipe(Effect.catchTag("InsufficientBalance", () => Effect.succeed(undefined)))
        // Each fiber yields between steps, so holds, captures and releases interleave.
        const call = (i: number) =>
          Effect.gen(function*() {
            yield* Effect.yieldNow()
            const input = hold(700, `req_${i}`)
            const reserved: Reservation | undefined = yield* (i % 2 === 0 ? exact(input) : repo.reserveQuickly(input))
            lowest.push((yield* repo.wallet(accountId)).availableMicroMyr)
            if (reserved === undefined) return { held: false, charged: 0 }
            yield* Effect.yieldNow()
            if (i % 5 === 0) {
              expect(yield* repo.release(reserved.id)).toBe(true)
              return { held: true, charged: 0 }
            }
            return {
              held: true,
              charged: (yield* repo.capture(reserved.id, microMyr(500), `call ${i}`)).chargedMicroMyr
            }
          })
        const calls = yield* Effect.forEach(Array.from({ length: 400 }, (_, i) => i), call, {
          concurrency: "unbounded"
        })
        const total = calls.reduce((sum, c) => sum + c.charged, 0)
        expect(Math.min(...lowest)).toBeGreaterThanOrEqual(0)
        // 100,000 affords 142 holds of 700 at once: at least those were held, and the rest of the 400 contended.
        expect(calls.filter((c) => c.held).length).toBeGreaterThanOrEqual(142)
        expect(calls.filter((c) => !c.held).length).toBeGreaterThan(0)
        const wallet = yield* repo.wallet(accountId)
        expect(wallet.reservedMicroMyr).toBe(0)
        expect(wallet.lifetimeSpendMicroMyr).toBe(total)
        expect(wallet.availableMicroMyr).toBe(100_000 - total)
        const [usage] = yield* sql<{ entries: number; charged: number }>`
        SELECT count(*)::int AS entries, COALESCE(-SUM(amount_micro_myr), 0)::int AS charged
        FROM ledger_entries WHERE account_id = ${accountId} AND type = 'usage'
      `
        expect(usage).toEqual({ entries: calls.filter((c) => c.charged > 0).length, charged: total })
        expect(yield* repo.openHolds).toBe(openBefore)
        expect(yield* violations).toEqual([])
      }),
    { timeout: 120_000 }
  )
})
