import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Context, Effect, Layer, Logger, LogLevel, Option, Redacted } from "effect"
import { AppConfig, type AppConfigShape } from "../../src/AppConfig.js"
import { freePort } from "../../src/Database/EmbeddedPostgres.js"
import { ServerLive } from "../../src/Http/Server.js"
import { Spending } from "../../src/Wallet/Spending.js"
import { webhookOverrides } from "./Stripe.js"
import { freshDatabase, makeShiftableClock } from "./TestServer.js"

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
