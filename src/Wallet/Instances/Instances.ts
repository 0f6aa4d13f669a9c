import type { SqlClient, SqlError } from "@effect/sql"
import { Data, Duration, Effect } from "effect"

// Hand-cast SQL (docs/performance.md, "Hand-cast SQL on the call path"): heartbeats and liveness checks, beside every flush and sweep.

/**
 * The `instances` table: one row per process start, its `heartbeat_at` the
 * database's `now()` at the process's last beat. Every statement on it is
 * here; reservations, grants, request logs and idempotency records name their
 * process as `holder`, and ask `holderDead` whether it still lives.
 */

/** A process that has not beaten for this long is dead: its holds may be taken back. */
export const DEAD_AFTER = Duration.seconds(6)
/** A process lends from grants, and judges others, only while its own last beat is younger than this: half the dead mark. */
export const FRESH_FOR = Duration.seconds(3)

/** `now() + d` in SQL: every deadline is the database's clock, never an instance's. */
export const secondsSql = (d: Duration.DurationInput) => Duration.toMillis(d) / 1000

/** A second process started with the `INSTANCE_ID` of one that is alive: it refuses to start. */
export class InstanceIdInUse extends Data.TaggedError("InstanceIdInUse")<{ readonly message: string }> {}

/** How often a starting process looks again at a live-looking process with its identity. */
const WATCH_EVERY = Duration.millis(250)

/**
 * Waits until no other process with `identity` is alive: one that beats while
 * watched is alive (the start is refused); one silent for `DEAD_AFTER` is dead
 * (a SIGKILL a moment ago), and is replaced.
 */
const awaitIdentityFree = (sql: SqlClient.SqlClient, identity: string) =>
  Effect.gen(function*() {
    const seen = new Map<string, number>()
    for (;;) {
      const live = yield* sql<{ id: string; heartbeatAt: Date; ageMs: number }>`
        SELECT id, heartbeat_at, (extract(epoch FROM now() - heartbeat_at) * 1000)::float8 AS age_ms
        FROM instances WHERE identity = ${identity} AND heartbeat_at > now() - ${
        secondsSql(DEAD_AFTER)
      } * interval '1 second'
      `
      if (live.length === 0) return
      for (const row of live) {
        const before = seen.get(row.id)
        if (before !== undefined && row.heartbeatAt.getTime() > before) {
          return yield* new InstanceIdInUse({
            message: `INSTANCE_ID "${identity}" is in use by a live process (${row.id}, beat ${
              (row.ageMs / 1000).toFixed(1)
            } s ago): give each instance its own INSTANCE_ID.`
          })
        }
        seen.set(row.id, row.heartbeatAt.getTime())
      }
      yield* Effect.sleep(WATCH_EVERY)
    }
  })

/**
 * Registers this process; an earlier process with its identity must be dead
 * (silent for `DEAD_AFTER`, or stopped) and is marked dead from now on, so
 * what it held is released at once. A live one makes this fail.
 */
export const registerInstance = (
  sql: SqlClient.SqlClient,
  holder: string,
  identity: string,
  /** Runs just before the registering transaction begins: its `now()` is the first heartbeat. */
  registering: Effect.Effect<void> = Effect.void
): Effect.Effect<void, SqlError.SqlError | InstanceIdInUse> =>
  Effect.zipRight(
    Effect.zipRight(awaitIdentityFree(sql, identity), registering),
    sql.withTransaction(Effect.gen(function*() {
      // Two processes starting at once with one identity: the second waits here, then finds the first alive.
      yield* sql`SELECT pg_advisory_xact_lock(hashtext('nenas_instance:' || ${identity}))`
      const live = yield* sql<{ id: string }>`
        SELECT id FROM instances
        WHERE identity = ${identity} AND heartbeat_at > now() - ${secondsSql(DEAD_AFTER)} * interval '1 second'
      `
      if (live.length > 0) {
        return yield* new InstanceIdInUse({
          message: `INSTANCE_ID "${identity}" is in use by a live process (${
            live.map((row) => row.id).join(", ")
          }): give each instance its own INSTANCE_ID.`
        })
      }
      yield* sql`UPDATE instances SET heartbeat_at = '-infinity' WHERE identity = ${identity} AND id <> ${holder}`
      yield* sql`INSERT INTO instances (id, identity, started_at, heartbeat_at) VALUES (${holder}, ${identity}, now(), now())`
      // Rows of processes dead for a day only slow the lookups down.
      yield* sql`DELETE FROM instances WHERE heartbeat_at < now() - interval '1 day'`
    }))
  )

/**
 * This process is alive now: the database's time of the beat, or `replaced`
 * when its row was marked dead for good (stopped, or replaced by a process
 * with its identity): a beat never brings such a process back to life.
 */
export const beat = (sql: SqlClient.SqlClient, holder: string): Effect.Effect<Date | "replaced", SqlError.SqlError> =>
  sql<{ at: Date }>`
    UPDATE instances SET heartbeat_at = now() WHERE id = ${holder} AND heartbeat_at > '-infinity' RETURNING now() AS at
  `.pipe(Effect.map((rows) => rows[0]?.at ?? "replaced"))

/** A clean stop is a death too: what the process still holds is released by the next sweep. */
export const markStopped = (sql: SqlClient.SqlClient, holder: string): Effect.Effect<void, SqlError.SqlError> =>
  Effect.asVoid(sql`UPDATE instances SET heartbeat_at = '-infinity' WHERE id = ${holder}`)

/**
 * SQL: true when the process named by `holder` (a column) is dead — no beat
 * within `DEAD_AFTER`, or replaced by a process with its identity — as judged
 * by `self`, whose own beat must be fresh (`FRESH_FOR`, by the database's
 * clock): a process that itself stalled declares nobody dead. `self` is never
 * dead to itself.
 */
export const holderDead = (sql: SqlClient.SqlClient, holder: string, self: string) =>
  sql`(${sql.literal(holder)} IS NOT NULL AND ${sql.literal(holder)} <> ${self} AND NOT EXISTS (
    SELECT 1 FROM instances i
    WHERE i.id = ${sql.literal(holder)} AND i.heartbeat_at > now() - ${secondsSql(DEAD_AFTER)} * interval '1 second'
  ) AND EXISTS (
    SELECT 1 FROM instances me
    WHERE me.id = ${self} AND me.heartbeat_at > now() - ${secondsSql(FRESH_FOR)} * interval '1 second'
  ))`
