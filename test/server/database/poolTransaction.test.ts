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
 * A request whose client leaves mid-transaction: its query is cancelled, and
 * the transaction's connection is closed rather than handed to the next
 * request, where the late cancel signal could stop someone else's query.
 */

const url = () => Redacted.make(inject("adminDatabaseUrl"))

/** Two connections, as the service's pool at its smallest: the cancel runs on the other. */
const Sql = PgClient.layerFromPool({ acquire: makePool({ url: url(), types: pg.types, max: 2 }) })

/** A statement on its own connection, outside the pool under test. */
const admin = <A extends pg.QueryResultRow>(text: string, values: Array<unknown> = []) =>
  Effect.promise(() =>
    withClient(inject("adminDatabaseUrl"), async (client) => (await client.query<A>(text, values)).rows)
  )

const backendPid = Effect.flatMap(SqlClient.SqlClient, (sql) => sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`)
  .pipe(Effect.map((rows) => rows[0]?.pid))

/** The backend running the statement marked `marker` (this lookup's own text names it too: not itself). */
const runningBackend = (marker: string) =>
  Effect.gen(function*() {
    for (let waited = 0; waited < 200; waited++) {
      const running = yield* admin<{ pid: number }>(
        `SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active' AND query LIKE '%' || $1 || '%'`,
        [`${marker}-running`]
      )
      const pid = running[0]?.pid
      if (pid !== undefined) return pid
      yield* realSleep(20)
    }
    return expect.fail("the long query was never seen running")
  })

describe("the service's PostgreSQL pool, inside a transaction", () => {
  it.live("a transaction whose query is cancelled has its connection closed, not reused by the next request", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const long = yield* Effect.fork(sql.withTransaction(Effect.zipRight(
        sql`SELECT 1`,
        sql`SELECT pg_sleep(30), 'nenas-tx-test-running' AS marker`
      )))
      const first = yield* runningBackend("nenas-tx-test")
      const started = Date.now()
      yield* Fiber.interrupt(long)
      expect(Date.now() - started, "the query was cancelled at once").toBeLessThan(5_000)
      // However many requests come next, none runs on the cancelled transaction's backend.
      for (let i = 0; i < 4; i++) {
        expect(yield* backendPid).not.toBe(first)
        expect(yield* sql.withTransaction(backendPid)).not.toBe(first)
      }
      for (let waited = 0; waited < 200; waited++) {
        const left = yield* admin<{ n: number }>("SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = $1", [
          first
        ])
        if (left[0]?.n === 0) return
        yield* realSleep(20)
      }
      expect.fail(`backend ${first} still open`)
    }).pipe(Effect.provide(Layer.fresh(Sql)), Effect.scoped))
})
