import { SqlClient } from "@effect/sql"
import { describe, expect, layer } from "@effect/vitest"
import { Effect, Layer, Option, Redacted } from "effect"
import { AccountsRepo } from "../../../src/Accounts/Repo.js"
import { AppConfig } from "../../../src/AppConfig.js"
import { DatabaseLive } from "../../../src/Database/Database.js"
import { LISTEN_APPLICATION_NAME, Listener } from "../../../src/Database/Listener.js"
import { newId } from "../../../src/Domain/Ids.js"
import { hashKey } from "../../../src/Keys/ApiKeys.js"
import { KeyCache, KEYS_CHANNEL } from "../../../src/Keys/KeyCache.js"
import { type KeyLookup, KeysRepo } from "../../../src/Keys/Repo.js"
import { MembersRepo } from "../../../src/Members/Repo.js"
import { Metrics } from "../../../src/Observability/Metrics.js"
import { call, createKey, type Reply } from "../../support/Http.js"
import { modelCall } from "../../support/Models.js"
import { topUp } from "../../support/Stripe.js"
import { freshDatabase, onDatabase, query, TestServer } from "../../support/TestServer.js"
import {
  ASK,
  bothListening,
  DEADLINE_MS,
  Instances,
  on,
  outcome,
  seenWithin,
  TwoInstancesLive
} from "../../support/TwoInstances.js"
import { developer, WalletRepoLive } from "../../support/Wallet.js"

/** The database connections that LISTEN (one per listening instance, on every channel). */
const listeners = (sql: SqlClient.SqlClient) =>
  sql<{ pid: number }>`
    SELECT pid FROM pg_stat_activity
    WHERE datname = current_database() AND application_name = ${LISTEN_APPLICATION_NAME} AND pid <> pg_backend_pid()
  `

/** Runs `statements` in one session with triggers off: a change the database does not announce. */
const unannounced = (...statements: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    yield* sql.withTransaction(Effect.gen(function*() {
      yield* sql`SET LOCAL session_replication_role = replica`
      for (const statement of statements) yield* sql.unsafe(statement)
    }))
  })

