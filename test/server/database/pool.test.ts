import { SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber, Layer, Redacted } from "effect"
import pg from "pg"
import { inject } from "vitest"
import { makePool } from "../../../src/Database/Pool.js"
import { realSleep } from "../../support/RealTime.js"
import { withClient } from "../../support/TestServer.js"

/**
 * The service's pool on real PostgreSQL (`src/Database/Pool.ts`): a query of
 * an interrupted fiber is cancelled, and its connection is not used again, so
 * a cancel signal the backend acts on late cannot stop another request's query.
 */

const url = () => Redacted.make(inject("adminDatabaseUrl"))

/** Two connections, as the service's pool at its smallest: the cancel runs on the other. */
const Sql = PgClient.layerFromPool({ acquire: makePool({ url: url(), types: pg.types, max: 2 }) })

/** A statement on its own connection, outside the pool under test (the late signal, the activity view). */
const admin = <A extends pg.QueryResultRow>(text: string, values: Array<unknown> = []) =>
  Effect.promise(() =>
    withClient(inject("adminDatabaseUrl"), async (client) => (await client.query<A>(text, values)).rows)
  )

const backendPid = Effect.flatMap(SqlClient.SqlClient, (sql) => sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`)
  .pipe(Effect.map((rows) => rows[0]!.pid))

describe("the service's PostgreSQL pool", () => {
  it.live("a cancelled query's connection is closed, not reused: a late cancel signal to it stops no other query", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const long = yield* Effect.fork(sql`SELECT pg_sleep(30), 'nenas-pool-test' AS marker`)
      // The backend the long query runs on (this lookup's own text names the marker too: not itself).
      let first: number | undefined
      for (let waited = 0; waited < 100 && first === undefined; waited++) {
        const running = yield* admin<{ pid: number }>(
          `SELECT pid FROM pg_stat_activity
           WHERE pid <> pg_backend_pid() AND state = 'active' AND query LIKE '%nenas-pool-' || 'test%'`
        )
        first = running[0]?.pid
        if (first === undefined) yield* realSleep(20)
      }
      if (first === undefined) return expect.fail("the long query was never seen running")
      const started = Date.now()
      yield* Fiber.interrupt(long)
      // The library cancelled the query (30 s) at once.
      expect(Date.now() - started).toBeLessThan(5_000)
      // The next query, on the pool's most recently released connection, is on another backend.
      const next = yield* backendPid
      expect(next).not.toBe(first)
      // A cancel signal that reaches the old backend only now stops nothing: the query runs to its end.
      const slow = yield* Effect.fork(sql<{ done: number }>`SELECT 1 AS done FROM pg_sleep(0.3)`)
      yield* realSleep(50)
      yield* admin("SELECT pg_cancel_backend($1)", [first])
      const done = yield* Fiber.join(slow)
      expect(done[0]!.done).toBe(1)
      // And the old backend is gone.
      for (let waited = 0; waited < 100; waited++) {
        const left = yield* admin<{ n: number }>("SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = $1", [
          first
        ])
        if (left[0]!.n === 0) return
        yield* realSleep(20)
      }
      expect.fail(`backend ${first} still open`)
    }).pipe(Effect.provide(Layer.fresh(Sql)), Effect.scoped))
})
