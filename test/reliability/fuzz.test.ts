import { describe, expect, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import fc from "fast-check"
import { isErrorBody } from "../support/ErrorBody.js"
import { createKey, devToken } from "../support/Http.js"
import { SMOKE } from "../support/Smoke.js"
import { query, TestServer, TestServerLive } from "../support/TestServer.js"

/**
 * Fuzzing: generated bad requests across every endpoint — wrong
 * types, huge and negative numbers, unicode and U+0000, deep nesting, missing
 * and extra fields, bad headers, wrong content types, invalid UTF-8,
 * oversized and chunked bodies, bad query parameters and dates. None may
 * answer 5xx; every error body is the error shape; every answer carries an
 * X-Request-Id; and nothing in the database changes.
 */

const RUNS = SMOKE ? 400 : 10_000

const TABLES = [
  "accounts",
  "wallets",
  "api_keys",
  "api_key_tombstones",
  "reservations",
  "payment_transactions",
  "disputes",
  "ledger_entries",
  "webhook_events",
  "request_logs",
  "idempotency_records",
  "stripe_charges"
]

const snapshot = Effect.gen(function*() {
  const counts: Record<string, number> = {}
  for (const table of TABLES) {
    const rows = yield* query<{ n: number }>(`SELECT count(*)::int AS n FROM ${table}`)
    counts[table] = rows[0]?.n ?? -1
  }
  const wallets = yield* query("SELECT * FROM wallets ORDER BY account_id")
  const keys = yield* query("SELECT id, name, monthly_spend_limit_micro_myr, expires_at FROM api_keys ORDER BY id")
  return { counts, wallets, keys }
})

type Auth = "none" | "session" | "testKey" | "liveKey" | "garbage"

interface Endpoint {
  readonly method: string
  readonly path: (param: string) => string
  readonly auth: ReadonlyArray<Auth>
  /** A valid body; the fuzzer always breaks it. */
  readonly body?: Record<string, unknown>
  /** The required field the fuzzer breaks (drops, or sets to a value `invalid` accepts). */
  readonly required?: string
  readonly invalid?: (value: unknown) => boolean
  readonly query?: ReadonlyArray<string>
}

const ENDPOINTS: ReadonlyArray<Endpoint> = [
  { method: "GET", path: () => "/healthz", auth: ["none"] },
  { method: "GET", path: () => "/readyz", auth: ["none"] },
  { method: "GET", path: () => "/v1/models", auth: ["testKey", "garbage", "none"] },
  {
    method: "POST",
    path: () => "/v1/responses",
    auth: ["testKey", "liveKey", "garbage", "none"],
    body: { model: "svc/nenas-flash", input: "hello", max_output_tokens: 16 },
    required: "input",
    invalid: (v) => typeof v !== "string" && !Array.isArray(v)
  },
  {
    method: "POST",
    path: () => "/v1/chat/completions",
    auth: ["testKey", "liveKey", "garbage", "none"],
    body: { model: "svc/nenas-flash", messages: [{ role: "user", content: "hi" }], max_tokens: 16 },
    required: "messages",
    invalid: (v) => !Array.isArray(v)
  },
  {
    method: "POST",
    path: () => "/dev/session",
    auth: ["none"],
    body: { email: "fuzz@example.com" },
    required: "email",
    invalid: (v) => typeof v !== "string" || !v.includes("@")
  },
  { method: "GET", path: () => "/dev/.well-known/jwks.json", auth: ["none"] },
  {
    method: "POST",
    path: () => "/dashboard/api-keys",
    auth: ["session", "garbage", "none"],
    body: { name: "fuzz" },
    required: "name",
    invalid: (v) => typeof v !== "string" || v.trim() === "" || v.trim().length > 100 || v.includes("\u0000")
  },
  { method: "GET", path: () => "/dashboard/api-keys", auth: ["session", "garbage", "none"] },
  { method: "DELETE", path: (id) => `/dashboard/api-keys/${id}`, auth: ["session", "garbage", "none"] },
  {
    method: "POST",
    path: () => "/dashboard/billing/checkout",
    auth: ["session", "garbage", "none"],
    body: { amount_sen: 1000 },
    required: "amount_sen",
    invalid: (v) => ![1000, 2500, 5000, 10000, 25000, 50000].includes(v as number)
  },
  { method: "GET", path: () => "/dashboard/billing/balance", auth: ["session", "garbage", "none"] },
  {
    method: "GET",
    path: () => "/dashboard/billing/transactions",
    auth: ["session", "garbage"],
    query: ["page", "limit", "type"]
  },
  {
    method: "POST",
    path: () => "/billing/stripe/webhook",
    auth: ["none"],
    body: { id: "evt_1", type: "checkout.session.completed", data: { object: {} } }
  },
  { method: "GET", path: (id) => `/dev/checkout/${id}`, auth: ["none"] },
  { method: "POST", path: (id) => `/dev/checkout/${id}/pay`, auth: ["none"] },
  { method: "POST", path: (id) => `/dev/checkout/${id}/cancel`, auth: ["none"] },
  {
    method: "GET",
    path: () => "/dashboard/logs",
    auth: ["session", "garbage"],
    query: ["page", "limit", "status", "api_key_id", "endpoint", "from", "to"]
  },
  {
    method: "GET",
    path: () => "/dashboard/usage",
    auth: ["session", "garbage"],
    query: ["from", "to", "granularity", "api_key_id"]
  },
  { method: "GET", path: () => "/dashboard/overview", auth: ["session", "garbage", "none"] },
  { method: "GET", path: () => "/openapi.json", auth: ["none"] },
  { method: "PATCH", path: (id) => `/v1/${id}`, auth: ["testKey", "none"] }
]

/** Values of the wrong type or range for any field. */
const badValue: fc.Arbitrary<unknown> = fc.oneof(
  fc.constantFrom(
    null,
    true,
    false,
    0,
    -1,
    -1e308,
    1e308,
    2 ** 53 + 1,
    -(2 ** 63),
    0.5,
    "",
    " ",
    "\u0000",
    "a\u0000b",
    "NaN",
    "Infinity",
    "-0",
    "1e999"
  ),
  fc.integer(),
  fc.double(),
  fc.string({ unit: "grapheme", maxLength: 40 }),
  fc.string({ unit: "binary", maxLength: 20 }),
  fc.constantFrom("x".repeat(10_000), "😀".repeat(500), "\uD800", "\uDFFF"),
  fc.array(fc.integer(), { maxLength: 4 }),
  fc.dictionary(fc.string({ maxLength: 5 }), fc.integer(), { maxKeys: 3 })
)

const badDate = fc.oneof(
  fc.constantFrom(
    "2024-06-31T00:00:00Z",
    "2024-02-30T00:00:00Z",
    "-1",
    "12/31/2024",
    "2024-06-30T00:00:00Z\u0000",
    "0",
    "99999-01-01T00:00:00Z",
    "2024-13-01T00:00:00Z",
    "2024-06-30T25:00:00Z",
    "2024-06-30T00:00:00+24:00",
    "now",
    ""
  ),
  fc.date({ noInvalidDate: false }).map((d) => Number.isNaN(d.getTime()) ? "Invalid Date" : d.toString()),
  fc.string({ maxLength: 30 })
)

const queryValue = fc.oneof(badDate, badValue.map((v) => typeof v === "string" ? v : JSON.stringify(v) ?? "undefined"))

const deep = (depth: number) => `{"input":${"[".repeat(depth)}${"]".repeat(depth)}}`

type BodyKind =
  | { readonly kind: "json"; readonly text: string }
  | { readonly kind: "bytes"; readonly bytes: Uint8Array }
  | { readonly kind: "chunked"; readonly parts: ReadonlyArray<string> }

/** A body that is surely invalid for the endpoint (its valid template broken), plus noise. */
const badBody = (endpoint: Endpoint): fc.Arbitrary<BodyKind> => {
  const template = endpoint.body ?? {}
  const field = endpoint.required ?? "x"
  const invalid = endpoint.invalid ?? (() => true)
  const broken = fc.record({
    value: fc.option(badValue.filter(invalid), { nil: undefined }),
    extra: fc.dictionary(fc.string({ maxLength: 8 }), badValue, { maxKeys: 3 })
  }).map(({ value, extra }) => {
    const body: Record<string, unknown> = { ...extra, ...template }
    if (value === undefined) delete body[field]
    else body[field] = value
    return { kind: "json" as const, text: JSON.stringify(body) }
  })
  return fc.oneof(
    { weight: 20, arbitrary: broken },
    {
      weight: 2,
      arbitrary: fc.integer({ min: 65, max: 12_000 }).map((d) => ({ kind: "json" as const, text: deep(d) }))
    },
    {
      weight: 3,
      arbitrary: fc.string({ maxLength: 200 }).map((text) => ({ kind: "json" as const, text: `{${text}` }))
    },
    {
      weight: 2,
      arbitrary: fc.uint8Array({ minLength: 1, maxLength: 200 }).map((bytes) => ({
        kind: "bytes" as const,
        bytes: Uint8Array.from([0x7b, 0x22, 0xff, 0xfe, ...bytes])
      }))
    },
    {
      weight: 2,
      arbitrary: fc.array(fc.string({ maxLength: 50 }), { minLength: 1, maxLength: 5 }).map((parts) => ({
        kind: "chunked" as const,
        parts: ["{\"input\": 1, ", ...parts]
      }))
    },
    {
      weight: 1,
      arbitrary: fc.constantFrom(
        "null",
        "[]",
        "\"text\"",
        "1",
        "{}",
        "{\"__proto__\": {\"x\": 1}}",
        "{\"constructor\": {\"prototype\": 1}}"
      ).map((text) => ({ kind: "json" as const, text }))
    },
    // Over 8 MiB; rare, as each costs a connection.
    {
      weight: 1,
      arbitrary: fc.constant(null).chain(() => fc.integer({ min: 0, max: 50 })).filter((n) => n === 0).map(() => ({
        kind: "json" as const,
        text: `{"input":"${"a".repeat(9 * 1024 * 1024)}"}`
      }))
    }
  )
}

const contentType = fc.oneof(
  { weight: 12, arbitrary: fc.constant("application/json") },
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      "multipart/form-data",
      "multipart/form-data; boundary=xyz",
      `multipart/form-data; boundary=${"b".repeat(300)}`,
      "text/plain",
      "application/x-www-form-urlencoded",
      "application/octet-stream",
      "application/json; charset=latin1",
      "garbage",
      "application/vnd.api+json",
      ""
    )
  },
  { weight: 1, arbitrary: fc.constant(undefined) }
)

