/**
 * A preload (`node --import ./bench/phases.mjs`) that times the phases of each
 * model call the process serves, one call at a time (the added latency at one
 * connection: docs/performance.md, "Stage budget (npm run bench:pipeline)"),
 * and writes the medians of the last calls to `NENAS_PHASES_FILE` (JSON, twice
 * a second). `npm run bench:pipeline` with BENCH_PHASES=1 and
 * BENCH_CONNECTIONS=1 runs the service with it.
 *
 * A call's phases, each as wall time and as the time the event loop was busy
 * in it (`performance.eventLoopUtilization`):
 * - `before`: the request's arrival to its upstream request's send (the
 *   server, the guard, the key, the limits, the estimate, the hold);
 * - `upstream`: the send to the upstream's answer (its head) — the upstream's
 *   own time, and whatever runs here meanwhile;
 * - `after`: the answer to the response's end (decoding, relaying,
 *   settling, encoding);
 * - `finished`: the response's end to the turn after it (its write, the
 *   access log, the metrics, what the call leaves to run).
 *
 * Calls are told apart only one at a time: the upstream request made is
 * the current call's. With more than one connection the phases mix calls;
 * read them at one connection only. It costs a little CPU itself.
 */
import { writeFileSync } from "node:fs"
import http from "node:http"
import { performance } from "node:perf_hooks"

const file = process.env["NENAS_PHASES_FILE"]
const MODEL_PATHS = ["/v1/chat/completions", "/v1/responses", "/v1/messages"]
const KEPT = 2000
const PHASES = ["before", "upstream", "after", "finished"]
/** Per phase, the last KEPT calls' wall and busy µs. */
const kept = Object.fromEntries(PHASES.map((phase) => [phase, { wall: [], busy: [] }]))
let calls = 0
let current

const now = () => ({ at: performance.now(), loop: performance.eventLoopUtilization() })
const record = (phase, from, to) => {
  const samples = kept[phase]
  samples.wall.push((to.at - from.at) * 1000)
  samples.busy.push(performance.eventLoopUtilization(to.loop, from.loop).active * 1000)
  if (samples.wall.length > KEPT) {
    samples.wall.shift()
    samples.busy.shift()
  }
}

const emit = http.Server.prototype.emit
http.Server.prototype.emit = function(event, ...args) {
  if (event === "request" && MODEL_PATHS.some((path) => args[0].url?.startsWith(path))) {
    const call = { arrived: now() }
    current = call
    const response = args[1]
    const end = response.end
    response.end = function(...endArgs) {
      call.ended = now()
      if (call.answered !== undefined) record("after", call.answered, call.ended)
      return end.apply(this, endArgs)
    }
    response.once("finish", () => {
      setImmediate(() => {
        if (call.sent === undefined || call.answered === undefined || call.ended === undefined) return
        calls++
        record("before", call.arrived, call.sent)
        record("upstream", call.sent, call.answered)
        record("finished", call.ended, now())
      })
    })
  }
  return emit.call(this, event, ...args)
}

const requestEnd = http.ClientRequest.prototype.end
http.ClientRequest.prototype.end = function(...args) {
  const call = current
  if (call !== undefined && call.sent === undefined) {
    call.sent = now()
    this.once("response", () => {
      call.answered = now()
    })
  }
  return requestEnd.apply(this, args)
}

const median = (values) => {
  if (values.length === 0) return null
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.floor(sorted.length / 2)]
}

if (file !== undefined) {
  setInterval(() => {
    const phases = Object.fromEntries(PHASES.map((phase) => [phase, { wall: median(kept[phase].wall), busy: median(kept[phase].busy) }]))
    writeFileSync(file, JSON.stringify({ calls, phases }))
  }, 500).unref()
}
