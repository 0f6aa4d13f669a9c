import { Effect, Exit, Redacted, Scope } from "effect"
import { chmod } from "node:fs/promises"
import { join } from "node:path"
import pg from "pg"
import { expect, inject, it } from "vitest"
import { startEmbeddedPostgres } from "../../src/Database/EmbeddedPostgres.js"
import { randomBase62 } from "../../src/Domain/Ids.js"
import { fundedDeveloper } from "../support/Fetch.js"
import { accountIds, invariantViolations, moneyState } from "../support/Money.js"
import { processBed, sleep } from "../support/ProcessBed.js"
import { stopService } from "../support/ServiceProcess.js"
import { SMOKE } from "../support/Smoke.js"
import { isDone, parseSse } from "../support/Sse.js"
import { withDatabase } from "../support/TestServer.js"

/**
 * Database outage: the service's connections are killed (`pg_terminate_backend`)
 * and, on an embedded PostgreSQL the test owns, the server is stopped and
 * started again, mid-load. Calls fail only with documented retryable errors,
 * none is half-applied, the service recovers by itself, and `/readyz`
 * reflects the outage.
 */
const WORKERS = SMOKE ? 4 : 12
const TERMINATIONS = SMOKE ? 3 : 10
const ACCOUNTS = 3
/** The retryable codes (docs/api/errors.md, "Errors") a call may answer while its database is away. */
const RETRYABLE = new Set(["internal_error", "provider_unavailable", "provider_timeout", "billing_error"])

const bed = processBed({
  name: "outage",
  database: false,
  upstream: { record: false },
  stopSignal: "SIGTERM",
  setup: async ({ dataDir, upstream }) => {
    // As root, the embedded PostgreSQL runs as the `postgres` user, which must reach its directory inside this one.
    await chmod(dataDir, 0o755)
    upstream.setBehaviour({ kind: "ok", delayMs: 100, chunkDelayMs: 20, text: "word ".repeat(24) })
  }
})

interface Outcome {
  readonly status: number | "cut"
  readonly code?: string
  readonly retryable?: boolean
  /** A stream that ended with an error event instead of its answer. */
  readonly streamFailed?: boolean
}

