/**
 * `npm run bench:failover`: what a fallback adds to a call's latency
 * (docs/performance.md, "Failover (npm run bench:failover)"). The compiled
 * service runs behind `UPSTREAMS` with two upstreams: a primary that fails,
 * then the shared bench's fake upstream, which answers. Calls go one at a time
 * (one connection), plain and streamed, for each primary:
 *
 * - `none`: the fake upstream alone (the baseline);
 * - `refuses`: a primary that answers 503 at once;
 * - `silent`: a primary that accepts the request and never answers, so the
 *   call falls back when its share of the first-byte deadline
 *   (`UPSTREAM_FIRST_BYTE_TIMEOUT_MS` over the targets left) runs out;
 * - `open`: the refusing primary with its circuit breaker open (default
 *   breaker settings): it is skipped without a request.
 *
 * For the first three, breakers are set never to open, so every call pays the
 * fallback. Added latency = the scenario's median minus the baseline's.
 *
 * Settings (environment): BENCH_FAILOVER_CALLS (default 200; the silent
 * scenario makes a fifth of them), BENCH_FIRST_BYTE_MS (default 1000),
 * BENCH_PEERS_DIR (default <repo>/../shared/bench, for fake-upstream.mjs).
 */
import { mkdtemp, rm } from "node:fs/promises"
import { createServer, type Server } from "node:http"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import { freePort } from "../src/Database/EmbeddedPostgres.js"
import { type Account, createAccount, ensureFunds } from "./account.js"
import {
  buildService,
  type Child,
  log,
  SERVICE_NODE_ARGS,
  startFakeUpstream,
  startNode,
  stopChild,
  waitHttp
} from "./processes.js"

const ROOT = resolve(fileURLToPath(new URL("..", import.meta.url)))
const peersDir = resolve(process.env["BENCH_PEERS_DIR"] ?? join(ROOT, "..", "shared", "bench"))
const calls = Number(process.env["BENCH_FAILOVER_CALLS"] ?? 200)
const firstByteMs = Number(process.env["BENCH_FIRST_BYTE_MS"] ?? 1000)
if (!(calls >= 10) || !(firstByteMs >= 100)) {
  console.error("BENCH_FAILOVER_CALLS must be at least 10 and BENCH_FIRST_BYTE_MS at least 100")
  process.exit(1)
}

const plainBody = JSON.stringify({
  model: "svc/nenas-flash",
  messages: [{ role: "user", content: "hi" }],
  max_tokens: 16
})
const streamBody = JSON.stringify({
  model: "svc/nenas-flash",
  messages: [{ role: "user", content: "hi" }],
  max_tokens: 16,
  stream: true
})

/** A primary upstream that fails as `kind` says. */
const primary = async (kind: "refuses" | "silent"): Promise<{ readonly url: string; readonly server: Server }> => {
  const server = createServer((request, response) => {
    request.resume()
    if (kind === "silent") return
    request.on("end", () => {
      response.writeHead(503, { "content-type": "application/json" })
      response.end(JSON.stringify({ error: { message: "overloaded" } }))
    })
  })
  await new Promise<void>((listening) => server.listen(0, "127.0.0.1", listening))
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, server }
}

const upstreamEntry = (name: string, baseUrl: string) => ({
  name,
  base_url: baseUrl,
  models: { general: ["gpt-4.1-mini"], reasoning: ["o4-mini"] }
})

/** One call's wall time to its last byte, in milliseconds; it must answer 200. */
const timedCall = async (account: Account, body: string): Promise<number> => {
  const started = performance.now()
  const reply = await fetch(`${account.base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${account.apiKey}` },
    body
  })
  const text = await reply.text()
  if (reply.status !== 200 || text.includes("\"error\"")) {
    throw new Error(`a call failed: ${reply.status} ${text.slice(0, 300)}`)
  }
  return performance.now() - started
}

const median = (values: ReadonlyArray<number>) => {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.floor(sorted.length / 2)] ?? Number.NaN
}
const p99 = (values: ReadonlyArray<number>) => {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * 0.99))] ?? Number.NaN
}

interface Scenario {
  readonly name: "none" | "refuses" | "silent" | "open"
  readonly primaryUrl: string | undefined
  readonly breakersNeverOpen: boolean
  readonly calls: number
}

