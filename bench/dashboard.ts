/**
 * `npm run bench:dashboard`: the dashboard's reads at growing numbers of
 * request logs. One developer (three keys: two live, one test) gets logs up to
 * 1,000,000 over the last 30 days; past that, 50 other accounts get the rest.
 * Logs are seeded with `generate_series` (rollup triggers off), then
 * `npm run rollups:rebuild` builds the rollups; each read is timed
 * BENCH_REPS times (after two warm-ups) through the service's HTTP API, and
 * p50/p99 are printed per read per size. Then the flush's cost: batches of
 * log upserts (pending, then final) with and without the rollup triggers.
 *
 * Settings (environment): BENCH_SIZES (default "100000,1000000,10000000",
 * ascending), BENCH_REPS (default 50), BENCH_DATABASE_URL or DATABASE_URL (a
 * PostgreSQL server; a database is created in it and dropped after; default
 * postgres://postgres@127.0.0.1:5432/postgres), BENCH_KEEP=1 (keep it).
 */
import { spawnSync } from "node:child_process"
import { readFileSync } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import { loadavg, tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import pg from "pg"
import { freePort } from "../src/Database/EmbeddedPostgres.js"
import { log, startNode, stopChild, tail, waitHttp } from "./processes.js"

const ROOT = resolve(fileURLToPath(new URL("..", import.meta.url)))
const DEVELOPER_MAX = 1_000_000
const OTHERS = 50
const CHUNK = 1_000_000

const sizes = (process.env.BENCH_SIZES ?? "100000,1000000,10000000").split(",").map(Number)
const reps = Number(process.env.BENCH_REPS ?? 50)
const adminUrl = process.env.BENCH_DATABASE_URL ?? process.env.DATABASE_URL ??
  "postgres://postgres@127.0.0.1:5432/postgres"
if (sizes.some((n, i) => !Number.isInteger(n) || n <= 0 || (i > 0 && n <= (sizes[i - 1] ?? 0)))) {
  throw new Error("BENCH_SIZES must be ascending positive integers, e.g. 100000,1000000")
}

const withDatabase = (url: string, name: string) => {
  const parsed = new URL(url)
  parsed.pathname = `/${name}`
  return parsed.toString()
}

const percentile = (sorted: ReadonlyArray<number>, p: number) =>
  sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)] ?? NaN

const request = async (base: string, method: string, path: string, token?: string, json?: unknown) => {
  const response = await fetch(`${base}${path}`, {
    method,
    headers: {
      ...(token === undefined ? {} : { authorization: `Bearer ${token}` }),
      ...(json === undefined ? {} : { "content-type": "application/json" })
    },
    ...(json === undefined ? {} : { body: JSON.stringify(json) })
  })
  const text = await response.text()
  if (response.status >= 300) throw new Error(`${method} ${path}: ${response.status} ${text.slice(0, 300)}`)
  return JSON.parse(text) as Record<string, unknown>
}

/** Logs `[first, last]` (1-based, across sizes): the developer's first, then the other accounts'. */
const seed = async (
  client: pg.Client,
  developer: { accountId: string; keys: ReadonlyArray<string> },
  first: number,
  last: number
) => {
  for (let start = first; start <= last; start += CHUNK) {
    const end = Math.min(last, start + CHUNK - 1)
    const ownFrom = start
    const ownTo = Math.min(end, DEVELOPER_MAX)
    const [live1, live2, test] = developer.keys
    const columns = `request_id, account_id, api_key_id, public_model, upstream_model, routing_category, endpoint,
      status, input_tokens, output_tokens, reasoning_tokens, cached_tokens, search_count, content_pages,
      cost_micro_myr, latency_ms, created_at, completed_at, environment, error_code`
    // Spread over the last 30 days; one call in 20 failed (cost 0); the test key's calls are free.
    const values = (account: string, key: string, environment: string) => `
      'req_bench_' || g, ${account}, ${key}, 'svc/nenas-flash', 'upstream/model',
      (ARRAY['general', 'reasoning', 'search'])[g % 3 + 1],
      CASE WHEN g % 7 = 0 THEN '/v1/chat/completions' ELSE '/v1/responses' END,
      CASE WHEN g % 20 = 0 THEN 'failed' ELSE 'billed' END,
      100 + g % 900, CASE WHEN g % 20 = 0 THEN 0 ELSE 50 + g % 500 END, g % 40, g % 30, g % 3 / 2, g % 5 / 4,
      CASE WHEN g % 20 = 0 OR ${environment} = 'test' THEN 0 ELSE 200 + g % 5000 END, 300 + g % 2000,
      at, at + interval '1 second', ${environment}, CASE WHEN g % 20 = 0 THEN 'upstream_error' END`
    const at = "now() - ((g::bigint * 7919) % 2592000000) * interval '1 millisecond'"
    if (ownFrom <= ownTo) {
      await client.query(
        `
        INSERT INTO request_logs (${columns})
        SELECT ${values("$1", "(ARRAY[$2, $3, $4])[g % 3 + 1]", "CASE WHEN g % 3 = 2 THEN 'test' ELSE 'live' END")}
        FROM generate_series($5::bigint, $6::bigint) g, LATERAL (SELECT ${at} AS at) t`,
        [developer.accountId, live1, live2, test, ownFrom, ownTo]
      )
    }
    const otherFrom = Math.max(start, DEVELOPER_MAX + 1)
    if (otherFrom <= end) {
      await client.query(
        `
        INSERT INTO request_logs (${columns})
        SELECT ${values(`'acct_bench_' || g % ${OTHERS}`, `'key_bench_' || g % ${OTHERS}`, "'live'")}
        FROM generate_series($1::bigint, $2::bigint) g, LATERAL (SELECT ${at} AS at) t`,
        [otherFrom, end]
      )
    }
    log(`  seeded ${end.toLocaleString("en")} logs`)
  }
}

