import { expect, layer } from "@effect/vitest"
import { Effect, Option } from "effect"
import { request } from "node:http"
import { expectClientError } from "../../support/ErrorBody.js"
import { call, type Reply } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream } from "../../support/Models.js"
import { TestServer } from "../../support/TestServer.js"

/**
 * Bounded work before admission (docs/security.md, "Security"): a key's per-minute token and concurrency slot are taken as
 * soon as the key is known, before its body is read, parsed or decoded, once a request; a lowered limit holds
 * from the next request on; and `x-api-key` authenticates whatever other scheme `Authorization` carries.
 */

const CHAT = "/v1/chat/completions"
const chatBody = { model: "svc/nenas-flash", messages: [{ role: "user", content: "Say hello" }] }
const MALFORMED = "{\"model\": \"svc/nenas-flash\", \"messages\": [nope"

const patchKey = (token: string, keyId: string, json: Record<string, unknown>) =>
  Effect.map(call("PATCH", `/dashboard/api-keys/${keyId}`, { token, json }), (reply) => {
    expect(reply.status, `PATCH ${JSON.stringify(json)} (${reply.text.slice(0, 200)})`).toBe(200)
    return reply
  })

const expectLimited = (reply: Reply, name: string) => {
  expectClientError(reply, { status: 429, code: "rate_limit_exceeded" }, name)
  expect(reply.headers.get("retry-after"), `${name}: Retry-After`).toMatch(/^\d+$/)
}

/**
 * Sends the headers of a `declared`-byte body and only its first `sent` bytes, then waits: the status the server
 * answers with while the client is still sending, or "no answer" after `waitMs`.
 */
const answerBeforeBodyEnds = (apiKey: string, path: string, declared: number, sent: number, waitMs: number) =>
  Effect.flatMap(TestServer, ({ baseUrl }) =>
    Effect.promise(() =>
      new Promise<number | "no answer">((resolve) => {
        const { hostname, port } = new URL(baseUrl)
        const sending = request({
          host: hostname,
          port: Number(port),
          method: "POST",
          path,
          headers: {
            authorization: `Bearer ${apiKey}`,
            "content-type": "application/json",
            "content-length": String(declared)
          }
        }, (response) => {
          clearTimeout(deadline)
          response.resume()
          resolve(response.statusCode ?? 0)
          sending.destroy()
        })
        const deadline = setTimeout(() => {
          resolve("no answer")
          sending.destroy()
        }, waitMs)
        sending.on("error", () => {})
        sending.write(`{"model":"svc/nenas-flash","messages":[{"role":"user","content":"${"x".repeat(sent)}`)
      })
    ))

/** Both stores of the limits: this instance's memory, and the Redis on this machine. */
const STORES = [
  { name: "memory", overrides: {} },
  { name: "redis", overrides: { redisUrl: Option.some("redis://127.0.0.1:6379") } }
] as const