describe("the API-key cache of one instance", () => {
  /** Lookups that reached SQL. */
  let sqlLookups = 0
  const CountingKeysRepo = Layer.effect(
    KeysRepo,
    Effect.map(KeysRepo, (repo) =>
      KeysRepo.of({
        ...repo,
        lookup: (hash) => Effect.zipRight(Effect.sync(() => sqlLookups++), repo.lookup(hash))
      }))
  )
  const Database = Layer.unwrapScoped(
    Effect.map(
      freshDatabase,
      ({ url }) =>
        DatabaseLive.pipe(Layer.provideMerge(AppConfig.layerWith({ databaseUrl: Option.some(Redacted.make(url)) })))
    )
  )
  const TIME_TO_LIVE_MS = 2_000
  const Parts = KeyCache.layer({ timeToLive: TIME_TO_LIVE_MS }).pipe(
    Layer.provide(CountingKeysRepo),
    Layer.provideMerge(Layer.merge(Listener.layer({ channels: [KEYS_CHANNEL] }), Metrics.Default)),
    Layer.provideMerge(
      Layer.mergeAll(KeysRepo.layer, AccountsRepo.layer).pipe(
        Layer.provide(Layer.merge(WalletRepoLive, MembersRepo.layer))
      )
    ),
    Layer.provideMerge(Database)
  )

  layer(Parts, { excludeTestServices: true, timeout: 60_000 })((it) => {
    const listening = Effect.gen(function*() {
      const cache = yield* KeyCache
      const since = Date.now()
      while (!(yield* cache.listening)) {
        if (Date.now() - since > 10_000) return yield* Effect.dieMessage("the cache never started listening")
        yield* Effect.sleep("20 millis")
      }
    })

    const newKey = Effect.gen(function*() {
      const account = yield* (yield* AccountsRepo).signIn({
        issuer: "test",
        subject: newId("sub"),
        email: null,
        name: null
      })
      const secret = newId("secret")
      const row = yield* (yield* KeysRepo).create({
        id: newId("key"),
        accountId: account.id,
        name: "cached",
        prefix: "nns_live_abc",
        environment: "live",
        keyHash: hashKey(secret),
        monthlySpendLimitMicroMyr: null,
        expiresAt: null
      })
      return { hash: hashKey(secret), row }
    })

    /** Looks `hash` up `times` times; returns the answers and how many reached SQL. */
    const lookups = (hash: Buffer, times: number) =>
      Effect.gen(function*() {
        const cache = yield* KeyCache
        const before = sqlLookups
        const answers: Array<KeyLookup> = []
        for (let i = 0; i < times; i++) answers.push(yield* cache.lookup(hash))
        return { answers, sql: sqlLookups - before }
      })

    /**
     * Looks `hash` up until an answer comes from memory: the key's own creation is announced too, and
     * drops what was remembered before it was heard. Fails when that takes longer than the deadline.
     */
    const remembered = (hash: Buffer) => seenWithin(Date.now(), lookups(hash, 1), ({ sql }) => sql === 0)

    it.effect("a remembered lookup costs no SQL; a last-use write drops nothing", () =>
      Effect.gen(function*() {
        yield* listening
        const { hash, row } = yield* newKey
        yield* remembered(hash)
        const first = yield* lookups(hash, 50)
        expect(first.sql).toBe(0)
        expect(first.answers.every((answer) => answer._tag === "Active" && answer.key.id === row.id)).toBe(true)
        // Recording a use announces nothing; announcements arrive in commit order, so once a later change to
        // another key is heard, an announcement of the use would have been heard too.
        yield* (yield* KeysRepo).recordLastUsed([{ id: row.id, at: new Date() }])
        const other = yield* newKey
        yield* remembered(other.hash)
        const sql = yield* SqlClient.SqlClient
        yield* sql`UPDATE api_keys SET name = 'renamed' WHERE id = ${other.row.id}`
        yield* seenWithin(Date.now(), lookups(other.hash, 1), ({ answers }) =>
          answers[0]?._tag === "Active" && answers[0].key.name === "renamed")
        expect((yield* lookups(hash, 5)).sql).toBe(0)
      }))

    it.effect("an unknown key is never remembered (each lookup asks SQL), a created one is seen, and a deleted one answers revoked", () =>
      Effect.gen(function*() {
        yield* listening
        const secret = newId("secret")
        // Remembering unknown keys would let a stream of made-up keys push real ones out of memory.
        expect(yield* lookups(hashKey(secret), 3)).toMatchObject({
          sql: 3,
          answers: [{ _tag: "Unknown" }, { _tag: "Unknown" }, { _tag: "Unknown" }]
        })
        const account = yield* (yield* AccountsRepo).signIn({
          issuer: "test",
          subject: newId("sub"),
          email: null,
          name: null
        })
        const keyId = newId("key")
        const keys = yield* KeysRepo
        yield* keys.create({
          id: keyId,
          accountId: account.id,
          name: "late",
          prefix: "nns_live_abc",
          environment: "live",
          keyHash: hashKey(secret),
          monthlySpendLimitMicroMyr: null,
          expiresAt: null
        })
        yield* seenWithin(Date.now(), lookups(hashKey(secret), 1), ({ answers }) => answers[0]?._tag === "Active")
        yield* keys.remove(account.id, keyId)
        yield* seenWithin(Date.now(), lookups(hashKey(secret), 1), ({ answers }) => answers[0]?._tag === "Revoked")
      }))

    it.effect("a dropped listening connection stops memory from answering, and memory resumes once it listens again", () =>
      Effect.gen(function*() {
        yield* listening
        const { hash, row } = yield* newKey
        yield* remembered(hash)
        const sql = yield* SqlClient.SqlClient
        const [listener] = yield* listeners(sql)
        expect(listener).toBeDefined()
        yield* sql`SELECT pg_terminate_backend(${listener?.pid ?? 0})`
        // Deleted while nobody listens: the announcement is lost, yet the key must not stay valid.
        const deletedAt = Date.now()
        yield* (yield* KeysRepo).remove(row.accountId, row.id)
        yield* seenWithin(deletedAt, lookups(hash, 1), ({ answers }) => answers[0]?._tag === "Revoked")
        // A new connection listens, and what is remembered from then on costs no SQL again.
        yield* listening
        const again = yield* newKey
        yield* remembered(again.hash)
        expect((yield* lookups(again.hash, 3)).sql).toBe(0)
        expect((yield* listeners(sql)).map(({ pid }) => pid)).not.toContain(listener?.pid)
      }))

    it.effect("an unannounced change is seen once the safety time-to-live passes", () =>
      Effect.gen(function*() {
        yield* listening
        const { hash, row } = yield* newKey
        const cache = yield* KeyCache
        yield* remembered(hash)
        yield* unannounced(`UPDATE api_keys SET name = 'quiet' WHERE id = '${row.id}'`)
        const changedAt = Date.now()
        // Served from memory: the database was not asked.
        const stale = yield* cache.lookup(hash)
        expect(stale._tag === "Active" && stale.key.name).toBe("cached")
        while (true) {
          const found = yield* cache.lookup(hash)
          if (found._tag === "Active" && found.key.name === "quiet") break
          if (Date.now() - changedAt > TIME_TO_LIVE_MS + 1_000) {
            return yield* Effect.dieMessage("still remembered after its time-to-live")
          }
          yield* Effect.sleep("50 millis")
        }
      }))
  })
})

