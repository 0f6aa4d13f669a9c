import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import { Console, Effect, Layer, Option } from "effect"
import { AppConfig } from "../../AppConfig.js"
import { DatabaseLive } from "../../Database/Database.js"
import { microMyr, toMyrString } from "../../Domain/Money.js"
import { RequestLogs } from "../../Logs/RequestLogs.js"
import { replayParked } from "./Parked.js"

/**
 * `DATABASE_URL=postgres://… npm run settlement:replay [-- <parked id or request id> …]`:
 * writes the parked settlements (all, or those named) that can now succeed,
 * one line each, and exits 1 while any is still refused.
 */
const program = Effect.gen(function*() {
  const config = yield* AppConfig
  if (Option.isNone(config.databaseUrl)) {
    yield* Console.error("settlement:replay needs DATABASE_URL (the service's database)")
    return 2
  }
  const only = process.argv.slice(2).filter((arg) => arg !== "--")
  const results = yield* replayParked(only.length > 0 ? only : undefined).pipe(
    Effect.provide(RequestLogs.layer.pipe(Layer.provideMerge(DatabaseLive)))
  )
  for (const result of results) {
    yield* Console.log(
      result.outcome === "replayed"
        ? `replayed ${result.id} (${result.kind}, request ${result.requestId})` +
          (result.chargedMicroMyr === null ? "" : `: billed RM ${toMyrString(microMyr(result.chargedMicroMyr))}`)
        : `still refused ${result.id} (${result.kind}, request ${result.requestId}): ${result.error}`
    )
  }
  const failed = results.filter((result) => result.outcome === "failed").length
  yield* Console.log(`${results.length - failed} replayed, ${failed} still parked`)
  return failed > 0 ? 1 : 0
})

program.pipe(
  Effect.provide(AppConfig.layer),
  Effect.flatMap((code) => Effect.sync(() => void (process.exitCode = code))),
  NodeRuntime.runMain
)
