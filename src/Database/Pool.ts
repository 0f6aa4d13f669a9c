import { SqlError } from "@effect/sql/SqlError"
import { Effect, Redacted } from "effect"
import pg from "pg"

/** What `@effect/sql-pg` sends, on another connection, to stop the query of a fiber interrupted while it runs. */
const CANCEL = /^SELECT pg_cancel_backend\((\d+)\)$/

/**
 * After a cancel, the cancelled connection is closed instead of going back to
 * the pool. `@effect/sql-pg` stops an interrupted fiber's query (a client that
 * went away mid-request) with `pg_cancel_backend(pid)`, which only sends the
 * backend a signal, then returns the connection to the pool. On a loaded
 * machine the backend may act on the signal only once the next query on that
 * connection, another request's, has begun: that query then fails with
 * "canceling statement due to user request" (seen once in CI, a dashboard
 * read answering 500). A connection that a cancel was sent to is discarded
 * when its holder releases it, so the late signal finds no one else's query.
 * Its holder may release it as `client.release` (a single query) or as the
 * `release` that `connect` hands its callback (a transaction's connection):
 * both are the discarding one.
 */
const discardCancelled = (pool: pg.Pool): void => {
  const checkedOut = new Map<number, pg.PoolClient>()
  const cancelled = new WeakSet<pg.PoolClient>()
  const pid = (client: pg.PoolClient): number | undefined =>
    (client as unknown as { readonly processID?: number }).processID
  pool.on("acquire", (client) => {
    const id = pid(client)
    if (id !== undefined) checkedOut.set(id, client)
  })
  pool.on("release", (_error, client) => {
    const id = pid(client)
    if (id !== undefined && checkedOut.get(id) === client) checkedOut.delete(id)
  })
  type Release = (error?: Error | boolean) => void
  type Connected = (error: Error | undefined, client: pg.PoolClient | undefined, release: Release) => void
  /** pg-pool closes a connection released with an error instead of keeping it. */
  const discarding = (client: pg.PoolClient, release: Release): Release => (error) =>
    release(error ?? (cancelled.has(client) ? new Error("a query on this connection was cancelled") : undefined))
  const connect = pool.connect.bind(pool) as (callback?: Connected) => Promise<pg.PoolClient> | undefined
  const query = pool.query.bind(pool) as (...args: Array<unknown>) => unknown
  Object.assign(pool, {
    connect: (callback?: Connected) => {
      if (callback === undefined) {
        return connect()?.then((client) => {
          client.release = discarding(client, client.release)
          return client
        })
      }
      return connect((error, client, release) => {
        if (client === undefined) return callback(error, client, release)
        const once = discarding(client, release)
        client.release = once
        return callback(error, client, once)
      })
    },
    query: (...args: Array<unknown>) => {
      const match = typeof args[0] === "string" ? CANCEL.exec(args[0]) : null
      const client = match === null ? undefined : checkedOut.get(Number(match[1]))
      if (client !== undefined) cancelled.add(client)
      return query(...args)
    }
  })
}

/**
 * The service's connection pool (what `PgClient.layer` would make, plus
 * `discardCancelled`), closed with its scope; fails when the first
 * connection does not answer within 5 s.
 */
export const makePool = (
  options: { readonly url: Redacted.Redacted; readonly types: pg.CustomTypesConfig; readonly max: number }
) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const pool = new pg.Pool({
        connectionString: Redacted.value(options.url),
        max: options.max,
        application_name: "nenas",
        types: options.types
      })
      // Errors of idle connections (a server restart): the next checkout connects afresh.
      pool.on("error", () => {})
      discardCancelled(pool)
      return pool
    }),
    (pool) => Effect.promise(() => pool.end()).pipe(Effect.interruptible, Effect.timeoutOption(1000))
  ).pipe(
    Effect.tap((pool) =>
      Effect.tryPromise({
        try: () => pool.query("SELECT 1"),
        catch: (cause) => new SqlError({ cause, message: "PgClient: Failed to connect" })
      }).pipe(
        Effect.timeoutFail({
          duration: "5 seconds",
          onTimeout: () =>
            new SqlError({ cause: new Error("Connection timed out"), message: "PgClient: Connection timed out" })
        })
      )
    )
  )
