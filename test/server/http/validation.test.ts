import { describe, expect, layer, type Vitest } from "@effect/vitest"
import { Effect } from "effect"
import { call, createKey, devToken, type Reply } from "../../support/Http.js"
import { TestServer, TestServerLive } from "../../support/TestServer.js"

/**
 * Input validation across the contract: every schema failure, malformed body,
 * oversize body and unknown route answers the error body
 * (docs/api/errors.md, "Errors"), with `param` naming the offending field, and
 * never a 500.
 */

const ERROR_KEYS = ["message", "type", "code", "param", "request_id", "guidance", "action_url", "retryable"] as const

/** The error body every failure shares, whatever its code; `name` labels every assertion. */
const expectErrorShape = (reply: Reply, name: string) => {
  expect(reply.status, `${name}: never a 500 (${reply.text})`).toBeLessThan(500)
  expect(reply.body, `${name}: body is JSON (${reply.text})`).toBeTypeOf("object")
  expect(reply.body?.type, `${name}: body.type`).toBe("error")
  const error = reply.body?.error
  expect(error, `${name}: body.error`).toBeTypeOf("object")
  for (const key of ERROR_KEYS) expect(Object.keys(error ?? {}), `${name}: error.${key} present`).toContain(key)
  expect(error.message, `${name}: error.message`).toBeTypeOf("string")
  expect(error.message.length, `${name}: error.message non-empty`).toBeGreaterThan(0)
  expect(error.guidance, `${name}: error.guidance`).toBeTypeOf("string")
  expect(error.request_id, `${name}: error.request_id`).toBeTypeOf("string")
  expect(error.request_id.length, `${name}: error.request_id non-empty`).toBeGreaterThan(0)
  expect(reply.headers.get("x-request-id"), `${name}: x-request-id header equals error.request_id`).toBe(
    error.request_id
  )
}

/** A client error of the given status and code, in the full error shape. */
const expectClientError = (
  reply: Reply,
  name: string,
  expected: { readonly status: number; readonly code: string; readonly param?: string | null }
) => {
  expect(reply.status, `${name}: status (${reply.text})`).toBe(expected.status)
  expectErrorShape(reply, name)
  const error = reply.body.error
  expect(error.code, `${name}: error.code`).toBe(expected.code)
  expect(error.type, `${name}: error.type`).toBe("invalid_request_error")
  expect(error.retryable, `${name}: error.retryable`).toBe(false)
  expect(error.action_url, `${name}: error.action_url`).toBeNull()
  if (expected.param !== undefined) expect(error.param, `${name}: error.param`).toBe(expected.param)
}

/** 400 `invalid_request` naming `param`. */
const expectInvalid = (reply: Reply, name: string, param: string | null) =>
  expectClientError(reply, name, { status: 400, code: "invalid_request", param })

// One session and one API key for the whole file (an account holds at most 50 keys).
let session: string | undefined
const sessionToken = Effect.suspend(() =>
  session !== undefined
    ? Effect.succeed(session)
    : Effect.tap(devToken("validation@example.com"), (token) => {
      session = token
    })
)

let apiKey: string | undefined
const apiKeyToken = Effect.suspend(() =>
  apiKey !== undefined
    ? Effect.succeed(apiKey)
    : Effect.gen(function*() {
      const { full_key } = yield* createKey(yield* sessionToken, { name: "validation" })
      apiKey = full_key
      return full_key
    })
)

type It = Vitest.MethodsNonLive<TestServer, true>

type Auth = "session" | "key" | "none"

const tokenFor = (auth: Auth) =>
  auth === "session" ? sessionToken : auth === "key" ? apiKeyToken : Effect.succeed(undefined)

interface Case {
  readonly name: string
  readonly param: string | null
  /** A JSON value sent as the body (`Http.call`'s `json`). */
  readonly json?: unknown
  /** A raw body, sent as `application/json`. */
  readonly raw?: string
}

/** A table of 400 `invalid_request` cases against one endpoint, one test per case. */
const invalidCases = (
  it: It,
  method: string,
  path: string,
  auth: Auth,
  cases: ReadonlyArray<Case>
) => {
  for (const c of cases) {
    it.effect(`${method} ${path}: ${c.name} → 400 param ${c.param === null ? "null" : `'${c.param}'`}`, () =>
      Effect.gen(function*() {
        const token = yield* tokenFor(auth)
        const reply = yield* call(method, path, {
          token,
          ...(c.json !== undefined ? { json: c.json } : {}),
          ...(c.raw !== undefined ? { body: c.raw, headers: { "content-type": "application/json" } } : {})
        })
        expectInvalid(reply, `${method} ${path} ${c.name}`, c.param)
      }))
  }
}

