import { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import type { Scope } from "effect"
import { Cause, Context, Duration, Effect, Exit, Fiber, Runtime, Schedule } from "effect"
import type { LogWrite } from "../Logs/RequestLogs.js"
import { pendingRow, RequestLogs } from "../Logs/RequestLogs.js"
import { Metrics } from "../Observability/Metrics.js"
import { type CallHold, reservationIdOf } from "./CallHold.js"
import type { GrantPool } from "./GrantPool.js"
import type { Grant } from "./Grants.js"
import { ReservationLeases } from "./Leases.js"
import { logCapture } from "./Repo.js"
import type { Batch, BatchOutcome, GrantReturn, SettleItem } from "./Settle.js"
import { settleBatch } from "./Settle.js"

/** Settlements are written at most this far apart (DESIGN.md: 20 ms). */
export const FLUSH_INTERVAL = Duration.millis(20)
/** A queue this long is written at once, without waiting for the tick. */
const FLUSH_AT_DEPTH = 512
/** A call still running after this long is written as `pending`. */
const PENDING_AFTER_MS = 1000
/** After this many failed flushes in a row, settlements are written one by one: one the database refuses does not hold back the rest. */
const ISOLATE_AFTER = 3

/** One settlement waiting for the flush: money to move, a log row, or both. */
export interface Queued {
  readonly item?: SettleItem | undefined
  readonly log?: LogWrite | undefined
  /** What a grant charge moved to the grant's `pending`. */
  readonly grant?: { readonly grant: Grant; readonly amount: number } | undefined
}

/**
 * Batched settlement (DESIGN.md, Money): the calls' charges, their ledger
 * entries and log rows wait here and are written in one transaction at most
 * `FLUSH_INTERVAL` apart, never on a call's path, with what the grant pool
 * hands back. A failed flush keeps everything, in order, for the next one;
 * at shutdown everything is written and every grant handed back.
 */
export interface SettlementQueue {
  /** A call admitted: written as `pending` if it runs longer than `PENDING_AFTER_MS`. */
  readonly track: (hold: CallHold) => CallHold
  /** The call is over (settled or failed): no `pending` row for it any more. */
  readonly finish: (hold: CallHold) => void
  readonly enqueue: (entry: Queued) => void
  /** Writes everything queued so far (one flush at a time; a reader that goes away does not stop it). */
  readonly flush: Effect.Effect<void, SqlError.SqlError>
}

interface Running {
  readonly hold: CallHold
  written: boolean
}

/** The queue's state, and what a flush needs. */
interface Queue {
  readonly pool: GrantPool
  readonly leases: ReservationLeases["Type"]
  readonly metrics: Metrics
  /** What `settleBatch` runs on. */
  readonly context: Context.Context<SqlClient.SqlClient | RequestLogs>
  /** This service's clock, whoever calls it (a test on a TestClock may ask it to flush). */
  readonly nowMs: Effect.Effect<number>
  readonly running: Map<string, Running>
  entries: Array<Queued>
  /** Failed flushes in a row. */
  failures: number
}

/** What one flush takes: the queue, calls due a `pending` row, the grants' hand-backs. */
interface Taken {
  readonly entries: ReadonlyArray<Queued>
  readonly due: ReadonlyArray<Running>
  readonly returns: ReadonlyArray<GrantReturn>
  readonly close: ReadonlyArray<Grant>
}

export const makeSettlementQueue = (
  pool: GrantPool
): Effect.Effect<SettlementQueue, never, Scope.Scope | SqlClient.SqlClient | RequestLogs | ReservationLeases | Metrics> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const logs = yield* RequestLogs
    const queue: Queue = {
      pool,
      leases: yield* ReservationLeases,
      metrics: yield* Metrics,
      context: Context.make(SqlClient.SqlClient, sql).pipe(Context.add(RequestLogs, logs)),
      nowMs: (yield* Effect.clock).currentTimeMillis,
      running: new Map(),
      entries: [],
      failures: 0
    }
    const lock = yield* Effect.makeSemaphore(1)
    // Uninterruptible: a reader that goes away mid-flush (its client disconnected) must not drop what the flush took.
    const flush = lock.withPermits(1)(Effect.uninterruptible(flushOnce(queue)))
    const runtime = yield* Effect.runtime<never>()
    const loop = yield* flushForever(queue, flush)
    yield* Effect.addFinalizer(() => flushAtShutdown(queue, flush, loop))
    return {
      track: (hold) => {
        queue.running.set(hold.log.requestId, { hold, written: false })
        return hold
      },
      finish: (hold) => void queue.running.delete(hold.log.requestId),
      enqueue: (entry) => {
        queue.entries.push(entry)
        queue.metrics.settlementQueueDepth.set(queue.entries.length)
        if (queue.entries.length >= FLUSH_AT_DEPTH) Runtime.runFork(runtime)(Effect.ignore(flush))
      },
      flush
    }
  })

/**
 * Flushes every `FLUSH_INTERVAL`. Any failure, a defect included (a connection killed mid-transaction can
 * fail its rollback as one), is retried: the loop itself must never stop while the process lives.
 */
