/**
 * `npm run bench`: the service next to its peers, in one run of the shared
 * peer benchmark (`../shared/bench/peers.mjs`) per setting: 32 and 1
 * connections, plain and streamed chat completions. The peers are the fake
 * upstream called directly, a minimal Node proxy, the leanest Effect gateway
 * and Portkey; the service (compiled, as production runs it) runs its whole billed path (API key, rate limits,
 * reservation, request log, upstream call, capture) on embedded PostgreSQL
 * with its default durable commits.
 *
 * It prints a table per run (with each target's idle and peak RSS: that of
 * its node process, read from /proc), PostgreSQL's transactions and WAL bytes
 * per call, and PASS/MISS for each goal (docs/performance.md, "Benchmark");
 * it never fails on a MISS, only when it cannot run.
 *
 * Settings (environment): BENCH_DURATION (s per target and round, default 10),
 * BENCH_WARMUP (s, default 3), BENCH_ROUNDS (default 3; medians),
 * BENCH_RUNS (default "32,32s,1,1s,32p,32g,32h,32hs,32r,32rs": connections, `s` for streamed, `p` for a 4 kB
 * prompt holding personal data, `g` for that prompt on a key whose guardrail policy redacts it, `h` for calls the
 * response cache answers (every one a hit), `r` for calls that refresh it (each billed and stored), `k` for calls
 * of an account whose own provider key answers them, on the same fake upstream),
 * BENCH_BUILTINS (peers.mjs's built-in targets beside the service, default
 * "direct,floor,portkey,effect"; the goals need portkey, the summary's
 * CPU ÷ effect needs effect),
 * BENCH_PEERS_DIR (default <repo>/../shared/bench), BENCH_DATABASE_URL (a
 * PostgreSQL server to use instead of the embedded one: a database is created
 * in it and dropped after), BENCH_CPU_PROF=1 (the service runs under
 * --cpu-prof; the profile's folder and its summary are printed).
 */