/** Two instances of the whole service in this process, on one database: each with its own cache and listener. */
describe("API keys cached by two instances on one database", () => {
  layer(TwoInstancesLive("keycache"), { excludeTestServices: true, timeout: 120_000 })((it) => {
    /** `probe` answered by both instances until each gives `expected`; both within the deadline from `since`. */
    const bothSee = (since: number, probe: Effect.Effect<Reply, never, TestServer>, expected: string) =>
      Effect.flatMap(
        Instances,
        ({ a, b }) =>
          Effect.all([a, b].map((base) => seenWithin(since, on(base)(probe), (reply) => outcome(reply) === expected)), {
            concurrency: 2
          })
      )

    const warm = (probe: Effect.Effect<Reply, never, TestServer>) =>
      Effect.gen(function*() {
        const { a, b } = yield* Instances
        for (const base of [a, b, a, b]) expect(outcome(yield* on(base)(probe))).toBe("200")
      })

    it.effect("a key deleted through one instance is refused by the other within a second", () =>
      Effect.gen(function*() {
        yield* bothListening
        const { a, b } = yield* Instances
        const { token } = yield* on(a)(developer("cache-delete@example.com"))
        const created = yield* on(a)(createKey(token, { name: "doomed", environment: "test" }))
        const models = call("GET", "/v1/models", { token: created.full_key })
        yield* warm(models)
        const deletedAt = Date.now()
        const deleted = yield* on(a)(call("DELETE", `/dashboard/api-keys/${created.key.id}`, { token }))
        expect(deleted.status).toBe(200)
        // The instance that deleted it knows at once; the other within the deadline.
        expect(outcome(yield* on(a)(models))).toBe("revoked_api_key")
        const elapsed = yield* seenWithin(deletedAt, on(b)(models), (reply) => outcome(reply) === "revoked_api_key")
        expect(elapsed).toBeLessThanOrEqual(DEADLINE_MS)
      }))

    it.effect("an account suspended in the database (as a dispute does) is refused by both within a second, and lifted alike", () =>
      Effect.gen(function*() {
        yield* bothListening
        const { a } = yield* Instances
        const { accountId, token } = yield* on(a)(developer("cache-suspend@example.com"))
        const created = yield* on(a)(createKey(token, { name: "suspended", environment: "test" }))
        const respond = modelCall(created.full_key, "/v1/responses", ASK)
        yield* warm(respond)
        const suspendedAt = Date.now()
        yield* query("UPDATE accounts SET suspended_at = now() WHERE id = $1", [accountId])
        const refused = yield* bothSee(suspendedAt, respond, "permission_denied")
        expect(Math.max(...refused)).toBeLessThanOrEqual(DEADLINE_MS)
        const liftedAt = Date.now()
        yield* query("UPDATE accounts SET suspended_at = NULL WHERE id = $1", [accountId])
        const served = yield* bothSee(liftedAt, respond, "200")
        expect(Math.max(...served)).toBeLessThanOrEqual(DEADLINE_MS)
      }))

    it.effect("a key's monthly spend limit and expiry changed in the database are applied by both within a second", () =>
      Effect.gen(function*() {
        yield* bothListening
        const { a } = yield* Instances
        const { token } = yield* on(a)(developer("cache-limit@example.com"))
        yield* on(a)(topUp(token, 1000))
        const created = yield* on(a)(
          createKey(token, { name: "limited", environment: "live", monthly_spend_limit_myr: 100 })
        )
        const respond = modelCall(created.full_key, "/v1/responses", ASK)
        yield* warm(respond)
        const loweredAt = Date.now()
        yield* query("UPDATE api_keys SET monthly_spend_limit_micro_myr = 0 WHERE id = $1", [created.key.id])
        const limited = yield* bothSee(loweredAt, respond, "spend_limit_exceeded")
        expect(Math.max(...limited)).toBeLessThanOrEqual(DEADLINE_MS)
        const expiredAt = Date.now()
        yield* query("UPDATE api_keys SET expires_at = now() - interval '1 minute' WHERE id = $1", [created.key.id])
        const expired = yield* bothSee(
          expiredAt,
          call("GET", "/v1/models", { token: created.full_key }),
          "expired_api_key"
        )
        expect(Math.max(...expired)).toBeLessThanOrEqual(DEADLINE_MS)
      }))

    it.effect("a call authenticated from memory asks the database nothing: a change it does not announce goes unseen", () =>
      Effect.gen(function*() {
        yield* bothListening
        const { a, b } = yield* Instances
        const { token } = yield* on(a)(developer("cache-memory@example.com"))
        // A momentary silence (a stalled event loop) would send that instance's lookups to SQL: a few tries.
        const fromMemory: Array<boolean> = []
        for (let attempt = 0; attempt < 3 && !fromMemory.includes(true); attempt++) {
          const created = yield* on(a)(createKey(token, { name: `quiet ${attempt}`, environment: "test" }))
          const models = call("GET", "/v1/models", { token: created.full_key })
          // Its creation's own announcement has been heard once a lookup after it is remembered.
          yield* seenWithin(Date.now(), on(b)(models), (reply) => outcome(reply) === "200")
          yield* warm(models)
          yield* onDatabase(async (client) => {
            await client.query("BEGIN")
            await client.query("SET LOCAL session_replication_role = replica")
            await client.query("UPDATE api_keys SET expires_at = now() - interval '1 minute' WHERE id = $1", [
              created.key.id
            ])
            await client.query("COMMIT")
          })
          fromMemory.push(outcome(yield* on(b)(models)) === "200")
        }
        expect(fromMemory).toContain(true)
      }))
  })
})
