import { PgClient } from "@effect/sql-pg"
import { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Cause, Context, Duration, Effect, Either, Exit, Fiber, Layer, Option, Runtime, Schedule, Stream } from "effect"
import type { PermissionDenied, SpendLimitExceeded } from "../Domain/Errors.js"
import { InsufficientBalance } from "../Domain/Errors.js"
import { newId } from "../Domain/Ids.js"
import type { MicroMyr } from "../Domain/Money.js"
import { microMyr, toMyrString } from "../Domain/Money.js"
import { Metrics } from "../Observability/Metrics.js"
import type { LoggedUsage, LogWrite, OpenLog } from "../Logs/RequestLogs.js"
import { failedRow, pendingRow, RequestLogs } from "../Logs/RequestLogs.js"
import type { Grant, Pace } from "./Grants.js"
import { grantGrowth, newGrant, newPace, notePace, wantsGrant } from "./Grants.js"
import { ReservationLeases } from "./Leases.js"
import type { Reservation, ReserveInput, Wallet } from "./Repo.js"
import { GRANT_CHANNEL, logCapture, WalletRepo } from "./Repo.js"
import type { GrantReturn, SettleItem } from "./Settle.js"
import { settleBatch } from "./Settle.js"

/** Settlements are written at most this far apart (DESIGN.md: 20 ms). */
export const FLUSH_INTERVAL = Duration.millis(20)
/** A queue this long is written at once, without waiting for the tick. */
const FLUSH_AT_DEPTH = 512
/** A call still running after this long is written as `pending`. */
const PENDING_AFTER_MS = 1000
/** A grant no call has reserved from for this long is handed back. */
const GRANT_IDLE_MS = 5000
/** After a request to hand grants back (a call was refused), no grant for the account for this long. */
const GRANT_COOLDOWN_MS = 10_000
/** How long a refused call waits for other instances to hand their grants back. */
const RECLAIM_WAIT_MS = 1000

/** Where a call's money is held. */
export type HoldSource =
  /** In memory, from this instance's credit grant for the account. */
  | { readonly _tag: "Grant"; readonly grant: Grant }
  /** A reservation row of its own. */
  | { readonly _tag: "Reservation"; readonly reservation: Reservation }
  /** Nothing to hold: a test key, or a model priced at nothing. */
  | { readonly _tag: "None" }

/** A call admitted: its log and what it holds. */
export interface CallHold {
  readonly log: OpenLog
  readonly startedAt: Date
  readonly amountMicroMyr: number
  readonly source: HoldSource
}

interface Running {
  readonly hold: CallHold
  written: boolean
}

interface Queued {
  readonly item?: SettleItem | undefined
  readonly log?: LogWrite | undefined
  /** What a grant charge moved from the grant's `pending`. */
  readonly grant?: { readonly grant: Grant; readonly amount: number } | undefined
}

/**
 * The wallet's side of a model call (DESIGN.md, Money): hold the call's
 * maximum before it runs — in memory from a credit grant when the account
 * spends often and the wallet is large, otherwise in one SQL reservation —
 * then settle it: the charge, its ledger entry and the call's log row are
 * queued and written in batches, one transaction at most `FLUSH_INTERVAL`
 * apart, never on the call's path. Reads of the wallet, ledger and logs go
 * through `settled` first, so they include every call this instance answered.
 */
