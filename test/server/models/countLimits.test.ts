import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { expectClientError } from "../../support/ErrorBody.js"
import { call } from "../../support/Http.js"
import { caller, TestServerWithUpstream, walletOf } from "../../support/Models.js"
import { query } from "../../support/TestServer.js"

/**
 * Count limits (docs/security.md, "Bounded work per request"): a request holds at most
 * 10,000 messages (Responses: input items), 20,000 content blocks and 512
 * tools. One over answers 400 `invalid_request` naming the param, on every
 * model endpoint, before anything is held or logged; at the limit it is
 * answered.
 */

const MESSAGES = 10_000
const BLOCKS = 20_000
const TOOLS = 512

type Endpoint = "/v1/chat/completions" | "/v1/responses" | "/v1/messages" | "/v1/messages/count_tokens"
type Limit = "messages" | "blocks" | "tools"

const ENDPOINTS: ReadonlyArray<Endpoint> = [
  "/v1/chat/completions",
  "/v1/responses",
  "/v1/messages",
  "/v1/messages/count_tokens"
]

const role = (i: number) => (i % 2 === 0 ? "user" : "assistant")

/** A body of `endpoint` with `count` of what `limit` limits. */
const bodyOf = (endpoint: Endpoint, limit: Limit, count: number): Record<string, unknown> => {
  const anthropic = endpoint.startsWith("/v1/messages")
  const responses = endpoint === "/v1/responses"
  const field = responses ? "input" : "messages"
  const message = (
    i: number,
    content: unknown
  ) => (responses ? { type: "message", role: role(i), content } : { role: role(i), content })
  const base = Object.assign(
    { model: "svc/nenas-flash" },
    endpoint === "/v1/messages/count_tokens" ? {} : responses ? { max_output_tokens: 16 } : { max_tokens: 16 }
  )
  switch (limit) {
    case "messages":
      return Object.assign(base, { [field]: Array.from({ length: count }, (_, i) => message(i, `turn ${i}`)) })
    case "blocks":
      // Two messages share the blocks: the limit is the request's, not a message's.
      return Object.assign(base, {
        [field]: [0, 1].map((i) =>
          message(
            0,
            Array.from(
              { length: Math.ceil(count / 2) - (i === 1 ? count % 2 : 0) },
              (_, j) => ({ type: responses ? "input_text" : "text", text: `b${j}` })
            )
          )
        )
      })
    case "tools": {
      const parameters = { type: "object", properties: {} }
      const tools = Array.from({ length: count }, (_, i) =>
        anthropic
          ? { name: `t${i}`, input_schema: parameters }
          : responses
          ? { type: "function", name: `t${i}`, parameters }
          : { type: "function", function: { name: `t${i}`, parameters } })
      return Object.assign(base, { [field]: [message(0, "Pick one.")], tools })
    }
  }
}

const LIMITS: ReadonlyArray<readonly [Limit, number]> = [["messages", MESSAGES], ["blocks", BLOCKS], ["tools", TOOLS]]

const CASES = ENDPOINTS.flatMap((endpoint) => LIMITS.map(([limit, most]) => [endpoint, limit, most] as const))

layer(TestServerWithUpstream(), { timeout: 300_000 })("count limits", (it) => {
  describe.each(CASES)("%s, %s", (endpoint, limit, most) => {
    it.effect(`one over the limit answers 400 naming the param; at the limit it is answered`, () =>
      Effect.gen(function*() {
        const live = yield* caller(`limits-${limit}@example.com`, { sen: 10_000 })
        const param = limit === "tools" ? "tools" : endpoint === "/v1/responses" ? "input" : "messages"
        const over = yield* call("POST", endpoint, { token: live.apiKey, json: bodyOf(endpoint, limit, most + 1) })
        if (endpoint.startsWith("/v1/messages")) {
          // Anthropic's error body: nenas's code and param inside `error`.
          expect(over.status, over.text.slice(0, 300)).toBe(400)
          expect(over.body.type).toBe("error")
          expect(over.body.error.code).toBe("invalid_request")
          expect(over.body.error.param).toBe(param)
        } else {
          expectClientError(over, { status: 400, code: "invalid_request", param })
        }
        expect(over.body.error.message).toContain(String(most))
        const requestId = over.headers.get("x-request-id")
        expect(yield* query("SELECT request_id FROM request_logs WHERE request_id = $1", [requestId])).toEqual([])
        expect(yield* query("SELECT request_id FROM reservations WHERE request_id = $1", [requestId])).toEqual([])
        expect((yield* walletOf(live.accountId)).reserved).toBe(0)

        const at = yield* call("POST", endpoint, { token: live.apiKey, json: bodyOf(endpoint, limit, most) })
        expect(at.status, at.text.slice(0, 300)).toBe(200)
      }))
  })
})
