/**
 * A preload (`node --import ./bench/effect-ops.mjs`) that counts the Effect
 * runtime's operations and the HTTP requests the process receives, and writes
 * both to `NENAS_EFFECT_OPS_FILE` (JSON, twice a second). `npm run
 * bench:pipeline` with BENCH_EFFECT_OPS=1 runs the service with it and prints
 * the operations a request of each kind: a measure of the Effect work on a
 * request's path that the machine's noise does not move
 * (docs/performance.md, "Stage budget (npm run bench:pipeline)").
 *
 * It wraps each operation handler of the fiber runtime (`FiberRuntime`'s
 * methods named by op code: a flatMap's continuation, a sync, a FiberRef
 * read, a change of runtime flags, …), so it costs CPU itself: read its
 * counts, not the CPU of a run made with it.
 */
import { writeFileSync } from "node:fs"
import http from "node:http"

const file = process.env["NENAS_EFFECT_OPS_FILE"]
const runtime = await import(import.meta.resolve("effect").replace(/index\.js$/, "internal/fiberRuntime.js"))
const OP_CODES = [
  "Tag", "Sync", "Success", "Failure", "WithRuntime", "UpdateRuntimeFlags", "OnSuccess", "OnFailure",
  "OnSuccessAndFailure", "Async", "Yield", "While", "Iterator", "Commit"
]
const counts = Object.fromEntries(OP_CODES.map((code) => [code, 0]))
let requests = 0

const proto = runtime.FiberRuntime.prototype
for (const code of OP_CODES) {
  const handler = proto[code]
  if (typeof handler !== "function") throw new Error(`effect-ops: the fiber runtime has no ${code} handler (another Effect version?)`)
  proto[code] = function(op) {
    counts[code]++
    return handler.call(this, op)
  }
}

const emit = http.Server.prototype.emit
http.Server.prototype.emit = function(event, ...args) {
  if (event === "request") requests++
  return emit.call(this, event, ...args)
}

if (file !== undefined) {
  setInterval(() => writeFileSync(file, JSON.stringify({ requests, counts })), 500).unref()
}
