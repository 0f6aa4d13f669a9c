import { SqlClient, type SqlError } from "@effect/sql"
import { Context, Duration, Effect, Layer, Schedule } from "effect"
import { AppConfig } from "../../AppConfig.js"
import { microMyr } from "../../Domain/Money.js"
import { RequestLogs } from "../../Logs/RequestLogs.js"
import { WalletRepo } from "../Repo.js"
import { holderDead, secondsSql } from "./Instances.js"
import { MAX_HOLD, ReservationLeases } from "./Leases.js"

// Hand-cast SQL (docs/performance.md, "Hand-cast SQL on the call path"): taking back lapsed holds, beside every flush.

export interface SweepResult {
  readonly released: number
  /** Lapsed reservations whose call's row reported its cost: billed, not released. */
  readonly captured: number
  /** Credit grants of dead processes, returned to their wallets. */
  readonly grantsReturned: number
  /** Logs left `pending` by a call that is gone (its reservation settled, or its process dead), now closed. */
  readonly closedLogs: number
}

const nothing: SweepResult = { released: 0, captured: 0, grantsReturned: 0, closedLogs: 0 }

/**
 * Settles what calls of dead processes left: reservations whose owner stopped
 * beating (or, whatever the beat, whose lease lapsed), their credit grants,
 * and request logs left `pending`. Every deadline is compared with the database's `now()`. Safe with
 * several instances: each reservation is taken with `FOR UPDATE SKIP LOCKED`
 * and checked again under the lock. A sweeper whose own beat is not fresh
 * (or was stale less than `DEAD_AFTER` ago) declares nobody dead.
 */
export class ReservationSweeper extends Context.Tag("nenas/ReservationSweeper")<ReservationSweeper, {
  readonly sweep: Effect.Effect<SweepResult, SqlError.SqlError>
}>() {
  static readonly make = Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const wallet = yield* WalletRepo
    const logs = yield* RequestLogs
    const { fence, holder: self } = yield* ReservationLeases
    const config = yield* AppConfig
    // Older than any call (its first byte, its whole stream, a stalled client's deadline), with a minute to spare.
    const longestCall = Duration.max(
      MAX_HOLD,
      Duration.millis(
        config.upstreamFirstByteTimeoutMs + config.upstreamTotalTimeoutMs + config.streamWriteStallMs + 60_000
      )
    )
    const lapsed = sql`(expires_at < now() OR ${holderDead(sql, "holder", self)})`

    /**
     * Settles a lapsed reservation: billed when its call's row says it
     * reported a cost (a row written before settlement was batched), else
     * released, its pending row failed: its process died before the call settled.
     */
    const settle = (reservationId: string) =>
      sql.withTransaction(Effect.gen(function*() {
        const taken = yield* sql`
          SELECT id FROM reservations
          WHERE id = ${reservationId} AND status = 'open' AND ${lapsed}
          FOR UPDATE SKIP LOCKED
        `
        if (taken.length === 0) return "skipped" as const
        const reported = yield* logs.reportedCost(reservationId)
        if (reported !== undefined) {
          yield* wallet.capture(reservationId, microMyr(reported), "Model call (settled after its process stopped)")
          yield* logs.markBilled(reservationId)
          return "captured" as const
        }
        yield* logs.failReleased(reservationId)
        yield* wallet.release(reservationId)
        return "released" as const
      }))

    const sweep = Effect.gen(function*() {
      // Stale itself (a stall, a freeze, a database that stopped answering), it cannot tell a dead peer from its own lapse.
      // `holderDead` checks it again in SQL, by the database's clock, for a sweep that stalls after this.
      if (!fence.mayJudge()) return nothing
      const candidates = yield* sql<{ id: string }>`
        SELECT id FROM reservations WHERE status = 'open' AND ${lapsed} ORDER BY expires_at LIMIT 500
      `
      let released = 0
      let captured = 0
      for (const { id } of candidates) {
        const outcome = yield* settle(id)
        if (outcome === "released") released++
        if (outcome === "captured") captured++
      }
      const grantsReturned = yield* wallet.returnDeadGrants
      const closedLogs = yield* logs.closeOrphans(
        sql`(${holderDead(sql, "holder", self)} OR created_at < now() - ${
          secondsSql(longestCall)
        } * interval '1 second')`
      )
      return { released, captured, grantsReturned, closedLogs }
    })
    return ReservationSweeper.of({ sweep })
  })

  static readonly layer = Layer.effect(ReservationSweeper, ReservationSweeper.make)

  /** The sweeper and its background fiber: at start (what dead predecessors held), then every `reservationSweepIntervalMs` (2 s). */
  static readonly layerRunning = Layer.scoped(
    ReservationSweeper,
    Effect.gen(function*() {
      const interval = Duration.millis((yield* AppConfig).reservationSweepIntervalMs)
      const sweeper = yield* ReservationSweeper.make
      yield* sweeper.sweep.pipe(
        Effect.tap(({ captured, closedLogs, grantsReturned, released }) =>
          released + captured + grantsReturned + closedLogs > 0
            ? Effect.logInfo("settled what dead calls held", { released, captured, grantsReturned, closedLogs })
            : Effect.void
        ),
        Effect.catchAllCause((cause) => Effect.logWarning("reservation sweep failed", cause)),
        Effect.repeat(Schedule.spaced(interval)),
        Effect.forkScoped
      )
      return sweeper
    })
  )
}
