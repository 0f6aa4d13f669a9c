import { SqlClient } from "@effect/sql"
import { Clock, Context, Duration, Effect, Layer, Schedule } from "effect"

/** How long a reservation outlives its owner's last renewal. */
export const RESERVATION_LEASE = Duration.seconds(45)
/** How often a live process renews the reservations it holds. */
export const LEASE_RENEWAL = Duration.seconds(10)
/**
 * The longest this process renews one reservation: longer than any call may
 * run, so a reservation its call forgot still lapses and is swept.
 */
export const MAX_HOLD = Duration.minutes(15)

/**
 * The reservations this process holds for calls in flight. While the process
 * lives it pushes their deadlines forward; when it dies they lapse, and the
 * sweeper (any instance) releases them.
 */
export class ReservationLeases extends Context.Tag("nenas/ReservationLeases")<ReservationLeases, {
  readonly hold: (reservationId: string) => Effect.Effect<void>
  readonly drop: (reservationId: string) => Effect.Effect<void>
  /** Pushes every held deadline to now + the lease; the background fiber calls it. */
  readonly renew: Effect.Effect<number>
}>() {
  static readonly layer = (renewal: Duration.DurationInput = LEASE_RENEWAL) =>
    Layer.scoped(
      ReservationLeases,
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        /** Each held reservation and when it was taken. */
        const held = new Map<string, number>()
        const renew = Effect.gen(function*() {
          const now = yield* Clock.currentTimeMillis
          for (const [id, since] of held) if (now - since > Duration.toMillis(MAX_HOLD)) held.delete(id)
          if (held.size === 0) return 0
          const until = new Date(now + Duration.toMillis(RESERVATION_LEASE))
          const rows = yield* sql`
            UPDATE reservations SET expires_at = ${until}
            WHERE id = ANY(${[...held.keys()]}) AND status = 'open'
            RETURNING id
          `
          return rows.length
        }).pipe(
          Effect.catchAllCause((cause) => Effect.as(Effect.logWarning("reservation lease renewal failed", cause), 0))
        )
        yield* renew.pipe(Effect.repeat(Schedule.spaced(renewal)), Effect.forkScoped)
        return ReservationLeases.of({
          hold: (id) => Effect.map(Clock.currentTimeMillis, (now) => void held.set(id, now)),
          drop: (id) => Effect.sync(() => void held.delete(id)),
          renew
        })
      })
    )
}
