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
 */
const discardCancelled = (pool: pg.Pool): void => {
  const checkedOut = new Map<number, pg.PoolClient>()
  const pid = (client: pg.PoolClient): number | undefined => (client as unknown as { readonly processID?: number }).processID
  pool.on("acquire", (client) => {
    const id = pid(client)
    if (id !== undefined) checkedOut.set(id, client)
  })
  pool.on("release", (_error, client) => {
    const id = pid(client)
    if (id !== undefined && checkedOut.get(id) === client) checkedOut.delete(id)
  })
  const query = pool.query.bind(pool) as (...args: Array<unknown>) => unknown
  Object.assign(pool, {
    query: (...args: Array<unknown>) => {
      const cancelled = typeof args[0] === "string" ? CANCEL.exec(args[0]) : null
      const client = cancelled === null ? undefined : checkedOut.get(Number(cancelled[1]))
      if (client !== undefined) {
        const release = client.release
        // pg-pool closes a connection released with an error instead of keeping it.
        client.release = (error?: Error | boolean) => release(error ?? new Error("a query on this connection was cancelled"))
      }
      return query(...args)
    }
  })
}

/**
 * The service's connection pool (what `PgClient.layer` would make, plus
 * `discardCancelled`), closed with its scope; fails when the first
 * connection does not answer within 5 s.
 */
export const makePool = (options: { readonly url: Redacted.Redacted; readonly types: pg.CustomTypesConfig; readonly max: number }) =>
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
          onTimeout: () => new SqlError({ cause: new Error("Connection timed out"), message: "PgClient: Connection timed out" })
        })
      ))
  )