interface Read {
  readonly name: string
  readonly path: string
}

const reads = (keyId: string, now: Date): ReadonlyArray<Read> => {
  const iso = (daysAgo: number) => new Date(now.getTime() - daysAgo * 86_400_000).toISOString()
  return [
    { name: "overview", path: "/dashboard/overview" },
    { name: "usage, default (7 days by day)", path: "/dashboard/usage" },
    { name: "usage, 366 days by day", path: `/dashboard/usage?from=${iso(365)}&to=${now.toISOString()}` },
    {
      name: "usage, 31 days by hour",
      path: `/dashboard/usage?granularity=hour&from=${iso(30.9)}&to=${now.toISOString()}`
    },
    { name: "usage by key, 366 days", path: `/dashboard/usage?api_key_id=${keyId}&from=${iso(365)}` },
    {
      name: "usage, live only, 31 days by hour",
      path: `/dashboard/usage?environment=live&granularity=hour&from=${iso(30.9)}`
    },
    { name: "logs, first page", path: "/dashboard/logs" },
    { name: "logs, page 500 of 200", path: "/dashboard/logs?page=500&limit=200" },
    { name: "logs, status=failed, 200", path: "/dashboard/logs?status=failed&limit=200" },
    { name: "logs, status=failed, page 100", path: "/dashboard/logs?status=failed&page=100" },
    { name: "logs by endpoint, page 100", path: "/dashboard/logs?endpoint=/v1/chat/completions&page=100" },
    { name: "logs by key and dates", path: `/dashboard/logs?api_key_id=${keyId}&from=${iso(20)}&to=${iso(10)}` },
    { name: "logs, environment=test, page 100", path: "/dashboard/logs?environment=test&page=100" }
  ]
}

/** A cursor deep in the logs (after ~100,000 rows), for the keyset read. */
const deepCursor = async (client: pg.Client, accountId: string) => {
  const { rows } = await client.query<{ at: string; id: string }>(
    `
    SELECT (extract(epoch FROM created_at) * 1000000)::bigint::text AS at, request_id AS id FROM request_logs
    WHERE account_id = $1 ORDER BY created_at DESC, request_id DESC OFFSET 100000 LIMIT 1`,
    [accountId]
  )
  const row = rows[0]
  return row === undefined ? undefined : Buffer.from(`${row.at}.${row.id}`).toString("base64url")
}

const time = async (base: string, token: string, path: string) => {
  for (let i = 0; i < 2; i++) await request(base, "GET", path, token)
  const times: Array<number> = []
  for (let i = 0; i < reps; i++) {
    const started = performance.now()
    await request(base, "GET", path, token)
    times.push(performance.now() - started)
  }
  times.sort((a, b) => a - b)
  return { p50: percentile(times, 50), p99: percentile(times, 99) }
}

/**
 * The flush's log writes (50 pending rows, then the same 50 final: one
 * transaction each), with the rollup triggers off and on in alternating
 * rounds, so that a busy machine weighs on both alike; the median
 * milliseconds per transaction of each.
 */
