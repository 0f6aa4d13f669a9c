/**
 * `npm run bench`: non-streaming chat completions through the whole billed
 * path (API key, rate limits, reservation, request log, upstream call,
 * capture, billed log; PostgreSQL with its default synchronous commit)
 * against the same upstream called directly, at 1 and 32 connections.
 *
 * It reports and never fails on a missed target (PASS/MISS per target); it
 * exits non-zero only when the benchmark itself could not run.
 *
 * Settings (environment): BENCH_DURATION (s, default 10), BENCH_WARMUP (s,
 * default 3), BENCH_REPS (default 3), BENCH_CONNECTIONS (default "1,32"),
 * BENCH_CPU_PROF=1 (runs the service with --cpu-prof; the profile's folder is printed).
 */
import { execFileSync, spawn } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import autocannon from "autocannon"
import type { Result } from "autocannon"
import pg from "pg"
import { freePort } from "../src/Database/EmbeddedPostgres.js"

const ROOT = resolve(fileURLToPath(new URL("..", import.meta.url)))

const numberSetting = (name: string, fallback: number) => {
  const raw = process.env[name]
  const value = raw === undefined || raw === "" ? fallback : Number(raw)
  if (!Number.isFinite(value) || value <= 0) throw new Error(`${name} must be a positive number, got ${raw}`)
  return value
}

const DURATION_S = numberSetting("BENCH_DURATION", 10)
const WARMUP_S = numberSetting("BENCH_WARMUP", 3)
const REPS = Math.round(numberSetting("BENCH_REPS", 3))
const CONNECTIONS = (process.env["BENCH_CONNECTIONS"] ?? "1,32").split(",").map((c) => Number(c.trim()))
const CPU_PROF = process.env["BENCH_CPU_PROF"] === "1"

const TARGET_RPS_32 = 2000
const TARGET_ADDED_P50_MS = 0.5
/** An upper bound of what one call reserves (max_tokens 16, a short prompt): about RM 0.0007. */
const RESERVE_BOUND_MICRO_MYR = 1_000
/** No run here will go faster than this; the wallet is kept above what such a run could reserve. */
const RPS_BOUND = 20_000
const TOPUP_SEN = 50_000

const CLK_TCK = (() => {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100
  } catch {
    return 100
  }
})()

const started = Date.now()
const log = (line: string) => process.stdout.write(`[${((Date.now() - started) / 1000).toFixed(1).padStart(6)}s] ${line}\n`)

// ---------------------------------------------------------------- processes

interface Child {
  readonly process: ChildProcess
  readonly pid: number
  /** Everything it printed, stdout and stderr interleaved. */
  readonly output: Array<string>
  readonly exited: Promise<number | null>
}

const startChild = (args: ReadonlyArray<string>, env: NodeJS.ProcessEnv): Child => {
  const child = spawn(process.execPath, args, { cwd: ROOT, env, stdio: ["ignore", "pipe", "pipe"] })
  if (child.pid === undefined) throw new Error(`could not start node ${args.join(" ")}`)
  const output: Array<string> = []
  child.stdout?.setEncoding("utf8").on("data", (text: string) => output.push(text))
  child.stderr?.setEncoding("utf8").on("data", (text: string) => output.push(text))
  const exited = new Promise<number | null>((resolveExit) => child.once("exit", (code) => resolveExit(code)))
  return { process: child, pid: child.pid, output, exited }
}

const isRunning = (child: Child) => child.process.exitCode === null && child.process.signalCode === null

const stopChild = async (child: Child, name: string, graceMs: number) => {
  if (!isRunning(child)) return
  child.process.kill("SIGTERM")
  const timer = new Promise<"timeout">((resolveTimer) => setTimeout(() => resolveTimer("timeout"), graceMs).unref())
  if ((await Promise.race([child.exited, timer])) === "timeout") {
    log(`${name} (pid ${child.pid}) did not stop within ${graceMs} ms of SIGTERM; sending SIGKILL`)
    child.process.kill("SIGKILL")
    await child.exited
  }
}

const tail = (child: Child, chars = 4000) => child.output.join("").slice(-chars)

