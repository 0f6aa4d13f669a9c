import { describe, expect, layer } from "@effect/vitest"
import { Duration, Effect, Fiber, Option } from "effect"
import { Redis } from "ioredis"
import { call, createKey, type Reply } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream, violations } from "../../support/Models.js"
import { parseSse } from "../../support/Sse.js"
import { query, TestServer } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * Per-key rate limits of model calls (docs/operations.md, "Configuration";
 * docs/api/errors.md, "Errors"): requests per minute and requests in flight, in
 * the memory store and in the Redis store, with the 429 body and the
 * `X-RateLimit-*` and `Retry-After` headers. Redis runs on this machine; keys
 * are per API key id, so tests and runs do not collide.
 */

const RESPONSES = "/v1/responses"
const CHAT = "/v1/chat/completions"
const MODEL = "svc/nenas-flash"
const REDIS_URL = "redis://127.0.0.1:6379"
const REDIS_PREFIX = "nenas:ratelimit:"

const responsesBody = (extra: Record<string, unknown> = {}) => ({ input: "Say hello", ...extra })
const chatBody = { model: MODEL, messages: [{ role: "user", content: "Say hello" }] }

/**
 * The 429 (docs/api/errors.md, "Errors"): rate_limit_exceeded, retryable, `retry_after_seconds` equal to
 * `Retry-After`.
 */
const expectRateLimited = (reply: Reply, name: string) => {
  expect(reply.status, `${name}: status (${reply.text.slice(0, 300)})`).toBe(429)
  expect(reply.body?.type, `${name}: body.type`).toBe("error")
  const error = reply.body.error
  expect(error.code, `${name}: code`).toBe("rate_limit_exceeded")
  expect(error.type, `${name}: type`).toBe("rate_limit_error")
  expect(error.retryable, `${name}: retryable`).toBe(true)
  expect(error.request_id, `${name}: request_id`).toBe(reply.headers.get("x-request-id"))
  expect(Number.isInteger(error.retry_after_seconds), `${name}: retry_after_seconds is an integer`).toBe(true)
  expect(error.retry_after_seconds, `${name}: retry_after_seconds`).toBeGreaterThanOrEqual(1)
  expect(reply.headers.get("retry-after"), `${name}: Retry-After`).toBe(String(error.retry_after_seconds))
  return error as { retry_after_seconds: number }
}

const expectOk = (reply: Reply, name: string) => {
  expect(reply.status, `${name}: status (${reply.text.slice(0, 300)})`).toBe(200)
  return reply
}

/** `x-ratelimit-reset-requests` as seconds: `"20s"` → 20. */
const resetSeconds = (reply: Reply) => {
  const header = reply.headers.get("x-ratelimit-reset-requests") ?? ""
  expect(header, "x-ratelimit-reset-requests").toMatch(/^\d+s$/)
  return Number(header.slice(0, -1))
}

/** Polls until `done` holds; fails after 10 s. */
const waitUntil = (what: string, done: () => boolean) =>
  Effect.gen(function*() {
    for (let i = 0; i < 1000 && !done(); i++) yield* Effect.sleep(Duration.millis(10))
    expect(done(), `waited for ${what}`).toBe(true)
  })

/** The Redis keys and values under the rate-limit prefix that mention `id`. */
const redisEntries = (id: string) =>
  Effect.acquireUseRelease(
    Effect.sync(() => new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 1 })),
    (redis) =>
      Effect.promise(async () => {
        await redis.connect()
        const keys = (await redis.keys(`${REDIS_PREFIX}*`)).filter((key) => key.includes(id)).sort()
        const values = keys.length === 0 ? [] : await redis.mget(...keys)
        return Object.fromEntries(keys.map((key, i) => [key, values[i] ?? null]))
      }),
    (redis) => Effect.promise(() => redis.quit().catch(() => "closed"))
  )

const logCountOf = (apiKeyId: string) =>
  Effect.map(
    query<{ n: string }>("SELECT count(*) AS n FROM request_logs WHERE api_key_id = $1", [apiKeyId]),
    (rows) => Number(rows[0]?.n)
  )

const STORES = [
  { name: "memory", overrides: {} },
  { name: "redis", overrides: { redisUrl: Option.some(REDIS_URL) } }
] as const

