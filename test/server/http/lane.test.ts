import * as HttpApi from "@effect/platform/HttpApi"
import { describe, expect, it, layer } from "@effect/vitest"
import { Effect, Option } from "effect"
import { NenasApi } from "../../../src/Api.js"
import { LANE_ENDPOINTS } from "../../../src/Lane/ModelLane.js"
import { call, type Reply } from "../../support/Http.js"
import { caller, TestServerWithUpstream } from "../../support/Models.js"

/**
 * The lane (docs/architecture.md, "One request's path"): the model calls
 * served in front of the router must answer exactly as the router's endpoints
 * do. A request with a query string is the router's, so each case is sent
 * twice, once to each, and the answers compared.
 */

const MODEL = "svc/nenas-flash"

describe("the lane's endpoints (no database)", () => {
  it("decode with the very Schemas NenasApi declares for them, at the same method and path", () => {
    const declared = new Map<string, { method: string; path: string; payload: unknown }>()
    HttpApi.reflect(NenasApi, {
      onGroup: () => {},
      onEndpoint: ({ endpoint, group }) =>
        declared.set(`${group.identifier}.${endpoint.name}`, {
          method: endpoint.method,
          path: endpoint.path,
          payload: Option.getOrUndefined(endpoint.payloadSchema)
        })
    })
    for (const [name, lane] of Object.entries(LANE_ENDPOINTS)) {
      const endpoint = declared.get(`${lane.group}.${name}`)
      expect(endpoint, name).toBeDefined()
      expect(endpoint?.method, name).toBe("POST")
      expect(endpoint?.path, name).toBe(lane.path)
      expect(endpoint?.payload === lane.payload, `${name}: the same Schema object`).toBe(true)
    }
  })
})

const HEADERS_COMPARED = [
  "content-type",
  "cache-control",
  "content-security-policy",
  "x-content-type-options",
  "referrer-policy",
  "access-control-allow-origin",
  "access-control-expose-headers",
  "retry-after",
  "connection",
  "idempotent-replayed"
]

/** An answer with its request id (which differs by nature) and, for a 200, its generated ids and times taken out. */
const comparable = (reply: Reply) => {
  const requestId = reply.headers.get("x-request-id") ?? ""
  const headers = Object.fromEntries(HEADERS_COMPARED.map((name) => [name, reply.headers.get(name)]))
  const body = reply.status === 200 && reply.body !== undefined
    ? Object.keys(reply.body).sort()
    : reply.text.replaceAll(requestId, "REQUEST_ID")
  return { status: reply.status, hasRequestId: /^req_/.test(requestId), headers, body }
}

interface Case {
  readonly name: string
  readonly body?: string
  readonly json?: unknown
  readonly headers?: Record<string, string>
  /** No API key, or this one instead of the caller's. */
  readonly key?: string | null
  /** It answers 200 (else it is refused). */
  readonly answers?: boolean
}

const valid = {
  "/v1/chat/completions": { model: MODEL, messages: [{ role: "user", content: "Hi." }], max_tokens: 16 },
  "/v1/responses": { model: MODEL, input: "Hi.", max_output_tokens: 16 },
  "/v1/messages": { model: MODEL, messages: [{ role: "user", content: "Hi." }], max_tokens: 16 }
} as const

const casesFor = (path: keyof typeof valid): ReadonlyArray<Case> => {
  const body = valid[path]
  return [
    { name: "a valid call", json: body, answers: true },
    { name: "another model", json: { ...body, model: "gpt-4o" } },
    // The Responses API's model defaults to the one model.
    { name: "no model", json: { ...body, model: undefined }, answers: path === "/v1/responses" },
    { name: "a number for the model", json: { ...body, model: 4 } },
    { name: "an unknown field", json: { ...body, frobnicate: true }, answers: true },
    {
      name: "a negative output limit",
      json: path === "/v1/responses" ? { ...body, max_output_tokens: -1 } : { ...body, max_tokens: -1 }
    },
    // Anthropic's metadata is `user_id` alone: another field is not read.
    { name: "NUL in metadata", json: { ...body, metadata: { tag: "a\u0000b" } }, answers: path === "/v1/messages" },
    { name: "a JSON array", json: [body] },
    { name: "JSON null", body: "null", headers: { "content-type": "application/json" } },
    { name: "not JSON", body: "{\"model\":", headers: { "content-type": "application/json" } },
    { name: "no body", body: "" },
    { name: "a text body", body: JSON.stringify(body), headers: { "content-type": "text/plain" } },
    { name: "an empty Idempotency-Key", json: body, headers: { "idempotency-key": "" } },
    { name: "an Idempotency-Key of 300 characters", json: body, headers: { "idempotency-key": "k".repeat(300) } },
    // The payload is decoded before the headers, as the router's endpoint does.
    {
      name: "an empty Idempotency-Key and a number for the model",
      json: { ...body, model: 4 },
      headers: { "idempotency-key": "" }
    },
    { name: "no API key", json: body, key: null },
    { name: "a key of the wrong shape", json: body, key: "sk-not-ours" },
    { name: "a key that does not exist", json: body, key: `nns_test_${"0".repeat(32)}` },
    { name: "an Anthropic x-api-key header", json: body, key: null, headers: { "x-api-key": "nns_test_nope" } }
  ]
}

layer(TestServerWithUpstream({ rateLimitRpm: 100_000, rateLimitConcurrent: 100, ipAuthFailuresPerMinute: 100_000 }), {
  timeout: 120_000
})(
  "the lane and the router",
  (it) => {
    it.effect("answer every case of a corpus of valid and invalid calls alike, on each model endpoint", () =>
      Effect.gen(function*() {
        const { apiKey } = yield* caller("lane-corpus@example.com", { environment: "test" })
        for (const path of Object.keys(valid) as Array<keyof typeof valid>) {
          for (const testCase of casesFor(path)) {
            const key = testCase.key === undefined ? apiKey : testCase.key
            const send = (url: string) =>
              call("POST", url, {
                ...(key === null ? {} : { token: key }),
                ...(testCase.json === undefined ? {} : { json: testCase.json }),
                ...(testCase.body === undefined ? {} : { body: testCase.body }),
                ...(testCase.headers === undefined ? {} : { headers: testCase.headers })
              })
            const lane = comparable(yield* send(path))
            const router = comparable(yield* send(`${path}?via=router`))
            expect(lane, `${path}, ${testCase.name}`).toEqual(router)
            expect(lane.hasRequestId, `${path}, ${testCase.name}: a request id`).toBe(true)
            if (testCase.answers === true) expect(lane.status, `${path}, ${testCase.name}: answered`).toBe(200)
            else expect(lane.status, `${path}, ${testCase.name}: refused`).toBeGreaterThanOrEqual(400)
          }
        }
      }))
  }
)