// ---------------------------------------------------------------- CPU accounting

/** utime + stime of one process, in clock ticks (with `reaped`, also its waited-for children's); 0 once it is gone. */
const cpuTicks = async (pid: number, reaped = false): Promise<number> => {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8")
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
    // fields[0] is field 3 (state): utime, stime, cutime, cstime are fields 14 to 17.
    const own = Number(fields[11]) + Number(fields[12])
    return reaped ? own + Number(fields[13]) + Number(fields[14]) : own
  } catch {
    return 0
  }
}

/** Every live descendant of `pid` (the embedded PostgreSQL's postmaster and backends, for the service). */
const descendants = async (pid: number): Promise<Array<number>> => {
  const parents = new Map<number, Array<number>>()
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue
    try {
      const stat = await readFile(`/proc/${entry}/stat`, "utf8")
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1])
      const siblings = parents.get(ppid) ?? []
      siblings.push(Number(entry))
      parents.set(ppid, siblings)
    } catch {
      // gone meanwhile
    }
  }
  const found: Array<number> = []
  const queue = [pid]
  while (queue.length > 0) {
    for (const child of parents.get(queue.shift() ?? 0) ?? []) {
      found.push(child)
      queue.push(child)
    }
  }
  return found
}

/** Busy and total jiffies of the whole machine. */
const machineTicks = async () => {
  const line = (await readFile("/proc/stat", "utf8")).split("\n")[0] ?? ""
  const values = line.trim().split(/\s+/).slice(1).map(Number)
  const total = values.reduce((a, b) => a + b, 0)
  const idle = (values[3] ?? 0) + (values[4] ?? 0)
  return { busy: total - idle, total }
}

interface CpuSnapshot {
  readonly service: number
  /** Per process of the embedded PostgreSQL (the service's descendants), reaped children included. */
  readonly database: ReadonlyMap<number, number>
  readonly upstream: number
  /** This process (the load generator), in ms. */
  readonly benchMs: number
  readonly machine: { readonly busy: number; readonly total: number }
}

const snapshot = async (servicePid: number, upstreamPid: number): Promise<CpuSnapshot> => {
  const databasePids = await descendants(servicePid)
  const [service, database, upstream, machine] = await Promise.all([
    cpuTicks(servicePid),
    Promise.all(databasePids.map(async (pid) => [pid, await cpuTicks(pid, true)] as const)).then((all) => new Map(all)),
    cpuTicks(upstreamPid),
    machineTicks()
  ])
  const usage = process.cpuUsage()
  return { service, database, upstream, benchMs: (usage.user + usage.system) / 1000, machine }
}

/**
 * The database's CPU between two snapshots: backends that lived through it by
 * their difference, backends started meanwhile whole; backends that ended
 * meanwhile are in the postmaster's reaped children's time.
 */
const databaseTicks = (before: CpuSnapshot, after: CpuSnapshot) => {
  let ticks = 0
  for (const [pid, now] of after.database) ticks += now - (before.database.get(pid) ?? 0)
  return ticks
}

const ticksToMs = (ticks: number) => (ticks * 1000) / CLK_TCK

// ---------------------------------------------------------------- HTTP

interface Reply {
  readonly status: number
  readonly body: unknown
  readonly text: string
}

const request = async (method: string, url: string, options: { token?: string; json?: unknown } = {}): Promise<Reply> => {
  const headers: Record<string, string> = {}
  if (options.token !== undefined) headers["authorization"] = `Bearer ${options.token}`
  if (options.json !== undefined) headers["content-type"] = "application/json"
  const response = await fetch(url, {
    method,
    headers,
    ...(options.json === undefined ? {} : { body: JSON.stringify(options.json) })
  })
  const text = await response.text()
  let body: unknown = undefined
  try {
    body = JSON.parse(text)
  } catch {
    // HTML pages (the simulated checkout) and empty bodies
  }
  return { status: response.status, body, text }
}

const field = (value: unknown, ...path: Array<string | number>): unknown => {
  let current = value
  for (const key of path) {
    if (typeof current !== "object" || current === null) return undefined
    current = (current as Record<string | number, unknown>)[key]
  }
  return current
}

