import { Cause, Effect, FiberRef, HashMap, HashSet, Layer, List, Logger } from "effect"
import { AppConfig } from "../AppConfig.js"

const messageOf = (message: unknown): unknown =>
  Array.isArray(message) ? (message.length === 1 ? message[0] : message) : message

/**
 * One JSON object a line, in `Logger.jsonLogger`'s shape (`message`,
 * `logLevel`, `timestamp`, `annotations`, `spans`, and `cause` when there is
 * one), written straight to stdout. The library's logger renders every value
 * through its redaction machinery first, which cost the access log an eighth
 * of a model call's CPU under load; ours are plain values already.
 */
export const jsonLineLogger = Logger.make<unknown, void>(({ annotations, cause, date, logLevel, message, spans }) => {
  const record: Record<string, unknown> = {
    message: messageOf(message),
    logLevel: logLevel.label,
    timestamp: date.toISOString(),
    annotations: Object.fromEntries(HashMap.toEntries(annotations))
  }
  if (!List.isNil(spans)) {
    const now = date.getTime()
    record["spans"] = Object.fromEntries(List.toArray(spans).map((span) => [span.label, now - span.startTime]))
  }
  if (!Cause.isEmpty(cause)) record["cause"] = Cause.pretty(cause, { renderErrorCause: true })
  process.stdout.write(`${JSON.stringify(record)}\n`)
})

/**
 * `LOG_FORMAT`: one JSON object a line for log collectors (production's
 * default), pretty lines for a terminal. Replaces whichever logger the runtime
 * installed (`runMain` adds a pretty one), so each line is written once.
 */
export const LoggingLive = Layer.unwrapEffect(
  Effect.map(AppConfig, ({ logFormat }) =>
    Layer.scopedDiscard(Effect.locallyScopedWith(
      FiberRef.currentLoggers,
      () => HashSet.make(logFormat === "json" ? jsonLineLogger : Logger.prettyLoggerDefault)
    )))
)
