import { SqlClient } from "@effect/sql"
import { Context, Duration, Effect, Layer, Schedule } from "effect"
import { AppConfig } from "../../AppConfig.js"
import { newId } from "../../Domain/Ids.js"
import { holdIntact, isFresh, mayJudge, newFence, noteBeat } from "./Fence.js"
import { beat, markStopped, registerInstance, secondsSql } from "./Instances.js"

// `Models/Admission/Idempotency.ts` leases its records on the same clock and the same heartbeats.

/** How long a reservation outlives its owner's last renewal, whatever its owner's heartbeat says. */
export const RESERVATION_LEASE = Duration.seconds(45)
/** How often idempotency records' leases are renewed. */
export const LEASE_RENEWAL = Duration.seconds(2)
/** How often a live process beats: a third of `FRESH_FOR`, so one late beat does not make it stale. */
export const BEAT_INTERVAL = Duration.seconds(1)
/** Every how many beats it also renews the reservations it holds (their lease is long: a row each is not free). */
const BEATS_PER_RENEWAL = 10
/**
 * Longer than any call runs (each is bounded: its upstream's timeouts, its client's write-stall deadline): a
 * pending log with no reservation older than this belongs to no call. A reservation is renewed for as long as
 * its call holds it, whatever its age: its call is bounded, not its lease.
 */
export const MAX_HOLD = Duration.minutes(15)

/** The local monotonic clock: a process frozen (SIGSTOP) or a wall clock set back cannot make an old beat look new. */
const monotonicMs = () => performance.now()

/** What this process knows of its own heartbeat (`Fence.ts`), read now. */
export interface FenceView {
  /** The last beat is under `FRESH_FOR` old: the process may lend from grants. */
  readonly fresh: () => boolean
  /** The current epoch: a call remembers it with its hold. */
  readonly epoch: () => number
  /** A hold taken in `epoch` cannot have been taken back by another instance's sweeper. */
  readonly intact: (epoch: number) => boolean
  /** The process may declare others dead. */
  readonly mayJudge: () => boolean
}

/**
 * This process (one row in `instances`, beating every `BEAT_INTERVAL` with the
 * database's `now()`) and the reservations it holds for calls in flight. While
 * the process lives it pushes their deadlines forward; when it dies, its beat
 * stops and the sweeper (any instance) releases what it held. A process
 * starting with the identity of an earlier one marks that one dead at once,
 * unless it is alive: then the start fails.
 */
export class ReservationLeases extends Context.Tag("nenas/ReservationLeases")<ReservationLeases, {
  /** This process's id in `instances`: what its reservations, logs and idempotency records name as holder. */
  readonly holder: string
  readonly hold: (reservationId: string) => Effect.Effect<void>
  readonly drop: (reservationId: string) => Effect.Effect<void>
  /** Beats, and pushes every held deadline to now + the lease; the background fiber calls it. */
  readonly renew: Effect.Effect<number>
  readonly fence: FenceView
}>() {
  static readonly layer = (interval: Duration.DurationInput = BEAT_INTERVAL) =>
    Layer.scoped(
      ReservationLeases,
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const { instanceId } = yield* AppConfig
        const holder = newId("ins")
        const fence = newFence(monotonicMs())
        // Registering is the first beat: sent when the registering transaction begins.
        yield* registerInstance(sql, holder, instanceId, Effect.sync(() => void (fence.lastBeatSentAt = monotonicMs())))
        const beatOnce = Effect.gen(function*() {
          const sentAt = monotonicMs()
          const at = yield* beat(sql, holder)
          if (at !== "replaced") return noteBeat(fence, sentAt, at, monotonicMs())
          if (!fence.replaced) {
            fence.replaced = true
            yield* Effect.logError(
              "this process was marked dead and replaced by another with its INSTANCE_ID: it lends nothing and judges nobody"
            ).pipe(Effect.annotateLogs({ holder, instanceId }))
          }
        })
        /** Each reservation a call in flight holds, until its settlement is written. */
        const held = new Set<string>()
        const renew = Effect.gen(function*() {
          yield* beatOnce
          if (held.size === 0) return 0
          const rows = yield* sql`
            UPDATE reservations SET expires_at = now() + ${secondsSql(RESERVATION_LEASE)} * interval '1 second'
            WHERE id = ANY(${[...held]}) AND status = 'open'
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
            : beatOnce.pipe(Effect.catchAllCause((cause) => Effect.logWarning("instance heartbeat failed", cause)))
        )
        yield* tick.pipe(Effect.repeat(Schedule.spaced(interval)), Effect.forkScoped)
        yield* Effect.addFinalizer(() => Effect.ignore(markStopped(sql, holder)))
        return ReservationLeases.of({
          holder,
          hold: (id) => Effect.sync(() => void held.add(id)),
          drop: (id) => Effect.sync(() => void held.delete(id)),
          renew,
          fence: {
            fresh: () => isFresh(fence, monotonicMs()),
            epoch: () => fence.epoch,
            intact: (epoch) => holdIntact(fence, epoch, monotonicMs()),
            mayJudge: () => mayJudge(fence, monotonicMs())
          }
        })
      })
    )
}
