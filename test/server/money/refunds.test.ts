import { SqlClient, type SqlError } from "@effect/sql"
import { describe, expect, layer } from "@effect/vitest"
import { Effect, Either, Exit, Schedule, Scope } from "effect"
import { newId } from "../../../src/Domain/Ids.js"
import { microMyr } from "../../../src/Domain/Money.js"
import { deliverEvent, events, topUp, webhookOverrides } from "../../support/Stripe.js"
import { TestServer, TestServerLive } from "../../support/TestServer.js"
import { developer, walletInstance } from "../../support/Wallet.js"

/**
 * The prepaid wallet under concurrency: reservations, captures, releases,
 * refunds, spend limits and the sweeper, each ending in the ledger invariant
 * (docs/money.md, "The ledger invariant") and exact balances. Amounts are
 * micro-MYR; 1 sen = 10_000.
 */

type Instance = Effect.Effect.Success<ReturnType<typeof walletInstance>>

const SEN = 10_000
const HOUR = 60 * 60 * 1000
/** Kuala Lumpur (the default BUSINESS_TIMEZONE) is UTC+8 all year. */
const KL_OFFSET = 8 * HOUR

/** Runs SQL on an instance's pool. */
const query = <A extends object>(
  inst: Instance,
  f: (sql: SqlClient.SqlClient) => Effect.Effect<ReadonlyArray<A>, SqlError.SqlError>
) => inst.run(Effect.flatMap(SqlClient.SqlClient, f)).pipe(Effect.orDie)

const reserve = (
  inst: Instance,
  accountId: string,
  amount: number,
  options: { readonly apiKeyId?: string; readonly limit?: number | null } = {}
) =>
  inst.wallet.reserve({
    accountId,
    apiKeyId: options.apiKeyId ?? "key_wallet_test",
    requestId: newId("req"),
    amountMicroMyr: microMyr(amount),
    monthlySpendLimitMicroMyr: options.limit ?? null,
    memberId: null,
    memberMonthlySpendLimitMicroMyr: null
  })

/** "ok", or the failure's `_tag`. */
const outcome = <A>(result: Either.Either<A, { readonly _tag: string }>) =>
  Either.isRight(result) ? "ok" : result.left._tag

const count = <A>(items: ReadonlyArray<A>, item: A) => items.filter((x) => x === item).length

const balances = (inst: Instance, accountId: string) =>
  Effect.map(inst.wallet.wallet(accountId), (w) => ({ available: w.availableMicroMyr, reserved: w.reservedMicroMyr }))

const reservationRow = (inst: Instance, id: string) =>
  Effect.map(
    query<{ status: string; capturedMicroMyr: number | null; settledAt: Date | null }>(inst, (sql) =>
      sql`SELECT status, captured_micro_myr, settled_at FROM reservations WHERE id = ${id}`),
    (rows) =>
      rows[0]
  )

const expectInvariant = (inst: Instance, accountId: string) =>
  Effect.map(inst.invariant(accountId), (report) => expect(report.violations).toEqual([]))

/**
 * A developer with a topped-up wallet and a wallet instance on this test's
 * scope. Whatever the test leaves open is released when it ends, so that one
 * test's reservations never reach another test's sweep.
 */
const account = (email: string, topUpSen: number) =>
  Effect.gen(function*() {
    const inst = yield* Effect.flatMap(Effect.scope, walletInstance)
    const { accountId, token } = yield* developer(email)
    const payment = yield* topUp(token, topUpSen)
    yield* Effect.addFinalizer(() => releaseOpen(inst, accountId))
    return { inst, accountId, token, payment }
  })

const releaseOpen = (inst: Instance, accountId: string) =>
  query<{ id: string }>(
    inst,
    (sql) => sql`SELECT id FROM reservations WHERE account_id = ${accountId} AND status = 'open'`
  )
    .pipe(Effect.flatMap((rows) => Effect.forEach(rows, (row) => inst.wallet.release(row.id))), Effect.ignore)

/** Runs `use` on an instance of its own, which then dies: its scope closes and its lease renewals stop. */
const withDyingInstance = <A, E, R>(use: (inst: Instance) => Effect.Effect<A, E, R>) =>
  Effect.acquireUseRelease(
    Scope.make(),
    (scope) => Effect.flatMap(walletInstance(scope), use),
    (scope) => Scope.close(scope, Exit.void)
  )