for (const store of STORES) {
  const redis = store.name === "redis"

  layer(
    TestServerWithUpstream({ rateLimitRpm: 3, rateLimitConcurrent: 2, ...store.overrides }),
    { excludeTestServices: true }
  )(`requests per minute (${store.name} store)`, (it) => {
    it.effect("the 4th call within a minute answers 429 with Retry-After; another key has its own budget; /v1/models draws on it too", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { apiKey, keyId, token } = yield* caller(`rpm-${store.name}@example.com`, { environment: "test" })
        const passed: Array<Reply> = []
        // Both endpoints draw on one budget per key.
        for (
          const [path, body] of [[RESPONSES, responsesBody()], [CHAT, chatBody], [RESPONSES, responsesBody()]] as const
        ) {
          passed.push(expectOk(yield* modelCall(apiKey, path, body), `call ${passed.length + 1}`))
        }
        expect(passed.map((r) => r.headers.get("x-ratelimit-limit-requests"))).toEqual(["3", "3", "3"])
        expect(passed.map((r) => r.headers.get("x-ratelimit-remaining-requests"))).toEqual(["2", "1", "0"])
        const resets = passed.map(resetSeconds)
        for (const [i, reset] of resets.entries()) {
          expect(reset, `reset ${i + 1}`).toBeGreaterThanOrEqual(1)
          expect(reset, `reset ${i + 1}`).toBeLessThanOrEqual(60)
          if (i > 0) {
            expect(reset, `reset ${i + 1} grows as the budget is used`).toBeGreaterThanOrEqual(resets[i - 1] ?? 0)
          }
        }

        for (
          const [name, path, body] of [
            ["responses", RESPONSES, responsesBody()],
            ["chat", CHAT, chatBody],
            ["a streamed call", RESPONSES, responsesBody({ stream: true })]
          ] as const
        ) {
          const refused = yield* modelCall(apiKey, path, body)
          const error = expectRateLimited(refused, `4th call: ${name}`)
          expect(error.retry_after_seconds, "within the minute").toBeLessThanOrEqual(60)
          expect(refused.headers.get("x-ratelimit-limit-requests")).toBe("3")
          expect(refused.headers.get("x-ratelimit-remaining-requests")).toBe("0")
          expect(refused.headers.get("x-ratelimit-reset-requests")).toBe(`${error.retry_after_seconds}s`)
        }
        expect(yield* logCountOf(keyId), "refused calls leave no log rows").toBe(3)

        // Like every /v1 call: it declares 429, and answers it past the key's budget.
        const models = yield* call("GET", "/v1/models", { token: apiKey })
        expect(expectRateLimited(models, "GET /v1/models past the budget").retry_after_seconds).toBeLessThanOrEqual(60)
        const otherModels = yield* call("GET", "/v1/models", {
          token: (yield* createKey(token, { name: "lister", environment: "test" })).full_key
        })
        expect(otherModels.status, "another key lists the models").toBe(200)
        expect(otherModels.body.data[0].id).toBe(MODEL)

        const other = yield* createKey(token, { name: "second key", environment: "test" })
        const fresh = expectOk(
          yield* modelCall(other.full_key, RESPONSES, responsesBody()),
          "another key of the account"
        )
        expect(fresh.headers.get("x-ratelimit-limit-requests")).toBe("3")
        expect(fresh.headers.get("x-ratelimit-remaining-requests")).toBe("2")
        expect(upstream.requests.length, "test keys never reach the upstream").toBe(0)

        const entries = yield* redisEntries(keyId)
        if (redis) {
          expect(Object.keys(entries), "the limits live in Redis under the key's id").toEqual(
            expect.arrayContaining([`${REDIS_PREFIX}rpm:${keyId}`])
          )
          expect(entries[`${REDIS_PREFIX}rpm:${keyId}`], "no requests left this minute").toBe("0")
          // The in-flight slots are a sorted set of request ids; with every slot given back Redis drops it.
          expect(Object.keys(entries), "every slot given back").not.toContain(`${REDIS_PREFIX}inflight:${keyId}`)
          const otherEntries = yield* redisEntries(other.key.id)
          expect(otherEntries[`${REDIS_PREFIX}rpm:${other.key.id}`], "the other key's own bucket").toBe("2")
        } else {
          expect(entries, "the memory store writes nothing to Redis").toEqual({})
        }
      }))

    it.effect("the budget comes back as the minute passes", () =>
      Effect.gen(function*() {
        const { clock } = yield* TestServer
        const { apiKey } = yield* caller(`rpm-refill-${store.name}@example.com`, { environment: "test" })
        for (let i = 0; i < 3; i++) expectOk(yield* modelCall(apiKey, RESPONSES, responsesBody()), `call ${i + 1}`)
        const error = expectRateLimited(yield* modelCall(apiKey, RESPONSES, responsesBody()), "4th call")
        clock.advance(Duration.seconds(error.retry_after_seconds))
        const again = expectOk(
          yield* modelCall(apiKey, RESPONSES, responsesBody()),
          `after ${error.retry_after_seconds} s`
        )
        expect(again.headers.get("x-ratelimit-remaining-requests")).toBe("0")
        expectRateLimited(yield* modelCall(apiKey, RESPONSES, responsesBody()), "then limited again")
      }))
  })

  layer(
    TestServerWithUpstream({
      rateLimitRpm: 1000,
      rateLimitConcurrent: 2,
      // The last test moves the clock by a minute; the sweeper must not release the calls in flight meanwhile.
      reservationSweepIntervalMs: 3_600_000,
      ...store.overrides
    }),
    { excludeTestServices: true }
  )(`calls in flight (${store.name} store)`, (it) => {
    describe("a limit of 2 calls in flight", () => {
      it.effect("a 3rd call while 2 run answers 429; the slots come back when the calls end, streamed or not", () =>
        Effect.gen(function*() {
          const upstream = yield* Upstream
          upstream.reset()
          upstream.setBehaviour({ kind: "ok", delayMs: 1500 })
          const { accountId, apiKey, keyId } = yield* caller(`inflight-${store.name}@example.com`, { sen: 1000 })
          const streamed = yield* Effect.fork(modelCall(apiKey, RESPONSES, responsesBody({ stream: true })))
          const plain = yield* Effect.fork(modelCall(apiKey, CHAT, chatBody))
          yield* waitUntil("two calls at the upstream", () => upstream.requests.length === 2)

          const refused = yield* modelCall(apiKey, RESPONSES, responsesBody())
          expectRateLimited(refused, "3rd call in flight")
          expect(refused.headers.get("x-ratelimit-limit-concurrent")).toBe("2")
          expect(refused.headers.get("x-ratelimit-remaining-concurrent")).toBe("0")
          expectRateLimited(yield* modelCall(apiKey, RESPONSES, responsesBody({ stream: true })), "3rd call, streamed")
          expect(upstream.requests.length, "refused calls never reach the upstream").toBe(2)

          const streamedReply = expectOk(yield* Fiber.join(streamed), "the streamed call")
          expect(parseSse(streamedReply.text).map((e) => e.event)).toContain("response.completed")
          const plainReply = expectOk(yield* Fiber.join(plain), "the plain call")
          expect(plainReply.body.object).toBe("chat.completion")
          expect(plainReply.headers.get("x-ratelimit-limit-concurrent")).toBe("2")
          expect(["0", "1"]).toContain(plainReply.headers.get("x-ratelimit-remaining-concurrent"))

          upstream.setBehaviour({ kind: "ok" })
          const after = expectOk(yield* modelCall(apiKey, RESPONSES, responsesBody()), "a call after both ended")
          expect(after.headers.get("x-ratelimit-remaining-concurrent"), "both slots were given back").toBe("1")
          expect(upstream.requests.length).toBe(3)

          const logs = yield* query<{ status: string }>("SELECT status FROM request_logs WHERE api_key_id = $1", [
            keyId
          ])
          expect(logs.map((row) => row.status), "refused calls leave no log rows").toEqual([
            "billed",
            "billed",
            "billed"
          ])
          expect(yield* violations(accountId)).toEqual([])
          if (redis) {
            const entries = yield* redisEntries(keyId)
            expect(Object.keys(entries), "every slot given back in Redis").not.toContain(
              `${REDIS_PREFIX}inflight:${keyId}`
            )
          }
        }))

      it.effect("slots that come back after a minute do not raise the limit once the calls end", () =>
        Effect.gen(function*() {
          const upstream = yield* Upstream
          const { clock } = yield* TestServer
          upstream.reset()
          upstream.setBehaviour({ kind: "ok", delayMs: 1500 })
          const { accountId, apiKey } = yield* caller(`inflight-minute-${store.name}@example.com`, { sen: 1000 })
          const first = yield* Effect.fork(Effect.all([
            modelCall(apiKey, RESPONSES, responsesBody()),
            modelCall(apiKey, RESPONSES, responsesBody())
          ], { concurrency: "unbounded" }))
          yield* waitUntil("two calls at the upstream", () => upstream.requests.length === 2)
          // A minute later the two calls still hold their slots (a slot lapses only after the longest call could run).
          clock.advance(Duration.seconds(61))
          const third = yield* modelCall(apiKey, RESPONSES, responsesBody())
          for (const reply of yield* Fiber.join(first)) expectOk(reply, "the first two calls")
          const before = upstream.requests.length

          // Every call has ended: the key is back to 2 in flight, no more.
          const next = yield* Effect.fork(Effect.all([
            modelCall(apiKey, RESPONSES, responsesBody()),
            modelCall(apiKey, RESPONSES, responsesBody())
          ], { concurrency: "unbounded" }))
          yield* waitUntil("two more calls at the upstream", () => upstream.requests.length === before + 2)
          const extra = yield* modelCall(apiKey, RESPONSES, responsesBody())
          for (const reply of yield* Fiber.join(next)) expectOk(reply, "two calls in flight")
          expect(
            extra.status,
            `a 3rd call in flight after the refill (the call made after the refill answered ${third.status}): ${
              extra.text.slice(0, 200)
            }`
          ).toBe(429)
          expect(yield* violations(accountId)).toEqual([])
        }))
    })
  })
}