const callOnce = async (baseUrl: string, apiKey: string, stream: boolean): Promise<Outcome> => {
  try {
    const reply = await fetch(`${baseUrl}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
      body: JSON.stringify({
        model: "svc/nenas-flash",
        messages: [{ role: "user", content: "hello" }],
        max_tokens: 100,
        stream
      }),
      signal: AbortSignal.timeout(60_000)
    })
    const text = await reply.text()
    if (reply.status === 200) return { status: 200, streamFailed: stream && !parseSse(text).some(isDone) }
    const body = JSON.parse(text) as { error: { code: string; retryable: boolean } }
    return { status: reply.status, code: body.error.code, retryable: body.error.retryable }
  } catch {
    return { status: "cut" }
  }
}

const load = (baseUrl: string, keys: ReadonlyArray<string>, stop: { done: boolean }) =>
  Promise.all(Array.from({ length: WORKERS }, async (_, w) => {
    const outcomes: Array<Outcome> = []
    for (let i = 0; !stop.done; i++) {
      outcomes.push(await callOnce(baseUrl, keys[(w + i) % keys.length]!, (w + i) % 3 === 0))
    }
    return outcomes
  })).then((all) => all.flat())

const readyStatus = async (baseUrl: string) => {
  try {
    return (await fetch(`${baseUrl}/readyz`, { signal: AbortSignal.timeout(5_000) })).status
  } catch {
    return 0
  }
}

/** Waits (up to a minute) for the database to hold no open reservation and no pending log. */
const settled = async (databaseUrl: string) => {
  const started = Date.now()
  let state = await moneyState(databaseUrl)
  while ((state.openReservations > 0 || state.pendingLogs > 0) && Date.now() - started < 60_000) {
    await sleep(200)
    state = await moneyState(databaseUrl)
  }
  return { state, ms: Date.now() - started }
}

const expectWhole = async (databaseUrl: string, outcomes: ReadonlyArray<Outcome>) => {
  const wrong = outcomes.filter((o) =>
    o.status !== 200 && (o.status === "cut" || o.retryable !== true || !RETRYABLE.has(o.code ?? ""))
  )
  expect(wrong, "every refusal is a documented retryable error").toEqual([])
  const { ms, state } = await settled(databaseUrl)
  // The instance lives on: it may hold credit grants (the invariant below counts them).
  const { grants: _grants, ...money } = state
  expect(money).toEqual({
    openReservations: 0,
    pendingLogs: 0,
    negativeWallets: 0,
    billedTwice: 0,
    logLedgerMismatches: 0,
    captureMismatches: 0
  })
  expect(await invariantViolations(databaseUrl, await accountIds(databaseUrl))).toEqual([])
  return ms
}

const startFunded = async (databaseUrl: string) => {
  const service = await bed.start({ DATABASE_URL: databaseUrl })
  const keys: Array<string> = []
  for (let i = 0; i < ACCOUNTS; i++) {
    keys.push(
      (await fundedDeveloper(service.baseUrl, `outage-${i}-${randomBase62(6)}@example.com`, 10_000, "signed webhook"))
        .apiKey
    )
  }
  return { service, keys }
}

const summarize = (outcomes: ReadonlyArray<Outcome>) => {
  const codes: Record<string, number> = {}
  for (const o of outcomes) {
    const name = o.status === 200
      ? (o.streamFailed === true ? "200 (stream error event)" : "200")
      : `${o.status} ${o.code ?? ""}`
    codes[name] = (codes[name] ?? 0) + 1
  }
  return codes
}

it(`the service's connections killed ${TERMINATIONS} times mid-load`, async () => {
  const name = `nenas_outage_${randomBase62(10).toLowerCase()}`
  const admin = new pg.Client({ connectionString: inject("adminDatabaseUrl") })
  await admin.connect()
  try {
    await admin.query(`CREATE DATABASE "${name}"`)
    const databaseUrl = withDatabase(inject("adminDatabaseUrl"), name)
    const { keys, service } = await startFunded(databaseUrl)
    const stop = { done: false }
    const running = load(service.baseUrl, keys, stop)
    let killed = 0
    for (let i = 0; i < TERMINATIONS; i++) {
      await sleep(1_000)
      const rows = await admin.query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'nenas'",
        [name]
      )
      killed += rows.rowCount ?? 0
    }
    await sleep(500)
    stop.done = true
    const outcomes = await running
    const recoveryMs = await expectWhole(databaseUrl, outcomes)
    expect(await readyStatus(service.baseUrl)).toBe(200)
    expect((await callOnce(service.baseUrl, keys[0]!, false)).status).toBe(200)
    console.log(
      `db outage (terminate): ${
        JSON.stringify({
          requests: outcomes.length,
          terminations: TERMINATIONS,
          connectionsKilled: killed,
          settledMs: recoveryMs,
          outcomes: summarize(outcomes)
        })
      }`
    )
    await stopService(service)
  } finally {
    await admin.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`).catch(() => undefined)
    await admin.end()
  }
})

it("an embedded PostgreSQL stopped and started again mid-load: /readyz says so, and the service recovers by itself", async () => {
  const scope = Effect.runSync(Scope.make())
  try {
    const database = await Effect.runPromise(
      Scope.extend(startEmbeddedPostgres(join(bed.dataDir, "db"), "nenas"), scope)
    )
    const databaseUrl = Redacted.value(database.url)
    const { keys, service } = await startFunded(databaseUrl)
    const stop = { done: false }
    const running = load(service.baseUrl, keys, stop)
    await sleep(SMOKE ? 1_000 : 2_000)
    const downAt = Date.now()
    await database.server.stop()
    let notReady = 0
    while (notReady === 0 && Date.now() - downAt < 15_000) {
      const status = await readyStatus(service.baseUrl)
      if (status !== 200) notReady = status
      else await sleep(100)
    }
    await sleep(SMOKE ? 1_000 : 3_000)
    await database.server.start()
    const upAt = Date.now()
    while ((await readyStatus(service.baseUrl)) !== 200) {
      if (Date.now() - upAt > 60_000) throw new Error("/readyz did not recover within a minute")
      await sleep(100)
    }
    const readyAgainMs = Date.now() - upAt
    await sleep(SMOKE ? 1_000 : 2_000)
    stop.done = true
    const outcomes = await running
    expect(notReady, "/readyz answered 503 while the database was down").toBe(503)
    const settledMs = await expectWhole(databaseUrl, outcomes)
    expect((await callOnce(service.baseUrl, keys[0]!, false)).status).toBe(200)
    console.log(
      `db outage (restart): ${
        JSON.stringify({
          requests: outcomes.length,
          restarts: 1,
          readyAgainMs,
          settledMs,
          outcomes: summarize(outcomes)
        })
      }`
    )
    await stopService(service)
  } finally {
    await Effect.runPromise(Scope.close(scope, Exit.void))
  }
})
