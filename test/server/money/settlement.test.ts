import { describe, expect, layer } from "@effect/vitest"
import { Effect, Either, Exit, Layer, Option, Redacted, Scope } from "effect"
import { AppConfig } from "../../../src/AppConfig.js"
import { CurrentApiKey } from "../../../src/Auth/Api.js"
import { DatabaseLive } from "../../../src/Database/Database.js"
import { newId } from "../../../src/Domain/Ids.js"
import { DEFAULT_PRICES } from "../../../src/Domain/Prices.js"
import { ServicesLive } from "../../../src/Http/Server.js"
import { Idempotency } from "../../../src/Models/Admission/Idempotency.js"
import { ModelCalls } from "../../../src/Models/Call/ModelCalls.js"
import { chatEvents } from "../../../src/Models/OpenAi/Wire.js"
import { CurrentRequestId } from "../../../src/Request/Context.js"
import { ReservationLeases } from "../../../src/Wallet/Instances/Leases.js"
import { caller, modelCall, TestServerWithUpstream, violations, walletOf } from "../../support/Models.js"
import { isDone, parseSse } from "../../support/Sse.js"
import { query, TestServer } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"
import { walletInstance } from "../../support/Wallet.js"

const FREE = { inputPerMillion: 0, cachedInputPerMillion: 0, outputPerMillion: 0 }
const chat = (json: Record<string, unknown> = {}) => ({
  model: "svc/nenas-flash",
  messages: [{ role: "user", content: "Say hello." }],
  ...json
})

/** The idempotency store of another process on the test database; closing `scope` kills that process. */
const idempotencyInstance = (scope: Scope.Scope) =>
  Effect.gen(function*() {
    const { databaseUrl } = yield* TestServer
    const config = AppConfig.layerWith({
      databaseUrl: Option.some(Redacted.make(databaseUrl)),
      instanceId: newId("test")
    })
    const layer = Idempotency.layer.pipe(
      Layer.provideMerge(ReservationLeases.layer()),
      Layer.provideMerge(DatabaseLive),
      Layer.provide(config)
    )
    const context = yield* Layer.buildWithScope(layer, scope)
    return context.unsafeMap.get(Idempotency.key) as Idempotency["Type"]
  })

