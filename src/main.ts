import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import { Cause, Effect, Layer, Option } from "effect"
import { AppConfig } from "./AppConfig.js"
import { EmbeddedPostgresError } from "./Database/EmbeddedPostgres.js"
import { ServerLive } from "./Http/Server.js"
import { holdRepeatedSignals } from "./Http/Shutdown.js"
import { InstanceIdInUse } from "./Wallet/Instances/Instances.js"

/** A start-up failure that already names its cause and remedy is that one line; anything else is logged whole. */
const reportFailure = (cause: Cause.Cause<unknown>) => {
  if (Cause.isInterruptedOnly(cause)) return Effect.void
  const known = Cause.failureOption(cause).pipe(
    Option.filter((error) => error instanceof EmbeddedPostgresError || error instanceof InstanceIdInUse)
  )
  return Option.isSome(known)
    ? Effect.sync(() => console.error(`nenas: ${known.value.message}`))
    : Effect.logError(cause)
}

holdRepeatedSignals()
ServerLive.pipe(
  Layer.provide(AppConfig.layer),
  Layer.launch,
  Effect.tapErrorCause(reportFailure),
  NodeRuntime.runMain({ disableErrorReporting: true })
)