for (const store of STORES) {
  layer(TestServerWithUpstream({ rateLimitRpm: 600, rateLimitConcurrent: 10, ...store.overrides }), {
    excludeTestServices: true
  })(`admission before the body (${store.name} store)`, (it) => {
    it.effect("past its per-minute limit a key is refused before its body is parsed, on the lane and the router alike", () =>
      Effect.gen(function*() {
        const { apiKey, keyId, token } = yield* caller(`${store.name}-admission-rpm@example.com`, {
          environment: "test"
        })
        yield* patchKey(token, keyId, { rate_limit_rpm: 1 })
        expect((yield* call("GET", "/v1/models", { token: apiKey })).status, "the minute's one request").toBe(200)
        // Malformed JSON would answer 400 were it parsed first: a 429 says the body was never read.
        for (const path of [CHAT, `${CHAT}?through=router`, "/v1/responses"]) {
          expectLimited(
            yield* call("POST", path, {
              token: apiKey,
              body: MALFORMED,
              headers: { "content-type": "application/json" }
            }),
            path
          )
        }
        const messages = yield* call("POST", "/v1/messages", {
          body: MALFORMED,
          headers: { "x-api-key": apiKey, "content-type": "application/json" }
        })
        expect(messages.status, `/v1/messages (${messages.text.slice(0, 200)})`).toBe(429)
        // A 7.5 MB body, of which the client has sent 64 KiB: answered while it is still sending.
        const answer = yield* answerBeforeBodyEnds(apiKey, CHAT, 7_500_000, 64 * 1024, 5_000)
        expect(answer, "answered before the body was all sent").toBe(429)
      }))

    it.effect("one token a request: a limit of 2 admits two calls, then refuses", () =>
      Effect.gen(function*() {
        const { apiKey, keyId, token } = yield* caller(`${store.name}-admission-once@example.com`, {
          environment: "test"
        })
        yield* patchKey(token, keyId, { rate_limit_rpm: 2 })
        const first = yield* modelCall(apiKey, CHAT, chatBody)
        expect(first.status, first.text.slice(0, 200)).toBe(200)
        expect(first.headers.get("x-ratelimit-remaining-requests")).toBe("1")
        const second = yield* modelCall(apiKey, "/v1/responses", { input: "Say hello", stream: true })
        expect(second.status, second.text.slice(0, 200)).toBe(200)
        expect(second.headers.get("x-ratelimit-remaining-requests")).toBe("0")
        expectLimited(yield* modelCall(apiKey, CHAT, chatBody), "the third")
      }))

    it.effect("a request refused after admission gives its concurrency slot back", () =>
      Effect.gen(function*() {
        const { apiKey, keyId, token } = yield* caller(`${store.name}-admission-slot@example.com`, {
          environment: "test"
        })
        yield* patchKey(token, keyId, { rate_limit_concurrent: 1 })
        for (const [i, path] of [CHAT, `${CHAT}?through=router`, CHAT, "/v1/responses"].entries()) {
          const reply = yield* call("POST", path, {
            token: apiKey,
            body: MALFORMED,
            headers: { "content-type": "application/json" }
          })
          expectClientError(reply, { status: 400, code: "invalid_request" }, `malformed #${i + 1} on ${path}`)
        }
        const ok = yield* modelCall(apiKey, CHAT, chatBody)
        expect(ok.status, ok.text.slice(0, 200)).toBe(200)
        expect(ok.headers.get("x-ratelimit-remaining-concurrent")).toBe("0")
        const listed = yield* call("GET", "/v1/models", { token: apiKey })
        expect(listed.status, "the call's slot came back").toBe(200)
      }))

    it.effect("a lowered per-minute limit holds from the next request, not after a minute", () =>
      Effect.gen(function*() {
        const { apiKey, keyId, token } = yield* caller(`${store.name}-admission-lowered@example.com`, {
          environment: "test"
        })
        for (let i = 0; i < 3; i++) expect((yield* modelCall(apiKey, CHAT, chatBody)).status).toBe(200)
        yield* patchKey(token, keyId, { rate_limit_rpm: 1 })
        const next = yield* modelCall(apiKey, CHAT, chatBody)
        expect(next.headers.get("x-ratelimit-limit-requests"), `the new limit (${next.status})`).toBe("1")
        expect(next.status === 200 || next.status === 429, `${next.status}`).toBe(true)
        // At most the new limit's one request this minute, whatever the old limit left.
        expectLimited(yield* modelCall(apiKey, CHAT, chatBody), "after the new limit's one")
        expectLimited(yield* call("GET", "/v1/models", { token: apiKey }), "a listing too")
      }))

    it.effect("x-api-key authenticates beside an Authorization of another scheme", () =>
      Effect.gen(function*() {
        const { apiKey } = yield* caller(`${store.name}-admission-basic@example.com`, { environment: "test" })
        const basic = { authorization: "Basic dXNlcjpwYXNzd29yZA==", "x-api-key": apiKey }
        const listed = yield* call("GET", "/v1/models", { headers: basic })
        expect(listed.status, listed.text.slice(0, 200)).toBe(200)
        const messages = yield* call("POST", "/v1/messages", {
          headers: Object.assign({ "anthropic-version": "2023-06-01" }, basic),
          json: { model: "svc/nenas-flash", max_tokens: 16, messages: [{ role: "user", content: "Say hello" }] }
        })
        expect(messages.status, messages.text.slice(0, 200)).toBe(200)
        // A Bearer key still wins over x-api-key, and a wrong Bearer key is still refused.
        const wrong = yield* call("GET", "/v1/models", {
          headers: { authorization: "Bearer nns_test_wrong", "x-api-key": apiKey }
        })
        expectClientError(wrong, { status: 401, code: "invalid_api_key" }, "a wrong Bearer key")
        const none = yield* call("GET", "/v1/models", { headers: { authorization: "Basic dXNlcjpwYXNzd29yZA==" } })
        expect(none.status, "no key at all").toBe(401)
      }))
  })
}