const main = async () => {
  const dataDir = await mkdtemp(join(tmpdir(), "nenas-failover-"))
  const children: Array<Child> = []
  const servers: Array<Server> = []
  try {
    buildService(ROOT)
    const upstream = await startFakeUpstream(peersDir, { ...process.env }, join(dataDir, "upstream.log"))
    children.push(upstream.child)
    const refusing = await primary("refuses")
    const silent = await primary("silent")
    servers.push(refusing.server, silent.server)
    const scenarios: ReadonlyArray<Scenario> = [
      { name: "none", primaryUrl: undefined, breakersNeverOpen: true, calls },
      { name: "refuses", primaryUrl: refusing.url, breakersNeverOpen: true, calls },
      { name: "silent", primaryUrl: silent.url, breakersNeverOpen: true, calls: Math.max(10, Math.round(calls / 5)) },
      { name: "open", primaryUrl: refusing.url, breakersNeverOpen: false, calls }
    ]
    const rows: Array<string> = []
    let baseline: { plain: number; stream: number } | undefined
    for (const scenario of scenarios) {
      const upstreams = [
        ...(scenario.primaryUrl === undefined ? [] : [upstreamEntry("primary", scenario.primaryUrl)]),
        upstreamEntry("fake", `${upstream.base}/v1`)
      ]
      const port = await freePort()
      const base = `http://127.0.0.1:${port}`
      const service = startNode(`the service (${scenario.name})`, [...SERVICE_NODE_ARGS, "dist/main.js"], {
        cwd: ROOT,
        logFile: join(dataDir, `service-${scenario.name}.log`),
        env: {
          ...process.env,
          DATABASE_URL: "",
          REDIS_URL: "",
          PORT: String(port),
          HOST: "127.0.0.1",
          DATA_DIR: dataDir,
          UPSTREAMS: JSON.stringify(upstreams),
          UPSTREAM_FIRST_BYTE_TIMEOUT_MS: String(firstByteMs),
          RATE_LIMIT_RPM: "100000000",
          RATE_LIMIT_CONCURRENT: "100000",
          LOG_FORMAT: "json",
          ...(scenario.breakersNeverOpen ? { BREAKER_FAILURES: "1000", BREAKER_MIN_CALLS: "1000000" } : {})
        }
      })
      children.push(service)
      await waitHttp(service, `${base}/readyz`, 120_000)
      const account = await createAccount(base)
      await ensureFunds(account, 2 * scenario.calls * 2 * 2_000)
      // Warm-up; for `open`, these also open the primary's breaker (five failures in a row).
      for (let i = 0; i < 10; i++) await timedCall(account, plainBody)
      const plain: Array<number> = []
      const stream: Array<number> = []
      for (let i = 0; i < scenario.calls; i++) {
        plain.push(await timedCall(account, plainBody))
        stream.push(await timedCall(account, streamBody))
      }
      const medians = { plain: median(plain), stream: median(stream) }
      baseline ??= medians
      const added = (mode: "plain" | "stream") =>
        scenario.name === "none" ? "" : (medians[mode] - baseline![mode]).toFixed(2)
      rows.push(
        [
          scenario.name.padEnd(8),
          String(scenario.calls).padStart(5),
          medians.plain.toFixed(2).padStart(9),
          p99(plain).toFixed(2).padStart(9),
          added("plain").padStart(10),
          medians.stream.toFixed(2).padStart(9),
          p99(stream).toFixed(2).padStart(9),
          added("stream").padStart(10)
        ].join("  ")
      )
      log(`${scenario.name}: plain p50 ${medians.plain.toFixed(2)} ms, stream p50 ${medians.stream.toFixed(2)} ms`)
      await stopChild(service, 15_000)
    }
    console.log(
      `\nFallback latency, 1 connection, ms (UPSTREAM_FIRST_BYTE_TIMEOUT_MS ${firstByteMs}; two targets, so the silent primary's share is ${
        firstByteMs / 2
      } ms)`
    )
    console.log(
      ["primary ", "calls", "plain p50", "plain p99", "plain added", "strm p50", "strm p99", "strm added"].join("  ")
    )
    for (const row of rows) console.log(row)
  } finally {
    for (const child of children.reverse()) await stopChild(child, 15_000)
    for (const server of servers) {
      server.closeAllConnections()
      server.close()
    }
    await rm(dataDir, { recursive: true, force: true })
  }
}

main().catch((error: unknown) => {
  console.error(error instanceof Error ? error.message : String(error))
  process.exitCode = 1
})
