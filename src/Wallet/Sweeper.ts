import { SqlClient, type SqlError } from "@effect/sql"
import { Context, Duration, Effect, Layer, Schedule } from "effect"
import { AppConfig } from "../AppConfig.js"
import { microMyr } from "../Domain/Money.js"
import { holderDead, MAX_HOLD, ReservationLeases, secondsSql } from "./Leases.js"
import { WalletRepo } from "./Repo.js"

export interface SweepResult {
  readonly released: number
  /** Lapsed reservations whose call had reported its usage: billed, not released. */
  readonly captured: number
  /** Logs left `pending` by a call that is gone (its reservation settled, or its process dead), now closed. */
  readonly closedLogs: number
}

/**
 * Settles what calls of dead processes left: reservations whose owner stopped
 * beating (or, whatever the beat, whose lease lapsed), and request logs left
 * `pending`. Every deadline is compared with the database's `now()`. Safe with
 * several instances: each reservation is taken with `FOR UPDATE SKIP LOCKED`
 * and checked again under the lock.
 */
export class ReservationSweeper extends Context.Tag("nenas/ReservationSweeper")<ReservationSweeper, {
  readonly sweep: Effect.Effect<SweepResult, SqlError.SqlError>
}>() {
  static readonly make = Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const wallet = yield* WalletRepo
    const { holder: self } = yield* ReservationLeases
    const lapsed = sql`(expires_at < now() OR ${holderDead(sql, "holder", self)})`

    const settle = (reservationId: string) =>
      sql.withTransaction(Effect.gen(function*() {
        const taken = yield* sql`
          SELECT id FROM reservations
          WHERE id = ${reservationId} AND status = 'open' AND ${lapsed}
          FOR UPDATE SKIP LOCKED
        `
        if (taken.length === 0) return "skipped" as const
        const logs = yield* sql<{ requestId: string; status: string; costMicroMyr: number }>`
          SELECT request_id, status, cost_micro_myr FROM request_logs WHERE reservation_id = ${reservationId}
        `
        const log = logs[0]
        if (log !== undefined && log.status === "succeeded") {
          yield* wallet.capture(reservationId, microMyr(log.costMicroMyr), "Model call (settled after its process stopped)")
          yield* sql`UPDATE request_logs SET status = 'billed', completed_at = now() WHERE request_id = ${log.requestId}`
          return "captured" as const
        }
        yield* wallet.release(reservationId, closeLogOf(reservationId))
        return "released" as const
      }))

    const closeLogOf = (reservationId: string) =>
      Effect.asVoid(sql`
        UPDATE request_logs SET status = 'failed', cost_micro_myr = 0, error_code = 'internal_error', completed_at = now()
        WHERE reservation_id = ${reservationId} AND status = 'pending'
      `)

    /** Logs whose call can no longer settle them: their reservation is settled, or they hold none and their process is dead. */
    const closeOrphanLogs = Effect.gen(function*() {
      const settled = yield* sql`
        UPDATE request_logs l
        SET status = CASE WHEN r.status = 'captured' THEN 'billed' ELSE 'failed' END,
            cost_micro_myr = COALESCE(r.captured_micro_myr, 0),
            error_code = CASE WHEN r.status = 'captured' THEN l.error_code ELSE 'internal_error' END,
            completed_at = now()
        FROM reservations r
        WHERE l.status = 'pending' AND l.reservation_id = r.id AND r.status <> 'open'
        RETURNING l.request_id
      `
      const unheld = yield* sql`
        UPDATE request_logs
        SET status = 'failed', cost_micro_myr = 0, error_code = 'internal_error', completed_at = now()
        WHERE status = 'pending' AND reservation_id IS NULL
          AND (${holderDead(sql, "holder", self)} OR created_at < now() - ${secondsSql(MAX_HOLD)} * interval '1 second')
        RETURNING request_id
      `
      return settled.length + unheld.length
    })

    const sweep = Effect.gen(function*() {
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
      const closedLogs = yield* closeOrphanLogs
      return { released, captured, closedLogs }
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
        Effect.tap(({ captured, closedLogs, released }) =>
          released + captured + closedLogs > 0
            ? Effect.logInfo("settled what dead calls held", { released, captured, closedLogs })
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
