import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import fc from "fast-check"
import { isErrorBody } from "../../support/ErrorBody.js"
import { call, type Reply } from "../../support/Http.js"
import { caller, TestServerWithUpstream, violations, walletOf } from "../../support/Models.js"
import { query } from "../../support/TestServer.js"

/**
 * The fuzz test of hostile text: what PostgreSQL cannot store (U+0000, unpaired
 * surrogates), strings past the documented maxima and JSON nested 10,000 deep,
 * sent into every field an endpoint keeps or puts in SQL — the model
 * endpoints' user, metadata, input, instructions and tools (Anthropic's
 * Messages API and its count_tokens too, which keeps nothing), and the
 * dashboard's key names, webhooks, billing settings, log filters and grouping
 * tags. None may answer 5xx; every model call answered 2xx is logged and
 * (live key) billed once its settlement is written; one answered 4xx holds,
 * bills and logs nothing; no settlement is left parked or held.
 */

const WEBHOOK_HOST = "127.0.0.1:9"

/** Documented maxima, each exceeded: tag key 64, tag value 512, key name 100, webhook description 200, user filter 256, URL 2048. */
const OVERLONG = [65, 101, 201, 257, 513, 2049, 70_000] as const

const hostile = fc.oneof(
  fc.tuple(fc.string({ maxLength: 12 }), fc.string({ maxLength: 12 })).map(([a, b]) => `${a}\u0000${b}`),
  // fc.string's characters are printable ASCII: the surrogate between them is always unpaired.
  fc.tuple(fc.string({ maxLength: 12 }), fc.integer({ min: 0xd800, max: 0xdfff }), fc.string({ maxLength: 12 }))
    .map(([a, unit, b]) => `${a}${String.fromCharCode(unit)}${b}`),
  fc.tuple(fc.constantFrom(...OVERLONG), fc.integer({ min: 0, max: 3 })).map(([length, extra]) =>
    "x".repeat(length + extra)
  ),
  // Storable text (emoji, combining marks, U+FFFD): answered 2xx where it fits, and then it must be billed and logged.
  fc.string({ unit: "grapheme", minLength: 1, maxLength: 24 })
)

/** The fixed cases every field gets, besides the generated ones. */
const FIXED = ["\u0000", "\ud800", "\udc00", "\udc00\ud800", "ok 😀 \uFFFD", "y".repeat(300_000)]
const SAMPLES = [...FIXED, ...fc.sample(hostile, { seed: 33, numRuns: 6 })]

/** `depth` nested arrays: JSON.stringify cannot be trusted with it, so it is spliced in as text. */
const DEEP = (depth: number) => `${"[".repeat(depth)}${"]".repeat(depth)}`
const DEEP_MARK = "__deep__"
/** A body with `DEEP_MARK` (a string) replaced by JSON nested `depth` deep. */
const withDeep = (body: unknown, depth: number) => JSON.stringify(body).replace(JSON.stringify(DEEP_MARK), DEEP(depth))

/** Query text a client could send for `value`: each code point percent-encoded as UTF-8, a lone surrogate as its three bytes. */
const percent = (value: string): string =>
  [...value].map((char) => {
    const code = char.codePointAt(0) ?? 0
    if (/^[A-Za-z0-9_.~-]$/.test(char)) return char
    const bytes = code < 0x80
      ? [code]
      : code < 0x800
      ? [0xc0 | (code >> 6), 0x80 | (code & 63)]
      : code < 0x10000
      ? [0xe0 | (code >> 12), 0x80 | ((code >> 6) & 63), 0x80 | (code & 63)]
      : [0xf0 | (code >> 18), 0x80 | ((code >> 12) & 63), 0x80 | ((code >> 6) & 63), 0x80 | (code & 63)]
    return bytes.map((b) => `%${b.toString(16).toUpperCase().padStart(2, "0")}`).join("")
  }).join("")

const ASK = { model: "svc/nenas-flash", input: "Say hello.", max_output_tokens: 16 }
const CHAT = { model: "svc/nenas-flash", messages: [{ role: "user", content: "Say hello." }], max_tokens: 16 }
const MESSAGES = { model: "svc/nenas-flash", messages: [{ role: "user", content: "Say hello." }], max_tokens: 16 }
const COUNT = { model: "svc/nenas-flash", messages: [{ role: "user", content: "Say hello." }] }
const anthropicTool = (description: unknown, input_schema: unknown = { type: "object", properties: {} }) => ({
  name: "lookup",
  description,
  input_schema
})
const fn = (description: unknown, parameters: unknown = { type: "object", properties: {} }) => ({
  name: "lookup",
  description,
  parameters
})

