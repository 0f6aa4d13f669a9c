import { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import type { Scope } from "effect"
import { Cause, Context, Duration, Effect, Exit, Fiber, Runtime, Schedule } from "effect"
import { pendingRow, RequestLogs } from "../../Logs/RequestLogs.js"
import { Metrics } from "../../Observability/Metrics.js"
import type { StoredWrite } from "../../Responses/Store.js"
import { type CallHold, reservationIdOf } from "../CallHold.js"
import type { GrantPool } from "../Grants/GrantPool.js"
import type { Grant } from "../Grants/Grants.js"
import { ReservationLeases } from "../Instances/Leases.js"
import { logCapture } from "../Repo.js"
import { type Anomaly, clampItem, clampLog } from "./Clamp.js"
import { refusalOf, writeInParts } from "./Isolation.js"
import { parkRefused, refuse, type Refused, retryRefused } from "./Refusals.js"
import { settleBatch } from "./Settle.js"
import type { Batch, BatchOutcome, NumberedReturn, Queued, SettleItem } from "./SettleBatch.js"

/** Settlements are written at most this far apart (docs/money.md, "Batched settlement": 20 ms). */
export const FLUSH_INTERVAL = Duration.millis(20)
/** A queue this long is written at once, without waiting for the tick. */
const FLUSH_AT_DEPTH = 512
/** A call still running after this long is written as `pending`. */
const PENDING_AFTER_MS = 1000
/** After this many failed flushes in a row, settlements are written in parts: one the database refuses does not hold back the rest. */
const ISOLATE_AFTER = 3

/**
 * Batched settlement (docs/money.md, "Batched settlement"): the calls' charges, their ledger
 * entries and log rows wait here and are written in one transaction at most
 * `FLUSH_INTERVAL` apart, never on a call's path, with what the grant pool
 * hands back. A failed flush keeps everything, in order, for the next one;
 * every item is safe to write twice (`settleBatch`). After `ISOLATE_AFTER`
 * failures in a row the batch is written in parts (`Isolation.ts`), halved
 * until each part is written or is one settlement the database refuses;
 * that one is retried alone, beside the batches (`Refusals.ts`), and parked after
 * `PARK_AFTER` refusals. At shutdown everything is written and every grant
 * handed back.
 */
export interface SettlementQueue {
  /** A call admitted: written as `pending` if it runs longer than `PENDING_AFTER_MS`. */
  readonly track: (hold: CallHold) => CallHold
  /** The call is over (settled or failed): no `pending` row for it any more. */
  readonly finish: (hold: CallHold) => void
  readonly enqueue: (entry: Queued) => void
  /** Writes everything queued so far (one flush at a time; a reader that goes away does not stop it). */
  readonly flush: Effect.Effect<void, SqlError.SqlError>
  /** Failed flushes in a row (0 once one succeeds), and settlements refused so far and retried alone. */
  readonly health: () => { readonly failures: number; readonly refused: number }
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
  /** Hand-backs taken but not written: written as they are, in their order, before any newer one. */
  returns: Array<NumberedReturn>
  nextReturn: number
  refused: Array<Refused>
  /** Failed flushes in a row. */
  failures: number
}

/** What one write takes: settlements, calls due a `pending` row, the grants' hand-backs. */
interface Taken {
  readonly entries: ReadonlyArray<Queued>
  readonly due: ReadonlyArray<Running>
  readonly returns: ReadonlyArray<NumberedReturn>
  readonly close: ReadonlyArray<Grant>
}

export const makeSettlementQueue = (
  pool: GrantPool
): Effect.Effect<
  SettlementQueue,
  never,
  Scope.Scope | SqlClient.SqlClient | RequestLogs | ReservationLeases | Metrics
> =>
  // eslint-disable-next-line nenas/no-gen-in-arrow -- built once, at start
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
      returns: [],
      nextReturn: 1,
      refused: [],
      failures: 0
    }
    const lock = yield* Effect.makeSemaphore(1)
    // Uninterruptible: a reader that goes away mid-flush (its client disconnected) must not drop what the flush took.
    const flush = lock.withPermits(1)(Effect.uninterruptible(flushOnce(queue)))
    const runtime = yield* Effect.runtime<never>()
    const loop = yield* flushForever(queue, flush)
    yield* Effect.addFinalizer(() => flushAtShutdown(queue, flush, lock, loop))
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
      flush,
      health: () => ({ failures: queue.failures, refused: queue.refused.length })
    }
  })

/**
 * Flushes every `FLUSH_INTERVAL`. Any failure, a defect included (a connection killed mid-transaction can
 * fail its rollback as one), is retried: the loop itself must never stop while the process lives.
 */
