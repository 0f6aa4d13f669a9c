import type { SqlClient, SqlError } from "@effect/sql"
import { Duration, Effect } from "effect"

/**
 * The `instances` table: one row per process start, its `heartbeat_at` the
 * database's `now()` at the process's last beat. Every statement on it is
 * here; reservations, grants, request logs and idempotency records name their
 * process as `holder`, and ask `holderDead` whether it still lives.
 */

/** A process that has not beaten for this long is dead: three beats missed. */
export const DEAD_AFTER = Duration.seconds(6)

/** `now() + d` in SQL: every deadline is the database's clock, never an instance's. */
export const secondsSql = (d: Duration.DurationInput) => Duration.toMillis(d) / 1000

/** Registers this process; earlier processes with its identity are dead from now on. */
export const registerInstance = (
  sql: SqlClient.SqlClient,
  holder: string,
  identity: string
): Effect.Effect<void, SqlError.SqlError> =>
  sql.withTransaction(Effect.gen(function*() {
    yield* sql`UPDATE instances SET heartbeat_at = '-infinity' WHERE identity = ${identity} AND id <> ${holder}`
    yield* sql`INSERT INTO instances (id, identity, started_at, heartbeat_at) VALUES (${holder}, ${identity}, now(), now())`
    // Rows of processes dead for a day only slow the lookups down.
    yield* sql`DELETE FROM instances WHERE heartbeat_at < now() - interval '1 day'`
  }))

/** This process is alive now. */
export const beat = (sql: SqlClient.SqlClient, holder: string): Effect.Effect<void, SqlError.SqlError> =>
  Effect.asVoid(sql`UPDATE instances SET heartbeat_at = now() WHERE id = ${holder}`)

/** A clean stop is a death too: what the process still holds is released by the next sweep. */
export const markStopped = (sql: SqlClient.SqlClient, holder: string): Effect.Effect<void, SqlError.SqlError> =>
  Effect.asVoid(sql`UPDATE instances SET heartbeat_at = '-infinity' WHERE id = ${holder}`)

/**
 * SQL: true when the process named by `holder` (a column) is dead — no beat
 * within `DEAD_AFTER`, or replaced by a process with its identity. `self` is
 * never dead to itself (its beat may be late after a database outage).
 */
export const holderDead = (sql: SqlClient.SqlClient, holder: string, self: string) =>
  sql`(${sql.literal(holder)} IS NOT NULL AND ${sql.literal(holder)} <> ${self} AND NOT EXISTS (
    SELECT 1 FROM instances i
    WHERE i.id = ${sql.literal(holder)} AND i.heartbeat_at > now() - ${secondsSql(DEAD_AFTER)} * interval '1 second'
  ))`
