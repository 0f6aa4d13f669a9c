/**
 * `npm run bench:pipeline`: where a model call's CPU goes, stage by stage
 * (docs/performance.md, "Stage budget (npm run bench:pipeline)"). The compiled
 * service (embedded PostgreSQL, the shared bench's fake upstream, as `npm run
 * bench` runs it) is driven by autocannon at 32 connections, one request kind
 * at a time, each kind doing one stage more than the one before; the CPU of its
 * node process and of its PostgreSQL (the node process's descendants) are read
 * from /proc around each:
 *
 * 1. `GET /healthz`: the HTTP server, HttpApi routing, the error middleware,
 *    the request guard, metrics, the access log and the security headers;
 * 2. `GET /v1/models` with an API key: that, plus authentication from the
 *    key cache and the key's rate limits;
 * 3. `POST /v1/messages/count_tokens`: that, plus the body's read, its JSON
 *    parse and Schema decode, and the conversation's token count;
 * 4. `POST /v1/chat/completions` with a test key: that, plus the call's
 *    machinery without money or upstream (routing, the estimate, the
 *    simulated model, the answer's encoding, the request log);
 * 5. the same with a live key: plus the hold, the upstream exchange, the
 *    settlement (amortized over its batches) and PostgreSQL's share;
 * 6. the same, streamed.
 *
 * Each stage's cost is the difference between two kinds; the table holds it to
 * its budget (docs/performance.md, "Stage budget (npm run bench:pipeline)").
 * With BENCH_CPU_PROF=1 the service runs under --cpu-prof and the live plain
 * call's profile is summed by part (the Effect runtime, GC, Node's HTTP, our
 * code by folder). With BENCH_EFFECT_OPS=1 it runs with `bench/effect-ops.mjs`
 * and prints the Effect runtime's operations a request of each kind, which the
 * machine's noise does not move (its CPU figures are then the counter's too:
 * read the counts only). With BENCH_PHASES=1 (and BENCH_CONNECTIONS=1: calls
 * one at a time) it runs with `bench/phases.mjs` and prints, for each live
 * call, the median wall and busy time of its phases: before the upstream, the
 * upstream exchange, after it, and after the response's end (the added latency
 * at one connection).
 *
 * Settings (environment): BENCH_DURATION (s per kind, default 8),
 * BENCH_KINDS (which kinds, e.g. "1,5"; default all), BENCH_CONNECTIONS (default 32), BENCH_CPU_PROF=1, BENCH_EFFECT_OPS=1,
 * BENCH_PHASES=1,
 * BENCH_PEERS_DIR (default <repo>/../shared/bench: fake-upstream.mjs and autocannon).
 */
import { readdirSync, readFileSync } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import { freePort } from "../src/Database/EmbeddedPostgres.js"
import { createAccount, createTestKey, ensureFunds } from "./account.js"
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
const durationS = Number(process.env["BENCH_DURATION"] ?? 8)
const connections = Number(process.env["BENCH_CONNECTIONS"] ?? 32)
const CLOCK_TICKS_PER_S = 100

/** The fields of /proc/PID/stat after the command name, or undefined for a process gone. */
const statOf = (pid: number): ReadonlyArray<string> | undefined => {
  try {
    return readFileSync(`/proc/${pid}/stat`, "utf8").replace(/^.*\) /s, "").split(" ")
  } catch {
    return undefined
  }
}