const expectStatus = (reply: Reply, status: number, what: string) => {
  if (reply.status !== status) throw new Error(`${what}: expected ${status}, got ${reply.status}: ${reply.text.slice(0, 500)}`)
}

// ---------------------------------------------------------------- database counters

interface DbCounters {
  /** The next transaction id: write transactions since are exactly the difference. */
  readonly nextXid: bigint
  readonly walBytes: bigint
  /** From the cumulative statistics (flushed by backends about once a second): approximate. */
  readonly commits: number
}

const databaseCounters = async (client: pg.Client): Promise<DbCounters> => {
  const { rows } = await client.query<{ next_xid: string; wal: string; commits: string }>(
    `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid,
            pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal,
            (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS commits`
  )
  const row = rows[0]
  if (row === undefined) throw new Error("no database counters")
  return { nextXid: BigInt(row.next_xid), walBytes: BigInt(row.wal), commits: Number(row.commits) }
}

/** A client of our own to the service's embedded cluster, from what it keeps in DATA_DIR. */
const connectDatabase = async (dataDir: string): Promise<pg.Client | undefined> => {
  try {
    const credentials = JSON.parse(await readFile(join(dataDir, "pg-credentials.json"), "utf8")) as {
      user: string
      password: string
    }
    const port = Number((await readFile(join(dataDir, "pg", "postmaster.pid"), "utf8")).split("\n")[3])
    const client = new pg.Client({
      host: "127.0.0.1",
      port,
      user: credentials.user,
      password: credentials.password,
      database: "nenas",
      application_name: "nenas-bench"
    })
    await client.connect()
    return client
  } catch (error) {
    log(`database counters unavailable: ${String(error)}`)
    return undefined
  }
}

// ---------------------------------------------------------------- measurement

interface Measurement {
  readonly rps: number
  readonly requests: number
  /** autocannon's histogram (1 ms resolution). */
  readonly p50: number
  readonly p99: number
  /** From every 2xx response time autocannon reported (sub-millisecond). */
  readonly p50Exact: number
  readonly p99Exact: number
  readonly meanExact: number
  readonly non2xx: number
  readonly errors: number
  readonly timeouts: number
  readonly statusCodes: Record<string, number>
  readonly errorMessages: Record<string, number>
  readonly serviceCpuMsPerReq: number
  readonly databaseCpuMsPerReq: number
  readonly upstreamCpuMsPerReq: number
  readonly benchCpuMsPerReq: number
  /** Share of both cores busy, 0..1. */
  readonly machineBusy: number
  readonly writeXactsPerReq: number | undefined
  readonly walBytesPerReq: number | undefined
  readonly commitsPerReq: number | undefined
}

interface Target {
  readonly name: "upstream" | "service"
  readonly url: string
  readonly body: string
  readonly headers: Record<string, string>
}

interface Context {
  readonly servicePid: number
  readonly upstreamPid: number
  readonly db: pg.Client | undefined
}

const percentile = (sorted: Float64Array, q: number) =>
  sorted.length === 0 ? NaN : sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? NaN