// The general model priced at nothing, as a local upstream would be.
// The server's own sweeper waits an hour: the orphan test counts what its sweep closes, and a background sweep between
// its inserts and that sweep would close them first.
layer(
  TestServerWithUpstream({
    prices: { ...DEFAULT_PRICES, models: { ...DEFAULT_PRICES.models, "gpt-4.1-mini": FREE } },
    reservationSweepIntervalMs: 3_600_000
  }),
  {
    excludeTestServices: true
  }
)("settlement edges", (it) => {
  it.scoped("max_total_cost_myr too large for micro-MYR answers 400 naming it, not 500", () =>
    Effect.gen(function*() {
      const live = yield* caller("settle-cap@example.com", { sen: 1000 })
      for (const cap of [1e10, 1e300]) {
        const reply = yield* modelCall(live.apiKey, "/v1/chat/completions", chat({ max_total_cost_myr: cap }))
        expect(reply.status, reply.text).toBe(400)
        expect(reply.body.error.code).toBe("invalid_request")
        expect(reply.body.error.param).toBe("max_total_cost_myr")
      }
      const ok = yield* modelCall(live.apiKey, "/v1/responses", {
        model: "svc/nenas-flash",
        input: "hi",
        max_total_cost_myr: 1_000_000
      })
      expect(ok.status, ok.text).toBe(200)
    }))

  it.scoped("a model priced 0 runs live calls without a reservation, logs them and charges nothing", () =>
    Effect.gen(function*() {
      const live = yield* caller("settle-free@example.com", { sen: 1000 })
      const before = yield* walletOf(live.accountId)
      const plain = yield* modelCall(live.apiKey, "/v1/chat/completions", chat())
      expect(plain.status, plain.text).toBe(200)
      const streamed = yield* modelCall(live.apiKey, "/v1/chat/completions", chat({ stream: true }))
      expect(streamed.status, streamed.text).toBe(200)
      expect(parseSse(streamed.text).some(isDone), streamed.text).toBe(true)
      const logs = yield* query<{ status: string; costMicroMyr: string; reservationId: string | null }>(
        `SELECT status, cost_micro_myr AS "costMicroMyr", reservation_id AS "reservationId" FROM request_logs WHERE account_id = $1`,
        [live.accountId]
      )
      expect(logs).toEqual([
        { status: "succeeded", costMicroMyr: "0", reservationId: null },
        { status: "succeeded", costMicroMyr: "0", reservationId: null }
      ])
      expect(yield* walletOf(live.accountId)).toEqual(before)
      expect(yield* violations(live.accountId)).toEqual([])
    }))

  it.scoped("a free call is still refused while the balance is negative", () =>
    Effect.gen(function*() {
      const live = yield* caller("settle-free-negative@example.com", { sen: 1000 })
      yield* query(
        `UPDATE wallets SET available_micro_myr = -5 WHERE account_id = $1`,
        [live.accountId]
      )
      const reply = yield* modelCall(live.apiKey, "/v1/chat/completions", chat())
      expect(reply.status, reply.text).toBe(402)
      expect(reply.body.error.code).toBe("insufficient_balance")
    }))

  describe("idempotency leases", () => {
    const claim = (store: Idempotency["Type"], apiKeyId: string, key: string, requestId: string) =>
      Effect.either(store.claim({ apiKeyId, key, endpoint: "/v1/chat/completions", body: { n: 1 }, requestId }))

    it.scoped("a running call is never taken over while its process lives, however long it runs", () =>
      Effect.gen(function*() {
        const store = yield* idempotencyInstance(yield* Effect.scope)
        const apiKeyId = newId("key")
        expect(Either.isRight(yield* claim(store, apiKeyId, "k", "req_first"))).toBe(true)
        // Older than the longest call (total timeout + 60 s), the old rule for "dead".
        yield* query(`UPDATE idempotency_records SET created_at = now() - interval '1 hour' WHERE api_key_id = $1`, [
          apiKeyId
        ])
        const second = yield* claim(store, apiKeyId, "k", "req_second")
        expect(Either.isLeft(second) && second.left._tag).toBe("IdempotencyConflict")
      }))

    it.scoped("a dead process's record is taken over at once, and its late answer does not overwrite the new one", () =>
      Effect.gen(function*() {
        const scope = yield* Scope.make()
        const dying = yield* idempotencyInstance(scope)
        const store = yield* idempotencyInstance(yield* Effect.scope)
        const apiKeyId = newId("key")
        expect(Either.isRight(yield* claim(dying, apiKeyId, "k", "req_first"))).toBe(true)
        yield* Scope.close(scope, Exit.void)
        expect(Either.isRight(yield* claim(store, apiKeyId, "k", "req_second"))).toBe(true)
        yield* store.complete(apiKeyId, "k", "req_second", 200, "second")
        // The first call's answer arrives late (its process was only slow): it must not replace the second's.
        yield* store.complete(apiKeyId, "k", "req_first", 200, "first")
        const rows = yield* query<{ requestId: string; responseBody: string }>(
          `SELECT request_id AS "requestId", response_body AS "responseBody" FROM idempotency_records WHERE api_key_id = $1`,
          [apiKeyId]
        )
        expect(rows).toEqual([{ requestId: "req_second", responseBody: "second" }])
        const replay = yield* claim(store, apiKeyId, "k", "req_third")
        expect(Either.isRight(replay) && replay.right).toEqual({
          _tag: "Replay",
          status: 200,
          body: "second",
          requestId: "req_second"
        })
      }))

    it.scoped("a record whose lease lapsed (nobody renews it) is taken over", () =>
      Effect.gen(function*() {
        const store = yield* idempotencyInstance(yield* Effect.scope)
        const apiKeyId = newId("key")
        yield* query(
          `INSERT INTO idempotency_records (api_key_id, idempotency_key, endpoint, request_hash, request_id, status, expires_at, lease_expires_at)
           VALUES ($1, 'k', '/v1/chat/completions', '\\x00', 'req_lost', 'running', now() + interval '1 day', now() - interval '1 second')`,
          [apiKeyId]
        )
        // Same key, different body: the record is taken over, so the body does not conflict.
        expect(Either.isRight(yield* claim(store, apiKeyId, "k", "req_new"))).toBe(true)
      }))
  })

  describe("the sweeper closes logs whose call is gone", () => {
    it.scoped("a pending log whose reservation was released, and one of a dead process without a reservation", () =>
      Effect.gen(function*() {
        const live = yield* caller("settle-orphans@example.com", { sen: 1000 })
        const inst = yield* walletInstance(yield* Effect.scope)
        const crashed = newId("ins")
        yield* query(
          `INSERT INTO instances (id, identity, heartbeat_at) VALUES ($1, $1, now() - interval '1 minute')`,
          [crashed]
        )
        const log = (requestId: string, reservationId: string | null, holder: string | null) =>
          query(
            `INSERT INTO request_logs (request_id, account_id, api_key_id, reservation_id, public_model, endpoint, status, holder)
             VALUES ($1, $2, $3, $4, 'svc/nenas-flash', '/v1/chat/completions', 'pending', $5)`,
            [requestId, live.accountId, live.keyId, reservationId, holder]
          )
        // Released by the old two-step settlement, which crashed before the log was marked failed.
        const released = newId("rsv")
        yield* query(
          `INSERT INTO reservations (id, account_id, api_key_id, request_id, amount_micro_myr, status, expires_at, settled_at)
           VALUES ($1, $2, $3, 'req_released', 1000, 'released', now(), now())`,
          [released, live.accountId, live.keyId]
        )
        yield* log("req_released", released, null)
        yield* log("req_dead_free", null, crashed)
        yield* log("req_alive_free", null, inst.leases.holder)
        expect(yield* inst.sweeper.sweep).toEqual({ released: 0, captured: 0, grantsReturned: 0, closedLogs: 2 })
        const rows = yield* query<{ requestId: string; status: string }>(
          `SELECT request_id AS "requestId", status FROM request_logs WHERE account_id = $1 ORDER BY request_id`,
          [live.accountId]
        )
        expect(rows).toEqual([
          { requestId: "req_alive_free", status: "pending" },
          { requestId: "req_dead_free", status: "failed" },
          { requestId: "req_released", status: "failed" }
        ])
      }))
  })
})