/** Header values fetch can send: printable latin-1. */
const headerValue = fc.oneof(
  fc.string({ unit: fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c)), maxLength: 300 }),
  fc.constantFrom("x".repeat(256), "ÿÿÿ", "Bearer", "Bearer ", "Basic Zm9vOmJhcg==", "-1", "99999999999999999999")
)

const request = fc.constantFrom(...ENDPOINTS).chain((endpoint) =>
  fc.record({
    endpoint: fc.constant(endpoint),
    param: fc.oneof(
      fc.constantFrom("%00", "a%00b", "key_" + "x".repeat(500), "..", "%2e%2e", "%E2%82", "😀", "key_abc"),
      fc.string({ maxLength: 30 }).map(encodeURIComponent)
    ),
    auth: fc.constantFrom(...endpoint.auth),
    garbageToken: headerValue,
    query: fc.dictionary(
      fc.constantFrom(...(endpoint.query ?? []), "x", "from", "to", "page", "limit", "%00"),
      queryValue,
      { maxKeys: 4 }
    ),
    body: endpoint.method === "POST" ? badBody(endpoint).map((b) => b as BodyKind | undefined) : fc.constant(undefined),
    contentType,
    headers: fc.dictionary(
      fc.constantFrom(
        "idempotency-key",
        "stripe-signature",
        "accept",
        "x-request-id",
        "accept-encoding",
        "origin",
        "x-forwarded-for"
      ),
      headerValue,
      { maxKeys: 3 }
    )
  })
)