import { spawnSync } from "node:child_process"
import { mkdir, mkdtemp, readdir, readFile, rm } from "node:fs/promises"
import { cpus, loadavg, tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import pg from "pg"
import { embeddedClusterLocation, freePort } from "../src/Database/EmbeddedPostgres.js"
import type { Account } from "./account.js"
import { billingCheck, chatCall, createAccount, createGuardedKey, createProviderKey, ensureFunds } from "./account.js"
import { DatabaseCounters, WindowTracker } from "./database.js"
import type { PeerResults } from "./peers.js"
import { combineRounds, OneLine, preparePeers, readResults, runPeers, stopPeers, TARGET } from "./peers.js"
import type { Child } from "./processes.js"
import {
  buildService,
  isRunning,
  log,
  SERVICE_NODE_ARGS,
  startFakeUpstream,
  startNode,
  stopChild,
  tail,
  waitHttp
} from "./processes.js"
import type { RunOutcome, RunSpec } from "./report.js"
import { goalLines, label, runTable, summaryTable } from "./report.js"

const ROOT = resolve(fileURLToPath(new URL("..", import.meta.url)))

const numberSetting = (name: string, fallback: number) => {
  const raw = process.env[name]
  const value = raw === undefined || raw === "" ? fallback : Number(raw)
  if (!Number.isFinite(value) || value <= 0) throw new OneLine(`${name} must be a positive number, got ${raw}`)
  return value
}

const runsSetting = (raw: string): Array<RunSpec> =>
  raw.split(",").map((item) => {
    const match = /^\s*(\d+)([hrk]?)([spg]?)\s*$/.exec(item)
    if (match === null || Number(match[1]) < 1) {
      throw new OneLine(
        `BENCH_RUNS: "${item}" is not connections with an optional h, r or k, then s, p or g (e.g. 32s, 32hs)`
      )
    }
    const flag = match[3]
    return {
      connections: Number(match[1]),
      stream: flag === "s",
      prompt: flag === "p" ? "4kB" as const : flag === "g" ? "4kB guarded" as const : undefined,
      cache: match[2] === "h" ? "hit" as const : match[2] === "r" ? "refresh" as const : undefined,
      ownKey: match[2] === "k"
    }
  })

/** The settings, read in `main` so that a bad one is a one-line failure. */
const readSettings = () => {
  const durationS = numberSetting("BENCH_DURATION", 10)
  const warmupS = numberSetting("BENCH_WARMUP", 3)
  const rounds = Math.round(numberSetting("BENCH_ROUNDS", 3))
  return {
    durationS,
    warmupS,
    rounds,
    runs: runsSetting(process.env["BENCH_RUNS"] ?? "32,32s,1,1s,32p,32g,32h,32hs,32r,32rs,32k"),
    peersDir: resolve(process.env["BENCH_PEERS_DIR"] ?? join(ROOT, "..", "shared", "bench")),
    externalDatabase: process.env["BENCH_DATABASE_URL"] ?? "",
    cpuProf: process.env["BENCH_CPU_PROF"] === "1",
    /** Before each run the wallet holds twice what that run could reserve: it never runs dry, and never looks small. */
    fundsPerRun: 2 * RPS_BOUND * rounds * (warmupS + durationS) * RESERVE_BOUND_MICRO_MYR
  }
}

const BODY = JSON.stringify({ model: "svc/nenas-flash", messages: [{ role: "user", content: "hi" }], max_tokens: 16 })
/** A 4 kB prompt with four items of personal data: what the guardrail runs (`32p`, `32g`) send. */
const PII_PROMPT = "Please help Aminah (aminah@example.com.my, 012-345 6789, IC 880101-14-5678) " +
  "with her account; she logged in from 192.168.10.24. " + "The customer wrote at length about the service. ".repeat(80)
const BODY_4K = JSON.stringify({
  model: "svc/nenas-flash",
  messages: [{ role: "user", content: PII_PROMPT.slice(0, 4096) }],
  max_tokens: 16
})
/** The `Nenas-Cache` header of the cache runs (docs/api/cache.md, "Turning it on"). */
const CACHE_HEADER = { hit: "on", refresh: "refresh" } as const
/** An upper bound of what one call reserves (max_tokens 16, a short prompt: about RM 0.0002). */
const RESERVE_BOUND_MICRO_MYR = 1_000
/** No run here goes faster than this. */
const RPS_BOUND = 20_000

/** A database of its own on BENCH_DATABASE_URL's server, for the service. */
const externalDatabase = async (serverUrl: string) => {
  const name = `nenas_bench_${process.pid}`
  const admin = new pg.Client({ connectionString: serverUrl })
  await admin.connect()
  try {
    await admin.query(`CREATE DATABASE ${admin.escapeIdentifier(name)}`)
  } finally {
    await admin.end()
  }
  const url = new URL(serverUrl)
  url.pathname = `/${name}`
  return {
    name,
    url: url.toString(),
    drop: async () => {
      const client = new pg.Client({ connectionString: serverUrl })
      await client.connect()
      await client.query(`DROP DATABASE IF EXISTS ${client.escapeIdentifier(name)} WITH (FORCE)`).finally(() =>
        client.end()
      )
    }
  }
}

/** Fails when a process the runs need has exited (a crash, or someone else's kill). */
const ensureRunning = async (child: Child) => {
  if (isRunning(child)) return
  const how = child.process.signalCode === null
    ? `code ${child.process.exitCode}`
    : `signal ${child.process.signalCode}`
  throw new Error(
    `${child.name} (pid ${child.pid}) exited during the run (${how}); its last output:\n${await tail(child)}`
  )
}

/** The service's log lines at warning level or above (JSON or pretty format). */
const serviceProblems = async (service: Child) => {
  const text = await readFile(service.logFile, "utf8").catch(() => "")
  return text.split("\n").filter((line) => /"level":"(WARN|ERROR|FATAL)"|level=(WARN|ERROR|FATAL)|\bError\b/.test(line))
}

const printProfiles = async (dir: string, peersDir: string) => {
  const files = (await readdir(dir)).filter((file) => file.endsWith(".cpuprofile"))
  process.stdout.write(`\nThe service's CPU profile: ${dir} (${files.join(", ") || "no profile written"})\n`)
  // CPU.<date>.<time>.<pid>.<thread>.<n>.cpuprofile: thread 0 is the main thread.
  for (const file of files.filter((name) => /\.\d+\.0\.\d+\.cpuprofile$/.test(name))) {
    const summary = spawnSync(
      process.execPath,
      [join(peersDir, "profile-summary.mjs"), join(dir, file), "--top", "25"],
      {
        encoding: "utf8"
      }
    )
    process.stdout.write(summary.stdout + summary.stderr)
  }
}

const main = async () => {
  const { cpuProf, durationS, externalDatabase: externalServer, fundsPerRun, peersDir, rounds, runs, warmupS } =
    readSettings()
  const peersScript = preparePeers(peersDir)
  const stamp = new Date().toISOString().replace(/[:.]/g, "-")
  const outDir = join(peersDir, "results", `nenas-${stamp}`)
  await mkdir(outDir, { recursive: true })
  const dataDir = await mkdtemp(join(tmpdir(), "nenas-bench-"))
  const cluster = await embeddedClusterLocation(dataDir)
  const profileDir = cpuProf ? await mkdtemp(join(tmpdir(), "nenas-bench-prof-")) : undefined
  let upstream: Child | undefined
  let service: Child | undefined
  let counters: DatabaseCounters | undefined
  let dropDatabase: (() => Promise<void>) | undefined
  let cleaned = false
  const cleanup = async () => {
    if (cleaned) return
    cleaned = true
    stopPeers()
    await counters?.end().catch(() => undefined)
    if (service !== undefined) await stopChild(service, 60_000)
    if (upstream !== undefined) await stopChild(upstream, 5_000)
    await dropDatabase?.().catch((error: unknown) => log(`could not drop the bench database: ${String(error)}`))
    await rm(dataDir, { recursive: true, force: true })
    // As root the embedded cluster lives outside DATA_DIR.
    if (cluster.layout === "root") await rm(cluster.ownDir, { recursive: true, force: true })
  }
  let stopping = false
  const interrupted = () => {
    stopping = true
    log("interrupted: stopping the service, the upstream and peers.mjs")
    void cleanup().finally(() => process.exit(130))
  }
  process.once("SIGINT", interrupted)
  process.once("SIGTERM", interrupted)

  const outcomes: Array<RunOutcome> = []
  const failures: Array<string> = []
  try {
    log(
      `runs [${
        runs.map(label).join("; ")
      }] x ${rounds} round(s) of ${durationS} s per target after ${warmupS} s warm-up; ` +
        `${cpus().length} cores, load average ${loadavg().map((l) => l.toFixed(2)).join(" ")}; results in ${outDir}`
    )
    const environment = { ...process.env }
    for (
      const name of [
        "DATABASE_URL",
        "REDIS_URL",
        "NODE_ENV",
        "STRIPE_SECRET_KEY",
        "STRIPE_WEBHOOK_SECRET",
        "AUTH_JWKS_URL",
        "PUBLIC_BASE_URL",
        "PRICE_TABLE",
        "UPSTREAM_API_KEY"
      ]
    ) {
      delete environment[name]
    }

    const fake = await startFakeUpstream(peersDir, environment, join(outDir, "upstream.log"))
    upstream = fake.child
    const { base: upstreamBase, child: upstreamChild, port: upstreamPort } = fake
    log(`fake upstream (pid ${upstreamChild.pid}) at ${upstreamBase}`)

    const external = externalServer === "" ? undefined : await externalDatabase(externalServer)
    dropDatabase = external?.drop
    const port = await freePort()
    const base = `http://127.0.0.1:${port}`
    const nodeArgs = [
      ...SERVICE_NODE_ARGS,
      ...(profileDir === undefined ? [] : ["--cpu-prof", `--cpu-prof-dir=${profileDir}`])
    ]
    buildService(ROOT)
    service = startNode("the service", [...nodeArgs, "dist/main.js"], {
      cwd: ROOT,
      logFile: join(dataDir, "service.log"),
      env: {
        ...environment,
        PORT: String(port),
        HOST: "127.0.0.1",
        DATA_DIR: dataDir,
        UPSTREAM_BASE_URL: `${upstreamBase}/v1`,
        // No key limit may throttle the bench.
        RATE_LIMIT_RPM: "100000000",
        RATE_LIMIT_CONCURRENT: "100000",
        // The own-key runs' provider is the fake upstream on the loopback.
        PROVIDER_ALLOWED_HOSTS: "127.0.0.1",
        // As in production: one JSON object a line.
        LOG_FORMAT: "json",
        ...(external === undefined ? {} : { DATABASE_URL: external.url })
      }
    })
    const readyStart = Date.now()
    await waitHttp(service, `${base}/readyz`, 120_000)
    log(
      `service (pid ${service.pid}) ready at ${base} after ${((Date.now() - readyStart) / 1000).toFixed(1)} s` +
        (profileDir === undefined ? "" : `; its CPU profile goes to ${profileDir} when it stops`)
    )

    const account: Account = await createAccount(base)
    const guardedKey = await createGuardedKey(account)
    await ensureFunds(account, fundsPerRun)
    await chatCall(account, BODY)
    // A second account, whose own provider key answers its calls (the `k` runs).
    const ownKeyAccount = runs.some((spec) => spec.ownKey === true)
      ? await createAccount(base, "bench-own-key@example.com")
      : undefined
    if (ownKeyAccount !== undefined) {
      await createProviderKey(ownKeyAccount, `${upstreamBase}/v1`)
      await ensureFunds(ownKeyAccount, fundsPerRun)
      await chatCall(ownKeyAccount, BODY)
    }
    counters = external === undefined
      ? await DatabaseCounters.embedded(dataDir, upstreamBase)
      : await DatabaseCounters.connect({ connectionString: externalServer }, external.name, upstreamBase)
    if (external !== undefined) {
      log(
        "BENCH_DATABASE_URL: the service's CPU excludes that PostgreSQL's, and WAL bytes count the whole server's writes"
      )
    }

    let first = true
    for (const spec of runs) {
      // A 4 kB prompt holds some ten times what a short one does; its calls are as many times fewer.
      const caller = spec.ownKey === true && ownKeyAccount !== undefined ? ownKeyAccount : account
      await ensureFunds(caller, fundsPerRun)
      const body = spec.prompt === undefined ? BODY : BODY_4K
      const apiKey = spec.prompt === "4kB guarded" ? guardedKey : caller.apiKey
      const name = `${spec.connections}c-${spec.stream ? "stream" : "plain"}${
        spec.prompt === undefined ? "" : `-${spec.prompt.replace(" ", "-")}`
      }${spec.cache === undefined ? "" : `-cache-${spec.cache}`}${spec.ownKey === true ? "-own-key" : ""}`
      // A hit run's answer is stored before it starts (the cache key leaves `stream` out: one serves both modes).
      if (spec.cache === "hit") await chatCall(account, body, CACHE_HEADER.hit)
      // One peers.mjs per round: the service is its last target, so nothing else reaches the upstream after its window.
      await ensureRunning(upstreamChild)
      const tracker = new WindowTracker(counters)
      await tracker.begin()
      const roundResults: Array<PeerResults> = []
      for (let round = 1; round <= rounds; round++) {
        const args = [
          "--builtins",
          process.env["BENCH_BUILTINS"] ?? "direct,floor,portkey,effect",
          "--effect-project",
          ROOT,
          "--target",
          `${TARGET}=${base}/v1/chat/completions`,
          "--header",
          `${TARGET}=Authorization:Bearer ${apiKey}`,
          "--pid",
          `${TARGET}=${service.pid}`,
          "--cpu-tree",
          TARGET,
          "--upstream-port",
          String(upstreamPort),
          "--upstream-pid",
          String(upstreamChild.pid),
          "--floor-port",
          String(await freePort()),
          "--effect-port",
          String(await freePort()),
          "--portkey-port",
          String(await freePort()),
          "--connections",
          String(spec.connections),
          "--duration",
          String(durationS),
          "--warmup",
          String(warmupS),
          "--body",
          body,
          ...(spec.stream ? ["--stream"] : []),
          ...(spec.cache === undefined ? [] : ["--header", `${TARGET}=Nenas-Cache:${CACHE_HEADER[spec.cache]}`])
        ]
        log(`peers.mjs, ${label(spec)}, round ${round} of ${rounds}`)
        const out = join(outDir, `${name}-${round}.json`)
        const { exitCode, memory, stderr } = await runPeers(peersScript, args, {
          cwd: ROOT,
          out,
          tracker,
          quiet: !first,
          pids: { [TARGET]: service.pid, direct: upstreamChild.pid }
        })
        first = false
        await ensureRunning(upstreamChild)
        await ensureRunning(service)
        const results = await readResults(out, memory).catch(() => undefined)
        if (results === undefined) {
          throw new Error(
            `peers.mjs (${label(spec)}) exited with ${exitCode} and wrote no results:\n${stderr.slice(-3000)}`
          )
        }
        if (exitCode !== 0) failures.push(`${label(spec)}, round ${round}: peers.mjs exited with ${exitCode}`)
        for (const target of results.targets) {
          if (target.failed !== undefined) {
            failures.push(`${label(spec)}, round ${round}: ${target.name} ${target.failed}`)
          }
        }
        roundResults.push(results)
      }
      const database = await tracker.finish().catch((error: unknown) => {
        log(`PostgreSQL readings failed: ${String(error)}`)
        return undefined
      })
      const outcome: RunOutcome = { spec, results: combineRounds(roundResults), database }
      outcomes.push(outcome)
      process.stdout.write(
        `\n${label(spec)}: ${rounds} round(s) of ${durationS} s per target after ${warmupS} s warm-up (medians)\n${
          runTable(outcome)
        }\n\n`
      )
    }

    const billing = await billingCheck(account, BODY)
    process.stdout.write(
      `\nSummary (Node ${process.version} for every target; ${rounds} round(s) of ${durationS} s per target; ratios within each run)\n${
        summaryTable(outcomes)
      }\n`
    )
    process.stdout.write(
      `\nGoals (a MISS never fails the bench)\n${goalLines(outcomes, billing).map((l) => `  ${l}`).join("\n")}\n`
    )
    process.stdout.write(`\nBilling\n${billing.map((l) => `  ${l}`).join("\n")}\n`)
    const problems = await serviceProblems(service)
    if (problems.length > 0) {
      process.stdout.write(
        `\nService log: ${problems.length} warning/error lines; the first:\n${
          problems.slice(0, 10).map((l) => `  ${l.slice(0, 300)}`).join("\n")
        }\n`
      )
    }
    if (failures.length > 0) {
      process.stdout.write(`\nCould not run fully:\n${failures.map((f) => `  ${f}`).join("\n")}\n`)
      process.exitCode = 1
    }
  } catch (error) {
    if (stopping) throw new OneLine("interrupted")
    if (service !== undefined) process.stdout.write(`\nThe service's last output:\n${await tail(service, 8000)}\n`)
    throw error
  } finally {
    await cleanup()
    process.off("SIGINT", interrupted)
    process.off("SIGTERM", interrupted)
    if (profileDir !== undefined) await printProfiles(profileDir, peersDir)
    log(`done; peers.mjs results and server logs in ${outDir}`)
  }
}

main().catch((error: unknown) => {
  if (error instanceof OneLine) process.stderr.write(`bench: ${error.message}\n`)
  else process.stderr.write(`bench failed: ${error instanceof Error ? error.stack ?? error.message : String(error)}\n`)
  process.exitCode = 1
})