/** The service's own parts (as `npm start` composes them) on the test server's database, with a short stream handoff. */
const services = Effect.gen(function*() {
  const { databaseUrl } = yield* TestServer
  const upstream = yield* Upstream
  const config = AppConfig.layerWith({
    databaseUrl: Option.some(Redacted.make(databaseUrl)),
    upstreamBaseUrl: Option.some(upstream.baseUrl),
    instanceId: newId("test"),
    streamHandoffTimeoutMs: 300
  })
  const context = yield* Layer.build(ServicesLive.pipe(Layer.provide(config)))
  return context.unsafeMap.get(ModelCalls.key) as ModelCalls["Type"]
})

layer(TestServerWithUpstream(), { excludeTestServices: true })("streamed call handoff", (it) => {
  it.scoped("a stream dropped between calls.stream returning and its finalizer being attached is still settled", () =>
    Effect.gen(function*() {
      const live = yield* caller("settle-handoff@example.com", { sen: 1000 })
      const calls = yield* services
      const requestId = `req_${newId("handoff")}`
      const principal = {
        keyId: live.keyId,
        accountId: live.accountId,
        environment: "live" as const,
        monthlySpendLimitMicroMyr: null,
        memberId: null,
        memberMonthlySpendLimitMicroMyr: null,
        accountSuspended: false
      }
      // What the body's end releases (a rate-limit slot): released once, though the body was never read.
      let closed = 0
      // The request is interrupted right after the stream is handed over: the stream never runs.
      yield* calls.stream(
        {
          endpoint: "/v1/chat/completions",
          messages: [{ role: "user", content: "hello" }],
          upstream: [{ role: "user", content: "hello" }],
          capabilities: {},
          effort: "medium",
          maxOutputTokens: 100,
          maxTotalCostMyr: undefined,
          webSearch: undefined,
          stream: true,
          inputParam: "messages"
        },
        chatEvents({ requestId, createdAt: 0, dashboardUrl: "http://localhost/app" }),
        Effect.sync(() => closed++)
      ).pipe(Effect.provideService(CurrentApiKey, principal), Effect.locally(CurrentRequestId, requestId), Effect.orDie)
      const held = yield* query<{ status: string }>(`SELECT status FROM reservations WHERE request_id = $1`, [
        requestId
      ])
      expect(held).toEqual([{ status: "open" }])
      yield* Effect.sleep("1 second")
      const after = yield* query<{ status: string }>(`SELECT status FROM reservations WHERE request_id = $1`, [
        requestId
      ])
      expect(after[0]?.status).not.toBe("open")
      const logs = yield* query<{ status: string }>(`SELECT status FROM request_logs WHERE request_id = $1`, [
        requestId
      ])
      expect(logs[0]?.status).not.toBe("pending")
      expect((yield* walletOf(live.accountId)).reserved).toBe(0)
      expect(yield* violations(live.accountId)).toEqual([])
      expect(closed, "the body's end ran once").toBe(1)
    }))
})