type Case = typeof request extends fc.Arbitrary<infer A> ? A : never

layer(TestServerLive({ rateLimitRpm: 10_000_000, rateLimitConcurrent: 10_000 }), { timeout: 3_600_000 })(
  "fuzz",
  (it) => {
    it.effect(`${RUNS} generated bad requests across ${ENDPOINTS.length} endpoints: no 5xx, the error shape, no state change`, () =>
      Effect.gen(function*() {
        const { baseUrl } = yield* TestServer
        const session = yield* devToken("fuzz@example.com")
        const testKey = (yield* createKey(session, { name: "fuzz test", environment: "test" })).full_key
        const liveKey = (yield* createKey(session, { name: "fuzz live" })).full_key
        const before = yield* snapshot
        const tokens: Record<Auth, (c: Case) => string | undefined> = {
          none: () => undefined,
          session: () => session,
          testKey: () => testKey,
          liveKey: () => liveKey,
          garbage: (c) => c.garbageToken
        }
        const statuses = new Map<number, number>()
        const failures: Array<string> = []

        const send = async (c: Case) => {
          const headers: Record<string, string> = { ...c.headers }
          const token = tokens[c.auth](c)
          if (token !== undefined) headers["authorization"] = c.auth === "garbage" ? token : `Bearer ${token}`
          if (c.contentType !== undefined && c.body !== undefined) headers["content-type"] = c.contentType
          const search = new URLSearchParams(Object.entries(c.query)).toString().replaceAll("%2500", "%00")
          const url = `${baseUrl}${c.endpoint.path(c.param)}${search === "" ? "" : `?${search}`}`
          const init: RequestInit & { duplex?: "half" } = {
            method: c.endpoint.method,
            headers,
            signal: AbortSignal.timeout(30_000)
          }
          if (c.body?.kind === "json") init.body = c.body.text
          if (c.body?.kind === "bytes") init.body = c.body.bytes
          if (c.body?.kind === "chunked") {
            const parts = c.body.parts
            init.body = new ReadableStream({
              start(controller) {
                for (const part of parts) controller.enqueue(new TextEncoder().encode(part))
                controller.close()
              }
            })
            init.duplex = "half"
          }
          const label = `${c.endpoint.method} ${url.slice(0, 200)} [${c.auth}] ${c.body?.kind ?? ""} ${
            c.body?.kind === "json" ? c.body.text.slice(0, 120) : ""
          }`
          let response: Response
          try {
            response = await fetch(url, init)
          } catch (error) {
            // A client-side refusal (an invalid header or URL) is no request at all.
            if (error instanceof TypeError && !/fetch failed/.test(error.message)) return
            failures.push(`${label}: no answer (${String(error)}: ${String((error as { cause?: unknown }).cause)})`)
            return
          }
          const text = await response.text()
          statuses.set(response.status, (statuses.get(response.status) ?? 0) + 1)
          let body: unknown
          try {
            body = JSON.parse(text)
          } catch {
            body = undefined
          }
          const problems: Array<string> = []
          if (response.status >= 500) problems.push(`status ${response.status}`)
          if (response.headers.get("x-request-id") === null) problems.push("no X-Request-Id")
          if (response.status >= 400 && !isErrorBody(body)) problems.push("not the error shape")
          if (c.endpoint.method === "POST" && c.endpoint.body !== undefined && response.status < 400) {
            problems.push(`accepted (${response.status})`)
          }
          if (problems.length > 0) failures.push(`${label}: ${problems.join(", ")}: ${text.slice(0, 300)}`)
        }

        // Every case runs (no shrinking): each problem is collected with the request that caused it.
        const seed = Number(process.env["FUZZ_SEED"] ?? Date.now() % 2 ** 31)
        yield* Effect.promise(() =>
          fc.assert(fc.asyncProperty(request, async (c) => void (await send(c))), { numRuns: RUNS, seed })
        )
        const after = yield* snapshot
        console.log(
          `fuzz (seed ${seed}): ${RUNS} cases, ${ENDPOINTS.length} endpoints; statuses ${
            JSON.stringify(Object.fromEntries([...statuses].sort()))
          }`
        )
        expect(failures.slice(0, 20)).toEqual([])
        expect(after).toEqual(before)
      }))
  }
)

describe("the fuzzer's own generators", () => {
  it("makes deep bodies that are valid JSON", () => {
    expect(() => JSON.parse(deep(100))).not.toThrow()
  })
})
