import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { expectClientError } from "../../support/ErrorBody.js"
import { call, createKey, devToken } from "../../support/Http.js"
import { query, TestServerLive } from "../../support/TestServer.js"

/**
 * Inputs an outside probe turned into 500s or hangs, each now a 4xx
 * in the error shape: JSON nested 10,000 deep, U+0000 in what reaches SQL,
 * multipart and other content types on JSON endpoints, lenient date-times.
 */

const deep = (depth: number) => `{"input":${"[".repeat(depth)}${"]".repeat(depth)}}`

const JSON_ENDPOINTS = [
  ["/v1/responses", "key"],
  ["/v1/chat/completions", "key"],
  ["/dashboard/api-keys", "session"],
  ["/dashboard/billing/checkout", "session"],
  ["/dev/session", "none"]
] as const

layer(TestServerLive(), { timeout: 120_000 })("bad input", (it) => {
  const setup = Effect.gen(function*() {
    const session = yield* devToken("bad-input@example.com")
    const { full_key } = yield* createKey(session, { name: "bad input", environment: "test" })
    const tokenFor = (who: "key" | "session" | "none") =>
      who === "key" ? full_key : who === "session" ? session : undefined
    return { session, key: full_key, tokenFor }
  })

  it.effect("JSON nested 10,000 deep → 400 on every JSON endpoint, the depth named", () =>
    Effect.gen(function*() {
      const { tokenFor } = yield* setup
      for (const [path, who] of JSON_ENDPOINTS) {
        const reply = yield* call("POST", path, {
          token: tokenFor(who),
          body: deep(10_000),
          headers: { "content-type": "application/json" }
        })
        expectClientError(reply, { status: 400, code: "invalid_request" }, path)
        expect(reply.body.error.message).toContain("deeper than 64")
      }
      // Ordinary nesting is untouched: 60 levels reach the schema, which names the field.
      const reply = yield* call("POST", "/v1/responses", {
        token: tokenFor("key"),
        body: deep(60),
        headers: { "content-type": "application/json" }
      })
      expectClientError(reply, { status: 400, code: "invalid_request", param: "input[0]" })
    }))

  it.effect("a huge wrong-typed value is not echoed in full", () =>
    Effect.gen(function*() {
      const { key } = yield* setup
      const reply = yield* call("POST", "/v1/responses", {
        token: key,
        json: { input: 1, model: "x".repeat(1_000_000) }
      })
      expect(reply.status).toBe(400)
      expect(reply.text.length).toBeLessThan(4_000)
    }))

  it.effect("U+0000 in a path, a query or a stored string → 400, never a PostgreSQL error", () =>
    Effect.gen(function*() {
      const { session } = yield* setup
      expectClientError(yield* call("DELETE", "/dashboard/api-keys/%00", { token: session }), {
        status: 400,
        code: "invalid_request"
      })
      for (const param of ["api_key_id", "endpoint"]) {
        expectClientError(yield* call("GET", `/dashboard/logs?${param}=a%00b`, { token: session }), {
          status: 400,
          code: "invalid_request",
          param
        })
      }
      expectClientError(yield* call("GET", "/dashboard/usage?api_key_id=%00", { token: session }), {
        status: 400,
        code: "invalid_request",
        param: "api_key_id"
      })
      expectClientError(yield* call("GET", "/dev/checkout/cs_%00/", {}), { status: 400, code: "invalid_request" })
      const named = yield* call("POST", "/dashboard/api-keys", { token: session, json: { name: "a\u0000b" } })
      expectClientError(named, { status: 400, code: "invalid_request", param: "name" })
      const email = yield* call("POST", "/dev/session", { json: { email: "a\u0000@example.com" } })
      expectClientError(email, { status: 400, code: "invalid_request", param: "email" })
      const keys = yield* query<{ n: number }>("SELECT count(*)::int AS n FROM api_keys WHERE name LIKE 'a%b'")
      expect(keys[0]?.n).toBe(0)
    }))

  it.effect("multipart without a boundary, with a 300-character one, and unterminated → 400 at once", () =>
    Effect.gen(function*() {
      const { tokenFor } = yield* setup
      const bodies = [
        ["multipart/form-data", "x"],
        [`multipart/form-data; boundary=${"b".repeat(300)}`, "x"],
        ["multipart/form-data; boundary=xyz", "--xyz\r\ngarbage"],
        ["multipart/mixed; boundary=xyz", "--xyz\r\ngarbage"]
      ] as const
      for (const [path, who] of [...JSON_ENDPOINTS, ["/billing/stripe/webhook", "none"] as const]) {
        for (const [type, body] of bodies) {
          const reply = yield* call("POST", path, { token: tokenFor(who), body, headers: { "content-type": type } })
          expectClientError(reply, { status: 400, code: "invalid_request" }, `${path} ${type.slice(0, 40)}`)
          expect(reply.body.error.message).toContain("application/json")
        }
      }
    }))

  it.effect("a JSON endpoint refuses other content types at once; JSON with a charset passes", () =>
    Effect.gen(function*() {
      const { session } = yield* setup
      for (
        const type of [
          "application/x-www-form-urlencoded",
          "text/plain",
          "application/octet-stream",
          "application/xml",
          "application/vnd.api+json"
        ]
      ) {
        const reply = yield* call("POST", "/dashboard/api-keys", {
          token: session,
          body: "name=sneaky",
          headers: { "content-type": type }
        })
        expectClientError(reply, { status: 400, code: "invalid_request" }, type)
      }
      for (const type of ["application/json; charset=utf-8", "Application/JSON"]) {
        const reply = yield* call("POST", "/dashboard/api-keys", {
          token: session,
          body: JSON.stringify({ name: `ok ${type}` }),
          headers: { "content-type": type }
        })
        expect(reply.status, type).toBe(201)
        yield* call("DELETE", `/dashboard/api-keys/${reply.body.key.id}`, { token: session })
      }
    }))

  it.effect("a URL over Node's 16 KiB header limit → 400 in the error shape, not a bare 431", () =>
    Effect.gen(function*() {
      const { session } = yield* setup
      const reply = yield* call("GET", `/dashboard/logs?from=${"x".repeat(20_000)}`, { token: session })
      expectClientError(reply, { status: 400, code: "invalid_request" })
      expect(reply.body.error.message).toContain("16 KiB")
    }))

  describe("date-times are RFC 3339", () => {
    const refused = [
      "2024-06-31T00:00:00Z",
      "2024-02-30T00:00:00Z",
      "2023-02-29T00:00:00Z",
      "-1",
      "12/31/2024",
      "2024-06-30T00:00:00Z%00",
      "2024-06-30",
      "2024-06-30T24:00:00Z",
      "2024-06-30T00:00:00",
      "1719705600"
    ]
    it.effect("an invalid date-time → 400 naming the parameter, on logs and usage", () =>
      Effect.gen(function*() {
        const { session } = yield* setup
        for (const path of ["/dashboard/logs", "/dashboard/usage"]) {
          for (const param of ["from", "to"]) {
            for (const value of refused) {
              const encoded = value.endsWith("%00") ? value : encodeURIComponent(value)
              const reply = yield* call("GET", `${path}?${param}=${encoded}`, { token: session })
              expectClientError(reply, { status: 400, code: "invalid_request", param }, `${path} ${param}=${value}`)
            }
          }
        }
      }))

    it.effect("valid ones, with an offset or a fraction, are read as instants", () =>
      Effect.gen(function*() {
        const { session } = yield* setup
        const reply = yield* call(
          "GET",
          `/dashboard/usage?from=${
            encodeURIComponent("2024-02-29T08:00:00+08:00")
          }&to=2024-03-01T00:00:00.5Z&granularity=day`,
          { token: session }
        )
        expect(reply.status, reply.text).toBe(200)
        expect(reply.body.series.length).toBeGreaterThan(0)
        const logs = yield* call("GET", "/dashboard/logs?from=2024-06-30T00:00:00Z&to=2024-12-31T23:59:59.999Z", {
          token: session
        })
        expect(logs.status, logs.text).toBe(200)
      }))

    it.effect("a key's expires_at is strict too", () =>
      Effect.gen(function*() {
        const { session } = yield* setup
        const reply = yield* call("POST", "/dashboard/api-keys", {
          token: session,
          json: { name: "dated", expires_at: "2099-02-30T00:00:00Z" }
        })
        expectClientError(reply, { status: 400, code: "invalid_request", param: "expires_at" })
      }))
  })
})
