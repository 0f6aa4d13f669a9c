import { Clock, Effect, Layer } from "effect"
import type { Server } from "node:http"
import { Idempotency } from "../Models/Admission/Idempotency.js"

/**
 * How long in-flight calls may take to finish after SIGTERM or SIGINT. Then
 * their connections are closed: a stream is billed for what it produced, as
 * for a client that went away. Below the usual grace of container runtimes
 * and systemd (30 s and 90 s) before they kill.
 */
export const DRAIN_DEADLINE_MS = 25_000

/**
 * Released before the server's own `close` (which waits for every connection):
 * idle keep-alive connections go at once, the rest at the deadline. Calls
 * that run on without their client (idempotent ones) have the same deadline.
 */
export const drainDeadline = (server: Server) =>
  Layer.scopedDiscard(Effect.flatMap(Idempotency, (idempotency) =>
    Effect.addFinalizer(() =>
      Effect.gen(function*() {
        yield* Effect.logInfo(`stopping: in-flight calls have ${DRAIN_DEADLINE_MS / 1000} s to finish`)
        yield* idempotency.drainBy((yield* Clock.currentTimeMillis) + DRAIN_DEADLINE_MS)
        server.closeIdleConnections()
        setTimeout(() => server.closeAllConnections(), DRAIN_DEADLINE_MS).unref()
      })
    )))

/**
 * `kill -TERM -PGID` (systemd, container runtimes) and Ctrl-C reach node
 * twice: directly and forwarded by npm. The runtime acts on the first signal
 * and removes its listener; without this one, the second would kill the
 * process mid-drain (Node's default action).
 */
export const holdRepeatedSignals = (): void => {
  const repeated = (signal: NodeJS.Signals) => {
    if (stopping) console.error(`${signal} again: still draining (at most ${DRAIN_DEADLINE_MS / 1000} s)`)
    stopping = true
  }
  let stopping = false
  process.on("SIGTERM", repeated)
  process.on("SIGINT", repeated)
}