const flushCost = async (client: pg.Client, accountId: string, keyId: string) => {
  const triggers = async (action: "ENABLE" | "DISABLE") => {
    await client.query(`ALTER TABLE request_logs ${action} TRIGGER usage_rollups_insert`)
    await client.query(`ALTER TABLE request_logs ${action} TRIGGER usage_rollups_update`)
  }
  const times = { off: [] as Array<number>, on: [] as Array<number> }
  for (let round = 0; round < 10; round++) {
    for (const mode of ["off", "on"] as const) {
      await triggers(mode === "on" ? "ENABLE" : "DISABLE")
      for (let b = 0; b < 20; b++) {
        const ids = Array.from({ length: 50 }, (_, i) => `req_flush_${mode}_${round}_${b}_${i}`)
        for (const status of ["pending", "billed"]) {
          const started = performance.now()
          await client.query("BEGIN")
          await client.query(
            `
            INSERT INTO request_logs (request_id, account_id, api_key_id, public_model, endpoint, status, input_tokens,
              output_tokens, cost_micro_myr, created_at, environment)
            SELECT id, $2, $3, 'svc/nenas-flash', '/v1/responses', $4, 100, CASE WHEN $4 = 'billed' THEN 50 ELSE 0 END,
              CASE WHEN $4 = 'billed' THEN 1234 ELSE 0 END, now(), 'live'
            FROM unnest($1::text[]) id
            ON CONFLICT (request_id) DO UPDATE SET status = EXCLUDED.status, output_tokens = EXCLUDED.output_tokens,
              cost_micro_myr = EXCLUDED.cost_micro_myr
            WHERE request_logs.status = 'pending'`,
            [ids, accountId, keyId, status]
          )
          await client.query("COMMIT")
          times[mode].push(performance.now() - started)
        }
      }
    }
  }
  await triggers("ENABLE")
  const median = (xs: Array<number>) => percentile([...xs].sort((x, y) => x - y), 50)
  return { off: median(times.off), on: median(times.on) }
}

/** The service's resident memory now and at its peak so far (VmRSS, VmHWM), in MB. */
const memory = (pid: number) => {
  const status = readFileSync(`/proc/${pid}/status`, "utf8")
  const mb = (field: string) => Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(status)?.[1] ?? NaN) / 1024
  return { rss: mb("VmRSS"), peak: mb("VmHWM") }
}

/** The developer's whole log export, read as it streams: rows, bytes, seconds, and the service's peak RSS before and after. */
const exportAll = async (base: string, token: string, pid: number) => {
  const before = memory(pid)
  const started = performance.now()
  const response = await fetch(`${base}/dashboard/logs/export?format=csv`, {
    headers: { authorization: `Bearer ${token}` }
  })
  if (response.status !== 200 || response.body === null) throw new Error(`export: ${response.status}`)
  let bytes = 0
  let lines = 0
  for await (const chunk of response.body) {
    bytes += chunk.byteLength
    for (const byte of chunk) if (byte === 10) lines++
  }
  return { rows: lines - 1, bytes, seconds: (performance.now() - started) / 1000, before, after: memory(pid) }
}