/** 400 `invalid_request` cases on query parameters of a GET endpoint, one test per case. */
const invalidQueries = (
  it: It,
  path: string,
  cases: ReadonlyArray<{ readonly query: string; readonly param: string }>
) => {
  for (const c of cases) {
    it.effect(`GET ${path}?${c.query} → 400 param '${c.param}'`, () =>
      Effect.gen(function*() {
        const reply = yield* call("GET", `${path}?${c.query}`, { token: yield* sessionToken })
        expectInvalid(reply, `GET ${path}?${c.query}`, c.param)
      }))
  }
}

layer(TestServerLive(), { excludeTestServices: true })("validation", (it) => {
  describe("POST /dashboard/api-keys", () => {
    invalidCases(it, "POST", "/dashboard/api-keys", "session", [
      { name: "missing name", json: {}, param: "name" },
      { name: "empty name", json: { name: "" }, param: "name" },
      { name: "whitespace-only name", json: { name: "   " }, param: "name" },
      { name: "101-character name", json: { name: "n".repeat(101) }, param: "name" },
      { name: "environment staging", json: { name: "k", environment: "staging" }, param: "environment" },
      {
        name: "monthly_spend_limit_myr -1",
        json: { name: "k", monthly_spend_limit_myr: -1 },
        param: "monthly_spend_limit_myr"
      },
      {
        name: "monthly_spend_limit_myr as a string",
        json: { name: "k", monthly_spend_limit_myr: "10" },
        param: "monthly_spend_limit_myr"
      },
      { name: "expires_at not a date-time", json: { name: "k", expires_at: "tomorrow" }, param: "expires_at" },
      { name: "expires_at in the past", json: { name: "k", expires_at: "2000-01-01T00:00:00Z" }, param: "expires_at" },
      { name: "body an array", json: [], param: null },
      { name: "body a string", json: "x", param: null },
      { name: "malformed JSON", raw: "{\"name\":", param: null }
    ])

    it.effect("a 100-character name is accepted (the upper bound is inclusive)", () =>
      Effect.gen(function*() {
        const reply = yield* call("POST", "/dashboard/api-keys", {
          token: yield* sessionToken,
          json: { name: "n".repeat(100) }
        })
        expect(reply.status, reply.text).toBe(201)
        expect(reply.body.key.name).toHaveLength(100)
      }))

    it.effect("unknown extra fields are ignored: 201", () =>
      Effect.gen(function*() {
        const reply = yield* call("POST", "/dashboard/api-keys", {
          token: yield* sessionToken,
          json: { name: "extra fields", colour: "blue", nested: { a: 1 } }
        })
        expect(reply.status, reply.text).toBe(201)
        expect(reply.body.key.name).toBe("extra fields")
        expect(reply.body.key).not.toHaveProperty("colour")
      }))

    it.effect("an expires_at in the future is accepted: 201", () =>
      Effect.gen(function*() {
        const { clock } = yield* TestServer
        const expiresAt = new Date(clock.unsafeCurrentTimeMillis() + 24 * 60 * 60 * 1000).toISOString()
        const reply = yield* call("POST", "/dashboard/api-keys", {
          token: yield* sessionToken,
          json: { name: "future", expires_at: expiresAt }
        })
        expect(reply.status, reply.text).toBe(201)
        expect(reply.body.key.expires_at).toBe(expiresAt)
      }))

    it.effect("DELETE /dashboard/api-keys/does-not-exist → 404 not_found", () =>
      Effect.gen(function*() {
        const reply = yield* call("DELETE", "/dashboard/api-keys/does-not-exist", { token: yield* sessionToken })
        expectClientError(reply, "DELETE unknown key", { status: 404, code: "not_found" })
      }))
  })

  describe("POST /dev/session", () => {
    invalidCases(it, "POST", "/dev/session", "none", [
      { name: "missing email", json: {}, param: "email" },
      { name: "invalid email", json: { email: "not-an-email" }, param: "email" }
    ])
  })

  describe("POST /v1/responses", () => {
    invalidCases(it, "POST", "/v1/responses", "key", [
      { name: "input missing", json: {}, param: "input" },
      { name: "input a number", json: { input: 42 }, param: "input" },
      { name: "max_output_tokens 0", json: { input: "hi", max_output_tokens: 0 }, param: "max_output_tokens" },
      { name: "max_output_tokens 32001", json: { input: "hi", max_output_tokens: 32001 }, param: "max_output_tokens" },
      { name: "max_output_tokens 1.5", json: { input: "hi", max_output_tokens: 1.5 }, param: "max_output_tokens" },
      {
        name: "reasoning.effort extreme",
        json: { input: "hi", reasoning: { effort: "extreme" } },
        param: "reasoning.effort"
      },
      {
        name: "web_search.mode sometimes",
        json: { input: "hi", web_search: { mode: "sometimes" } },
        param: "web_search.mode"
      },
      {
        name: "web_search.search_depth slow",
        json: { input: "hi", web_search: { search_depth: "slow" } },
        param: "web_search.search_depth"
      },
      {
        name: "web_search.max_results 0",
        json: { input: "hi", web_search: { max_results: 0 } },
        param: "web_search.max_results"
      },
      {
        name: "web_search.max_results 26",
        json: { input: "hi", web_search: { max_results: 26 } },
        param: "web_search.max_results"
      },
      {
        name: "web_search.max_searches 0",
        json: { input: "hi", web_search: { max_searches: 0 } },
        param: "web_search.max_searches"
      },
      {
        name: "web_search.max_searches 6",
        json: { input: "hi", web_search: { max_searches: 6 } },
        param: "web_search.max_searches"
      },
      {
        name: "web_search.content.max_pages 0",
        json: { input: "hi", web_search: { content: { max_pages: 0 } } },
        param: "web_search.content.max_pages"
      },
      {
        name: "web_search.content.max_pages 11",
        json: { input: "hi", web_search: { content: { max_pages: 11 } } },
        param: "web_search.content.max_pages"
      },
      { name: "max_total_cost_myr 0", json: { input: "hi", max_total_cost_myr: 0 }, param: "max_total_cost_myr" },
      { name: "max_total_cost_myr -1", json: { input: "hi", max_total_cost_myr: -1 }, param: "max_total_cost_myr" },
      { name: "stream \"yes\"", json: { input: "hi", stream: "yes" }, param: "stream" },
      { name: "malformed JSON", raw: "{\"input\":", param: null }
    ])

    it.effect("a valid body passes validation and reaches the wallet (402 on an empty one)", () =>
      Effect.gen(function*() {
        const token = yield* apiKeyToken
        const bodies: ReadonlyArray<readonly [string, unknown]> = [
          ["minimal", { input: "hi" }],
          ["every field at its bounds", {
            input: [{ role: "user", content: "hi" }],
            instructions: null,
            reasoning: { effort: "high" },
            web_search: {
              mode: "on",
              search_depth: "deep",
              max_results: 25,
              max_searches: 5,
              content: { enabled: true, max_pages: 10 }
            },
            max_output_tokens: 32000,
            max_total_cost_myr: 100,
            stream: false
          }],
          ["lower bounds", {
            input: "hi",
            web_search: { max_results: 1, max_searches: 1, content: { max_pages: 1 } },
            max_output_tokens: 1
          }]
        ]
        for (const [name, json] of bodies) {
          const reply = yield* call("POST", "/v1/responses", { token, json })
          expect(reply.status, `valid responses body (${name}): ${reply.text}`).toBe(402)
          expectErrorShape(reply, name)
          expect(reply.body.error.code).toBe("insufficient_balance")
        }
      }))

    it.effect("a 9 MiB body → 413 context_length_exceeded", () =>
      Effect.gen(function*() {
        const reply = yield* call("POST", "/v1/responses", {
          token: yield* apiKeyToken,
          json: { input: "x".repeat(9 * 1024 * 1024) }
        })
        expectClientError(reply, "9 MiB body", { status: 413, code: "context_length_exceeded" })
      }))

    it.effect("a 9 MiB chunked body (no Content-Length) → 413 context_length_exceeded", () =>
      Effect.gen(function*() {
        const { baseUrl } = yield* TestServer
        const token = yield* apiKeyToken
        const reply = yield* Effect.promise(async (): Promise<Reply> => {
          const encoder = new TextEncoder()
          const megabyte = encoder.encode("x".repeat(1024 * 1024))
          const parts = [
            encoder.encode("{\"input\":\""),
            ...Array.from({ length: 9 }, () => megabyte),
            encoder.encode("\"}")
          ]
          // A stream body is sent with Transfer-Encoding: chunked.
          const stream = new ReadableStream<Uint8Array>({
            pull(controller) {
              const next = parts.shift()
              if (next === undefined) controller.close()
              else controller.enqueue(next)
            }
          })
          try {
            const response = await fetch(`${baseUrl}/v1/responses`, {
              method: "POST",
              headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
              body: stream,
              duplex: "half"
            } as RequestInit)
            const text = await response.text()
            let body: unknown = undefined
            try {
              body = JSON.parse(text)
            } catch {
              body = undefined
            }
            return { status: response.status, headers: response.headers, body, text }
          } catch (error) {
            const cause = error instanceof Error && error.cause instanceof Error ? error.cause.message : String(error)
            return { status: 0, headers: new Headers(), body: undefined, text: `no response: ${cause}` }
          }
        })
        expectClientError(reply, "9 MiB chunked body", { status: 413, code: "context_length_exceeded" })
      }))
  })

  describe("POST /v1/chat/completions", () => {
    const message = { role: "user", content: "hi" }
    const valid = { model: "svc/nenas-flash", messages: [message] }
    invalidCases(it, "POST", "/v1/chat/completions", "key", [
      { name: "model missing", json: { messages: [message] }, param: "model" },
      { name: "model gpt-4o", json: { ...valid, model: "gpt-4o" }, param: "model" },
      { name: "messages missing", json: { model: "svc/nenas-flash" }, param: "messages" },
      { name: "messages empty", json: { ...valid, messages: [] }, param: "messages" },
      { name: "message without role", json: { ...valid, messages: [{ content: "hi" }] }, param: "messages[0].role" },
      {
        name: "role wizard",
        json: { ...valid, messages: [{ role: "wizard", content: "hi" }] },
        param: "messages[0].role"
      },
      {
        name: "second message with a bad role",
        json: { ...valid, messages: [message, { role: "wizard", content: "hi" }] },
        param: "messages[1].role"
      },
      { name: "temperature -0.1", json: { ...valid, temperature: -0.1 }, param: "temperature" },
      { name: "temperature 2.1", json: { ...valid, temperature: 2.1 }, param: "temperature" },
      { name: "max_tokens 0", json: { ...valid, max_tokens: 0 }, param: "max_tokens" },
      { name: "max_tokens 32001", json: { ...valid, max_tokens: 32001 }, param: "max_tokens" },
      {
        name: "max_completion_tokens 40000",
        json: { ...valid, max_completion_tokens: 40000 },
        param: "max_completion_tokens"
      },
      { name: "max_total_cost_myr 0", json: { ...valid, max_total_cost_myr: 0 }, param: "max_total_cost_myr" },
      { name: "n 2", json: { ...valid, n: 2 }, param: "n" },
      { name: "top_p 1.5", json: { ...valid, top_p: 1.5 }, param: "top_p" }
    ])

    it.effect("a valid body passes validation and reaches the wallet (402 on an empty one)", () =>
      Effect.gen(function*() {
        const token = yield* apiKeyToken
        const bodies: ReadonlyArray<readonly [string, unknown]> = [
          ["minimal", valid],
          ["bounds", {
            ...valid,
            temperature: 2,
            top_p: 0,
            max_tokens: 32000,
            max_completion_tokens: 1,
            max_total_cost_myr: 0.5,
            n: 1,
            stop: ["a", "b"],
            reasoning_effort: "low"
          }]
        ]
        for (const [name, json] of bodies) {
          const reply = yield* call("POST", "/v1/chat/completions", { token, json })
          expect(reply.status, `valid chat body (${name}): ${reply.text}`).toBe(402)
          expectErrorShape(reply, name)
          expect(reply.body.error.code).toBe("insufficient_balance")
        }
      }))
  })

  describe("billing and usage", () => {
    invalidCases(it, "POST", "/dashboard/billing/checkout", "session", [
      { name: "amount_sen 999", json: { amount_sen: 999 }, param: "amount_sen" },
      { name: "amount_sen -1000", json: { amount_sen: -1000 }, param: "amount_sen" },
      { name: "amount_sen as a string", json: { amount_sen: "1000" }, param: "amount_sen" },
      { name: "amount_sen missing", json: {}, param: "amount_sen" }
    ])

    invalidQueries(it, "/dashboard/billing/transactions", [
      { query: "limit=0", param: "limit" },
      { query: "limit=201", param: "limit" },
      { query: "page=0", param: "page" },
      { query: "page=abc", param: "page" },
      { query: "type=bonus", param: "type" }
    ])

    invalidQueries(it, "/dashboard/logs", [
      { query: "limit=201", param: "limit" },
      { query: "status=done", param: "status" },
      { query: "from=yesterday", param: "from" }
    ])

    invalidQueries(it, "/dashboard/usage", [
      { query: "granularity=week", param: "granularity" }
    ])
  })

  describe("transport", () => {
    it.effect("unknown route GET /v1/nothing → 404 not_found", () =>
      Effect.gen(function*() {
        const reply = yield* call("GET", "/v1/nothing")
        expectClientError(reply, "GET /v1/nothing", { status: 404, code: "not_found" })
      }))

    it.effect("wrong method POST /v1/models → 404 or 405, in the error shape", () =>
      Effect.gen(function*() {
        const reply = yield* call("POST", "/v1/models", { token: yield* apiKeyToken, json: {} })
        expect([404, 405], `POST /v1/models: status (${reply.text})`).toContain(reply.status)
        expectErrorShape(reply, "POST /v1/models")
        expect(reply.body.error.retryable, "POST /v1/models: error.retryable").toBe(false)
        if (reply.status === 404) expect(reply.body.error.code, "POST /v1/models: error.code").toBe("not_found")
      }))
  })
})