type Body = (value: unknown) => Record<string, unknown>

/**
 * Each model endpoint field that is kept (log, stored response) or sent on, the body that carries it, and
 * whether the text must be storable (`user`, `metadata`, `previous_response_id`: the rest is stored as bytes or not at all).
 */
const MODEL_FIELDS: ReadonlyArray<readonly [string, string, Body, boolean]> = [
  ["/v1/responses", "user", (v) => ({ ...ASK, user: v }), true],
  ["/v1/responses", "metadata value", (v) => ({ ...ASK, metadata: { team: v } }), true],
  ["/v1/responses", "metadata key", (v) => ({ ...ASK, metadata: { [String(v).slice(0, 80_000)]: "x" } }), true],
  ["/v1/responses", "instructions", (v) => ({ ...ASK, instructions: v }), false],
  ["/v1/responses", "input", (v) => ({ ...ASK, input: v }), false],
  [
    "/v1/responses",
    "input item",
    (v) => ({ ...ASK, input: [{ role: "user", content: [{ type: "input_text", text: v }] }] }),
    false
  ],
  ["/v1/responses", "previous_response_id", (v) => ({ ...ASK, previous_response_id: v }), true],
  ["/v1/responses", "tool description", (v) => ({ ...ASK, tools: [{ type: "function", ...fn(v) }] }), false],
  ["/v1/responses", "user, streamed", (v) => ({ ...ASK, user: v, stream: true }), true],
  ["/v1/chat/completions", "user", (v) => ({ ...CHAT, user: v }), true],
  ["/v1/chat/completions", "metadata value", (v) => ({ ...CHAT, metadata: { team: v } }), true],
  ["/v1/chat/completions", "metadata key", (v) => ({ ...CHAT, metadata: { [String(v).slice(0, 80_000)]: "x" } }), true],
  ["/v1/chat/completions", "message", (v) => ({ ...CHAT, messages: [{ role: "user", content: v }] }), false],
  ["/v1/chat/completions", "stop", (v) => ({ ...CHAT, stop: v }), false],
  [
    "/v1/chat/completions",
    "tool description",
    (v) => ({ ...CHAT, tools: [{ type: "function", function: fn(v) }] }),
    false
  ],
  ["/v1/chat/completions", "metadata value, streamed", (v) => ({ ...CHAT, metadata: { team: v }, stream: true }), true],
  ["/v1/messages", "metadata.user_id", (v) => ({ ...MESSAGES, metadata: { user_id: v } }), true],
  [
    "/v1/messages",
    "metadata.user_id, streamed",
    (v) => ({ ...MESSAGES, metadata: { user_id: v }, stream: true }),
    true
  ],
  ["/v1/messages", "message", (v) => ({ ...MESSAGES, messages: [{ role: "user", content: v }] }), false],
  [
    "/v1/messages",
    "text block",
    (v) => ({ ...MESSAGES, messages: [{ role: "user", content: [{ type: "text", text: v }] }] }),
    false
  ],
  ["/v1/messages", "system", (v) => ({ ...MESSAGES, system: v }), false],
  ["/v1/messages", "stop_sequences", (v) => ({ ...MESSAGES, stop_sequences: [v] }), false],
  ["/v1/messages", "tool description", (v) => ({ ...MESSAGES, tools: [anthropicTool(v)] }), false],
  ["/v1/messages/count_tokens", "message", (v) => ({ ...COUNT, messages: [{ role: "user", content: v }] }), false],
  ["/v1/messages/count_tokens", "system", (v) => ({ ...COUNT, system: [{ type: "text", text: v }] }), false],
  ["/v1/messages/count_tokens", "tool description", (v) => ({ ...COUNT, tools: [anthropicTool(v)] }), false]
]

/** Text PostgreSQL cannot store. */
const unstorable = (value: string) => /\u0000|\p{Cs}/u.test(value)

/** JSON nested 10,000 deep (and 60, under the depth guard) where a field takes any JSON. */
const DEEP_FIELDS: ReadonlyArray<readonly [string, Record<string, unknown>]> = [
  ["/v1/responses", { ...ASK, metadata: { team: DEEP_MARK } }],
  ["/v1/responses", {
    ...ASK,
    tools: [{ type: "function", ...fn("d", { type: "object", properties: { a: DEEP_MARK } }) }]
  }],
  ["/v1/responses", {
    ...ASK,
    text: { format: { type: "json_schema", name: "s", schema: { type: "object", x: DEEP_MARK } } }
  }],
  ["/v1/chat/completions", { ...CHAT, metadata: { team: DEEP_MARK } }],
  ["/v1/chat/completions", {
    ...CHAT,
    tools: [{ type: "function", function: fn("d", { type: "object", x: DEEP_MARK }) }]
  }],
  ["/v1/chat/completions", {
    ...CHAT,
    response_format: { type: "json_schema", json_schema: { name: "s", schema: { x: DEEP_MARK } } }
  }],
  ["/v1/messages", { ...MESSAGES, tools: [anthropicTool("d", { type: "object", x: DEEP_MARK })] }],
  ["/v1/messages/count_tokens", { ...COUNT, tools: [anthropicTool("d", { type: "object", x: DEEP_MARK })] }]
]