const measure = async (target: Target, connections: number, durationS: number, ctx: Context): Promise<Measurement> => {
  const times: Array<number> = []
  const errorMessages: Record<string, number> = {}
  const dbBefore = ctx.db === undefined ? undefined : await databaseCounters(ctx.db)
  const before = await snapshot(ctx.servicePid, ctx.upstreamPid)
  const instance = autocannon({
    url: target.url,
    connections,
    pipelining: 1,
    duration: durationS,
    method: "POST",
    headers: target.headers,
    body: target.body,
    timeout: 10
  })
  instance.on("response", (_client: unknown, statusCode: number, _bytes: number, responseTime: number) => {
    if (statusCode >= 200 && statusCode < 300) times.push(responseTime)
  })
  instance.on("reqError", (error: Error) => {
    const message = error.message
    errorMessages[message] = (errorMessages[message] ?? 0) + 1
  })
  const result: Result = await instance
  const after = await snapshot(ctx.servicePid, ctx.upstreamPid)
  const dbAfter = ctx.db === undefined ? undefined : await databaseCounters(ctx.db)
  const requests = result.requests.total
  const perReq = (value: number) => requests === 0 ? NaN : value / requests
  const sorted = Float64Array.from(times).sort()
  const statusCodes = Object.fromEntries(Object.entries(result.statusCodeStats).map(([code, { count }]) => [code, count]))
  return {
    rps: result.requests.average,
    requests,
    p50: result.latency.p50,
    p99: result.latency.p99,
    p50Exact: percentile(sorted, 0.5),
    p99Exact: percentile(sorted, 0.99),
    meanExact: times.length === 0 ? NaN : times.reduce((a, b) => a + b, 0) / times.length,
    non2xx: result.non2xx,
    errors: result.errors,
    timeouts: result.timeouts,
    statusCodes,
    errorMessages,
    serviceCpuMsPerReq: perReq(ticksToMs(after.service - before.service)),
    databaseCpuMsPerReq: perReq(ticksToMs(databaseTicks(before, after))),
    upstreamCpuMsPerReq: perReq(ticksToMs(after.upstream - before.upstream)),
    benchCpuMsPerReq: perReq(after.benchMs - before.benchMs),
    machineBusy: (after.machine.busy - before.machine.busy) / Math.max(1, after.machine.total - before.machine.total),
    writeXactsPerReq: dbBefore === undefined || dbAfter === undefined ? undefined : perReq(Number(dbAfter.nextXid - dbBefore.nextXid)),
    walBytesPerReq: dbBefore === undefined || dbAfter === undefined ? undefined : perReq(Number(dbAfter.walBytes - dbBefore.walBytes)),
    commitsPerReq: dbBefore === undefined || dbAfter === undefined ? undefined : perReq(dbAfter.commits - dbBefore.commits)
  }
}

const median = (values: ReadonlyArray<number>) => {
  const sorted = values.filter((v) => !Number.isNaN(v)).sort((a, b) => a - b)
  if (sorted.length === 0) return NaN
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[mid] ?? NaN : ((sorted[mid - 1] ?? 0) + (sorted[mid] ?? 0)) / 2
}

const medianOf = (runs: ReadonlyArray<Measurement>, pick: (m: Measurement) => number | undefined) =>
  median(runs.map((m) => pick(m) ?? NaN))

const fmt = (value: number, digits: number) => Number.isNaN(value) ? "-" : value.toFixed(digits)

// ---------------------------------------------------------------- the service's public API

interface Account {
  readonly base: string
  readonly token: string
}

const availableMicroMyr = async (account: Account) => {
  const balance = await request("GET", `${account.base}/dashboard/billing/balance`, { token: account.token })
  expectStatus(balance, 200, "balance")
  return Number(field(balance.body, "wallet", "availableMicroMyr"))
}

const topUp = async (account: Account) => {
  const checkout = await request("POST", `${account.base}/dashboard/billing/checkout`, {
    token: account.token,
    json: { amount_sen: TOPUP_SEN }
  })
  expectStatus(checkout, 200, "checkout")
  const url = String(field(checkout.body, "url"))
  const paid = await request("POST", `${url}/pay`)
  expectStatus(paid, 200, "simulated checkout pay")
}

/** Tops the wallet up until it holds `needed` micro-MYR. */
const ensureFunds = async (account: Account, needed: number) => {
  let available = await availableMicroMyr(account)
  let topUps = 0
  while (available < needed) {
    await topUp(account)
    topUps += 1
    const now = await availableMicroMyr(account)
    if (now <= available) throw new Error(`a top-up did not reach the wallet (available stays ${now} micro-MYR)`)
    available = now
  }
  if (topUps > 0) log(`topped up RM ${(topUps * TOPUP_SEN) / 100}; available RM ${(available / 1_000_000).toFixed(2)}`)
}

const waitReady = async (base: string, service: Child, timeoutMs: number) => {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (!isRunning(service)) throw new Error(`the service exited (code ${service.process.exitCode}) before it was ready:\n${tail(service)}`)
    try {
      const reply = await fetch(`${base}/readyz`)
      await reply.arrayBuffer()
      if (reply.status === 200) return
    } catch {
      // not listening yet
    }
    await new Promise((resolveWait) => setTimeout(resolveWait, 200))
  }
  throw new Error(`the service was not ready within ${timeoutMs} ms:\n${tail(service)}`)
}

