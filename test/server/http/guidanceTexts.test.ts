import { describe, expect, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import { readFileSync } from "node:fs"
import {
  InsufficientBalance,
  insufficientBalanceGuidance,
  keyEditAction,
  NEGATIVE_BALANCE_GUIDANCE,
  SpendLimitExceeded,
  toErrorBody,
  UnsupportedInput
} from "../../../src/Domain/Errors.js"
import { forCaller } from "../../../src/Models/Call/ModelCalls.js"
import { SIMULATED_MODEL } from "../../../src/Providers/Simulated.js"
import { decideRoute } from "../../../src/Routing/Router.js"
import { call, type Reply } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream } from "../../support/Models.js"
import { query } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/** Every answer true: each answer says what is so. */

const CHAT = "/v1/chat/completions"
const RESPONSES = "/v1/responses"
const MODEL = "svc/nenas-flash"
const DASH = "https://dash.test"
const RPM = 6

const errorOf = (reply: Reply, status: number, code: string) => {
  expect(reply.status, reply.text).toBe(status)
  expect(reply.body.error.code).toBe(code)
  return reply.body.error as {
    message: string
    guidance: string
    action_url: string | null
    request_id: string
    param: string | null
  }
}

describe("guidance texts (no database)", () => {
  it("unsupported_input's guidance no longer claims only text is accepted, and points at the message and param", () => {
    const body = toErrorBody(
      new UnsupportedInput({
        message: "Content parts of type 'input_audio' are not supported here; text and images are accepted.",
        param: "messages[0].content[1]"
      }),
      "req_1",
      DASH
    )
    expect(body.error.guidance).not.toMatch(/only text/i)
    expect(body.error.guidance).toMatch(/param/)
    expect(body.error.message).toMatch(/'input_audio'/)
  })

  it("insufficient_balance names each endpoint's own output field; a negative balance's guidance says top up, not lower", () => {
    const plain = new InsufficientBalance({ message: "short" })
    const chat = toErrorBody(forCaller(plain, "/v1/chat/completions", "key_1"), "req_1", DASH).error
    const responses = toErrorBody(forCaller(plain, "/v1/responses", "key_1"), "req_1", DASH).error
    expect(chat.guidance).toBe(insufficientBalanceGuidance("max_tokens"))
    expect(chat.guidance).toMatch(/\bmax_tokens\b/)
    expect(chat.guidance).not.toMatch(/max_output_tokens/)
    expect(responses.guidance).toMatch(/\bmax_output_tokens\b/)
    expect(chat.action_url).toBe(`${DASH}/billing`)
    const negative = new InsufficientBalance({ message: "negative", guidance: NEGATIVE_BALANCE_GUIDANCE })
    const told = toErrorBody(forCaller(negative, "/v1/chat/completions", "key_1"), "req_1", DASH).error
    expect(told.guidance).toBe(NEGATIVE_BALANCE_GUIDANCE)
    expect(told.guidance).toMatch(/negative/)
    expect(told.guidance).not.toMatch(/max_tokens|lower|smaller/)
  })

  it("spend_limit_exceeded links to that key's edit view; other errors keep their code's page", () => {
    const refused = forCaller(new SpendLimitExceeded({ message: "over" }), "/v1/responses", "key_abc")
    expect(toErrorBody(refused, "req_1", DASH).error.action_url).toBe(`${DASH}/api-keys?edit=key_abc`)
    expect(keyEditAction("key_abc")).toBe("/api-keys?edit=key_abc")
    expect(toErrorBody(new SpendLimitExceeded({ message: "over" }), "req_1", DASH).error.action_url).toBe(
      `${DASH}/api-keys`
    )
  })

  it("reasoning.effort low keeps general even for a multi-step prompt; absent (medium) lets the router decide", () => {
    const models = { general: "g", reasoning: "r" }
    const messages = [{ role: "user" as const, content: "Prove step by step that there are infinitely many primes." }]
    expect(decideRoute(models, { messages, effort: "low", webSearch: "off" })).toMatchObject({
      category: "general",
      upstreamModel: "g"
    })
    expect(decideRoute(models, { messages, effort: "medium", webSearch: "off" })).toMatchObject({
      category: "reasoning",
      upstreamModel: "r"
    })
  })

  it("docs/operations.md lists every Stripe event the webhook handles, and no stale settlement-queue line", () => {
    const payments = readFileSync(new URL("../../../src/Billing/Payments.ts", import.meta.url), "utf8")
    const handled = [...payments.matchAll(/^\s+"((?:charge|checkout)\.[a-z_.]+)": /gm)].map((match) => match[1])
    expect(handled).toEqual(
      expect.arrayContaining(["charge.dispute.funds_withdrawn", "charge.dispute.funds_reinstated"])
    )
    const readme = readFileSync(new URL("../../../docs/operations.md", import.meta.url), "utf8")
    const stripe = readme.slice(readme.indexOf("- **Stripe.**"), readme.indexOf("- **Upstream model.**"))
    for (const event of handled) expect(stripe, event).toContain(`\`${event}\``)
    expect(readme).not.toMatch(/no settlement queue/)
  })
})

