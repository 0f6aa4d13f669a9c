/**
 * The local upstream in a process of its own, so that the load generator and
 * the upstream do not share one event loop. Prints `{"baseUrl": ...}` once
 * listening; closes on SIGTERM.
 */
import { startUpstream } from "../test/support/Upstream.js"

const upstream = await startUpstream({ record: false })
process.stdout.write(`${JSON.stringify({ baseUrl: upstream.baseUrl })}\n`)
process.once("SIGTERM", () => {
  void upstream.close().then(() => process.exit(0))
})