const flushForever = (queue: Queue, flush: Effect.Effect<void, SqlError.SqlError>) => {
  // eslint-disable-next-line nenas/no-gen-in-arrow -- the loop is made once
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

/** At shutdown (after the server drained its calls): write everything, park what is still refused, hand every grant back. */
const flushAtShutdown = Effect.fnUntraced(
  function*(
    queue: Queue,
    flush: Effect.Effect<void, SqlError.SqlError>,
    lock: Effect.Semaphore,
    loop: Fiber.Fiber<unknown, unknown>
  ) {
    yield* Fiber.interrupt(loop)
    yield* queue.pool.stop
    yield* flush.pipe(
      Effect.retry(Schedule.exponential("50 millis").pipe(Schedule.intersect(Schedule.recurs(8)))),
      Effect.catchAllCause((cause) => Effect.logError("the last settlements could not be written", cause))
    )
    if (queue.refused.length > 0) {
      // No time left to try them again: parked now, their holds given back, and the grants they kept open closed.
      const now = yield* queue.nowMs
      yield* lock.withPermits(1)(Effect.forEach([...queue.refused], (refused) => parkRefused(queue, refused, now)))
      yield* Effect.ignore(flush)
    }
    const left = queue.entries.length + queue.refused.length
    if (left > 0) yield* Effect.logError("settlements left unwritten at shutdown", { queued: left })
  }
)

const flushOnce = Effect.fnUntraced(function*(queue: Queue) {
  const now = yield* queue.nowMs
  const entries = queue.entries
  queue.entries = []
  const due = [...queue.running.values()].filter((r) =>
    !r.written && now - r.hold.startedAt.getTime() >= PENDING_AFTER_MS
  )
  const handBacks = queue.pool.takeHandBacks(now)
  // eslint-disable-next-line nenas/no-spread-adding-field -- once per grant handed back, not per call
  const returns = [...queue.returns, ...handBacks.returns.map((back) => ({ ...back, seq: queue.nextReturn++ }))]
  queue.returns = []
  if (entries.length > 0 || due.length > 0 || returns.length > 0) {
    const taken: Taken = { entries, due, returns, close: handBacks.close }
    yield* queue.failures < ISOLATE_AFTER ? write(queue, taken, now) : writeIsolated(queue, taken, now)
  }
  yield* retryRefused(queue, now, (entry) => write(queue, alone(entry), now, false))
  queue.metrics.settlementQueueDepth.set(queue.entries.length + queue.refused.length)
  queue.metrics.grantsHeld.set(queue.pool.unlent())
})

const alone = (entry: Queued): Taken => ({ entries: [entry], due: [], returns: [], close: [] })

/**
 * After repeated failures: the rows due and the hand-backs in a transaction of their own, the settlements in
 * parts (`writeInParts`); one the database refuses is set aside (`retryRefused`). The flush fails only when
 * nothing was written and the database did not answer.
 */
const writeIsolated = Effect.fnUntraced(function*(queue: Queue, taken: Taken, now: number) {
  const head = taken.due.length > 0 || taken.returns.length > 0 || taken.close.length > 0
    ? yield* writeHead(queue, taken, now)
    : undefined
  const parts = yield* writeInParts(
    taken.entries,
    (entries) => write(queue, { entries, due: [], returns: [], close: [] }, now, false),
    (entry, cause) => refuse(queue, entry, cause, now)
  )
  queue.entries = [...parts.kept, ...queue.entries]
  const headUnanswered = head !== undefined && Exit.isFailure(head) && refusalOf(head.cause) === undefined
    ? head.cause
    : undefined
  const unanswered = parts.unanswered ?? headUnanswered
  const written = parts.written || (head !== undefined && Exit.isSuccess(head))
  if (!written && unanswered !== undefined) return yield* Effect.failCause(unanswered)
})

/**
 * The rows due and the hand-backs. A `pending` row the database refuses is given up (the call's final row
 * comes with its settlement), and the hand-backs are written without it: they never wait behind it.
 */
const writeHead = Effect.fnUntraced(function*(queue: Queue, taken: Taken, now: number) {
  const head = { ...taken, entries: [] }
  const exit = yield* Effect.exit(write(queue, head, now, taken.due.length === 0))
  if (Exit.isSuccess(exit) || taken.due.length === 0) return exit
  if (refusalOf(exit.cause) === undefined) {
    queue.returns = [...taken.returns, ...queue.returns]
    return exit
  }
  for (const r of taken.due) r.written = true
  yield* Effect.logWarning(
    "pending rows refused by the database; their calls' final rows are written when they settle",
    exit.cause
  )
  return yield* Effect.exit(write(queue, { ...head, due: [] }, now))
})

/** The batch `taken` writes, its values clamped to what the columns hold (each change an anomaly). */
const batchOf = (taken: Taken, now: number, holder: string, pool: GrantPool, anomalies: Array<Anomaly>): Batch => {
  const items: Array<SettleItem> = []
  const stored: Array<StoredWrite> = []
  const logs = taken.due.map((r) =>
    clampLog(pendingRow(r.hold.log, reservationIdOf(r.hold), r.hold.startedAt), anomalies)
  )
  for (const entry of taken.entries) {
    if (entry.item !== undefined) items.push(clampItem(entry.item, anomalies))
    if (entry.log !== undefined) logs.push(clampLog(entry.log, anomalies))
    if (entry.stored !== undefined) stored.push(entry.stored)
  }
  const keyHolds = pool.keyHoldsAfter(taken.entries)
  return {
    items,
    returns: taken.returns,
    logs,
    stored,
    close: taken.close.map((grant) => grant.id),
    at: new Date(now),
    holder,
    keyHolds
  }
}

/** Writes `taken` in one transaction; on failure, unless `alone`, puts everything back for the next flush. */
const write = Effect.fnUntraced(function*(queue: Queue, taken: Taken, now: number, putBack = true) {
  const anomalies: Array<Anomaly> = []
  const batch = batchOf(taken, now, queue.leases.holder, queue.pool, anomalies)
  const started = performance.now()
  const observe = (outcome: "ok" | "error") =>
    queue.metrics.settlementFlushDuration.observe({ outcome }, (performance.now() - started) / 1000)
  const outcome = yield* settleBatch(batch).pipe(
    Effect.provide(queue.context),
    Effect.onError(() =>
      Effect.sync(() => {
        observe("error")
        if (!putBack) return
        // It waits for the next flush, in its order. A hand-back goes back as it is, never into the grant:
        // the commit may have happened (its answer lost), and its number makes a second write a no-op.
        queue.entries = [...taken.entries, ...queue.entries]
        queue.returns = [...taken.returns, ...queue.returns]
      })
    )
  )
  observe("ok")
  yield* afterWrite(queue, taken, batch, outcome)
  yield* recordAnomalies(queue, anomalies)
})

const recordAnomalies = (queue: Queue, anomalies: ReadonlyArray<Anomaly>) =>
  Effect.forEach(anomalies, (anomaly) => {
    queue.metrics.settlementClamped.inc({ field: anomaly.field })
    return Effect.logWarning("settlement value out of range, clamped").pipe(Effect.annotateLogs({ ...anomaly }))
  }, { discard: true })

/** An answer whose hold was taken back (this instance judged dead), billed late and short: an anomaly for the operator. */
const noteShortfall = (
  queue: Queue,
  item: Exclude<SettleItem, { readonly _tag: "Release" }>,
  chargedMicroMyr: number
) => {
  const shortfallMicroMyr = item.amountMicroMyr - chargedMicroMyr
  queue.metrics.billingShortfall.inc(shortfallMicroMyr)
  return Effect.logError(
    "billing shortfall: a call answered before its settlement was written, billed late from a wallet that could not pay it in full"
  )
    .pipe(Effect.annotateLogs({
      requestId: item._tag === "Capture" ? item.log?.requestId : item.requestId,
      costMicroMyr: item.amountMicroMyr,
      chargedMicroMyr,
      shortfallMicroMyr
    }))
}

/** What a written batch settles in memory: rows no longer due, leases dropped, grants' charges written. */
const afterWrite = Effect.fnUntraced(function*(queue: Queue, taken: Taken, batch: Batch, outcome: BatchOutcome) {
  for (const r of taken.due) r.written = true
  for (const entry of taken.entries) {
    if (entry.grant !== undefined) {
      queue.pool.chargeWritten(entry.grant.grant, entry.grant.amount, entry.grant.apiKeyId)
    }
    if (entry.item?._tag === "Capture" || entry.item?._tag === "Release") {
      yield* queue.leases.drop(entry.item.reservationId)
    }
  }
  for (const [index, item] of batch.items.entries()) {
    const done = outcome.items[index]
    if (item._tag === "Capture" && done !== undefined) {
      yield* logCapture({
        reservationId: item.reservationId,
        chargedMicroMyr: done.chargedMicroMyr,
        ledgerEntryId: done.ledgerEntryId
      })
    }
    if (item._tag !== "Release" && done !== undefined && done.chargedMicroMyr < item.amountMicroMyr) {
      yield* noteShortfall(queue, item, done.chargedMicroMyr)
    }
  }
  yield* queue.pool.written(taken.close, outcome.missingGrants, batch.keyHolds)
})