interface Answered {
  readonly label: string
  readonly status: number
  readonly requestId: string
  readonly environment: "live" | "test"
  readonly param: unknown
}

/** Anthropic's error body, nenas's code and param inside `error` (`/v1/messages` answers in it). */
const isAnthropicError = (body: unknown): boolean => {
  if (typeof body !== "object" || body === null) return false
  const { error, request_id, type } = body as {
    error?: { code?: unknown; message?: unknown }
    request_id?: unknown
    type?: unknown
  }
  return type === "error" && typeof request_id === "string" && typeof error?.code === "string" &&
    typeof error.message === "string"
}

/** No 5xx; an error in the error shape (Anthropic's on `/v1/messages`); the request id it answered with. */
const checked = (label: string, reply: Reply) => {
  expect(reply.status, `${label}: ${reply.text.slice(0, 200)}`).toBeLessThan(500)
  const shaped = label.startsWith("/v1/messages") ? isAnthropicError(reply.body) : isErrorBody(reply.body)
  if (reply.status >= 400) expect(shaped, `${label} error shape: ${reply.text.slice(0, 200)}`).toBe(true)
  return reply.headers.get("x-request-id") ?? ""
}

describe("fuzz: hostile values in every stored field", () => {
  layer(TestServerWithUpstream({ webhookAllowedHosts: new Set([WEBHOOK_HOST]) }), { timeout: 180_000 })((it) => {
    it.effect("no 5xx; every 2xx model call logged and billed; every 4xx holds nothing; nothing left parked or held", () =>
      Effect.gen(function*() {
        const live = yield* caller("fuzz-stored-live@example.com", { sen: 50_000 })
        const test = yield* caller("fuzz-stored-test@example.com", { environment: "test" })
        const answered: Array<Answered> = []
        const model = (path: string, label: string, body: string, key: "live" | "test") =>
          Effect.gen(function*() {
            const apiKey = key === "live" ? live.apiKey : test.apiKey
            const reply = yield* call("POST", path, {
              token: apiKey,
              body,
              headers: { "content-type": "application/json" }
            })
            const full = `${path} ${label} (${key})`
            answered.push({
              label: full,
              status: reply.status,
              requestId: checked(full, reply),
              environment: key,
              param: reply.body?.error?.param
            })
          })

        let mustRefuse = 0
        for (const [path, field, body, kept] of MODEL_FIELDS) {
          for (const [index, value] of SAMPLES.entries()) {
            // Most on the live key (money moves); every third on a test key.
            yield* model(path, `${field} #${index}`, JSON.stringify(body(value)), index % 3 === 2 ? "test" : "live")
            const last = answered[answered.length - 1]
            if (kept && unstorable(value) && last !== undefined) {
              mustRefuse++
              expect(last.status, `${last.label}: text PostgreSQL cannot store is refused`).toBe(400)
              if (field.startsWith("metadata.user_id")) {
                expect(last.param, `${last.label}: the field is named`).toBe("metadata.user_id")
              }
            }
          }
        }
        for (const [path, body] of DEEP_FIELDS) {
          for (const depth of [10_000, 60]) yield* model(path, `nested ${depth}`, withDeep(body, depth), "live")
        }

        // The dashboard's stored and filtering fields, on the live account's session.
        const { token } = live
        const dashboard = (method: string, path: string, json?: unknown, raw?: string) =>
          Effect.map(
            call(method, path, {
              token,
              ...(raw === undefined
                ? json === undefined ? {} : { json }
                : { body: raw, headers: { "content-type": "application/json" } })
            }),
            (reply) => checked(`${method} ${path.slice(0, 80)}`, reply)
          )
        const key = yield* call("POST", "/dashboard/api-keys", { token, json: { name: "fuzz target" } })
        expect(key.status).toBe(201)
        const hook = yield* call("POST", "/dashboard/webhooks", {
          token,
          json: { url: `http://${WEBHOOK_HOST}/hook`, events: ["balance.low"] }
        })
        expect(hook.status, hook.text).toBe(201)
        const keyPath = `/dashboard/api-keys/${key.body.key.id}`
        const hookPath = `/dashboard/webhooks/${hook.body.endpoint?.id ?? hook.body.id}`
        let dashboardCalls = 0
        for (const value of SAMPLES) {
          const text = String(value)
          yield* dashboard("POST", "/dashboard/api-keys", { name: text })
          yield* dashboard("PATCH", keyPath, { name: text })
          yield* dashboard("POST", "/dashboard/webhooks", { url: text, events: ["balance.low"], description: "d" })
          yield* dashboard("POST", "/dashboard/webhooks", {
            url: `http://${WEBHOOK_HOST}/${text}`,
            events: ["balance.low"],
            description: text
          })
          yield* dashboard("PATCH", hookPath, { description: text })
          yield* dashboard("PATCH", hookPath, { url: `http://${WEBHOOK_HOST}/${text}` })
          yield* dashboard("PUT", "/dashboard/billing/settings", { low_balance_threshold_myr: text })
          yield* dashboard("PUT", "/dashboard/usage/grouping-tags", { tag_keys: [text] })
          for (const param of ["user", "tag_key", "tag_value", "endpoint", "api_key_id", "cursor"]) {
            yield* dashboard("GET", `/dashboard/logs?${param}=${percent(text.slice(0, 3_000))}`)
          }
          yield* dashboard("GET", `/dashboard/usage?group_by_tag=${percent(text.slice(0, 3_000))}`)
          dashboardCalls += 14
        }
        yield* dashboard("POST", "/dashboard/api-keys", undefined, `{"name":${DEEP(10_000)}}`)
        yield* dashboard("PATCH", hookPath, undefined, `{"description":${DEEP(10_000)}}`)
        yield* dashboard("PUT", "/dashboard/billing/settings", undefined, `{"auto_topup":${DEEP(10_000)}}`)

        // The run's size: bounded, and every case was sent.
        expect(answered.length).toBe(MODEL_FIELDS.length * SAMPLES.length + DEEP_FIELDS.length * 2)
        expect(answered.length + dashboardCalls).toBeLessThan(600)
        const ok = answered.filter((a) => a.status < 300)
        const refused = answered.filter((a) => a.status >= 400)
        // The fuzzer reached both sides: storable values answered, hostile ones refused.
        expect(ok.length).toBeGreaterThan(20)
        expect(mustRefuse).toBeGreaterThan(30)
        expect(refused.length).toBeGreaterThanOrEqual(mustRefuse)

        // Once the settlements are written (`query` waits for the flush): every answer logged, every live one billed once.
        const ids = answered.map((a) => a.requestId)
        const logs = new Map((yield* query<{ requestId: string; status: string }>(
          `SELECT request_id AS "requestId", status FROM request_logs WHERE request_id = ANY($1)`,
          [ids]
        )).map((row) => [row.requestId, row.status]))
        const billed = new Map((yield* query<{ requestId: string; n: number }>(
          `SELECT request_id AS "requestId", count(*)::int AS n FROM ledger_entries WHERE type = 'usage' AND request_id = ANY($1) GROUP BY 1`,
          [ids]
        )).map((row) => [row.requestId, row.n]))
        const held = new Set((yield* query<{ requestId: string }>(
          `SELECT request_id AS "requestId" FROM reservations WHERE request_id = ANY($1)`,
          [ids]
        )).map((row) => row.requestId))
        for (const a of ok) {
          if (a.label.startsWith("/v1/messages/count_tokens")) {
            // Free and not a call: no log row, nothing billed.
            expect(logs.has(a.requestId), `${a.label}: no log row`).toBe(false)
            expect(billed.has(a.requestId), `${a.label}: no usage entry`).toBe(false)
            continue
          }
          expect(logs.get(a.requestId), `${a.label}: its log row`).toBe(
            a.environment === "live" ? "billed" : "succeeded"
          )
          expect(billed.get(a.requestId), `${a.label}: its usage entry`).toBe(a.environment === "live" ? 1 : undefined)
        }
        for (const a of refused) {
          expect(logs.has(a.requestId), `${a.label} (${a.status}): no log row`).toBe(false)
          expect(billed.has(a.requestId), `${a.label} (${a.status}): no usage entry`).toBe(false)
          expect(held.has(a.requestId), `${a.label} (${a.status}): no hold`).toBe(false)
        }
        expect(yield* query("SELECT request_id FROM settlement_parked")).toEqual([])
        expect((yield* walletOf(live.accountId)).reserved).toBe(0)
        expect(yield* query("SELECT id FROM reservations WHERE account_id = $1 AND status = 'open'", [live.accountId]))
          .toEqual([])
        expect(yield* violations(live.accountId)).toEqual([])
      }))
  })
})
