import type { SqlClient, SqlError } from "@effect/sql"
import { Cause, type Context, Effect, Exit } from "effect"
import { newId } from "../../Domain/Ids.js"
import { storableJson } from "../../Domain/Strict.js"
import type { RequestLogs } from "../../Logs/RequestLogs.js"
import type { Metrics } from "../../Observability/Metrics.js"
import type { GrantPool } from "../Grants/GrantPool.js"
import type { ReservationLeases } from "../Instances/Leases.js"
import { refusalOf } from "./Isolation.js"
import { failureText, kindOf, park, requestIdOf } from "./Parked.js"
import type { Queued } from "./SettleBatch.js"

/**
 * Settlements the database refused, written alone (docs/money.md, "Parking and replay"): each
 * retried alone, later and later, then parked; one whose parking is refused
 * too is given up, loudly, after `GIVE_UP_AFTER` tries. None loops.
 */

/** A settlement the database refused this many times, written alone, is parked (`Parked.ts`). */
const PARK_AFTER = 3
/** A settlement whose parking the database refused this many times is given up (logged), never retried forever. */
const GIVE_UP_AFTER = 3
/** A refused settlement is tried alone again after this long, doubled each time (so parked about a second after it was first refused). */
const RETRY_ALONE_AFTER_MS = 250

/** A settlement the database refused, written alone: retried alone, later and later, then parked. */
export interface Refused {
  readonly entry: Queued
  /** Its id in `settlement_parked`, the same for every try at parking it. */
  readonly parkedId: string
  readonly firstFailedAt: Date
  attempts: number
  /** Times its parking was refused (not unanswered). */
  parkRefusals: number
  lastFailedAt: Date
  error: string
  nextTryAt: number
}

/** What the queue lends to its refused settlements. */
export interface RefusalQueue {
  readonly pool: GrantPool
  readonly leases: ReservationLeases["Type"]
  readonly metrics: Metrics
  readonly context: Context.Context<SqlClient.SqlClient | RequestLogs>
  refused: Array<Refused>
}

export const refuse = (queue: RefusalQueue, entry: Queued, cause: Cause.Cause<unknown>, now: number) => {
  const at = new Date(now)
  queue.refused.push({
    entry,
    parkedId: newId("sp"),
    firstFailedAt: at,
    attempts: 1,
    parkRefusals: 0,
    lastFailedAt: at,
    error: failureText(cause),
    nextTryAt: now + RETRY_ALONE_AFTER_MS
  })
}

/** Refused settlements whose time has come, each alone: written, refused again (parked after `PARK_AFTER`), or left for later. */
export const retryRefused = (
  queue: RefusalQueue,
  now: number,
  writeAlone: (entry: Queued) => Effect.Effect<void, SqlError.SqlError>
) =>
  Effect.gen(function*() {
    for (const refused of [...queue.refused]) {
      if (refused.nextTryAt > now) continue
      const exit = yield* Effect.exit(writeAlone(refused.entry))
      if (Exit.isSuccess(exit)) {
        queue.refused = queue.refused.filter((other) => other !== refused)
        continue
      }
      const backOff = RETRY_ALONE_AFTER_MS * 2 ** Math.min(refused.attempts, 4)
      refused.nextTryAt = now + backOff
      if (refusalOf(exit.cause) === undefined) continue
      refused.attempts++
      refused.lastFailedAt = new Date(now)
      refused.error = failureText(exit.cause)
      if (refused.attempts >= PARK_AFTER) yield* parkRefused(queue, refused, now)
    }
  })

/** Parks a settlement: its hold goes back to the wallet, and this instance forgets it (the grant's charge, the lease). */
export const parkRefused = (queue: RefusalQueue, refused: Refused, now: number) =>
  Effect.gen(function*() {
    const { entry } = refused
    const settlement = { item: entry.item, log: entry.log }
    const exit = yield* Effect.exit(
      park({
        id: refused.parkedId,
        settlement,
        error: refused.error,
        attempts: refused.attempts,
        firstFailedAt: refused.firstFailedAt,
        lastFailedAt: new Date(now),
        holder: queue.leases.holder
      }).pipe(Effect.provide(queue.context))
    )
    if (Exit.isFailure(exit)) {
      if (refusalOf(exit.cause) !== undefined && ++refused.parkRefusals >= GIVE_UP_AFTER) {
        return yield* giveUp(queue, refused, exit.cause)
      }
      return yield* Effect.logWarning("a refused settlement could not be parked; it is tried again", exit.cause).pipe(
        Effect.annotateLogs({ requestId: requestIdOf(settlement) })
      )
    }
    yield* forget(queue, refused)
    const kind = kindOf(settlement)
    queue.metrics.settlementParked.inc({ kind })
    yield* Effect.logError("settlement parked: the database kept refusing it; its hold went back to the wallet").pipe(
      Effect.annotateLogs({
        requestId: requestIdOf(settlement),
        parkedId: refused.parkedId,
        kind,
        attempts: refused.attempts,
        error: refused.error,
        replay: `DATABASE_URL=... npm run settlement:replay -- ${refused.parkedId}`
      })
    )
  })

/** This instance lets a settlement go: out of the queue, its grant charge counted as written, its lease dropped. */
const forget = (queue: RefusalQueue, refused: Refused) =>
  Effect.gen(function*() {
    const { entry } = refused
    queue.refused = queue.refused.filter((other) => other !== refused)
    if (entry.grant !== undefined) queue.pool.chargeWritten(entry.grant.grant, entry.grant.amount, entry.grant.apiKeyId)
    if (entry.item?._tag === "Capture" || entry.item?._tag === "Release") {
      yield* queue.leases.drop(entry.item.reservationId)
    }
  })

/**
 * A settlement the database would neither write nor park: dropped, loudly, so that it cannot loop. Its
 * reservation (if any) is released by the sweeper when its lease runs out; the log says what to bill by hand.
 */
const giveUp = (queue: RefusalQueue, refused: Refused, cause: Cause.Cause<unknown>) =>
  Effect.gen(function*() {
    yield* forget(queue, refused)
    const settlement = { item: refused.entry.item, log: refused.entry.log }
    queue.metrics.settlementParked.inc({ kind: "dropped" })
    yield* Effect.logError("settlement dropped: the database refused to write it and to park it", cause).pipe(
      Effect.annotateLogs({
        requestId: requestIdOf(settlement),
        kind: kindOf(settlement),
        settlement: storableJson(settlement)
      })
    )
  })
