import { Clock, Context, Duration, Effect, Layer, Logger, LogLevel, Option, Redacted } from "effect"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import pg from "pg"
import { inject } from "vitest"
import { AppConfig, type AppConfigShape } from "../../src/AppConfig.js"
import { freePort } from "../../src/Database/EmbeddedPostgres.js"
import { randomBase62 } from "../../src/Domain/Ids.js"
import { makeServer, type ServerOverrides } from "../../src/Http/Server.js"
import { Spending } from "../../src/Wallet/Spending.js"

/** Real time plus an offset a test can move forward: the server's `Clock`. */
export interface ShiftableClock extends Clock.Clock {
  readonly advance: (duration: Duration.DurationInput) => void
}

export const makeShiftableClock = (): ShiftableClock => {
  const live = Clock.make()
  let offset = 0
  const now = () => Date.now() + offset
  return {
    [Clock.ClockTypeId]: Clock.ClockTypeId,
    unsafeCurrentTimeMillis: now,
    currentTimeMillis: Effect.sync(now),
    unsafeCurrentTimeNanos: () => BigInt(now()) * 1_000_000n,
    currentTimeNanos: Effect.sync(() => BigInt(now()) * 1_000_000n),
    sleep: (duration) => live.sleep(duration),
    advance: (duration) => {
      offset += Duration.toMillis(duration)
    }
  }
}

export class TestServer extends Context.Tag("test/TestServer")<TestServer, {
  readonly baseUrl: string
  readonly databaseUrl: string
  readonly clock: ShiftableClock
  /** Writes the server's queued settlements, as its handlers do before they read. */
  readonly settled: Effect.Effect<void>
}>() {}

export const withDatabase = (url: string, database: string): string => {
  const parsed = new URL(url)
  parsed.pathname = `/${database}`
  return parsed.toString()
}

/** Runs `use` with a client of its own on `databaseUrl`, closed afterwards. */
export const withClient = async <A>(databaseUrl: string, use: (client: pg.Client) => Promise<A>): Promise<A> => {
  const client = new pg.Client({ connectionString: databaseUrl })
  await client.connect()
  try {
    return await use(client)
  } finally {
    await client.end()
  }
}

const adminQuery = (text: string) =>
  Effect.promise(() => withClient(inject("adminDatabaseUrl"), (client) => client.query(text)))

/** A database of its own for one test file, dropped when the file is done. */
export const freshDatabase = Effect.acquireRelease(
  Effect.gen(function*() {
    const name = `nenas_t_${randomBase62(12).toLowerCase()}`
    yield* adminQuery(`CREATE DATABASE "${name}"`)
    return { name, url: withDatabase(inject("adminDatabaseUrl"), name) }
  }),
  ({ name }) => adminQuery(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`)
)

const tempDir = Effect.acquireRelease(
  Effect.promise(() => mkdtemp(join(tmpdir(), "nenas-test-"))),
  (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
)

/**
 * The whole service, as `npm start` composes it, on a free loopback port with
 * its own database; `overrides` replace configuration values, and `parts`
 * replace services with test Layers (`makeServer`'s overrides).
 */
export const TestServerLive = (overrides: Partial<AppConfigShape> = {}, parts: ServerOverrides = {}) =>
  Layer.unwrapScoped(Effect.gen(function*() {
    const database = yield* freshDatabase
    const dataDir = yield* tempDir
    const port = yield* Effect.promise(freePort)
    const baseUrl = `http://127.0.0.1:${port}`
    const clock = makeShiftableClock()
    const config = AppConfig.layerWith({
      databaseUrl: Option.some(Redacted.make(database.url)),
      dataDir,
      host: "127.0.0.1",
      port,
      publicBaseUrl: baseUrl,
      dashboardUrl: `${baseUrl}/app`,
      instanceId: `test:${port}`,
      // With REDIS_URL, its breakers apart from other tests'.
      breakerKeyPrefix: `nenas:test:breaker:${database.name}:`,
      // Every test request comes from 127.0.0.1: per-address limits are tested where a test sets them.
      ipAuthFailuresPerMinute: 1_000_000,
      ipCheckoutsPerMinute: 1_000_000,
      ipDevSessionsPerMinute: 1_000_000,
      ...overrides
    })
    const server = makeServer(parts).pipe(
      Layer.provide(config),
      Layer.provide(Layer.setClock(clock)),
      // A line per request would bury a failing test's output; warnings and errors still show.
      Layer.provide(Logger.minimumLogLevel(LogLevel.Warning))
    )
    const testServer = Layer.effect(
      TestServer,
      Effect.map(Spending, (spending) => ({ baseUrl, databaseUrl: database.url, clock, settled: spending.settled }))
    )
    return Layer.provideMerge(testServer, server)
  }))

/**
 * Runs `use` with a client of its own on the test server's database, once the
 * server has written what it settled so far (it writes in batches).
 */
export const onDatabase = <A>(use: (client: pg.Client) => Promise<A>) =>
  Effect.flatMap(
    TestServer,
    ({ databaseUrl, settled }) => Effect.zipRight(settled, Effect.promise(() => withClient(databaseUrl, use)))
  )

/** The rows of one query on the test server's database. */
export const query = <A extends Record<string, unknown>>(text: string, values: Array<unknown> = []) =>
  onDatabase(async (client) => (await client.query<A>(text, values)).rows)
