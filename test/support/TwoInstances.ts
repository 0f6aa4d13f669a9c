import { Context, Effect, Layer, Logger, LogLevel, Option, Redacted } from "effect"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AppConfig, type AppConfigShape } from "../../src/AppConfig.js"
import { freePort } from "../../src/Database/EmbeddedPostgres.js"
import { ServerLive } from "../../src/Http/Server.js"
import { KeyCache } from "../../src/Keys/KeyCache.js"
import { Spending } from "../../src/Wallet/Spending.js"
import type { Reply } from "./Http.js"
import { realSleep } from "./RealTime.js"
import { webhookOverrides } from "./Stripe.js"
import { freshDatabase, makeShiftableClock, TestServer } from "./TestServer.js"

/**
 * Two in-process instances of the service on one fresh database and one
 * DATA_DIR (one development identity key for both, as one identity provider
 * would sign for both), behind one public address (`a`), on one clock.
 * `name` names the DATA_DIR and the instance ids; `config` is added to each.
 */
export const twoInstances = (name: string, config: Partial<AppConfigShape> = {}) =>
  Effect.gen(function*() {
    const database = yield* freshDatabase
    const dataDir = yield* Effect.acquireRelease(
      Effect.promise(() => mkdtemp(join(tmpdir(), `nenas-${name}-`))),
      (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
    )
    const ports = [yield* Effect.promise(freePort), yield* Effect.promise(freePort)] as const
    const [a, b] = ports.map((port) => `http://127.0.0.1:${port}`) as [string, string]
    const clock = makeShiftableClock()
    const instance = (port: number) =>
      ServerLive.pipe(
        Layer.provide(AppConfig.layerWith({
          ...webhookOverrides,
          databaseUrl: Option.some(Redacted.make(database.url)),
          dataDir,
          host: "127.0.0.1",
          port,
          // Behind one load balancer both have one public address (the development sign-in's token issuer).
          publicBaseUrl: a,
          dashboardUrl: `${a}/app`,
          instanceId: `${name}:${port}`,
          // Both share their breakers (with REDIS_URL), apart from other tests' instances.
          breakerKeyPrefix: `nenas:test:breaker:${database.name}:`,
          ...config
        })),
        Layer.provide(Layer.setClock(clock)),
        Layer.provide(Logger.minimumLogLevel(LogLevel.Warning))
      )
    // One after the other: the second finds the migrations applied.
    const first = yield* Layer.build(instance(ports[0]))
    const second = yield* Layer.build(instance(ports[1]))
    // Reads through the support helpers see what both instances settled.
    const settled = Effect.zipRight(Context.get(first, Spending).settled, Context.get(second, Spending).settled)
    return { a, b, database, clock, first, second, settled }
  })

/** The two instances' addresses, and whether both instances' caches hear the database's announcements. */
export class Instances extends Context.Tag("test/TwoInstances")<Instances, {
  readonly a: string
  readonly b: string
  readonly listening: Effect.Effect<boolean>
}>() {}

/** Two instances as a test Layer: `Instances`, and `TestServer` pointing at the first. */
export const TwoInstancesLive = (name: string, config: Partial<AppConfigShape> = {}) =>
  Layer.scopedContext(Effect.gen(function*() {
    const { a, b, clock, database, first, second, settled } = yield* twoInstances(name, config)
    const listening = Effect.map(
      Effect.all([Context.get(first, KeyCache).listening, Context.get(second, KeyCache).listening]),
      (both) => both.every(Boolean)
    )
    return Context.make(Instances, { a, b, listening }).pipe(
      Context.add(TestServer, { baseUrl: a, databaseUrl: database.url, clock, settled })
    )
  }))

/** Both instances listen for key changes (within 10 s) before a test remembers anything. */
export const bothListening = Effect.gen(function*() {
  const since = Date.now()
  const { listening } = yield* Instances
  while (!(yield* listening)) {
    if (Date.now() - since > 10_000) return yield* Effect.dieMessage("the instances never listened")
    yield* realSleep(50)
  }
})

/** Runs `effect` against the instance at `baseUrl` (the support helpers call "the" test server). */
export const on = (baseUrl: string) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.flatMap(TestServer, (server) => Effect.provideService(effect, TestServer, { ...server, baseUrl }))

/** What a reply says, in one word: `200`, or its error code. */
export const outcome = (reply: Reply): string =>
  reply.status === 200 ? "200" : String(reply.body?.error?.code ?? reply.status)

/** A cheap model call for probing an instance. */
export const ASK = { model: "svc/nenas-flash", input: "Say hello in Malay.", max_output_tokens: 16 }

/**
 * The bound of spend limits and the key cache: a change made through one instance is applied by every
 * instance within a second.
 */
export const DEADLINE_MS = 1_000

/** Probes every 50 ms until `done` holds; the milliseconds from `since` to the probe that saw it, or a failure past the deadline. */
export const seenWithin = <A, E, R>(
  since: number,
  probe: Effect.Effect<A, E, R>,
  done: (answer: A) => boolean,
  deadline = DEADLINE_MS
) =>
  Effect.gen(function*() {
    while (true) {
      const startedAt = Date.now()
      const answer = yield* probe
      if (done(answer) && startedAt - since <= deadline) return startedAt - since
      if (startedAt - since > deadline) {
        return yield* Effect.dieMessage(
          `not seen within ${deadline} ms; last answer: ${JSON.stringify(answer).slice(0, 300)}`
        )
      }
      yield* realSleep(50)
    }
  })