layer(TestServerWithUpstream({ dashboardUrl: DASH, rateLimitRpm: RPM, rateLimitConcurrent: 100 }), { timeout: 60_000 })(
  "answers over HTTP",
  (it) => {
    it.effect("a 402 is replayed under its Idempotency-Key after a top-up: same status, body and request id, nothing run or billed", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { accountId, apiKey, keyId } = yield* caller("true-replay402@example.com")
        const body = { model: MODEL, messages: [{ role: "user", content: "Say hi." }], max_tokens: 100 }
        const headers = { "Idempotency-Key": "replay-402" }
        const first = yield* modelCall(apiKey, CHAT, body, headers)
        const error = errorOf(first, 402, "insufficient_balance")
        expect(error.guidance).toMatch(/\bmax_tokens\b/)
        expect(error.request_id).toBe(first.headers.get("x-request-id"))

        yield* query(`UPDATE wallets SET available_micro_myr = available_micro_myr + 10000000 WHERE account_id = $1`, [
          accountId
        ])
        const again = yield* modelCall(apiKey, CHAT, body, headers)
        expect(again.status).toBe(402)
        expect(again.headers.get("idempotent-replayed")).toBe("true")
        expect(again.text).toBe(first.text)
        expect(again.headers.get("x-request-id")).toBe(error.request_id)
        expect(upstream.requests.length, "nothing ran").toBe(0)
        const records = yield* query<{ response_status: number }>(
          `SELECT response_status FROM idempotency_records WHERE api_key_id = $1`,
          [keyId]
        )
        expect(records.map((r) => r.response_status)).toEqual([402])
        const rows = yield* query<{ status: string; usage_source: string; error_code: string }>(
          `SELECT status, usage_source, error_code FROM request_logs WHERE account_id = $1`,
          [accountId]
        )
        expect(rows, "the refused call's row: its tokens are our count").toEqual([
          { status: "failed", usage_source: "estimated", error_code: "insufficient_balance" }
        ])
      }))

    it.effect("insufficient_balance on responses names max_output_tokens; a negative balance says so", () =>
      Effect.gen(function*() {
        const { accountId, apiKey } = yield* caller("true-negative@example.com")
        const empty = errorOf(
          yield* modelCall(apiKey, RESPONSES, { model: MODEL, input: "Hi.", max_output_tokens: 50 }),
          402,
          "insufficient_balance"
        )
        expect(empty.guidance).toMatch(/\bmax_output_tokens\b/)
        yield* query(`UPDATE wallets SET available_micro_myr = -5000 WHERE account_id = $1`, [accountId])
        const negative = errorOf(
          yield* modelCall(apiKey, RESPONSES, { model: MODEL, input: "Hi.", max_output_tokens: 50 }),
          402,
          "insufficient_balance"
        )
        expect(negative.message).toMatch(/negative/)
        expect(negative.guidance).toBe(NEGATIVE_BALANCE_GUIDANCE)
      }))

    it.effect("spend_limit_exceeded's action_url opens that key's edit view", () =>
      Effect.gen(function*() {
        const { apiKey, keyId } = yield* caller("true-limit@example.com", {
          sen: 1000,
          key: { monthly_spend_limit_myr: 0.000001 }
        })
        const error = errorOf(
          yield* modelCall(apiKey, CHAT, { model: MODEL, messages: [{ role: "user", content: "Hi." }] }),
          402,
          "spend_limit_exceeded"
        )
        expect(error.action_url).toBe(`${DASH}/api-keys?edit=${keyId}`)
      }))

    it.effect("unsupported_input names what is unsupported, and its guidance does not deny images", () =>
      Effect.gen(function*() {
        const { apiKey } = yield* caller("true-unsupported@example.com", { environment: "test" })
        const reply = yield* modelCall(apiKey, CHAT, {
          model: MODEL,
          messages: [{ role: "user", content: [{ type: "input_audio", input_audio: { data: "AAAA", format: "wav" } }] }]
        })
        const error = errorOf(reply, 400, "unsupported_input")
        expect(error.message).toMatch(/'input_audio'/)
        expect(error.message).toMatch(/images/)
        expect(error.guidance).not.toMatch(/only text/i)
      }))

    it.effect("a test key's routing.upstream_model and log row name the simulated model, on both endpoints", () =>
      Effect.gen(function*() {
        const { accountId, apiKey } = yield* caller("true-simulated@example.com", { environment: "test" })
        const responses = yield* modelCall(apiKey, RESPONSES, { model: MODEL, input: "Say hi." })
        expect(responses.status, responses.text).toBe(200)
        expect(responses.body.routing.upstream_model).toBe(SIMULATED_MODEL)
        const rows = yield* query<{ upstream_model: string }>(
          `SELECT upstream_model FROM request_logs WHERE account_id = $1`,
          [accountId]
        )
        expect(rows.map((r) => r.upstream_model)).toEqual([SIMULATED_MODEL])
      }))

    it.effect("a test key's simulated text names the model its routing names, not the upstream's", () =>
      Effect.gen(function*() {
        const { apiKey } = yield* caller("true-simulated-text@example.com", { environment: "test" })
        const responses = yield* modelCall(apiKey, RESPONSES, { model: MODEL, input: "Say hi." })
        expect(responses.status, responses.text).toBe(200)
        const routed: string = responses.body.routing.upstream_model
        const named = (text: string) => /\bfrom ([\w.:-]+) to:/.exec(text)?.[1]
        expect(named(responses.body.output_text), responses.body.output_text).toBe(routed)
        const chat = yield* modelCall(apiKey, CHAT, { model: MODEL, messages: [{ role: "user", content: "Say hi." }] })
        expect(chat.status, chat.text).toBe(200)
        // Chat carries no routing object: its text names the same model as the responses call's routing.
        expect(named(chat.body.choices[0].message.content), chat.text).toBe(routed)
      }))

    it.effect("reasoning.effort low keeps a multi-step prompt on the general route over HTTP; medium lets the router send it to reasoning", () =>
      Effect.gen(function*() {
        const { apiKey } = yield* caller("true-low@example.com", { environment: "test" })
        const input = "Prove step by step that there are infinitely many primes."
        const low = yield* modelCall(apiKey, RESPONSES, { model: MODEL, input, reasoning: { effort: "low" } })
        expect(low.body.routing.category, low.text).toBe("general")
        const chatLow = yield* modelCall(apiKey, CHAT, {
          model: MODEL,
          messages: [{ role: "user", content: input }],
          reasoning_effort: "low"
        })
        expect(chatLow.body.choices[0].message.content, chatLow.text).toBeTypeOf("string")
        const medium = yield* modelCall(apiKey, RESPONSES, { model: MODEL, input })
        expect(medium.body.routing.category, medium.text).toBe("reasoning")
      }))

    it.effect("chat takes null for the fields OpenAI takes null for, as if absent", () =>
      Effect.gen(function*() {
        const { apiKey } = yield* caller("true-nulls@example.com", { environment: "test" })
        const reply = yield* modelCall(apiKey, CHAT, {
          model: MODEL,
          messages: [{ role: "user", content: "Say hi." }],
          temperature: null,
          top_p: null,
          max_tokens: null,
          max_completion_tokens: null,
          n: null,
          reasoning_effort: null,
          stream: null,
          presence_penalty: null,
          frequency_penalty: null,
          logit_bias: null,
          logprobs: null,
          top_logprobs: null,
          seed: null,
          stop: null,
          tools: null,
          tool_choice: null,
          response_format: null,
          stream_options: null,
          parallel_tool_calls: null,
          metadata: null,
          service_tier: null,
          store: null
        })
        expect(reply.status, reply.text).toBe(200)
        expect(reply.body.object).toBe("chat.completion")
      }))

    it.effect("GET /v1/models is rate limited per key: past the minute's allowance it answers 429 with retry_after_seconds", () =>
      Effect.gen(function*() {
        const { apiKey } = yield* caller("true-models@example.com", { environment: "test" })
        const other = yield* caller("true-models-other@example.com", { environment: "test" })
        const replies: Array<Reply> = []
        for (let i = 0; i <= RPM; i++) replies.push(yield* call("GET", "/v1/models", { token: apiKey }))
        expect(replies.slice(0, RPM).map((r) => r.status)).toEqual(Array(RPM).fill(200))
        const refused = errorOf(replies[RPM] as Reply, 429, "rate_limit_exceeded")
        expect(refused).toHaveProperty("retry_after_seconds")
        expect((yield* call("GET", "/v1/models", { token: other.apiKey })).status, "another key is not limited by it")
          .toBe(200)
      }))
  }
)