// ---------------------------------------------------------------- main

const main = async () => {
  const dataDir = await mkdtemp(join(tmpdir(), "nenas-bench-"))
  let upstream: Child | undefined
  let service: Child | undefined
  let db: pg.Client | undefined
  let beforeStop = () => {}
  const cleanup = async () => {
    beforeStop()
    await db?.end().catch(() => undefined)
    if (service !== undefined) await stopChild(service, "service", 60_000)
    if (upstream !== undefined) await stopChild(upstream, "upstream", 5_000)
    await rm(dataDir, { recursive: true, force: true })
  }
  const interrupted = () => {
    log("interrupted: stopping the service and the upstream")
    void cleanup().finally(() => process.exit(130))
  }
  process.once("SIGINT", interrupted)
  process.once("SIGTERM", interrupted)

  try {
    log(`2 targets x connections [${CONNECTIONS.join(", ")}] x ${REPS} runs of ${DURATION_S} s (after ${WARMUP_S} s warm-up); data in ${dataDir}`)
    const environment = { ...process.env }
    for (const name of ["DATABASE_URL", "REDIS_URL", "NODE_ENV", "STRIPE_SECRET_KEY", "STRIPE_WEBHOOK_SECRET", "AUTH_JWKS_URL", "PUBLIC_BASE_URL", "PRICE_TABLE"]) {
      delete environment[name]
    }

    const upstreamChild = startChild(["--import", "tsx", "bench/upstream.ts"], environment)
    upstream = upstreamChild
    const upstreamBase = await new Promise<string>((resolveBase, reject) => {
      const timer = setTimeout(() => reject(new Error(`the upstream did not start:\n${tail(upstreamChild)}`)), 30_000)
      upstreamChild.process.stdout?.on("data", () => {
        const match = /\{"baseUrl":"([^"]+)"\}/.exec(upstreamChild.output.join(""))
        if (match?.[1] !== undefined) {
          clearTimeout(timer)
          resolveBase(match[1])
        }
      })
    })
    log(`upstream (pid ${upstream.pid}) at ${upstreamBase}`)

    const port = await freePort()
    const base = `http://127.0.0.1:${port}`
    const profileDir = CPU_PROF ? await mkdtemp(join(tmpdir(), "nenas-bench-prof-")) : undefined
    if (profileDir !== undefined) log(`the service's CPU profile will be written to ${profileDir} when it stops`)
    const args = profileDir === undefined
      ? ["--import", "tsx", "src/main.ts"]
      : ["--cpu-prof", `--cpu-prof-dir=${profileDir}`, "--import", "tsx", "src/main.ts"]
    service = startChild(args, {
      ...environment,
      PORT: String(port),
      HOST: "127.0.0.1",
      DATA_DIR: dataDir,
      UPSTREAM_BASE_URL: upstreamBase,
      RATE_LIMIT_RPM: "100000000",
      RATE_LIMIT_CONCURRENT: "100000"
    })
    const runningService = service
    let stopping = false
    beforeStop = () => {
      stopping = true
    }
    void runningService.exited.then((code) => {
      if (!stopping) {
        log(`the service (pid ${runningService.pid}) exited on its own: code ${code}, signal ${runningService.process.signalCode ?? "-"}`)
      }
    })
    const readyStart = Date.now()
    await waitReady(base, service, 120_000)
    log(`service (pid ${service.pid}) ready at ${base} after ${((Date.now() - readyStart) / 1000).toFixed(1)} s`)

    const session = await request("POST", `${base}/dev/session`, { json: { email: "bench@example.com" } })
    expectStatus(session, 200, "dev session")
    const account: Account = { base, token: String(field(session.body, "token")) }
    const key = await request("POST", `${base}/dashboard/api-keys`, { token: account.token, json: { name: "bench" } })
    if (key.status !== 200 && key.status !== 201) expectStatus(key, 201, "create API key")
    const apiKey = String(field(key.body, "full_key"))
    const perRunBudget = RPS_BOUND * (DURATION_S + WARMUP_S) * RESERVE_BOUND_MICRO_MYR
    await ensureFunds(account, perRunBudget)

    const chat = (model: string) => JSON.stringify({ model, messages: [{ role: "user", content: "Say hello" }], max_tokens: 16 })
    const upstreamTarget: Target = {
      name: "upstream",
      url: `${upstreamBase}/chat/completions`,
      body: chat("gpt-4.1-mini"),
      headers: { "content-type": "application/json", authorization: "Bearer upstream-key" }
    }
    const serviceTarget: Target = {
      name: "service",
      url: `${base}/v1/chat/completions`,
      body: chat("svc/nenas-flash"),
      headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` }
    }

    // One call first: the path works end to end, or there is nothing to measure.
    const probe = await fetch(serviceTarget.url, { method: "POST", headers: serviceTarget.headers, body: serviceTarget.body })
    const probeText = await probe.text()
    if (probe.status !== 200) throw new Error(`a model call failed: ${probe.status} ${probeText}`)

    db = await connectDatabase(dataDir)
    const ctx: Context = { servicePid: service.pid, upstreamPid: upstream.pid, db }
    const results = new Map<string, Array<Measurement>>()
    let service2xx = 1
    const problems: Array<string> = []
    const note = (target: Target, connections: number, m: Measurement, label: string) => {
      if (target.name === "service") service2xx += m.statusCodes["200"] ?? 0
      if (m.non2xx > 0 || m.errors > 0 || m.timeouts > 0) {
        problems.push(
          `${target.name} c=${connections} ${label}: non-2xx ${m.non2xx} ${JSON.stringify(m.statusCodes)}, errors ${m.errors} ${
            JSON.stringify(m.errorMessages)
          }, timeouts ${m.timeouts}`
        )
      }
    }

    for (const connections of CONNECTIONS) {
      for (const target of [upstreamTarget, serviceTarget]) {
        if (target.name === "service") await ensureFunds(account, perRunBudget)
        const warm = await measure(target, connections, WARMUP_S, ctx)
        note(target, connections, warm, "warm-up")
        log(`warm-up ${target.name.padEnd(8)} c=${String(connections).padStart(2)}: ${fmt(warm.rps, 0)} req/s`)
      }
      for (let rep = 1; rep <= REPS; rep++) {
        for (const target of [upstreamTarget, serviceTarget]) {
          if (target.name === "service") await ensureFunds(account, perRunBudget)
          const m = await measure(target, connections, DURATION_S, ctx)
          note(target, connections, m, `run ${rep}`)
          const key = `${target.name}/${connections}`
          results.set(key, [...(results.get(key) ?? []), m])
          log(
            `run ${rep} ${target.name.padEnd(8)} c=${String(connections).padStart(2)}: ${fmt(m.rps, 0)} req/s, p50 ${
              fmt(m.p50Exact, 3)
            } ms, p99 ${fmt(m.p99Exact, 3)} ms, service CPU ${fmt(m.serviceCpuMsPerReq, 3)} ms/req, machine ${
              fmt(m.machineBusy * 100, 0)
            }% busy`
          )
          if (!isRunning(service)) throw new Error(`the service exited during the run:\n${tail(service)}`)
        }
      }
    }

    // ------------------------------------------------------------ report
    const rows: Array<Array<string>> = [[
      "target",
      "conns",
      "req/s",
      "p50 ms",
      "p99 ms",
      "p50 exact",
      "p99 exact",
      "non-2xx",
      "svc CPU ms/req",
      "pg CPU ms/req",
      "upstr CPU ms/req",
      "bench CPU ms/req",
      "machine busy",
      "write xacts/req",
      "commits/req",
      "WAL B/req"
    ]]
    for (const connections of CONNECTIONS) {
      for (const name of ["upstream", "service"] as const) {
        const runs = results.get(`${name}/${connections}`) ?? []
        const svc = name === "service"
        rows.push([
          name,
          String(connections),
          fmt(medianOf(runs, (m) => m.rps), 0),
          fmt(medianOf(runs, (m) => m.p50), 0),
          fmt(medianOf(runs, (m) => m.p99), 0),
          fmt(medianOf(runs, (m) => m.p50Exact), 3),
          fmt(medianOf(runs, (m) => m.p99Exact), 3),
          String(runs.reduce((a, m) => a + m.non2xx + m.errors + m.timeouts, 0)),
          svc ? fmt(medianOf(runs, (m) => m.serviceCpuMsPerReq), 3) : "-",
          svc ? fmt(medianOf(runs, (m) => m.databaseCpuMsPerReq), 3) : "-",
          fmt(medianOf(runs, (m) => m.upstreamCpuMsPerReq), 3),
          fmt(medianOf(runs, (m) => m.benchCpuMsPerReq), 3),
          `${fmt(medianOf(runs, (m) => m.machineBusy) * 100, 0)}%`,
          svc ? fmt(medianOf(runs, (m) => m.writeXactsPerReq), 2) : "-",
          svc ? fmt(medianOf(runs, (m) => m.commitsPerReq), 2) : "-",
          svc ? fmt(medianOf(runs, (m) => m.walBytesPerReq), 0) : "-"
        ])
      }
    }
    const widths = (rows[0] ?? []).map((_, i) => Math.max(...rows.map((row) => (row[i] ?? "").length)))
    const lines = rows.map((row) => row.map((cell, i) => i < 2 ? cell.padEnd(widths[i] ?? 0) : cell.padStart(widths[i] ?? 0)).join("  "))
    process.stdout.write(`\nMedian of ${REPS} runs of ${DURATION_S} s each (pipelining 1, non-streaming chat completions, max_tokens 16)\n`)
    process.stdout.write(`${lines[0]}\n${"-".repeat(lines[0]?.length ?? 0)}\n${lines.slice(1).join("\n")}\n`)
    process.stdout.write(
      "p50/p99: autocannon's histogram (whole ms); exact: from every 2xx response time. CPU: utime+stime per completed request;\n" +
        "pg = the embedded PostgreSQL's processes; write xacts = transaction ids assigned; commits = pg_stat_database (approximate).\n"
    )

    // ------------------------------------------------------------ targets
    const rps32 = medianOf(results.get("service/32") ?? [], (m) => m.rps)
    const added = medianOf(results.get("service/1") ?? [], (m) => m.p50Exact) -
      medianOf(results.get("upstream/1") ?? [], (m) => m.p50Exact)
    const addedWhole = medianOf(results.get("service/1") ?? [], (m) => m.p50) -
      medianOf(results.get("upstream/1") ?? [], (m) => m.p50)
    const verdict = (ok: boolean) => ok ? "PASS" : "MISS"
    process.stdout.write("\nTargets\n")
    process.stdout.write(
      `  ${verdict(rps32 >= TARGET_RPS_32)}  service req/s at 32 connections >= ${TARGET_RPS_32}: ${fmt(rps32, 0)}\n`
    )
    process.stdout.write(
      `  ${verdict(added <= TARGET_ADDED_P50_MS)}  added p50 at 1 connection <= ${TARGET_ADDED_P50_MS} ms: ${fmt(added, 3)} ms (exact; autocannon's whole-ms histogram: ${
        fmt(addedWhole, 0)
      } ms)\n`
    )

    // ------------------------------------------------------------ billing happened
    // Calls whose client went away when a run stopped settle on their own; wait for them.
    const logCount = async (status: string) => {
      const page = await request("GET", `${base}/dashboard/logs?limit=1&status=${status}`, { token: account.token })
      expectStatus(page, 200, `logs?status=${status}`)
      return Number(field(page.body, "total"))
    }
    const settleStart = Date.now()
    let pending = await logCount("pending")
    while (pending > 0 && Date.now() - settleStart < 15_000) {
      await new Promise((resolveWait) => setTimeout(resolveWait, 250))
      pending = await logCount("pending")
    }
    log(`${pending} request logs still pending ${((Date.now() - settleStart) / 1000).toFixed(1)} s after the last run`)
    if (pending > 0 && db !== undefined) {
      const stuck = await db.query(
        `SELECT l.request_id, l.created_at, r.status AS reservation, r.expires_at
         FROM request_logs l LEFT JOIN reservations r ON r.id = l.reservation_id WHERE l.status = 'pending'`
      )
      for (const row of stuck.rows) log(`  pending: ${JSON.stringify(row)}`)
    }
    // Runs end by cutting calls in flight (those end `billed` or `failed`): one last whole call for the latest log.
    const last = await fetch(serviceTarget.url, { method: "POST", headers: serviceTarget.headers, body: serviceTarget.body })
    const lastText = await last.text()
    if (last.status === 200) service2xx += 1
    else problems.push(`the final call: ${last.status} ${lastText.slice(0, 300)}`)
    const balance = await request("GET", `${base}/dashboard/billing/balance`, { token: account.token })
    expectStatus(balance, 200, "balance")
    const spend = Number(field(balance.body, "wallet", "lifetimeSpendMicroMyr"))
    const reserved = Number(field(balance.body, "wallet", "reservedMicroMyr"))
    const latest = await request("GET", `${base}/dashboard/logs?limit=1`, { token: account.token })
    expectStatus(latest, 200, "logs")
    const total = Number(field(latest.body, "total"))
    const latestStatus = String(field(latest.body, "logs", 0, "status"))
    const latestCost = Number(field(latest.body, "logs", 0, "costMicroMyr"))
    const counts: Record<string, number> = {}
    for (const status of ["billed", "succeeded", "pending", "failed"]) counts[status] = await logCount(status)
    const billed = counts["billed"] ?? 0
    process.stdout.write("\nBilling\n")
    process.stdout.write(
      `  ${verdict(spend > 0)}  lifetime spend RM ${(spend / 1_000_000).toFixed(6)} (${fmt(billed > 0 ? spend / billed : NaN, 1)} micro-MYR per billed call); reserved ${reserved} micro-MYR\n`
    )
    process.stdout.write(
      `  ${verdict(latestStatus === "billed" && latestCost > 0)}  latest request log (a final whole call): ${latestStatus}, ${latestCost} micro-MYR\n`
    )
    process.stdout.write(
      `  ${verdict(reserved === 0 && pending === 0)}  nothing left reserved or pending 15 s after the runs cut their calls in flight\n`
    )
    process.stdout.write(
      `  request_logs: ${total} rows (${Object.entries(counts).map(([s, n]) => `${s} ${n}`).join(", ")}); 2xx answers the service gave: ${service2xx}\n`
    )

    if (problems.length > 0) {
      process.stdout.write(`\nProblems (non-2xx, errors, timeouts)\n${problems.map((p) => `  ${p}`).join("\n")}\n`)
      const sample = await fetch(serviceTarget.url, { method: "POST", headers: serviceTarget.headers, body: serviceTarget.body })
      process.stdout.write(`  a call now: ${sample.status} ${(await sample.text()).slice(0, 500)}\n`)
    }
    const serviceLog = service.output.join("")
    const errorLines = serviceLog.split("\n").filter((line) => /level=(ERROR|FATAL|WARN)|\bError\b/.test(line))
    if (errorLines.length > 0) {
      process.stdout.write(`\nService log: ${errorLines.length} warning/error lines; the first:\n${errorLines.slice(0, 10).map((l) => `  ${l.slice(0, 300)}`).join("\n")}\n`)
    }
  } catch (error) {
    if (service !== undefined) process.stdout.write(`\nThe service's last output:\n${tail(service, 8000)}\n`)
    throw error
  } finally {
    await cleanup()
    process.off("SIGINT", interrupted)
    process.off("SIGTERM", interrupted)
    const code = service?.process.exitCode
    log(`done; the service exited with ${code === null || code === undefined ? service?.process.signalCode ?? "-" : code}`)
  }
}

main().catch((error: unknown) => {
  const cause = error instanceof Error && error.cause !== undefined ? `\ncaused by: ${String(error.cause)}` : ""
  process.stderr.write(`bench failed: ${error instanceof Error ? error.stack ?? error.message : String(error)}${cause}\n`)
  process.exitCode = 1
})
