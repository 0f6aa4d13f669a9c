import { expect, it, layer } from "@effect/vitest"
import { Context, Effect, Layer, Logger, LogLevel, Option, Redacted } from "effect"
import { mkdtemp, readFile, rm, stat } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AppConfig, type AppConfigShape } from "../../../src/AppConfig.js"
import { freePort } from "../../../src/Database/EmbeddedPostgres.js"
import { randomBase62 } from "../../../src/Domain/Ids.js"
import { makeServer } from "../../../src/Http/Server.js"
import { ProviderKeys } from "../../../src/ProviderKeys/ProviderKeys.js"
import { Spending } from "../../../src/Wallet/Spending.js"
import { call } from "../../support/Http.js"
import { makeProviderStandIn, ProviderStandIn, ProviderStandInLive } from "../../support/ProviderStandIn.js"
import { realSleep } from "../../support/RealTime.js"
import { freshDatabase, makeShiftableClock, query, TestServer, TestServerLive } from "../../support/TestServer.js"
import { developer } from "../../support/Wallet.js"

/**
 * Provider keys' secrets (docs/api/provider-keys.md, "Secrets", "Rotating the server secret"): a database dump holds
 * no API key, in clear or encoded; a rotation opens what the previous secret sealed and seals it again; a key under
 * a secret the server no longer holds is reported, not fatal.
 */

const MODELS = { general: "g", reasoning: "r" }

const addKey = (token: string, baseUrl: string, apiKey: string) =>
  Effect.map(
    call("POST", "/dashboard/provider-keys", {
      token,
      json: { name: "secret test", base_url: baseUrl, api_key: apiKey, models: MODELS, mode: "first" }
    }),
    (reply) => {
      expect(reply.status, reply.text).toBe(201)
      return reply.body.provider_key as { id: string }
    }
  )

/**
 * Every row of every table of the service's schema, as PostgreSQL prints it (bytea as hex): what a data dump holds.
 * Read through SQL rather than `pg_dump`, whose client must match the server's major version.
 */
const dumpEveryRow = Effect.gen(function*() {
  const tables = yield* query<{ name: string }>(
    "SELECT table_name AS name FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
  )
  const parts = yield* Effect.forEach(tables, ({ name }) =>
    query<{ rows: string }>(
      `SELECT '${name}' || E'\\n' || coalesce(string_agg(t::text, E'\\n'), '') AS rows FROM "${name}" t`
    ))
  return parts.map(([part]) => part?.rows ?? "").join("\n")
})

layer(Layer.merge(TestServerLive({ providerAllowedHosts: new Set(["127.0.0.1"]) }), ProviderStandInLive), {
  excludeTestServices: true
})("at rest", (it) => {
  it.effect("a dump of every row of every table holds no API key: neither in clear, nor in base64 or hex", () =>
    Effect.gen(function*() {
      const standIn = yield* ProviderStandIn
      const { token } = yield* developer("pk-dump@example.com")
      const apiKey = `sk-dump-${randomBase62(40)}`
      standIn.accept(apiKey)
      const { id } = yield* addKey(token, standIn.baseUrl, apiKey)
      const [row] = yield* query<{ bytes: number; secret_key_id: string; last4: string }>(
        "SELECT octet_length(secret) AS bytes, secret_key_id, last4 FROM provider_keys WHERE id = $1",
        [id]
      )
      // iv (12) + tag (16) + ciphertext, as long as the key.
      expect(row?.bytes).toBe(12 + 16 + apiKey.length)
      expect(row?.secret_key_id).toMatch(/^[0-9a-f]{16}$/)
      expect(row?.last4).toBe(apiKey.slice(-4))

      const dump = yield* dumpEveryRow
      expect(dump).toContain("provider_keys")
      expect(dump).toContain(id)
      const plain = Buffer.from(apiKey, "utf8")
      // Every alignment of the key inside a longer base64 text.
      const encodings = [
        apiKey,
        plain.toString("hex"),
        plain.toString("base64").replace(/=+$/, ""),
        plain.subarray(1).toString("base64").slice(2, -4),
        plain.subarray(2).toString("base64").slice(2, -4),
        plain.toString("base64url").replace(/=+$/, "")
      ]
      for (const encoded of encodings) expect(dump).not.toContain(encoded)
    }))
})

/** One life of the service on `database`, `dataDir` and `port`, with `secrets`: its context and its test server. */
const startWith = (
  database: { readonly url: string },
  dataDir: string,
  port: number,
  settings: Partial<AppConfigShape>
) =>
  Effect.gen(function*() {
    const baseUrl = `http://127.0.0.1:${port}`
    const clock = makeShiftableClock()
    const context = yield* Layer.build(
      makeServer().pipe(
        Layer.provide(AppConfig.layerWith({
          databaseUrl: Option.some(Redacted.make(database.url)),
          dataDir,
          host: "127.0.0.1",
          port,
          publicBaseUrl: baseUrl,
          dashboardUrl: `${baseUrl}/app`,
          instanceId: `pk-secrets:${port}`,
          providerAllowedHosts: new Set(["127.0.0.1"]),
          ipAuthFailuresPerMinute: 1_000_000,
          ipDevSessionsPerMinute: 1_000_000,
          ...settings
        })),
        Layer.provide(Layer.setClock(clock)),
        Layer.provide(Logger.minimumLogLevel(LogLevel.Error))
      )
    )
    const server = { baseUrl, databaseUrl: database.url, clock, settled: Context.get(context, Spending).settled }
    return { keys: Context.get(context, ProviderKeys), server }
  })

