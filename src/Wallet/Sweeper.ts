import { SqlClient, type SqlError } from "@effect/sql"
import { Clock, Context, Duration, Effect, Layer, Schedule } from "effect"
import { AppConfig } from "../AppConfig.js"
import { microMyr } from "../Domain/Money.js"
import { WalletRepo } from "./Repo.js"

export interface SweepResult {
  readonly released: number
  /** Lapsed reservations whose call had reported its usage: billed, not released. */
  readonly captured: number
}

/**
 * Settles reservations whose owner stopped renewing them (its process died).
 * Safe with several instances: each reservation is taken with
 * `FOR UPDATE SKIP LOCKED` and checked again under the lock.
 */
export class ReservationSweeper extends Context.Tag("nenas/ReservationSweeper")<ReservationSweeper, {
  readonly sweep: Effect.Effect<SweepResult, SqlError.SqlError>
}>() {
  static readonly make = Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const wallet = yield* WalletRepo

    const settle = (reservationId: string, at: Date) =>
      sql.withTransaction(Effect.gen(function*() {
        const lapsed = yield* sql`
          SELECT id FROM reservations
          WHERE id = ${reservationId} AND status = 'open' AND expires_at < ${at}
          FOR UPDATE SKIP LOCKED
        `
        if (lapsed.length === 0) return "skipped" as const
        const logs = yield* sql<{ requestId: string; status: string; costMicroMyr: number }>`
          SELECT request_id, status, cost_micro_myr FROM request_logs WHERE reservation_id = ${reservationId}
        `
        const log = logs[0]
        if (log !== undefined && log.status === "succeeded") {
          yield* wallet.capture(reservationId, microMyr(log.costMicroMyr), "Model call (settled after its process stopped)")
          yield* sql`UPDATE request_logs SET status = 'billed', completed_at = ${at} WHERE request_id = ${log.requestId}`
          return "captured" as const
        }
        yield* wallet.release(reservationId)
        yield* sql`
          UPDATE request_logs SET status = 'failed', cost_micro_myr = 0, error_code = 'internal_error', completed_at = ${at}
          WHERE reservation_id = ${reservationId} AND status = 'pending'
        `
        return "released" as const
      }))

    const sweep = Effect.gen(function*() {
      const at = new Date(yield* Clock.currentTimeMillis)
      const candidates = yield* sql<{ id: string }>`
        SELECT id FROM reservations WHERE status = 'open' AND expires_at < ${at} ORDER BY expires_at LIMIT 500
      `
      let released = 0
      let captured = 0
      for (const { id } of candidates) {
        const outcome = yield* settle(id, at)
        if (outcome === "released") released++
        if (outcome === "captured") captured++
      }
      return { released, captured }
    })
    return ReservationSweeper.of({ sweep })
  })

  static readonly layer = Layer.effect(ReservationSweeper, ReservationSweeper.make)

  /** The sweeper and its background fiber, every `reservationSweepIntervalMs` (15 s). */
  static readonly layerRunning = Layer.scoped(
    ReservationSweeper,
    Effect.gen(function*() {
      const interval = Duration.millis((yield* AppConfig).reservationSweepIntervalMs)
      const sweeper = yield* ReservationSweeper.make
      yield* sweeper.sweep.pipe(
        Effect.tap(({ captured, released }) =>
          released + captured > 0
            ? Effect.logInfo("settled lapsed reservations", { released, captured })
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
