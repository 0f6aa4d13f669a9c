import { expect, layer } from "@effect/vitest"
import formats from "ajv-formats"
import { Ajv2020 } from "ajv/dist/2020.js"
import { Effect } from "effect"
import { PUBLIC_MODEL } from "../../../src/Models/OpenAi/Api.js"
import { call, type Reply } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream } from "../../support/Models.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * A client generated from `/openapi.json` must accept every real answer: real calls through the server,
 * each body validated against the response schema the document declares for its path, method and status,
 * with objects closed (`additionalProperties: false` wherever a schema lists its properties) as a strict
 * generated client reads them. The security schemes and headers a client must send are declared too.
 */

type Json = Record<string, unknown>
type Operation = {
  readonly parameters?: ReadonlyArray<{ readonly name: string; readonly in: string; readonly required?: boolean }>
  readonly security?: ReadonlyArray<Record<string, ReadonlyArray<string>>>
  readonly responses: Record<string, { readonly content?: Record<string, { readonly schema?: unknown }> }>
}

const DOC_ID = "https://nenas.invalid/openapi.json"

/**
 * Every object schema that lists its properties is closed, as a strict generated client decodes it. The
 * `$id`s Effect gives `unknown` and `object` (`/schemas/unknown`, repeated) name no document: dropped.
 */
const closed = (node: unknown): unknown => {
  if (Array.isArray(node)) return node.map(closed)
  if (typeof node !== "object" || node === null) return node
  const out: Json = {}
  for (const [key, value] of Object.entries(node)) if (key !== "$id") out[key] = closed(value)
  if ("properties" in out && !("additionalProperties" in out) && !("patternProperties" in out)) {
    out["additionalProperties"] = false
  }
  return out
}

