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
  write(`${JSON.stringify(record)}\n`)
})

let corked = false
const uncork = () => {
  corked = false
  process.stdout.uncork()
}

/** Lines written in one turn of the event loop go out in one system call (Node's cork/uncork). */
const write = (line: string) => {
  if (!corked) {
    corked = true
    process.stdout.cork()
    process.nextTick(uncork)
  }
  process.stdout.write(line)
}

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
