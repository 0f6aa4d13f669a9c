import { SqlClient } from "@effect/sql"
import { Clock, Context, Duration, Effect, Layer, Schedule } from "effect"
import { AppConfig } from "../AppConfig.js"
import { newId } from "../Domain/Ids.js"
import { beat, markStopped, registerInstance, secondsSql } from "./Instances.js"

// Models/Idempotency.ts leases its records on the same clock and the same heartbeats.

/** How long a reservation outlives its owner's last renewal, whatever its owner's heartbeat says. */
export const RESERVATION_LEASE = Duration.seconds(45)
/** How often a live process beats. */
export const LEASE_RENEWAL = Duration.seconds(2)
/** Every how many beats it also renews the reservations it holds (their lease is long: a row each is not free). */
const BEATS_PER_RENEWAL = 5
/**
 * The longest this process renews one reservation: longer than any call may
 * run, so a reservation its call forgot still lapses and is swept.
 */
export const MAX_HOLD = Duration.minutes(15)

/**
 * This process (one row in `instances`, beating every `LEASE_RENEWAL` with the
 * database's `now()`) and the reservations it holds for calls in flight. While
 * the process lives it pushes their deadlines forward; when it dies, its beat
 * stops and the sweeper (any instance) releases what it held. A process
 * starting with the identity of an earlier one marks that one dead at once.
 */
export class ReservationLeases extends Context.Tag("nenas/ReservationLeases")<ReservationLeases, {
  /** This process's id in `instances`: what its reservations, logs and idempotency records name as holder. */
  readonly holder: string
  readonly hold: (reservationId: string) => Effect.Effect<void>
  readonly drop: (reservationId: string) => Effect.Effect<void>
  /** Beats, and pushes every held deadline to now + the lease; the background fiber calls it. */
  readonly renew: Effect.Effect<number>
}>() {
  static readonly layer = (renewal: Duration.DurationInput = LEASE_RENEWAL) =>
    Layer.scoped(
      ReservationLeases,
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { instanceId } = yield* AppConfig
        const holder = newId("ins")
        yield* registerInstance(sql, holder, instanceId)
        /** Each held reservation and when it was taken. */
        const held = new Map<string, number>()
        const renew = Effect.gen(function*() {
          yield* beat(sql, holder)
          const now = yield* Clock.currentTimeMillis
          for (const [id, since] of held) if (now - since > Duration.toMillis(MAX_HOLD)) held.delete(id)
          if (held.size === 0) return 0
          const rows = yield* sql`
            UPDATE reservations SET expires_at = now() + ${secondsSql(RESERVATION_LEASE)} * interval '1 second'
            WHERE id = ANY(${[...held.keys()]}) AND status = 'open'
            RETURNING id
          `
          return rows.length
        }).pipe(
          Effect.catchAllCause((cause) => Effect.as(Effect.logWarning("reservation lease renewal failed", cause), 0))
        )
        let beats = 0
        const tick = Effect.suspend((): Effect.Effect<unknown> =>
          ++beats % BEATS_PER_RENEWAL === 0
            ? renew
            : beat(sql, holder).pipe(Effect.catchAllCause((cause) => Effect.logWarning("instance heartbeat failed", cause)))
        )
        yield* tick.pipe(Effect.repeat(Schedule.spaced(renewal)), Effect.forkScoped)
        yield* Effect.addFinalizer(() => Effect.ignore(markStopped(sql, holder)))
        return ReservationLeases.of({
          holder,
          hold: (id) => Effect.map(Clock.currentTimeMillis, (now) => void held.set(id, now)),
          drop: (id) => Effect.sync(() => void held.delete(id)),
          renew
        })
      })
    )
}
