import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, inject } from "vitest"
import { randomBase62 } from "../../src/Domain/Ids.js"
import { type ServiceProcess, type StartOptions, startService, stopService } from "./ServiceProcess.js"
import { WEBHOOK_SECRET } from "./Stripe.js"
import { withClient, withDatabase } from "./TestServer.js"
import { startUpstream, type UpstreamOptions, type UpstreamServer } from "./Upstream.js"

/**
 * What a test file of service processes (`startService`) shares: a database
 * of its own on the admin server, a DATA_DIR, a fake upstream, and the
 * processes it started, all made before its tests and taken down after them.
 */
export interface ProcessBed {
  /** The file's own database (empty with `database: false`). */
  readonly databaseUrl: string
  readonly dataDir: string
  readonly upstream: UpstreamServer
  /** Every process started through the bed, stopped after the file. */
  readonly services: Array<ServiceProcess>
  /** The database, its upstream and its DATA_DIR: what every start needs. */
  readonly core: () => Record<string, string>
  /** `core()` on 127.0.0.1, with the test webhook secret and rate limits no test reaches, then `overrides`. */
  readonly env: (overrides?: Record<string, string>) => Record<string, string>
  /** Starts a process (kept in `services`) as `options` say. */
  readonly launch: (options: StartOptions) => Promise<ServiceProcess>
  /** Starts a process with `env(overrides)` and waits until it is ready. */
  readonly start: (overrides?: Record<string, string>) => Promise<ServiceProcess>
  /** A statement on the admin server. */
  readonly admin: (text: string) => Promise<unknown>
  /** A query on the file's database: its rows. */
  readonly db: <A>(text: string, values?: Array<unknown>) => Promise<Array<A>>
}

export interface BedOptions {
  /** Names the database (`nenas_<name>_…`) and the DATA_DIR (`nenas-<name>-…`). */
  readonly name: string
  /** A database of its own (the default); false where each test brings its own. */
  readonly database?: boolean
  readonly upstream?: UpstreamOptions
  /** What stops the started processes after the file: SIGKILL by default. */
  readonly stopSignal?: NodeJS.Signals
  /** Runs at the end of the setup (an upstream behaviour, a directory's mode). */
  readonly setup?: (bed: ProcessBed) => Promise<void> | void
  /** Runs for each process before it is stopped (a frozen one resumed). */
  readonly beforeStop?: (service: ServiceProcess) => void
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

const admin = (text: string) => withClient(inject("adminDatabaseUrl"), (client) => client.query(text))

/** Registers the bed's `beforeAll` and `afterAll`; its fields are there once the setup has run. */
export const processBed = (options: BedOptions): ProcessBed => {
  const withDb = options.database ?? true
  let databaseName = ""
  let databaseUrl = ""
  let dataDir = ""
  let upstream: UpstreamServer | undefined
  const services: Array<ServiceProcess> = []

  const upstreamOf = () => {
    if (upstream === undefined) throw new Error("the process bed's upstream is not started yet")
    return upstream
  }
  const core = () => ({ DATABASE_URL: databaseUrl, DATA_DIR: dataDir, UPSTREAM_BASE_URL: upstreamOf().baseUrl })
  const env = (overrides: Record<string, string> = {}) => ({
    ...core(),
    HOST: "127.0.0.1",
    STRIPE_WEBHOOK_SECRET: WEBHOOK_SECRET,
    RATE_LIMIT_CONCURRENT: "1000",
    RATE_LIMIT_RPM: "100000",
    ...overrides
  })
  const launch = async (start: StartOptions) => {
    const service = await startService(start)
    services.push(service)
    return service
  }
  const bed: ProcessBed = {
    get databaseUrl() {
      return databaseUrl
    },
    get dataDir() {
      return dataDir
    },
    get upstream() {
      return upstreamOf()
    },
    services,
    core,
    env,
    launch,
    start: (overrides) => launch({ env: env(overrides), until: "ready" }),
    admin,
    db: <A>(text: string, values: Array<unknown> = []) =>
      withClient(databaseUrl, async (client) => (await client.query(text, values)).rows as Array<A>)
  }

  beforeAll(async () => {
    if (withDb) {
      databaseName = `nenas_${options.name}_${randomBase62(10).toLowerCase()}`
      await admin(`CREATE DATABASE "${databaseName}"`)
      databaseUrl = withDatabase(inject("adminDatabaseUrl"), databaseName)
    }
    dataDir = await mkdtemp(join(tmpdir(), `nenas-${options.name}-`))
    upstream = await startUpstream(options.upstream)
    await options.setup?.(bed)
  }, 120_000)

  afterAll(async () => {
    for (const service of services) {
      options.beforeStop?.(service)
      await stopService(service, options.stopSignal ?? "SIGKILL")
    }
    await upstream?.close()
    if (withDb) await admin(`DROP DATABASE IF EXISTS "${databaseName}" WITH (FORCE)`)
    await rm(dataDir, { recursive: true, force: true })
  })

  return bed
}

/** A chat completion on `baseUrl` with `apiKey`: `request` as its JSON body, given up after `timeoutMs`. */
export const postChat = (baseUrl: string, apiKey: string, request: Record<string, unknown>, timeoutMs: number) =>
  fetch(`${baseUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
    body: JSON.stringify(request),
    signal: AbortSignal.timeout(timeoutMs)
  })