const flushForever = (queue: Queue, flush: Effect.Effect<void, SqlError.SqlError>) => {
  const tick = Effect.gen(function*() {
    const exit = yield* Effect.exit(flush)
    if (Exit.isFailure(exit) && !Cause.isInterruptedOnly(exit.cause)) {
      queue.failures++
      yield* Effect.logWarning("settlement flush failed; it is retried", exit.cause)
      // A database outage: back off up to a second; every settlement stays queued, in order.
      yield* Effect.sleep(Duration.millis(Math.min(1000, 20 * 2 ** Math.min(queue.failures, 6))))
    } else {
      queue.failures = 0
    }
  })
  return tick.pipe(Effect.repeat(Schedule.spaced(FLUSH_INTERVAL)), Effect.interruptible, Effect.forkScoped)
}

/** At shutdown (after the server drained its calls): write everything, hand every grant back. */
const flushAtShutdown = (queue: Queue, flush: Effect.Effect<void, SqlError.SqlError>, loop: Fiber.Fiber<unknown, unknown>) =>
  Effect.gen(function*() {
    yield* Fiber.interrupt(loop)
    yield* queue.pool.stop
    yield* flush.pipe(
      Effect.retry(Schedule.exponential("50 millis").pipe(Schedule.intersect(Schedule.recurs(8)))),
      Effect.catchAllCause((cause) => Effect.logError("the last settlements could not be written", cause))
    )
    if (queue.entries.length > 0) yield* Effect.logError("settlements left unwritten at shutdown", { queued: queue.entries.length })
  })

const flushOnce = (queue: Queue) =>
  Effect.gen(function*() {
    const now = yield* queue.nowMs
    const entries = queue.entries
    queue.entries = []
    const due = [...queue.running.values()].filter((r) => !r.written && now - r.hold.startedAt.getTime() >= PENDING_AFTER_MS)
    const { close, returns } = queue.pool.takeHandBacks(now)
    if (entries.length === 0 && due.length === 0 && returns.length === 0) return
    const taken: Taken = { entries, due, returns, close }
    yield* queue.failures < ISOLATE_AFTER ? write(queue, taken, now) : writeOneByOne(queue, taken, now)
    queue.metrics.settlementQueueDepth.set(queue.entries.length)
    queue.metrics.grantsHeld.set(queue.pool.unlent())
  })

/** After repeated failures: each settlement in a transaction of its own, so one the database refuses holds back no other. */
const writeOneByOne = (queue: Queue, taken: Taken, now: number) =>
  Effect.gen(function*() {
    // Nothing of `entries` is written by this first one: should it fail, `entries` waits for the next flush too.
    if (taken.due.length > 0 || taken.returns.length > 0 || taken.close.length > 0) {
      yield* write(queue, { ...taken, entries: [] }, now).pipe(
        Effect.onError(() => Effect.sync(() => void (queue.entries = [...taken.entries, ...queue.entries])))
      )
    }
    let refused: Cause.Cause<SqlError.SqlError> | undefined = undefined
    for (const entry of taken.entries) {
      const exit = yield* Effect.exit(write(queue, { entries: [entry], due: [], returns: [], close: [] }, now))
      if (Exit.isFailure(exit)) refused = exit.cause
    }
    if (refused !== undefined) return yield* Effect.failCause(refused)
  })

const batchOf = (taken: Taken, now: number, holder: string): Batch => {
  const items: Array<SettleItem> = []
  const logs: Array<LogWrite> = taken.due.map((r) => pendingRow(r.hold.log, reservationIdOf(r.hold), r.hold.startedAt))
  for (const entry of taken.entries) {
    if (entry.item !== undefined) items.push(entry.item)
    if (entry.log !== undefined) logs.push(entry.log)
  }
  return { items, returns: taken.returns, logs, close: taken.close.map((grant) => grant.id), at: new Date(now), holder }
}

/** Writes `taken` in one transaction; on failure puts everything back for the next flush. */
const write = (queue: Queue, taken: Taken, now: number) =>
  Effect.gen(function*() {
    const batch = batchOf(taken, now, queue.leases.holder)
    const started = performance.now()
    const observe = (outcome: "ok" | "error") =>
      queue.metrics.settlementFlushDuration.observe({ outcome }, (performance.now() - started) / 1000)
    const outcome = yield* settleBatch(batch).pipe(
      Effect.provide(queue.context),
      Effect.onError(() =>
        Effect.sync(() => {
          // Nothing was written: it all waits for the next flush, in its order.
          queue.entries = [...taken.entries, ...queue.entries]
          queue.pool.unwritten(taken.returns)
          observe("error")
        })
      )
    )
    observe("ok")
    yield* afterWrite(queue, taken, batch, outcome)
  })

/** What a written batch settles in memory: rows no longer due, leases dropped, grants' charges written. */
const afterWrite = (queue: Queue, taken: Taken, batch: Batch, outcome: BatchOutcome) =>
  Effect.gen(function*() {
    for (const r of taken.due) r.written = true
    for (const entry of taken.entries) {
      if (entry.grant !== undefined) queue.pool.chargeWritten(entry.grant.grant, entry.grant.amount)
      if (entry.item !== undefined && entry.item._tag !== "GrantCharge") yield* queue.leases.drop(entry.item.reservationId)
    }
    for (const [index, item] of batch.items.entries()) {
      const done = outcome.items[index]
      if (item._tag === "Capture" && done !== undefined) {
        yield* logCapture({ reservationId: item.reservationId, chargedMicroMyr: done.chargedMicroMyr, ledgerEntryId: done.ledgerEntryId })
      }
    }
    yield* queue.pool.written(taken.close, outcome.missingGrants)
  })