export class Spending extends Context.Tag("nenas/Spending")<Spending, {
  /** Holds the call's maximum (`input`; null for a test key, which holds nothing). */
  readonly hold: (
    input: ReserveInput | null,
    log: OpenLog
  ) => Effect.Effect<CallHold, InsufficientBalance | SpendLimitExceeded | PermissionDenied | SqlError.SqlError>
  /** Bills `amount` (at most the hold) and logs the usage; returns the cost billed. Written with the next flush. */
  readonly settle: (hold: CallHold, amount: MicroMyr, description: string, usage: LoggedUsage) => Effect.Effect<number>
  /** Returns the hold whole and logs the failure (cost 0). */
  readonly fail: (hold: CallHold, errorCode: string, latencyMs: number) => Effect.Effect<void>
  /** A call refused before it held anything: one `failed` row. */
  readonly refused: (log: OpenLog, errorCode: string, latencyMs: number) => Effect.Effect<void>
  /**
   * Writes everything queued so far; reads that must include this instance's
   * calls run after it. A flush the database refuses is left to the retries:
   * the read goes on with what is written.
   */
  readonly settled: Effect.Effect<void>
  /** The balance as developers see it: grants are available money, calls in flight are reserved. */
  readonly balance: (accountId: string) => Effect.Effect<Wallet, SqlError.SqlError>
}>() {
  static readonly layer = Layer.scoped(
    Spending,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const wallets = yield* WalletRepo
      const logs = yield* RequestLogs
      const leases = yield* ReservationLeases
      const metrics = yield* Metrics
      const pg = yield* Effect.serviceOption(PgClient.PgClient)
      const holder = leases.holder
      const settleContext = Context.make(SqlClient.SqlClient, sql).pipe(Context.add(RequestLogs, logs))

      const grants = new Map<string, Grant>()
      const paces = new Map<string, Pace>()
      const running = new Map<string, Running>()
      let queue: Array<Queued> = []
      let stopping = false
      const flushLock = yield* Effect.makeSemaphore(1)
      const runtime = yield* Effect.runtime<never>()

      // This service's clock, whoever calls it (a test on a TestClock may ask it to flush).
      const clock = yield* Effect.clock
      const nowMs = clock.currentTimeMillis
      const paceOf = (accountId: string, now: number) => {
        let pace = paces.get(accountId)
        if (pace === undefined) {
          pace = newPace(now)
          paces.set(accountId, pace)
        }
        return pace
      }

      const enqueue = (entry: Queued) => {
        queue.push(entry)
        metrics.settlementQueueDepth.set(queue.length)
        if (queue.length >= FLUSH_AT_DEPTH) Runtime.runFork(runtime)(Effect.ignore(flush))
      }

      // ------------------------------------------------------------ flushing

      let lastPaceSweep = 0
      /** Forgets the pace of accounts that have not called for a minute (and hold no grant). */
      const forgetQuietAccounts = (now: number) => {
        if (now - lastPaceSweep < 5000) return
        lastPaceSweep = now
        for (const [accountId, pace] of paces) {
          if (now - pace.windowStart > 60_000 && !grants.has(accountId)) paces.delete(accountId)
        }
      }

      /** What to hand back now: grants asked for, idle ones, and all of them when stopping. */
      const handBacks = (now: number) => {
        forgetQuietAccounts(now)
        const returns: Array<GrantReturn> = []
        const close: Array<Grant> = []
        for (const grant of grants.values()) {
          if (!grant.stored) continue
          const idle = now - grant.lastHoldAt >= GRANT_IDLE_MS
          if (stopping || idle) grant.closing = true
          if (!grant.closing) continue
          // Even 0 when asked: the row's updated_at tells the waiting instance this one answered.
          if (grant.remaining > 0 || grant.asked) {
            returns.push({ grantId: grant.id, accountId: grant.accountId, amountMicroMyr: grant.remaining })
            grant.remaining = 0
            grant.asked = false
          }
          if (grant.inFlight === 0) close.push(grant)
        }
        return { returns, close }
      }

      /** Writes `taken` (and what is due) in one transaction; on failure puts everything back for the next flush. */
      const write = (taken: ReadonlyArray<Queued>, due: ReadonlyArray<Running>, returns: ReadonlyArray<GrantReturn>, close: ReadonlyArray<Grant>, now: number) =>
        Effect.gen(function*() {
          const items: Array<SettleItem> = []
          const rows: Array<LogWrite> = due.map((r) => pendingRow(r.hold.log, reservationIdOf(r.hold), r.hold.startedAt))
          for (const q of taken) {
            if (q.item !== undefined) items.push(q.item)
            if (q.log !== undefined) rows.push(q.log)
          }
          const started = performance.now()
          const outcome = yield* settleBatch({ items, returns, logs: rows, close: close.map((g) => g.id), at: new Date(now), holder }).pipe(
            Effect.provide(settleContext),
            Effect.onError(() =>
              Effect.sync(() => {
                // Nothing was written: it all waits for the next flush, in its order.
                queue = [...taken, ...queue]
                for (const back of returns) {
                  const grant = grants.get(back.accountId)
                  if (grant?.id === back.grantId) {
                    grant.remaining += back.amountMicroMyr
                    grant.asked = true
                  }
                }
                metrics.settlementFlushDuration.observe({ outcome: "error" }, (performance.now() - started) / 1000)
              })
            )
          )
          metrics.settlementFlushDuration.observe({ outcome: "ok" }, (performance.now() - started) / 1000)
          for (const r of due) r.written = true
          for (const q of taken) {
            if (q.grant !== undefined) q.grant.grant.pending -= q.grant.amount
            if (q.item !== undefined && q.item._tag !== "GrantCharge") yield* leases.drop(q.item.reservationId)
          }
          for (const [i, item] of items.entries()) {
            const done = outcome.items[i]
            if (item._tag === "Capture" && done !== undefined) {
              yield* logCapture({ reservationId: item.reservationId, chargedMicroMyr: done.chargedMicroMyr, ledgerEntryId: done.ledgerEntryId })
            }
          }
          for (const grant of close) {
            if (grant.inFlight === 0 && grant.pending === 0 && grant.remaining === 0 && grants.get(grant.accountId) === grant) {
              grants.delete(grant.accountId)
            }
          }
          for (const grant of [...grants.values()]) {
            if (!outcome.missingGrants.has(grant.id)) continue
            // The sweeper returned it (this process looked dead): calls on it were billed late; take no more from it.
            grants.delete(grant.accountId)
            yield* Effect.logWarning("a credit grant was returned by another instance's sweeper").pipe(
              Effect.annotateLogs({ grantId: grant.id, accountId: grant.accountId })
            )
          }
        })

      /** After this many failed flushes in a row, settlements are written one by one: one the database refuses does not hold back the rest. */
      const ISOLATE_AFTER = 3
      let failures = 0

      const flushOnce = Effect.gen(function*() {
        const now = yield* nowMs
        const taken = queue
        queue = []
        const due: Array<Running> = []
        for (const r of running.values()) {
          if (!r.written && now - r.hold.startedAt.getTime() >= PENDING_AFTER_MS) due.push(r)
        }
        const { close, returns } = handBacks(now)
        if (taken.length === 0 && due.length === 0 && returns.length === 0) return
        if (failures < ISOLATE_AFTER) {
          yield* write(taken, due, returns, close, now)
        } else {
          // Nothing of `taken` is written by this first one: should it fail, `taken` waits for the next flush too.
          if (due.length > 0 || returns.length > 0 || close.length > 0) {
            yield* write([], due, returns, close, now).pipe(Effect.onError(() => Effect.sync(() => void (queue = [...taken, ...queue]))))
          }
          let refused: Cause.Cause<SqlError.SqlError> | undefined = undefined
          for (const q of taken) {
            const exit = yield* Effect.exit(write([q], [], [], [], now))
            if (Exit.isFailure(exit)) refused = exit.cause
          }
          if (refused !== undefined) return yield* Effect.failCause(refused)
        }
        metrics.settlementQueueDepth.set(queue.length)
        let held = 0
        for (const grant of grants.values()) held += grant.remaining
        metrics.grantsHeld.set(held)
      })

      // Uninterruptible: a reader that goes away mid-flush (its client disconnected) must not drop what the flush took.
      const flush = flushLock.withPermits(1)(Effect.uninterruptible(flushOnce))

      // Any failure, a defect included (a connection killed mid-transaction can fail its rollback as one), is
      // retried: the loop itself must never stop while the process lives.
      const tick = Effect.gen(function*() {
        const exit = yield* Effect.exit(flush)
        if (Exit.isFailure(exit) && !Cause.isInterruptedOnly(exit.cause)) {
          failures++
          yield* Effect.logWarning("settlement flush failed; it is retried", exit.cause)
          // A database outage: back off up to a second; every settlement stays queued, in order.
          yield* Effect.sleep(Duration.millis(Math.min(1000, 20 * 2 ** Math.min(failures, 6))))
        } else {
          failures = 0
        }
      })
      const loop = yield* tick.pipe(Effect.repeat(Schedule.spaced(FLUSH_INTERVAL)), Effect.interruptible, Effect.forkScoped)

      // At shutdown (after the server drained its calls): write everything, hand every grant back.
      yield* Effect.addFinalizer(() =>
        Effect.gen(function*() {
          yield* Fiber.interrupt(loop)
          stopping = true
          // A growth still committing would leave a grant behind: wait for it (briefly) before handing everything back.
          for (let i = 0; i < 100 && [...grants.values()].some((g) => g.growing); i++) yield* Effect.sleep("10 millis")
          yield* flush.pipe(
            Effect.retry(Schedule.exponential("50 millis").pipe(Schedule.intersect(Schedule.recurs(8)))),
            Effect.catchAllCause((cause) => Effect.logError("the last settlements could not be written", cause))
          )
          if (queue.length > 0) yield* Effect.logError("settlements left unwritten at shutdown", { queued: queue.length })
        })
      )

      // ------------------------------------------------------------ grants

      /** Another instance (or a debit) asks for the account's grant back: hand it back, take none for a while. */
      const handBack = (accountId: string, now: number) => {
        paceOf(accountId, now).noGrantUntil = now + GRANT_COOLDOWN_MS
        const grant = grants.get(accountId)
        if (grant !== undefined) {
          grant.closing = true
          grant.asked = true
        }
      }

      if (Option.isSome(pg)) {
        // Listens again a second after the connection fails; meanwhile a refused call elsewhere waits at most
        // RECLAIM_WAIT_MS for this instance, and idle grants come back by themselves.
        yield* pg.value.listen(GRANT_CHANNEL).pipe(
          Stream.runForEach((accountId) => Effect.flatMap(nowMs, (now) => Effect.sync(() => handBack(accountId, now)))),
          Effect.catchAllCause((cause) => Effect.logWarning("listening for grant requests stopped; listening again", cause)),
          Effect.zipRight(Effect.sleep("1 second")),
          Effect.forever,
          Effect.forkScoped
        )
      }

      /** Grows `g` (marked growing by the caller) by what the wallet affords at the account's pace. */
      const grow = (g: Grant, pace: Pace) =>
        Effect.gen(function*() {
          const result = yield* wallets.growGrant({ id: g.id, accountId: g.accountId, create: !g.stored }, (w) =>
            grantGrowth({
              spendPerSecond: pace.spendPerSecond,
              estimate: pace.lastEstimate,
              remaining: g.remaining,
              heldMicroMyr: w.heldMicroMyr,
              availableMicroMyr: w.availableMicroMyr
            }))
          if (result === "missing") {
            if (grants.get(g.accountId) === g) grants.delete(g.accountId)
          } else if (result > 0) {
            g.stored = true
            g.remaining += result
          } else {
            // The wallet is low: calls reserve one by one for a while.
            pace.noGrantUntil = (yield* nowMs) + 1000
            if (!g.stored && grants.get(g.accountId) === g) grants.delete(g.accountId)
          }
        }).pipe(
          Effect.catchAllCause((cause) =>
            Effect.zipRight(
              Effect.sync(() => {
                if (!g.stored && grants.get(g.accountId) === g) grants.delete(g.accountId)
              }),
              Effect.logWarning("growing a credit grant failed", cause)
            )
          ),
          Effect.ensuring(Effect.sync(() => void (g.growing = false)))
        )

      /** Starts growing the account's grant in the background, creating it first when there is none. */
      const startGrowing = (accountId: string, pace: Pace, now: number) => {
        let g = grants.get(accountId)
        if (g === undefined) {
          g = newGrant(newId("gr"), accountId, now)
          grants.set(accountId, g)
        }
        g.growing = true
        Runtime.runFork(runtime)(grow(g, pace))
      }

      // ------------------------------------------------------------ holds

      const track = (hold: CallHold) => {
        running.set(hold.log.requestId, { hold, written: false })
        return hold
      }

      /** Another instance's grants (or this one's) may hold what this call needs: ask for them back, then decide again. */
      const reclaimAndRetry = (input: ReserveInput, now: number) =>
        Effect.gen(function*() {
          handBack(input.accountId, now)
          const own = grants.get(input.accountId)
          if (own !== undefined) yield* flush
          const [asked] = yield* sql<{ others: number; asked: Date }>`
            SELECT (SELECT count(*)::int FROM credit_grants WHERE account_id = ${input.accountId} AND holder <> ${holder}) AS others,
                   now() AS asked, pg_notify(${GRANT_CHANNEL}, ${input.accountId})
          `
          let attempt = yield* Effect.either(wallets.reserve(input))
          if (asked === undefined || asked.others === 0) return attempt
          const deadline = now + RECLAIM_WAIT_MS
          while (Either.isLeft(attempt) && attempt.left._tag === "InsufficientBalance" && (yield* nowMs) < deadline) {
            const [waiting] = yield* sql<{ unanswered: number }>`
              SELECT count(*)::int AS unanswered FROM credit_grants
              WHERE account_id = ${input.accountId} AND holder <> ${holder} AND updated_at < ${asked.asked}
            `
            const answered = (waiting?.unanswered ?? 0) === 0
            yield* Effect.sleep(Duration.millis(answered ? 0 : 20))
            attempt = yield* Effect.either(wallets.reserve(input))
            if (answered) break
          }
          return attempt
        }).pipe(Effect.flatMap(Either.match({ onLeft: Effect.fail, onRight: Effect.succeed })))

      const holdFromWallet = (input: ReserveInput, log: OpenLog, startedAt: Date) =>
        Effect.gen(function*() {
          const now = startedAt.getTime()
          if (input.monthlySpendLimitMicroMyr === null) {
            const quick = yield* wallets.reserveQuickly(input)
            if (quick !== undefined) {
              return track({ log, startedAt, amountMicroMyr: input.amountMicroMyr, source: { _tag: "Reservation", reservation: quick } })
            }
          }
          const exact = yield* Effect.either(wallets.reserve(input))
          const reservation = Either.isRight(exact) || exact.left._tag !== "InsufficientBalance"
            ? yield* exact
            : yield* reclaimAndRetry(input, now)
          return track({ log, startedAt, amountMicroMyr: input.amountMicroMyr, source: { _tag: "Reservation", reservation } })
        })

      const hold = (input: ReserveInput | null, log: OpenLog) =>
        Effect.gen(function*() {
          const now = yield* nowMs
          const startedAt = new Date(now)
          if (input === null) return track({ log, startedAt, amountMicroMyr: 0, source: { _tag: "None" } })
          if (input.amountMicroMyr === 0) {
            // A call priced at nothing (a free local model) holds nothing, but a negative balance still blocks it.
            const stored = yield* wallets.wallet(input.accountId)
            const balance = stored.availableMicroMyr + stored.grantedMicroMyr
            if (balance < 0) {
              return yield* new InsufficientBalance({
                message: `The wallet's balance is negative (RM ${toMyrString(microMyr(balance))}); live calls resume after a top-up.`
              })
            }
            return track({ log, startedAt, amountMicroMyr: 0, source: { _tag: "None" } })
          }
          const pace = paceOf(input.accountId, now)
          notePace(pace, input.amountMicroMyr, now)
          // A key with a monthly limit is counted in the database, call by call.
          if (input.monthlySpendLimitMicroMyr === null) {
            const grant = grants.get(input.accountId)
            if (!stopping && wantsGrant(pace, grant, now)) startGrowing(input.accountId, pace, now)
            if (grant !== undefined && !grant.closing && grant.remaining >= input.amountMicroMyr) {
              grant.remaining -= input.amountMicroMyr
              grant.inFlight += input.amountMicroMyr
              grant.lastHoldAt = now
              return track({ log, startedAt, amountMicroMyr: input.amountMicroMyr, source: { _tag: "Grant", grant } })
            }
          }
          return yield* holdFromWallet(input, log, startedAt)
        })

      // ------------------------------------------------------------ settling

      const finish = (hold: CallHold) => {
        const r = running.get(hold.log.requestId)
        running.delete(hold.log.requestId)
        return r
      }

      const settle = (hold: CallHold, amount: MicroMyr, description: string, usage: LoggedUsage) =>
        Effect.map(nowMs, (now) => {
          finish(hold)
          const charged = Math.min(Math.max(amount, 0), hold.amountMicroMyr)
          const base: LogWrite = {
            ...hold.log,
            ...usage,
            costMicroMyr: charged,
            reservationId: reservationIdOf(hold),
            status: hold.source._tag === "None" ? "succeeded" : "billed",
            errorCode: null,
            createdAt: hold.startedAt,
            completedAt: new Date(now)
          }
          const { source } = hold
          switch (source._tag) {
            case "None":
              enqueue({ log: base })
              break
            case "Reservation":
              enqueue({
                item: { _tag: "Capture", reservationId: source.reservation.id, amountMicroMyr: charged, description, log: base }
              })
              break
            case "Grant": {
              const grant = source.grant
              grant.inFlight -= hold.amountMicroMyr
              grant.remaining += hold.amountMicroMyr - charged
              grant.pending += charged
              enqueue({
                item: {
                  _tag: "GrantCharge",
                  grantId: grant.id,
                  accountId: grant.accountId,
                  apiKeyId: hold.log.apiKeyId,
                  requestId: hold.log.requestId,
                  amountMicroMyr: charged,
                  description,
                  log: base
                },
                grant: { grant, amount: charged }
              })
              break
            }
          }
          return charged
        })

      const fail = (hold: CallHold, errorCode: string, latencyMs: number) =>
        Effect.map(nowMs, (now) => {
          finish(hold)
          const row = failedRow(hold.log, reservationIdOf(hold), hold.startedAt, errorCode, latencyMs, new Date(now))
          const { source } = hold
          if (source._tag === "Reservation") {
            enqueue({ item: { _tag: "Release", reservationId: source.reservation.id, log: row } })
          } else {
            if (source._tag === "Grant") {
              source.grant.inFlight -= hold.amountMicroMyr
              source.grant.remaining += hold.amountMicroMyr
            }
            enqueue({ log: row })
          }
        })

      const refused = (log: OpenLog, errorCode: string, latencyMs: number) =>
        Effect.map(nowMs, (now) => {
          const at = new Date(now)
          enqueue({ log: failedRow(log, null, new Date(now - latencyMs), errorCode, latencyMs, at) })
        })

      const settled = flush.pipe(
        Effect.catchAllCause((cause) => Effect.logWarning("settlements could not be written before a read", cause))
      )

      const balance = (accountId: string) =>
        Effect.gen(function*() {
          yield* settled
          const stored = yield* wallets.wallet(accountId)
          const inFlight = grants.get(accountId)?.inFlight ?? 0
          return {
            availableMicroMyr: stored.availableMicroMyr + stored.grantedMicroMyr - inFlight,
            reservedMicroMyr: stored.reservedMicroMyr + inFlight,
            lifetimeTopupMicroMyr: stored.lifetimeTopupMicroMyr,
            lifetimeSpendMicroMyr: stored.lifetimeSpendMicroMyr
          } satisfies Wallet
        })

      return Spending.of({ hold, settle, fail, refused, settled, balance })
    })
  )
}

const reservationIdOf = (hold: CallHold) => hold.source._tag === "Reservation" ? hold.source.reservation.id : null

