import { Effect, FiberRef, HashSet, Layer, Logger } from "effect"
import { AppConfig } from "../AppConfig.js"

/**
 * `LOG_FORMAT`: one JSON object a line for log collectors (production's
 * default), pretty lines for a terminal. Replaces whichever logger the runtime
 * installed (`runMain` adds a pretty one), so each line is written once.
 */
export const LoggingLive = Layer.unwrapEffect(
  Effect.map(AppConfig, ({ logFormat }) =>
    Layer.scopedDiscard(Effect.locallyScopedWith(
      FiberRef.currentLoggers,
      () => HashSet.make(logFormat === "json" ? Logger.withConsoleLog(Logger.jsonLogger) : Logger.prettyLoggerDefault)
    )))
)