const main = async () => {
  const name = `nenas_bench_dash_${Date.now().toString(36)}`
  const admin = new pg.Client({ connectionString: adminUrl })
  await admin.connect()
  await admin.query(`CREATE DATABASE "${name}"`)
  const databaseUrl = withDatabase(adminUrl, name)
  const dataDir = await mkdtemp(join(tmpdir(), "nenas-bench-dashboard-"))
  const port = await freePort()
  const base = `http://127.0.0.1:${port}`
  const service = startNode("service", ["--import", "tsx", "src/main.ts"], {
    cwd: ROOT,
    env: {
      ...process.env,
      DATABASE_URL: databaseUrl,
      DATA_DIR: dataDir,
      PORT: String(port),
      HOST: "127.0.0.1",
      PUBLIC_BASE_URL: base,
      LOG_FORMAT: "json"
    },
    logFile: join(dataDir, "service.log")
  })
  const client = new pg.Client({ connectionString: databaseUrl })
  try {
    await waitHttp(service, `${base}/healthz`, 60_000)
    await client.connect()
    const token = String(
      (await request(base, "POST", "/dev/session", undefined, { email: "bench-dashboard@example.com" })).token
    )
    const keys: Array<string> = []
    for (const environment of ["live", "live", "test"]) {
      const created = await request(base, "POST", "/dashboard/api-keys", token, {
        name: `bench ${environment}`,
        environment
      })
      keys.push(String((created.key as { id: string }).id))
    }
    const accountId =
      (await client.query<{ id: string }>("SELECT account_id AS id FROM api_keys WHERE id = $1", [keys[0]])).rows[0]
        ?.id ?? ""
    await client.query(
      `INSERT INTO accounts (id, subject) SELECT 'acct_bench_' || g, 'bench-' || g FROM generate_series(0, ${
        OTHERS - 1
      }) g`
    )
    const developer = { accountId, keys }
    const results: Array<{ size: number; read: string; p50: number; p99: number }> = []
    let seeded = 0
    for (const size of sizes) {
      log(`size ${size.toLocaleString("en")}: seeding`)
      await client.query("ALTER TABLE request_logs DISABLE TRIGGER usage_rollups_insert")
      await seed(client, developer, seeded + 1, size)
      await client.query("ALTER TABLE request_logs ENABLE TRIGGER usage_rollups_insert")
      seeded = size
      await client.query("VACUUM ANALYZE request_logs")
      const rebuildStarted = performance.now()
      const rebuilt = spawnSync(process.execPath, ["--import", "tsx", "src/Logs/RebuildRollups.ts"], {
        cwd: ROOT,
        env: { ...process.env, DATABASE_URL: databaseUrl },
        encoding: "utf8"
      })
      if (rebuilt.status !== 0) throw new Error(`rollups:rebuild failed: ${rebuilt.stderr}`)
      log(`  ${rebuilt.stdout.trim()} in ${((performance.now() - rebuildStarted) / 1000).toFixed(1)} s`)
      await client.query("VACUUM ANALYZE usage_rollups")
      const cursor = await deepCursor(client, accountId)
      const all = [
        ...reads(keys[0] ?? "", new Date()),
        ...(cursor === undefined
          ? []
          : [{ name: "logs, cursor after 100,000 rows, 200", path: `/dashboard/logs?limit=200&cursor=${cursor}` }])
      ]
      for (const read of all) {
        const { p50, p99 } = await time(base, token, read.path)
        results.push({ size, read: read.name, p50, p99 })
        log(`  ${read.name.padEnd(40)} p50 ${p50.toFixed(1).padStart(7)} ms   p99 ${p99.toFixed(1).padStart(7)} ms`)
      }
    }
    // Twice: a second export that raises the peak no further shows the memory is bounded, not growing with rows.
    const exported = await exportAll(base, token, service.pid)
    const again = await exportAll(base, token, service.pid)
    const flush = await flushCost(client, accountId, keys[0] ?? "")
    console.log("\n| read | " + sizes.map((s) => `${s.toLocaleString("en")} p50 / p99 (ms)`).join(" | ") + " |")
    console.log("|---|" + sizes.map(() => "---|").join(""))
    for (const read of [...new Set(results.map((r) => r.read))]) {
      const cells = sizes.map((size) => {
        const r = results.find((x) => x.size === size && x.read === read)
        return r === undefined ? "–" : `${r.p50.toFixed(1)} / ${r.p99.toFixed(1)}`
      })
      console.log(`| ${read} | ${cells.join(" | ")} |`)
    }
    console.log(
      `\nexport of the developer's ${exported.rows.toLocaleString("en")} logs: ${
        (exported.bytes / 1e6).toFixed(0)
      } MB ` +
        `in ${exported.seconds.toFixed(1)} s; service RSS ${exported.before.rss.toFixed(0)} MB before, ` +
        `peak ${exported.before.peak.toFixed(0)} MB before and ${exported.after.peak.toFixed(0)} MB after; ` +
        `after a second export, peak ${again.after.peak.toFixed(0)} MB`
    )
    console.log(`load average at the end: ${loadavg().map((l) => l.toFixed(1)).join(", ")}`)
    console.log(
      `flush of 50 log rows (one transaction, median of 400): ${flush.off.toFixed(2)} ms without rollups, ` +
        `${flush.on.toFixed(2)} ms with (${(((flush.on - flush.off) / 50) * 1000).toFixed(0)} µs a row)`
    )
  } catch (error) {
    console.error(await tail(service))
    throw error
  } finally {
    await client.end().catch(() => undefined)
    await stopChild(service, 10_000)
    if (process.env.BENCH_KEEP !== "1") await admin.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`)
    else log(`kept database ${name}`)
    await admin.end()
    await rm(dataDir, { recursive: true, force: true })
  }
}

await main()