// The server's own sweeper would race the sweeps these tests count; here it waits an hour.
layer(TestServerLive({ ...webhookOverrides, reservationSweepIntervalMs: 3_600_000 }), { excludeTestServices: true })(
  "wallet",
  (it) => {
    it.scoped("200 concurrent reservations: exactly the ones the wallet affords succeed", () =>
      Effect.gen(function*() {
        const { accountId, inst } = yield* account("wallet-race-reserve@example.com", 1000)
        const balance = 1000 * SEN
        const K = 37
        const A = Math.floor(balance / K)
        expect(K * A).toBeLessThanOrEqual(balance)
        expect((K + 1) * A).toBeGreaterThan(balance)

        const results = yield* Effect.all(
          Array.from({ length: 200 }, () => Effect.either(reserve(inst, accountId, A))),
          { concurrency: "unbounded" }
        )
        const outcomes = results.map(outcome)
        const successes = count(outcomes, "ok")
        expect(successes).toBe(K)
        expect(count(outcomes, "InsufficientBalance")).toBe(200 - K)
        const after = yield* balances(inst, accountId)
        expect(after).toEqual({ available: balance - K * A, reserved: K * A })
        console.log(
          `reserve race: K=${K} A=${A} successes=${successes} failures=${200 - successes} ` +
            `available=${after.available} reserved=${after.reserved}`
        )
        yield* expectInvariant(inst, accountId)

        const open = yield* query<{ n: number }>(
          inst,
          (sql) =>
            sql`SELECT COUNT(*)::bigint AS n FROM reservations WHERE account_id = ${accountId} AND status = 'open'`
        )
        expect(open[0]?.n).toBe(K)
        yield* releaseOpen(inst, accountId)
        expect(yield* balances(inst, accountId)).toEqual({ available: balance, reserved: 0 })
        yield* expectInvariant(inst, accountId)
      }))

    it.scoped("concurrent and duplicate captures and releases settle each reservation once", () =>
      Effect.gen(function*() {
        const { accountId, inst } = yield* account("wallet-race-settle@example.com", 2500)
        const balance = 2500 * SEN
        const A = 1_000_000
        // What each captured reservation's call actually cost: 0, small, exact, and above the reservation.
        const actuals = [0, 1, 42, 250_000, 777_777, 999_999, 1_000_000, 1_000_001, 1_500_000, 5_000_000]
        const charged = actuals.map((a) => Math.min(a, A))
        const spent = charged.reduce((a, b) => a + b, 0)

        const reservations = yield* Effect.all(
          Array.from({ length: 2 * actuals.length }, () => reserve(inst, accountId, A)),
          { concurrency: "unbounded" }
        )
        const toCapture = reservations.slice(0, actuals.length)
        const toRelease = reservations.slice(actuals.length)
        expect(yield* balances(inst, accountId)).toEqual({ available: balance - 20 * A, reserved: 20 * A })

        const captures = toCapture.flatMap((r, i) =>
          Array.from({ length: 3 }, () =>
            Effect.map(
              inst.wallet.capture(r.id, microMyr(actuals[i]!), "Model call"),
              (c) => ({ kind: "capture" as const, i, c })
            ))
        )
        const releases = toRelease.flatMap((r, i) =>
          Array.from(
            { length: 3 },
            () => Effect.map(inst.wallet.release(r.id), (released) => ({ kind: "release" as const, i, released }))
          )
        )
        const results = yield* Effect.all([...captures, ...releases], { concurrency: "unbounded" })

        for (const [i, r] of toCapture.entries()) {
          const mine = results.flatMap((x) => x.kind === "capture" && x.i === i ? [x.c] : [])
          expect(mine).toHaveLength(3)
          for (const c of mine) {
            expect(c).toEqual(mine[0])
            expect(c.reservationId).toBe(r.id)
            expect(c.chargedMicroMyr).toBe(charged[i])
          }
          expect(mine[0]!.ledgerEntryId === null).toBe(charged[i] === 0)
          expect(yield* reservationRow(inst, r.id)).toMatchObject({ status: "captured", capturedMicroMyr: charged[i] })
        }
        for (const [i, r] of toRelease.entries()) {
          const mine = results.flatMap((x) => x.kind === "release" && x.i === i ? [x.released] : [])
          expect(mine.sort()).toEqual([false, false, true])
          expect(yield* reservationRow(inst, r.id)).toMatchObject({ status: "released", capturedMicroMyr: null })
        }

        const wallet = yield* inst.wallet.wallet(accountId)
        expect(wallet).toEqual({
          availableMicroMyr: balance - spent,
          reservedMicroMyr: 0,
          grantedMicroMyr: 0,
          lifetimeTopupMicroMyr: balance,
          lifetimeSpendMicroMyr: spent
        })
        const usage = yield* inst.wallet.ledger(accountId, { page: 1, limit: 100, type: "usage" })
        expect(usage).toHaveLength(charged.filter((c) => c > 0).length)
        expect(usage.map((e) => e.amountMicroMyr).sort((a, b) => a - b)).toEqual(
          charged.filter((c) => c > 0).map((c) => -c).sort((a, b) => a - b)
        )
        yield* expectInvariant(inst, accountId)

        // Later settlements change nothing: a captured one keeps its charge, settled ones do not release.
        const capped = toCapture[actuals.indexOf(5_000_000)]!
        const again = yield* inst.wallet.capture(capped.id, microMyr(1), "Model call, again")
        expect(again.chargedMicroMyr).toBe(A)
        const zero = toCapture[actuals.indexOf(0)]!
        expect((yield* inst.wallet.capture(zero.id, microMyr(A), "Model call, again")).chargedMicroMyr).toBe(0)
        expect(yield* inst.wallet.release(capped.id)).toBe(false)
        expect(yield* inst.wallet.release(toRelease[0]!.id)).toBe(false)
        expect(yield* inst.wallet.wallet(accountId)).toEqual(wallet)
        expect(yield* inst.wallet.ledger(accountId, { page: 1, limit: 100, type: "usage" })).toEqual(usage)
        yield* expectInvariant(inst, accountId)
      }))

    describe("refunds", () => {
      const cases = [
        { name: "partial refund, small charge", reserve: 3_000_000, actual: 2_000_000, refundedSen: 400 },
        { name: "partial refund larger than what is left", reserve: 8_000_000, actual: 7_000_000, refundedSen: 500 },
        {
          name: "full refund, charge capped at the reservation",
          reserve: 8_000_000,
          actual: 9_000_000,
          refundedSen: 1000
        }
      ]
      for (const [n, c] of cases.entries()) {
        it.scoped(`a refund racing a usage capture: ${c.name}`, () =>
          Effect.gen(function*() {
            // The capture starts with the webhook delivery or a little after it, so that both orders occur.
            for (const delay of [0, 10, 40]) {
              const { accountId, inst, payment } = yield* account(`wallet-refund-race-${n}-${delay}@example.com`, 1000)
              const topup = 1000 * SEN
              const refunded = c.refundedSen * SEN
              const charged = Math.min(c.actual, c.reserve)
              const r = yield* reserve(inst, accountId, c.reserve)
              const [capture, delivered] = yield* Effect.all([
                Effect.delay(inst.wallet.capture(r.id, microMyr(c.actual), "Model call"), `${delay} millis`),
                deliverEvent(events.chargeRefunded({
                  chargeId: payment.chargeId,
                  paymentIntentId: payment.paymentIntentId,
                  amountSen: 1000,
                  amountRefundedSen: c.refundedSen
                }))
              ], { concurrency: "unbounded" })
              expect(delivered.status).toBe(200)
              expect(delivered.body.processed).toBe(true)
              expect(capture.chargedMicroMyr).toBe(charged)
              expect(yield* inst.wallet.wallet(accountId)).toEqual({
                availableMicroMyr: topup - charged - refunded,
                reservedMicroMyr: 0,
                grantedMicroMyr: 0,
                lifetimeTopupMicroMyr: topup,
                lifetimeSpendMicroMyr: charged
              })
              const refunds = yield* inst.wallet.ledger(accountId, { page: 1, limit: 10, type: "refund" })
              expect(refunds.map((e) => e.amountMicroMyr)).toEqual([-refunded])
              yield* expectInvariant(inst, accountId)
            }
          }))
      }

      it.scoped("usage never takes available below 0; a negative balance blocks reservations", () =>
        Effect.gen(function*() {
          const refund = (payment: { chargeId: string; paymentIntentId: string }, refundedSen: number) =>
            Effect.map(
              deliverEvent(events.chargeRefunded({ ...payment, amountSen: 1000, amountRefundedSen: refundedSen })),
              (reply) => expect(reply.body.processed).toBe(true)
            )

          // RM 4 spent, then the whole RM 10 top-up refunded: the wallet is at -RM 4 and nothing can be reserved.
          const full = yield* account("wallet-negative-full@example.com", 1000)
          const spent = yield* reserve(full.inst, full.accountId, 4_000_000)
          yield* full.inst.wallet.capture(spent.id, microMyr(4_000_000), "Model call")
          yield* refund(full.payment, 1000)
          expect(yield* balances(full.inst, full.accountId)).toEqual({ available: -4_000_000, reserved: 0 })
          const blocked = yield* Effect.either(reserve(full.inst, full.accountId, 1))
          expect(outcome(blocked)).toBe("InsufficientBalance")
          expect(Either.isLeft(blocked) && blocked.left.message).toContain("balance is negative (RM -4.000000")
          expect(yield* balances(full.inst, full.accountId)).toEqual({ available: -4_000_000, reserved: 0 })
          yield* expectInvariant(full.inst, full.accountId)

          // A reservation released (as the sweeper does) is billed late from what the wallet holds, never more.
          const partial = yield* account("wallet-negative-late@example.com", 1000)
          const r = yield* reserve(partial.inst, partial.accountId, 8_000_000)
          yield* refund(partial.payment, 500)
          expect(yield* balances(partial.inst, partial.accountId)).toEqual({
            available: -3_000_000,
            reserved: 8_000_000
          })
          expect(yield* partial.inst.wallet.release(r.id)).toBe(true)
          expect(yield* balances(partial.inst, partial.accountId)).toEqual({ available: 5_000_000, reserved: 0 })
          const late = yield* partial.inst.wallet.capture(r.id, microMyr(8_000_000), "Model call (late)")
          expect(late.chargedMicroMyr).toBe(5_000_000)
          expect(yield* partial.inst.wallet.wallet(partial.accountId)).toMatchObject({
            availableMicroMyr: 0,
            reservedMicroMyr: 0,
            lifetimeSpendMicroMyr: 5_000_000
          })
          expect(outcome(yield* Effect.either(reserve(partial.inst, partial.accountId, 1)))).toBe("InsufficientBalance")
          yield* expectInvariant(partial.inst, partial.accountId)

          // With the wallet already negative, a late capture bills nothing.
          const negative = yield* account("wallet-negative-late-zero@example.com", 1000)
          const used = yield* reserve(negative.inst, negative.accountId, 3_000_000)
          yield* negative.inst.wallet.capture(used.id, microMyr(3_000_000), "Model call")
          const r3 = yield* reserve(negative.inst, negative.accountId, 2_000_000)
          yield* refund(negative.payment, 1000)
          expect(yield* balances(negative.inst, negative.accountId)).toEqual({
            available: -5_000_000,
            reserved: 2_000_000
          })
          expect(yield* negative.inst.wallet.release(r3.id)).toBe(true)
          const none = yield* negative.inst.wallet.capture(r3.id, microMyr(1_500_000), "Model call (late)")
          expect(none).toEqual({ reservationId: r3.id, chargedMicroMyr: 0, ledgerEntryId: null })
          expect(yield* negative.inst.wallet.wallet(negative.accountId)).toMatchObject({
            availableMicroMyr: -3_000_000,
            reservedMicroMyr: 0,
            lifetimeSpendMicroMyr: 3_000_000
          })
          yield* expectInvariant(negative.inst, negative.accountId)
        }))
    })

    it.scoped("a key's monthly spend limit counts captured usage and open reservations", () =>
      Effect.gen(function*() {
        const { accountId, inst } = yield* account("wallet-limit@example.com", 5000)
        const L = 5_000_000
        const key = newId("key")
        const other = newId("key")
        const onKey = (amount: number, apiKeyId = key) =>
          Effect.either(reserve(inst, accountId, amount, { apiKeyId, limit: L }))

        const first = yield* reserve(inst, accountId, 2_000_000, { apiKeyId: key, limit: L })
        expect((yield* inst.wallet.capture(first.id, microMyr(1_500_000), "Model call")).chargedMicroMyr).toBe(
          1_500_000
        )
        const held = yield* reserve(inst, accountId, 3_000_000, { apiKeyId: key, limit: L })
        // 1.5 spent + 3 held + 0.6 > 5.
        const over = yield* onKey(600_000)
        expect(outcome(over)).toBe("SpendLimitExceeded")
        // 1.5 + 3 + 0.5 = 5 exactly: allowed.
        const exact = yield* onKey(500_000)
        expect(outcome(exact)).toBe("ok")
        expect(outcome(yield* onKey(1))).toBe("SpendLimitExceeded")
        // Another key of the same account has its own month.
        expect(outcome(yield* onKey(L, other))).toBe("ok")
        expect(outcome(yield* Effect.either(reserve(inst, accountId, 10_000_000, { apiKeyId: newId("key") })))).toBe(
          "ok"
        )
        // Releasing the held reservation makes room again.
        expect(yield* inst.wallet.release(held.id)).toBe(true)
        expect(outcome(yield* onKey(3_000_000))).toBe("ok")
        yield* expectInvariant(inst, accountId)
      }))

    it.scoped("concurrent reservations never pass a key's monthly spend limit", () =>
      Effect.gen(function*() {
        const { accountId, inst } = yield* account("wallet-limit-race@example.com", 5000)
        const L = 5_000_000
        const A = 400_000
        const key = newId("key")
        const results = yield* Effect.all(
          Array.from({ length: 30 }, () => Effect.either(reserve(inst, accountId, A, { apiKeyId: key, limit: L }))),
          { concurrency: "unbounded" }
        )
        const outcomes = results.map(outcome)
        expect(count(outcomes, "ok")).toBe(Math.floor(L / A))
        expect(count(outcomes, "SpendLimitExceeded")).toBe(30 - Math.floor(L / A))
        const held = yield* query<{ sum: number }>(
          inst,
          (sql) =>
            sql`SELECT COALESCE(SUM(amount_micro_myr), 0)::bigint AS sum FROM reservations
            WHERE api_key_id = ${key} AND status = 'open'`
        )
        expect(held[0]?.sum).toBe(12 * A)
        expect(yield* balances(inst, accountId)).toEqual({ available: 50_000_000 - 12 * A, reserved: 12 * A })
        yield* expectInvariant(inst, accountId)
      }))

    describe("the sweeper", () => {
      it.scoped("releases a reservation whose owner died, at once", () =>
        Effect.gen(function*() {
          const { accountId, inst: b } = yield* account("wallet-sweep-dead@example.com", 1000)
          const r = yield* withDyingInstance((a) => reserve(a, accountId, 4_000_000))
          expect(yield* balances(b, accountId)).toEqual({ available: 6_000_000, reserved: 4_000_000 })
          // Its lease runs 45 s more, but its process is gone: no need to wait for it.
          expect(yield* b.sweeper.sweep).toEqual({ released: 1, captured: 0, grantsReturned: 0, closedLogs: 0 })
          expect(yield* reservationRow(b, r.id)).toMatchObject({ status: "released", capturedMicroMyr: null })
          expect(yield* balances(b, accountId)).toEqual({ available: 10_000_000, reserved: 0 })
          expect(yield* b.sweeper.sweep).toEqual({ released: 0, captured: 0, grantsReturned: 0, closedLogs: 0 })
          yield* expectInvariant(b, accountId)
        }))

      it.scoped("a live instance's reservation survives a sweeper whose clock runs ahead", () =>
        Effect.gen(function*() {
          const { clock } = yield* TestServer
          const { accountId, inst: b } = yield* account("wallet-sweep-skew@example.com", 1000)
          const c = yield* Effect.flatMap(Effect.scope, walletInstance)
          const r = yield* reserve(b, accountId, 4_000_000)
          // Instances' clocks (here both, sharing one) run a minute ahead of the database's: deadlines ignore them.
          clock.advance("61 seconds")
          expect(yield* c.sweeper.sweep).toEqual({ released: 0, captured: 0, grantsReturned: 0, closedLogs: 0 })
          expect((yield* reservationRow(b, r.id))?.status).toBe("open")
          yield* b.wallet.release(r.id)
          yield* expectInvariant(b, accountId)
        }))

      it.scoped("releases what a crashed process held once its heartbeat is 6 s old, not before", () =>
        Effect.gen(function*() {
          const { accountId, inst: b } = yield* account("wallet-sweep-heartbeat@example.com", 1000)
          const r = yield* reserve(b, accountId, 4_000_000)
          // A process that stopped beating 5 s ago without saying so (SIGKILL): alive as far as anyone knows.
          const crashed = newId("ins")
          yield* query(b, (sql) =>
            sql`
          INSERT INTO instances (id, identity, heartbeat_at) VALUES (${crashed}, ${crashed}, now() - interval '5 seconds')`)
          yield* query(b, (sql) => sql`UPDATE reservations SET holder = ${crashed} WHERE id = ${r.id}`)
          expect(yield* b.sweeper.sweep).toMatchObject({ released: 0 })
          yield* query(
            b,
            (sql) => sql`UPDATE instances SET heartbeat_at = now() - interval '7 seconds' WHERE id = ${crashed}`
          )
          expect(yield* b.sweeper.sweep).toMatchObject({ released: 1 })
          expect(yield* balances(b, accountId)).toEqual({ available: 10_000_000, reserved: 0 })
          yield* expectInvariant(b, accountId)
        }))

      it.scoped("leaves a captured reservation alone", () =>
        Effect.gen(function*() {
          const { accountId, inst: b } = yield* account("wallet-sweep-captured@example.com", 1000)
          const r = yield* withDyingInstance((a) =>
            Effect.tap(
              reserve(a, accountId, 4_000_000),
              (r) => a.wallet.capture(r.id, microMyr(2_500_000), "Model call")
            )
          )
          const before = yield* b.wallet.ledger(accountId, { page: 1, limit: 100 })
          const row = yield* reservationRow(b, r.id)
          expect(row).toMatchObject({ status: "captured", capturedMicroMyr: 2_500_000 })
          expect(yield* b.sweeper.sweep).toEqual({ released: 0, captured: 0, grantsReturned: 0, closedLogs: 0 })
          expect(yield* reservationRow(b, r.id)).toEqual(row)
          expect(yield* b.wallet.ledger(accountId, { page: 1, limit: 100 })).toEqual(before)
          expect(yield* balances(b, accountId)).toEqual({ available: 7_500_000, reserved: 0 })
          yield* expectInvariant(b, accountId)
        }))

      it.scoped("does not release a reservation whose owner keeps renewing it; a lapsed lease is released even so", () =>
        Effect.gen(function*() {
          const { accountId, inst: b } = yield* account("wallet-sweep-alive@example.com", 1000)
          const c = yield* Effect.flatMap(Effect.scope, walletInstance)
          const alive = yield* reserve(b, accountId, 2_000_000)
          const forgotten = yield* reserve(b, accountId, 1_000_000)
          // Both leases lapse in the database's time; only the first is renewed (b no longer holds the second).
          yield* query(
            b,
            (sql) =>
              sql`UPDATE reservations SET expires_at = now() - interval '1 second' WHERE account_id = ${accountId}`
          )
          yield* b.leases.drop(forgotten.id)
          expect(yield* b.leases.renew).toBe(1)
          expect(yield* c.sweeper.sweep).toEqual({ released: 1, captured: 0, grantsReturned: 0, closedLogs: 0 })
          expect((yield* reservationRow(b, forgotten.id))?.status).toBe("released")
          expect((yield* reservationRow(b, alive.id))?.status).toBe("open")
          expect(yield* balances(b, accountId)).toEqual({ available: 8_000_000, reserved: 2_000_000 })
          yield* expectInvariant(b, accountId)
          expect((yield* b.wallet.capture(alive.id, microMyr(1_000_000), "Model call")).chargedMicroMyr).toBe(1_000_000)
          expect(yield* balances(b, accountId)).toEqual({ available: 9_000_000, reserved: 0 })
          yield* expectInvariant(b, accountId)
        }))

      it.scoped("two sweepers running at once release each lapsed reservation exactly once", () =>
        Effect.gen(function*() {
          const { accountId, inst: b } = yield* account("wallet-sweep-twice@example.com", 1000)
          const c = yield* Effect.flatMap(Effect.scope, walletInstance)
          const N = 12
          const lapsed = yield* withDyingInstance((a) =>
            Effect.all(Array.from({ length: N }, () => reserve(a, accountId, 500_000)), { concurrency: 4 })
          )
          expect(yield* balances(b, accountId)).toEqual({ available: 10_000_000 - N * 500_000, reserved: N * 500_000 })
          const results = yield* Effect.all([b.sweeper.sweep, c.sweeper.sweep, b.sweeper.sweep, c.sweeper.sweep], {
            concurrency: "unbounded"
          })
          expect(results.reduce((sum, r) => sum + r.released, 0)).toBe(N)
          expect(results.reduce((sum, r) => sum + r.captured, 0)).toBe(0)
          for (const r of lapsed) expect((yield* reservationRow(b, r.id))?.status).toBe("released")
          expect(yield* balances(b, accountId)).toEqual({ available: 10_000_000, reserved: 0 })
          yield* expectInvariant(b, accountId)
        }))

      it.scoped("bills a lapsed reservation whose call reported its cost, and fails a pending one", () =>
        Effect.gen(function*() {
          const { accountId, inst: b } = yield* account("wallet-sweep-logs@example.com", 1000)
          const key = newId("key")
          const [succeeded, pending] = yield* withDyingInstance((a) =>
            Effect.all([
              reserve(a, accountId, 3_000_000, { apiKeyId: key }),
              reserve(a, accountId, 2_000_000, { apiKeyId: key })
            ])
          )
          const log = (r: typeof succeeded, status: "succeeded" | "pending", cost: number) =>
            query(b, (sql) =>
              sql`
              INSERT INTO request_logs
                (request_id, account_id, api_key_id, reservation_id, public_model, endpoint, status, cost_micro_myr)
              VALUES (${r.requestId}, ${accountId}, ${key}, ${r.id}, 'svc/nenas-flash', '/v1/chat/completions', ${status}, ${cost})
            `)
          yield* log(succeeded, "succeeded", 1_234_567)
          yield* log(pending, "pending", 10_000)
          expect(yield* b.sweeper.sweep).toEqual({ released: 1, captured: 1, grantsReturned: 0, closedLogs: 0 })

          expect(yield* reservationRow(b, succeeded.id)).toMatchObject({
            status: "captured",
            capturedMicroMyr: 1_234_567
          })
          expect((yield* reservationRow(b, pending.id))?.status).toBe("released")
          const logs = yield* query<
            { requestId: string; status: string; costMicroMyr: number; errorCode: string | null }
          >(
            b,
            (sql) =>
              sql`SELECT request_id, status, cost_micro_myr, error_code FROM request_logs
                WHERE account_id = ${accountId} ORDER BY cost_micro_myr DESC`
          )
          expect(logs).toEqual([
            { requestId: succeeded.requestId, status: "billed", costMicroMyr: 1_234_567, errorCode: null },
            { requestId: pending.requestId, status: "failed", costMicroMyr: 0, errorCode: "internal_error" }
          ])
          const usage = yield* query<{ amountMicroMyr: number; requestId: string; apiKeyId: string }>(
            b,
            (sql) =>
              sql`SELECT amount_micro_myr, request_id, api_key_id FROM ledger_entries
              WHERE account_id = ${accountId} AND type = 'usage'`
          )
          expect(usage).toEqual([{ amountMicroMyr: -1_234_567, requestId: succeeded.requestId, apiKeyId: key }])
          expect(yield* b.wallet.wallet(accountId)).toMatchObject({
            availableMicroMyr: 10_000_000 - 1_234_567,
            reservedMicroMyr: 0,
            lifetimeSpendMicroMyr: 1_234_567
          })
          yield* expectInvariant(b, accountId)
        }))
    })

    it.scoped("a suspended account cannot reserve", () =>
      Effect.gen(function*() {
        const { accountId, inst } = yield* account("wallet-suspended@example.com", 1000)
        const before = yield* reserve(inst, accountId, 1_000_000)
        yield* query(inst, (sql) => sql`UPDATE accounts SET suspended_at = now() WHERE id = ${accountId}`)
        const refused = yield* Effect.either(reserve(inst, accountId, 1_000_000))
        expect(outcome(refused)).toBe("PermissionDenied")
        expect(yield* balances(inst, accountId)).toEqual({ available: 9_000_000, reserved: 1_000_000 })
        const rows = yield* query<{ n: number }>(
          inst,
          (sql) => sql`SELECT COUNT(*)::bigint AS n FROM reservations WHERE account_id = ${accountId}`
        )
        expect(rows[0]?.n).toBe(1)
        // A call already in flight still settles.
        expect(yield* inst.wallet.release(before.id)).toBe(true)
        expect(yield* balances(inst, accountId)).toEqual({ available: 10_000_000, reserved: 0 })
        yield* expectInvariant(inst, accountId)
      }))

    // Last: it moves the shared clock to the end of a month.
    it.scoped("usage from the previous Kuala Lumpur month does not count against the limit", () =>
      Effect.gen(function*() {
        const { clock } = yield* TestServer
        const { accountId, inst } = yield* account("wallet-limit-month@example.com", 5000)
        const L = 3_000_000
        const key = newId("key")
        const onKey = (amount: number) => Effect.either(reserve(inst, accountId, amount, { apiKeyId: key, limit: L }))

        // The first Kuala Lumpur month start at least two hours away.
        const now = clock.unsafeCurrentTimeMillis()
        const local = new Date(now + KL_OFFSET)
        let monthStart = Date.UTC(local.getUTCFullYear(), local.getUTCMonth() + 1, 1) - KL_OFFSET
        if (monthStart - now < 2 * HOUR) {
          monthStart = Date.UTC(local.getUTCFullYear(), local.getUTCMonth() + 2, 1) - KL_OFFSET
        }
        // 23:00 on the month's last day in Kuala Lumpur: 15:00 UTC, the same UTC day as the next local month's 01:00.
        clock.advance(monthStart - HOUR - now)
        const r = yield* reserve(inst, accountId, 2_500_000, { apiKeyId: key, limit: L })
        expect((yield* inst.wallet.capture(r.id, microMyr(2_500_000), "Model call")).chargedMicroMyr).toBe(2_500_000)
        expect(outcome(yield* onKey(1_000_000))).toBe("SpendLimitExceeded")

        clock.advance(2 * HOUR)
        expect(new Date(clock.unsafeCurrentTimeMillis()).getUTCMonth()).toBe(new Date(monthStart - HOUR).getUTCMonth())
        // A new month: the whole limit is available again, and what it holds counts.
        expect(outcome(yield* onKey(L))).toBe("ok")
        expect(outcome(yield* onKey(1))).toBe("SpendLimitExceeded")
        expect(yield* balances(inst, accountId)).toEqual({ available: 50_000_000 - 2_500_000 - L, reserved: L })
        yield* expectInvariant(inst, accountId)
      }))
  }
)

// The running service's own sweeper, here every 200 ms, releases what a dead instance left.
layer(TestServerLive({ ...webhookOverrides, reservationSweepIntervalMs: 200 }), { excludeTestServices: true })(
  "the service's background sweeper",
  (it) => {
    it.scoped("releases what an instance held once it stops, and not while it lives", () =>
      Effect.gen(function*() {
        const { accountId, inst } = yield* account("wallet-background-sweep@example.com", 1000)
        const scope = yield* Scope.make()
        const other = yield* walletInstance(scope)
        const r = yield* reserve(other, accountId, 3_000_000)
        yield* Effect.sleep("600 millis")
        expect((yield* reservationRow(inst, r.id))?.status).toBe("open")
        yield* Scope.close(scope, Exit.void)
        yield* reservationRow(inst, r.id).pipe(
          Effect.repeat({ until: (row) => row?.status !== "open", schedule: Schedule.spaced("50 millis") }),
          Effect.timeout("2 seconds")
        )
        expect((yield* reservationRow(inst, r.id))?.status).toBe("released")
        expect(yield* balances(inst, accountId)).toEqual({ available: 10_000_000, reserved: 0 })
        yield* expectInvariant(inst, accountId)
      }))
  }
)