const pointer = (...parts: ReadonlyArray<string>) =>
  parts.map((p) => p.replace(/~/g, "~0").replace(/\//g, "~1")).join("/")

const openapi = Effect.map(call("GET", "/openapi.json"), (reply) => {
  expect(reply.status).toBe(200)
  const doc = reply.body as { paths: Record<string, Record<string, Operation>>; components: Json }
  const ajv = new Ajv2020({ strict: false, validateSchema: false, allErrors: true })
  // A CommonJS module: its function is both the module and its `default`.
  formats.default(ajv)
  ajv.addSchema(Object.assign(closed(doc) as Json, { $id: DOC_ID }))
  const operation = (path: string, method: string): Operation => {
    const op = doc.paths[path]?.[method]
    if (op === undefined) throw new Error(`${method} ${path} is not in /openapi.json`)
    return op
  }
  /** The reply's body is valid against the schema declared for its status and content type. */
  const expectValid = (path: string, method: string, reply: Reply, contentType = "application/json") => {
    const response = operation(path, method).responses[String(reply.status)]
    expect(response, `${method} ${path} declares ${reply.status}`).toBeDefined()
    const schema = response?.content?.[contentType]?.schema
    expect(schema, `${method} ${path} ${reply.status} declares a ${contentType} schema`).toBeDefined()
    const ref = `${DOC_ID}#/${
      pointer("paths", path, method, "responses", String(reply.status), "content", contentType, "schema")
    }`
    const validate = ajv.getSchema(ref)
    if (validate === undefined) throw new Error(`no schema at ${ref}`)
    const ok = validate(reply.body)
    const errors = ok
      ? []
      : (validate.errors ?? []).map((e) => `${e.instancePath} ${e.message} ${JSON.stringify(e.params)}`)
    expect(errors.join("\n"), `${method} ${path} ${reply.status}: ${reply.text.slice(0, 200)}`).toBe("")
  }
  return { doc, operation, expectValid }
})

const anthropic = (apiKey: string, json: unknown) =>
  call("POST", "/v1/messages", { headers: { "x-api-key": apiKey, "anthropic-version": "2023-06-01" }, json })

const USAGE = { prompt_tokens: 40, completion_tokens: 12, cached_tokens: 8, reasoning_tokens: 4 }

layer(TestServerWithUpstream(), { excludeTestServices: true, timeout: 60_000 })(
  "/openapi.json describes the real answers",
  (it) => {
    it.effect("model calls, plain: chat, responses (incomplete too) and messages, live and test keys", () =>
      Effect.gen(function*() {
        const { expectValid } = yield* openapi
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({ kind: "ok", text: "Kuala Lumpur.", usage: USAGE })
        const live = yield* caller("openapi-live@example.com", { sen: 1000 })
        const test = yield* caller("openapi-test@example.com", { environment: "test" })
        for (const who of [live, test]) {
          const chat = yield* modelCall(who.apiKey, "/v1/chat/completions", {
            model: PUBLIC_MODEL,
            messages: [{ role: "user", content: "Capital of Malaysia?" }],
            max_tokens: 50
          })
          expect(chat.status, chat.text).toBe(200)
          expectValid("/v1/chat/completions", "post", chat)
          const responses = yield* modelCall(who.apiKey, "/v1/responses", {
            model: PUBLIC_MODEL,
            input: "Capital of Malaysia?"
          })
          expect(responses.status, responses.text).toBe(200)
          expectValid("/v1/responses", "post", responses)
          const stored = yield* call("GET", `/v1/responses/${responses.body.id}`, { token: who.apiKey })
          expect(stored.status, stored.text).toBe(200)
          expectValid("/v1/responses/{response_id}", "get", stored)
          const message = yield* anthropic(who.apiKey, {
            model: PUBLIC_MODEL,
            max_tokens: 50,
            messages: [{ role: "user", content: "Capital of Malaysia?" }]
          })
          expect(message.status, message.text).toBe(200)
          expectValid("/v1/messages", "post", message)
        }
        upstream.setBehaviour({ kind: "ok", text: "Kuala", finishReason: "length", usage: USAGE })
        const cut = yield* modelCall(live.apiKey, "/v1/responses", {
          model: PUBLIC_MODEL,
          input: "Capital?",
          max_output_tokens: 16
        })
        expect(cut.body.incomplete_details).toEqual({ reason: "max_output_tokens" })
        expectValid("/v1/responses", "post", cut)
        const cutChat = yield* modelCall(live.apiKey, "/v1/chat/completions", {
          model: PUBLIC_MODEL,
          messages: [{ role: "user", content: "Capital?" }],
          max_tokens: 16,
          logprobs: true
        })
        expectValid("/v1/chat/completions", "post", cutChat)
        const models = yield* call("GET", "/v1/models", { token: live.apiKey })
        expectValid("/v1/models", "get", models)
        const count = yield* call("POST", "/v1/messages/count_tokens", {
          headers: { "x-api-key": live.apiKey },
          json: { model: PUBLIC_MODEL, messages: [{ role: "user", content: "Hi" }] }
        })
        expectValid("/v1/messages/count_tokens", "post", count)
      }))

    it.effect("errors of each model endpoint: 400, 401, 402, 404; /v1/messages in Anthropic's body", () =>
      Effect.gen(function*() {
        const { expectValid } = yield* openapi
        const broke = yield* caller("openapi-broke@example.com")
        const cases: ReadonlyArray<readonly [string, unknown]> = [
          ["/v1/chat/completions", {
            model: PUBLIC_MODEL,
            messages: [{ role: "user", content: "Hi" }],
            max_tokens: 10
          }],
          ["/v1/responses", { model: PUBLIC_MODEL, input: "Hi", max_output_tokens: 10 }],
          ["/v1/messages", { model: PUBLIC_MODEL, messages: [{ role: "user", content: "Hi" }], max_tokens: 10 }]
        ]
        for (const [path, body] of cases) {
          const unauthenticated = yield* modelCall("nns_live_notakey", path, body)
          expect(unauthenticated.status, unauthenticated.text).toBe(401)
          expectValid(path, "post", unauthenticated)
          const invalid = yield* modelCall(broke.apiKey, path, Object.assign({}, body, { model: "no-such-model" }))
          expect(invalid.status === 400 || invalid.status === 404, invalid.text).toBe(true)
          expectValid(path, "post", invalid)
          const malformed = yield* call("POST", path, {
            token: broke.apiKey,
            body: "{not json",
            headers: { "content-type": "application/json" }
          })
          expect(malformed.status, malformed.text).toBe(400)
          expectValid(path, "post", malformed)
          const unpaid = yield* modelCall(broke.apiKey, path, body)
          expect(unpaid.status, unpaid.text).toBe(402)
          expectValid(path, "post", unpaid)
        }
        const message = yield* anthropic("nns_live_notakey", cases[2]?.[1])
        expect(message.body).toMatchObject({ type: "error", error: { type: "authentication_error" } })
        const missing = yield* call("GET", "/v1/responses/resp_doesnotexist", { token: broke.apiKey })
        expect(missing.status).toBe(404)
        expectValid("/v1/responses/{response_id}", "get", missing)
      }))

    it.effect("dashboard reads and their errors", () =>
      Effect.gen(function*() {
        const { expectValid } = yield* openapi
        const who = yield* caller("openapi-dashboard@example.com", { sen: 1000 })
        for (
          const path of [
            "/dashboard/api-keys",
            "/dashboard/billing/balance",
            "/dashboard/billing/transactions",
            "/dashboard/logs",
            "/dashboard/accounts",
            "/dashboard/members"
          ]
        ) {
          const reply = yield* call("GET", path, { token: who.token })
          expect(reply.status, `${path}: ${reply.text}`).toBe(200)
          expectValid(path, "get", reply)
        }
        const unauthenticated = yield* call("GET", "/dashboard/api-keys", { token: "not-a-session" })
        expect(unauthenticated.status).toBe(401)
        expectValid("/dashboard/api-keys", "get", unauthenticated)
      }))

    it.effect("declared: the x-api-key scheme beside Bearer on /v1, server-sent events, Nenas-Account and Stripe-Signature", () =>
      Effect.gen(function*() {
        const { doc, operation } = yield* openapi
        const schemes = (doc.components["securitySchemes"] ?? {}) as Record<string, Json>
        const xApiKey = Object.entries(schemes).find(([, s]) =>
          s["type"] === "apiKey" && s["in"] === "header" && String(s["name"]).toLowerCase() === "x-api-key"
        )
        expect(xApiKey, "an apiKey scheme for the x-api-key header").toBeDefined()
        const bearer = Object.entries(schemes).filter(([, s]) => s["type"] === "http" && s["scheme"] === "bearer").map((
          [name]
        ) => name)
        for (const path of ["/v1/messages", "/v1/messages/count_tokens", "/v1/chat/completions", "/v1/responses"]) {
          const names = (operation(path, "post").security ?? []).flatMap((s) => Object.keys(s))
          expect(names, `${path} accepts x-api-key`).toContain(xApiKey?.[0])
          expect(names.some((name) => bearer.includes(name)), `${path} accepts Bearer`).toBe(true)
        }
        for (const path of ["/v1/messages", "/v1/chat/completions", "/v1/responses"]) {
          const content = operation(path, "post").responses["200"]?.content ?? {}
          expect(Object.keys(content), `${path} streams`).toEqual(
            expect.arrayContaining(["application/json", "text/event-stream"])
          )
        }
        const dashboard = Object.entries(doc.paths).filter(([path]) => path.startsWith("/dashboard/"))
        expect(dashboard.length).toBeGreaterThan(10)
        for (const [path, methods] of dashboard) {
          for (const [method, op] of Object.entries(methods)) {
            const header = (op.parameters ?? []).find((p) =>
              p.in === "header" && p.name.toLowerCase() === "nenas-account"
            )
            expect(header, `${method} ${path} declares Nenas-Account`).toBeDefined()
            expect(header?.required ?? false).toBe(false)
          }
        }
        const signature = (operation("/billing/stripe/webhook", "post").parameters ?? [])
          .find((p) => p.in === "header" && p.name.toLowerCase() === "stripe-signature")
        expect(signature, "the Stripe webhook declares Stripe-Signature").toMatchObject({ required: true })
      }))
  }
)
