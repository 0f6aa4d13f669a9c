/**
 * `npm run bench:pipeline`: where a model call's CPU goes, by what each kind
 * of request adds (issue 22). The compiled service (embedded PostgreSQL, the
 * shared bench's fake upstream, as `npm run bench` runs it) is driven by
 * autocannon at 32 connections, one request kind at a time, and the CPU of
 * its node process alone (not PostgreSQL's) is read from /proc around each:
 *
 * - `GET /healthz`: the HTTP server, HttpApi routing and the middleware;
 * - `GET /v1/models` with an API key: that, plus authentication;
 * - `POST /v1/chat/completions`, plain and streamed: that, plus the call
 *   (limits, estimate, hold, upstream request and answer, settlement, log).
 *
 * Settings (environment): BENCH_DURATION (s per kind, default 8),
 * BENCH_PEERS_DIR (default <repo>/../shared/bench: fake-upstream.mjs and autocannon).
 */
import { readFileSync } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import { freePort } from "../src/Database/EmbeddedPostgres.js"
import { createAccount, ensureFunds } from "./account.js"
import { buildService, type Child, log, SERVICE_NODE_ARGS, startFakeUpstream, startNode, stopChild, waitHttp } from "./processes.js"

const ROOT = resolve(fileURLToPath(new URL("..", import.meta.url)))
const peersDir = resolve(process.env["BENCH_PEERS_DIR"] ?? join(ROOT, "..", "shared", "bench"))
const durationS = Number(process.env["BENCH_DURATION"] ?? 8)
const CLOCK_TICKS_PER_S = 100

/** CPU seconds (user + system) a process has used so far (/proc/PID/stat). */
const cpuSeconds = (pid: number): number => {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").replace(/^.*\) /s, "").split(" ")
  return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS_PER_S
}

interface Autocannon {
  (options: Record<string, unknown>): Promise<{ readonly requests: { readonly total: number }; readonly non2xx: number; readonly errors: number }>
}
const autocannon = createRequire(join(peersDir, "package.json"))("autocannon") as Autocannon

const main = async () => {
  const dataDir = await mkdtemp(join(tmpdir(), "nenas-pipeline-"))
  const children: Array<Child> = []
  try {
    buildService(ROOT)
    const upstream = await startFakeUpstream(peersDir, { ...process.env }, join(dataDir, "upstream.log"))
    children.push(upstream.child)
    const port = await freePort()
    const base = `http://127.0.0.1:${port}`
    const service = startNode("the service", [...SERVICE_NODE_ARGS, "dist/main.js"], {
      cwd: ROOT,
      logFile: join(dataDir, "service.log"),
      env: {
        ...process.env,
        DATABASE_URL: "",
        REDIS_URL: "",
        PORT: String(port),
        HOST: "127.0.0.1",
        DATA_DIR: dataDir,
        UPSTREAM_BASE_URL: `${upstream.base}/v1`,
        RATE_LIMIT_RPM: "100000000",
        RATE_LIMIT_CONCURRENT: "100000",
        LOG_FORMAT: "json"
      }
    })
    children.push(service)
    await waitHttp(service, `${base}/readyz`, 120_000)
    const account = await createAccount(base)
    await ensureFunds(account, 40_000_000)
    const auth = { authorization: `Bearer ${account.apiKey}`, "content-type": "application/json" }
    const chat = (stream: boolean) =>
      JSON.stringify({ model: "svc/nenas-flash", messages: [{ role: "user", content: "hi" }], max_tokens: 16, ...(stream ? { stream: true } : {}) })
    const kinds = [
      { name: "GET /healthz", options: { url: `${base}/healthz` } },
      { name: "GET /v1/models (API key)", options: { url: `${base}/v1/models`, headers: auth } },
      { name: "POST /v1/chat/completions", options: { url: `${base}/v1/chat/completions`, method: "POST", headers: auth, body: chat(false) } },
      { name: "  the same, streamed", options: { url: `${base}/v1/chat/completions`, method: "POST", headers: auth, body: chat(true) } }
    ]
    const rows: Array<string> = []
    for (const kind of kinds) {
      await autocannon({ ...kind.options, connections: 32, duration: 2 })
      const before = cpuSeconds(service.pid)
      const result = await autocannon({ ...kind.options, connections: 32, duration: durationS })
      const used = cpuSeconds(service.pid) - before
      if (result.non2xx > 0 || result.errors > 0) throw new Error(`${kind.name}: ${result.non2xx} non-2xx answers, ${result.errors} errors`)
      const perRequest = (used * 1e6) / result.requests.total
      rows.push(`${kind.name.padEnd(28)} ${String(Math.round(result.requests.total / durationS)).padStart(7)}  ${perRequest.toFixed(0).padStart(8)}`)
      log(`${kind.name}: ${perRequest.toFixed(0)} µs of the service's CPU a request`)
    }
    console.log(`\n32 connections, ${durationS} s each; CPU of the service's node process only (PostgreSQL's not counted)`)
    console.log(`${"request".padEnd(28)} ${"req/s".padStart(7)}  ${"CPU µs".padStart(8)}`)
    for (const row of rows) console.log(row)
  } finally {
    for (const child of children.reverse()) await stopChild(child, 15_000)
    await rm(dataDir, { recursive: true, force: true })
  }
}

main().catch((error: unknown) => {
  console.error(error instanceof Error ? error.message : String(error))
  process.exitCode = 1
})
