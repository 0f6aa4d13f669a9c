import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import { SqlClient } from "@effect/sql"
import { Console, Effect, Option } from "effect"
import { AppConfig } from "../AppConfig.js"
import { DatabaseLive } from "../Database/Database.js"
import { rebuildRollups } from "./Rollups.js"
import { rebuildTagRollups } from "./TagRollups.js"

/**
 * `DATABASE_URL=postgres://… npm run rollups:rebuild`: computes the usage
 * rollups, and those by grouping tag, again from `request_logs` (after a
 * restore or an import of logs).
 * Idempotent; writers of logs wait while it runs.
 */
const program = Effect.gen(function*() {
  const config = yield* AppConfig
  if (Option.isNone(config.databaseUrl)) {
    yield* Console.error("rollups:rebuild needs DATABASE_URL (the service's database)")
    return 2
  }
  const [rows, tagRows] = yield* Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => Effect.all([rebuildRollups(sql), rebuildTagRollups(sql)])
  )
    .pipe(Effect.provide(DatabaseLive))
  yield* Console.log(`rebuilt ${rows} rollup rows and ${tagRows} tag rollup rows from request_logs`)
  return 0
})

program.pipe(
  Effect.provide(AppConfig.layer),
  Effect.flatMap((code) => Effect.sync(() => void (process.exitCode = code))),
  NodeRuntime.runMain
)