/** CPU seconds (user + system) a process has used so far. */
const cpuSeconds = (pid: number): number => {
  const fields = statOf(pid)
  return fields === undefined ? 0 : (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS_PER_S
}

/** Every process below `root` (for the service: its embedded PostgreSQL's postmaster and backends). */
const descendants = (root: number): ReadonlyArray<number> => {
  const children = new Map<number, Array<number>>()
  for (const entry of readdirSync("/proc")) {
    const pid = Number(entry)
    if (!Number.isInteger(pid)) continue
    const parent = Number(statOf(pid)?.[1])
    children.set(parent, [...(children.get(parent) ?? []), pid])
  }
  const found: Array<number> = []
  const visit = (pid: number) => {
    for (const child of children.get(pid) ?? []) {
      found.push(child)
      visit(child)
    }
  }
  visit(root)
  return found
}

/** CPU seconds of the service's node process, and of each of its descendants (PostgreSQL's postmaster and backends). */
const serviceCpu = (pid: number) => ({
  node: cpuSeconds(pid),
  database: new Map(descendants(pid).map((child) => [child, cpuSeconds(child)]))
})

/** PostgreSQL's CPU seconds between two readings: a backend that ended in between is not counted, one that began is counted whole. */
const databaseSeconds = (before: ReadonlyMap<number, number>, after: ReadonlyMap<number, number>): number =>
  [...after].reduce((sum, [pid, seconds]) => sum + seconds - (before.get(pid) ?? 0), 0)

/** VmRSS and VmHWM (its peak so far) of a process, in MB. */
const residentMb = (pid: number) => {
  const status = readFileSync(`/proc/${pid}/status`, "utf8")
  const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB$`, "m").exec(status)?.[1] ?? NaN) / 1024
  return { rss: field("VmRSS"), peak: field("VmHWM") }
}

interface Autocannon {
  (
    options: Record<string, unknown>
  ): Promise<{ readonly requests: { readonly total: number }; readonly non2xx: number; readonly errors: number }>
}
const autocannon = createRequire(join(peersDir, "package.json"))("autocannon") as Autocannon

interface Measured {
  readonly name: string
  readonly rps: number
  /** µs of the node process's CPU per request. */
  readonly node: number
  /** µs of PostgreSQL's CPU per request. */
  readonly database: number
  /** The Effect runtime's operations per request (BENCH_EFFECT_OPS=1). */
  readonly effectOps: number | undefined
  /** The median µs of each phase of a model call (BENCH_PHASES=1), wall and busy. */
  readonly phases: Phases | undefined
}

const PHASE_NAMES = ["before", "upstream", "after", "finished"] as const
type Phases = Record<(typeof PHASE_NAMES)[number], { readonly wall: number | null; readonly busy: number | null }>

/** The phases `bench/phases.mjs` timed, once its next write is in: undefined when it timed no model call. */
const phasesIn = async (file: string | undefined): Promise<Phases | undefined> => {
  if (file === undefined) return undefined
  await new Promise((resolve) => setTimeout(resolve, 600))
  const { calls, phases } = JSON.parse(readFileSync(file, "utf8")) as { calls: number; phases: Phases }
  return calls === 0 ? undefined : phases
}

/** What `bench/effect-ops.mjs` counted so far, once its next write is in. */
const effectOpsIn = async (file: string | undefined) => {
  if (file === undefined) return undefined
  await new Promise((resolve) => setTimeout(resolve, 600))
  const { counts, requests } = JSON.parse(readFileSync(file, "utf8")) as {
    requests: number
    counts: Record<string, number>
  }
  return { requests, ops: Object.values(counts).reduce((sum, count) => sum + count, 0) }
}

/**
 * Each stage as the difference of two kinds (by their index in `kinds`, the later minus the earlier; -1: nothing),
 * with its budget in µs of the node process's CPU per call
 * (docs/performance.md, "Stage budget (npm run bench:pipeline)"). The budgets of a plain call and PostgreSQL's add
 * up to Portkey's CPU per call in `npm run bench` (502 µs plain, 709 streamed on 2026-11-27), brought to this
 * bench's scale (it read 0.78 of the CPU that bench read for the same call): what the service must cost to be
 * level with Portkey.
 */
const STAGES: ReadonlyArray<
  { readonly name: string; readonly of: number; readonly minus: number; readonly budget: number }
> = [
  { name: "server, routing, middleware, metrics, access log", of: 0, minus: -1, budget: 95 },
  { name: "authentication from cache, rate limits", of: 1, minus: 0, budget: 60 },
  { name: "body read, JSON parse, decode, token count", of: 2, minus: 1, budget: 80 },
  { name: "call: route, estimate, answer encoding, log", of: 3, minus: 2, budget: 150 },
  { name: "hold, upstream exchange, settlement", of: 4, minus: 3, budget: 130 },
  { name: "streaming instead (the same call, streamed)", of: 5, minus: 4, budget: 170 }
]

/** PostgreSQL's CPU per live call, at most (docs/performance.md, "Stage budget (npm run bench:pipeline)"). */
const DATABASE_BUDGET = 60

const stageTable = (measured: ReadonlyArray<Measured | undefined>): Array<string> => {
  const rows = [`${"stage".padEnd(50)} ${"CPU µs".padStart(7)} ${"budget".padStart(7)}`]
  for (const stage of STAGES) {
    const of = measured[stage.of]
    const minus = stage.minus < 0 ? { node: 0 } : measured[stage.minus]
    if (of === undefined || minus === undefined) continue
    const cost = of.node - minus.node
    const over = cost > stage.budget ? `  over by ${Math.round(cost - stage.budget)}` : ""
    rows.push(`${stage.name.padEnd(50)} ${cost.toFixed(0).padStart(7)} ${String(stage.budget).padStart(7)}${over}`)
  }
  const live = measured[4]
  if (live !== undefined) {
    const over = live.database > DATABASE_BUDGET ? `  over by ${Math.round(live.database - DATABASE_BUDGET)}` : ""
    rows.push(
      `${"PostgreSQL, per live plain call".padEnd(50)} ${live.database.toFixed(0).padStart(7)} ${
        String(DATABASE_BUDGET).padStart(7)
      }${over}`
    )
  }
  return rows
}

const main = async () => {
  const dataDir = await mkdtemp(join(tmpdir(), "nenas-pipeline-"))
  const children: Array<Child> = []
  try {
    buildService(ROOT)
    const upstream = await startFakeUpstream(peersDir, { ...process.env }, join(dataDir, "upstream.log"))
    children.push(upstream.child)
    const port = await freePort()
    const base = `http://127.0.0.1:${port}`
    const profileDir = process.env["BENCH_CPU_PROF"] === "1"
      ? join(dataDir, "..", `nenas-pipeline-profile-${Date.now()}`)
      : undefined
    const profileArgs = profileDir === undefined ? [] : ["--cpu-prof", `--cpu-prof-dir=${profileDir}`]
    const opsFile = process.env["BENCH_EFFECT_OPS"] === "1" ? join(dataDir, "effect-ops.json") : undefined
    const opsArgs = opsFile === undefined ? [] : ["--import", join(ROOT, "bench", "effect-ops.mjs")]
    const phasesFile = process.env["BENCH_PHASES"] === "1" ? join(dataDir, "phases.json") : undefined
    if (phasesFile !== undefined && connections !== 1) {
      throw new Error("BENCH_PHASES=1 needs BENCH_CONNECTIONS=1: the phases tell calls apart one at a time")
    }
    const phasesArgs = phasesFile === undefined ? [] : ["--import", join(ROOT, "bench", "phases.mjs")]
    const service = startNode("the service", [
      ...SERVICE_NODE_ARGS,
      ...profileArgs,
      ...opsArgs,
      ...phasesArgs,
      "dist/main.js"
    ], {
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
        LOG_FORMAT: "json",
        ...(opsFile === undefined ? {} : { NENAS_EFFECT_OPS_FILE: opsFile }),
        ...(phasesFile === undefined ? {} : { NENAS_PHASES_FILE: phasesFile })
      }
    })
    children.push(service)
    await waitHttp(service, `${base}/readyz`, 120_000)
    const account = await createAccount(base)
    const testKey = await createTestKey(account)
    await ensureFunds(account, 40_000_000)
    const headers = (key: string) => ({ authorization: `Bearer ${key}`, "content-type": "application/json" })
    const messages = [{ role: "user", content: "hi" }]
    const chat = (stream: boolean) =>
      JSON.stringify({ model: "svc/nenas-flash", messages, max_tokens: 16, ...(stream ? { stream: true } : {}) })
    const post = (path: string, key: string, body: string) => ({
      url: `${base}${path}`,
      method: "POST",
      headers: headers(key),
      body
    })
    const kinds = [
      { name: "GET /healthz", options: { url: `${base}/healthz` } },
      { name: "GET /v1/models (API key)", options: { url: `${base}/v1/models`, headers: headers(account.apiKey) } },
      {
        name: "POST /v1/messages/count_tokens",
        options: post(
          "/v1/messages/count_tokens",
          account.apiKey,
          JSON.stringify({ model: "svc/nenas-flash", messages })
        )
      },
      { name: "POST /v1/chat/completions, test key", options: post("/v1/chat/completions", testKey, chat(false)) },
      { name: "  the same, live key", options: post("/v1/chat/completions", account.apiKey, chat(false)) },
      { name: "  the same, streamed", options: post("/v1/chat/completions", account.apiKey, chat(true)) }
    ]
    const idleMb = residentMb(service.pid).rss
    const only = process.env["BENCH_KINDS"]?.split(",")
    const measured: Array<Measured | undefined> = []
    for (const [index, kind] of kinds.entries()) {
      if (only !== undefined && !only.includes(String(index + 1))) continue
      await autocannon({ ...kind.options, connections, duration: 2 })
      const opsBefore = await effectOpsIn(opsFile)
      const before = serviceCpu(service.pid)
      const result = await autocannon({ ...kind.options, connections, duration: durationS })
      const after = serviceCpu(service.pid)
      const opsAfter = await effectOpsIn(opsFile)
      if (result.non2xx > 0 || result.errors > 0) {
        throw new Error(`${kind.name}: ${result.non2xx} non-2xx answers, ${result.errors} errors`)
      }
      const per = (seconds: number) => (seconds * 1e6) / result.requests.total
      measured[index] = {
        name: kind.name,
        rps: result.requests.total / durationS,
        node: per(after.node - before.node),
        database: per(databaseSeconds(before.database, after.database)),
        effectOps: opsBefore === undefined || opsAfter === undefined
          ? undefined
          : (opsAfter.ops - opsBefore.ops) / (opsAfter.requests - opsBefore.requests),
        phases: await phasesIn(phasesFile)
      }
      log(`${kind.name}: ${per(after.node - before.node).toFixed(0)} µs of the service's CPU a request`)
    }
    console.log(
      `\nNode ${process.version}, ${connections} connection(s), ${durationS} s each; CPU µs per request of the service's node process and of its PostgreSQL`
    )
    const opsColumn = (text: string) => opsFile === undefined ? "" : ` ${text.padStart(10)}`
    console.log(
      `${"request".padEnd(36)} ${"req/s".padStart(7)} ${"node µs".padStart(8)} ${"PG µs".padStart(7)}${
        opsColumn("Effect ops")
      }`
    )
    for (const row of measured) {
      if (row === undefined) continue
      console.log(
        `${row.name.padEnd(36)} ${row.rps.toFixed(0).padStart(7)} ${row.node.toFixed(0).padStart(8)} ${
          row.database.toFixed(0).padStart(7)
        }` +
          opsColumn(row.effectOps?.toFixed(0) ?? "")
      )
    }
    if (phasesFile !== undefined) {
      console.log(`\nPhases of a model call, one at a time (median µs: wall, and the event loop busy in it)`)
      console.log(`${"request".padEnd(36)} ${PHASE_NAMES.map((phase) => phase.padStart(14)).join(" ")}`)
      const cell = (value: number | null) => (value === null ? "-" : value.toFixed(0))
      for (const row of measured) {
        if (row?.phases === undefined) continue
        const { phases } = row
        console.log(
          `${row.name.padEnd(36)} ${
            PHASE_NAMES.map((phase) => `${cell(phases[phase].wall)} (${cell(phases[phase].busy)})`.padStart(14)).join(
              " "
            )
          }`
        )
      }
    }
    const { peak } = residentMb(service.pid)
    console.log(
      `\nthe service's node process (${SERVICE_NODE_ARGS.join(" ") || "no flags"}): ${idleMb.toFixed(0)} MB idle, ${
        peak.toFixed(0)
      } MB at its peak`
    )
    console.log(`\nStage budget (node process, each stage the difference of two rows above)`)
    for (const row of stageTable(measured)) console.log(row)
    if (profileDir !== undefined) console.log(`\nthe service's CPU profile goes to ${profileDir} as it stops`)
  } finally {
    for (const child of children.reverse()) await stopChild(child, 15_000)
    if (process.env["BENCH_KEEP_LOG"] === "1") console.log(`the service's log: ${join(dataDir, "service.log")}`)
    else await rm(dataDir, { recursive: true, force: true })
  }
}

main().catch((error: unknown) => {
  console.error(error instanceof Error ? error.message : String(error))
  process.exitCode = 1
})
