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

/** How long a log line may wait for others to go out with it. */
const FLUSH_MS = 20

let corked = false
const uncork = () => {
  if (!corked) return
  corked = false
  process.stdout.uncork()
}
// A process that exits writes what it holds (stdout to a file or a pipe is written synchronously then).
process.once("exit", uncork)

/**
 * Lines written within 20 ms go out in one system call (Node's cork/uncork):
 * under load, one write for many calls' access lines, not one each.
 */
const write = (line: string) => {
  if (!corked) {
    corked = true
    process.stdout.cork()
    setTimeout(uncork, FLUSH_MS).unref()
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