const secret = (name: string) => Option.some(Redacted.make(`${name}-${randomBase62(40)}`))

/** What GET /dashboard/provider-keys says of the key, once `done` holds (the load writes in the background). */
const listedUntil = (token: string, done: (key: { status: string; last_error: string | null }) => boolean) =>
  Effect.gen(function*() {
    for (let i = 0;; i++) {
      const reply = yield* call("GET", "/dashboard/provider-keys", { token })
      expect(reply.status, reply.text).toBe(200)
      const [key] = reply.body.provider_keys as Array<{ status: string; last_error: string | null }>
      if (key === undefined) return yield* Effect.dieMessage("the key is gone")
      if (done(key) || i === 100) return key
      yield* realSleep(20)
    }
  })

/**
 * Lives of the service one after the other on one database, DATA_DIR and port (so one development sign-in and
 * one account), with a stand-in provider that accepts `apiKey`.
 */
const lives = Effect.gen(function*() {
  const database = yield* freshDatabase
  const dataDir = yield* Effect.acquireRelease(
    Effect.promise(() => mkdtemp(join(tmpdir(), "nenas-pk-secrets-"))),
    (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
  )
  const port = yield* Effect.promise(freePort)
  const standIn = yield* makeProviderStandIn
  const apiKey = `sk-rotate-${randomBase62(40)}`
  standIn.accept(apiKey)
  const life = <X, E, R>(
    settings: Partial<AppConfigShape>,
    run: (keys: ProviderKeys["Type"]) => Effect.Effect<X, E, R>
  ) =>
    Effect.scoped(Effect.flatMap(
      startWith(database, dataDir, port, settings),
      ({ keys, server }) => Effect.provideService(run(keys), TestServer, server)
    ))
  const sealedUnder = Effect.map(
    query<{ secret_key_id: string }>("SELECT secret_key_id FROM provider_keys"),
    (rows) => rows.map((row) => row.secret_key_id)
  )
  return { apiKey, dataDir, life, sealedUnder, standIn }
})

const opened = (keys: ProviderKeys["Type"], accountId: string) =>
  keys.forAccount(accountId).map((key) => Redacted.value(key.apiKey))

it.live(
  "without PROVIDER_KEYS_SECRET, a secret made once in DATA_DIR (mode 0600) seals keys across restarts",
  () =>
    Effect.scoped(Effect.gen(function*() {
      const { apiKey, dataDir, life, sealedUnder, standIn } = yield* lives
      const email = "pk-datadir@example.com"
      const { accountId, first } = yield* life({}, () =>
        Effect.gen(function*() {
          const { accountId, token } = yield* developer(email)
          yield* addKey(token, standIn.baseUrl, apiKey)
          return { accountId, first: yield* sealedUnder }
        }))
      const file = join(dataDir, "provider-keys-secret")
      expect((yield* Effect.promise(() => stat(file))).mode & 0o777).toBe(0o600)
      const made = yield* Effect.promise(() => readFile(file, "utf8"))
      yield* life({}, (keys) =>
        Effect.gen(function*() {
          expect(opened(keys, accountId)).toEqual([apiKey])
          expect(yield* sealedUnder).toEqual(first)
        }))
      expect(yield* Effect.promise(() => readFile(file, "utf8"))).toBe(made)
    })),
  120_000
)

it.live(
  "a rotation opens and seals again what the previous secret sealed; a key under a lost secret is reported",
  () =>
    Effect.scoped(Effect.gen(function*() {
      const { apiKey, life, sealedUnder, standIn } = yield* lives
      const [a, b] = [secret("A"), secret("B")]
      const email = "pk-rotation@example.com"

      // Saved under A.
      const { accountId, keyId, underA } = yield* life({ providerKeysSecret: a }, () =>
        Effect.gen(function*() {
          const { accountId, token } = yield* developer(email)
          const { id } = yield* addKey(token, standIn.baseUrl, apiKey)
          return { accountId, keyId: id, underA: yield* sealedUnder }
        }))
      expect(underA).toHaveLength(1)

      // Only B: the service starts; the key is not used, and says the server secret changed.
      yield* life({ providerKeysSecret: b }, (keys) =>
        Effect.gen(function*() {
          expect(keys.forAccount(accountId)).toEqual([])
          const { token } = yield* developer(email)
          const key = yield* listedUntil(token, (key) => key.status === "failing")
          expect(key.status).toBe("failing")
          expect(key.last_error).toContain("server secret changed")
          expect(yield* sealedUnder).toEqual(underA)
        }))

      // B, and A as the previous secret: sealed again under B at start, and it opens.
      const underB = yield* life({ providerKeysSecret: b, providerKeysSecretPrevious: a }, (keys) =>
        Effect.gen(function*() {
          const now = yield* sealedUnder
          expect(now).toHaveLength(1)
          expect(now[0]).not.toBe(underA[0])
          expect(
            keys.forAccount(accountId).map((key) =>
              key.id
            )
          ).toEqual([keyId])
          expect(opened(keys, accountId)).toEqual([apiKey])
          // What loading said of it before is cleared.
          const { token } = yield* developer(email)
          const key = yield* listedUntil(token, (key) => key.status !== "failing")
          expect(key).toMatchObject({ status: "unchecked", last_error: null })
          return now
        }))

      // B alone again: the key is B's now.
      yield* life({ providerKeysSecret: b }, (keys) =>
        Effect.gen(function*() {
          expect(yield* sealedUnder).toEqual(underB)
          expect(opened(keys, accountId)).toEqual([apiKey])
        }))
    })),
  120_000
)
