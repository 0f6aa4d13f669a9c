import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { toMyrString } from "../../../src/Domain/Money.js"
import { costOf, DEFAULT_PRICES, withSafetyMargin } from "../../../src/Domain/Prices.js"
import type { Message } from "../../../src/Domain/Tokens.js"
import { countMessages } from "../../../src/Domain/Tokens.js"
import { SIMULATED_MODEL } from "../../../src/Providers/Simulated.js"
import { call, createKey, type Reply } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream, violations, walletOf } from "../../support/Models.js"
import { query, TestServer } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * The limits of the model calls (docs/api/models.md, "Model API details";
 * docs/security.md, "Bounded work per request"; docs/api/errors.md, "Errors";
 * docs/money.md, "The money rules";
 * docs/money.md, "Request lifecycle and logs"): every refused parameter with
 * its `param`, input the service does not take yet, the per-request cost cap,
 * spend limits and balance, the context window, suspended accounts, test keys,
 * and the log row a successful call leaves.
 */

const RESPONSES = "/v1/responses"
const CHAT = "/v1/chat/completions"
const MODEL = "svc/nenas-flash"
const GENERAL = "gpt-4.1-mini"
const REASONING = "o4-mini"
/** 1000 sen. */
const TEN_RINGGIT = 10_000_000

const PROMPT = "Say hello"
const responsesBody = (extra: Record<string, unknown> = {}) => ({ input: PROMPT, ...extra })
const chatBody = (extra: Record<string, unknown> = {}) => ({
  model: MODEL,
  messages: [{ role: "user", content: PROMPT }],
  ...extra
})

const ERROR_KEYS = ["message", "type", "code", "param", "request_id", "guidance", "action_url", "retryable"] as const

/** The spec's error body with this status, code, type and (when given) param; `name` labels every assertion. */
const expectError = (
  reply: Reply,
  name: string,
  expected: { readonly status: number; readonly code: string; readonly type: string; readonly param?: string | null }
) => {
  expect(reply.status, `${name}: status (${reply.text.slice(0, 500)})`).toBe(expected.status)
  expect(reply.body?.type, `${name}: body.type`).toBe("error")
  const error = reply.body.error
  for (const key of ERROR_KEYS) expect(Object.keys(error), `${name}: error.${key} present`).toContain(key)
  expect(error.code, `${name}: error.code`).toBe(expected.code)
  expect(error.type, `${name}: error.type`).toBe(expected.type)
  expect(error.request_id, `${name}: x-request-id equals error.request_id`).toBe(reply.headers.get("x-request-id"))
  if (expected.param !== undefined) expect(error.param, `${name}: error.param`).toBe(expected.param)
  return error
}

const expectInvalid = (reply: Reply, name: string, param: string) => {
  const error = expectError(reply, name, { status: 400, code: "invalid_request", type: "invalid_request_error", param })
  expect(error.retryable, `${name}: retryable`).toBe(false)
  return error
}

const expectOk = (reply: Reply, name: string) => {
  expect(reply.status, `${name}: status (${reply.text.slice(0, 500)})`).toBe(200)
  return reply.body
}

/** The estimated maximum of a call to the general model, as docs/money.md, "The money rules" defines it. */
const estimateOf = (messages: ReadonlyArray<Message>, outputTokens: number, model = GENERAL) =>
  costOf(DEFAULT_PRICES, model, {
    inputTokens: withSafetyMargin(countMessages(messages)),
    cachedTokens: 0,
    outputTokens,
    searches: 0,
    pages: 0
  })

const USER_PROMPT: ReadonlyArray<Message> = [{ role: "user", content: PROMPT }]

/** `cost_myr` ("0.001234") as micro-MYR. */
const micro = (costMyr: string) => {
  expect(costMyr, "cost_myr has 6 decimals").toMatch(/^\d+\.\d{6}$/)
  return Math.round(Number(costMyr) * 1_000_000)
}

const countOf = (sql: string, values: Array<unknown>) =>
  Effect.map(query<{ n: string }>(sql, values), (rows) => Number(rows[0]?.n))

const reservationsOf = (accountId: string) =>
  countOf("SELECT count(*) AS n FROM reservations WHERE account_id = $1", [accountId])
const logCountOf = (accountId: string) =>
  countOf("SELECT count(*) AS n FROM request_logs WHERE account_id = $1", [accountId])
const usageEntriesOf = (accountId: string) =>
  Effect.map(
    query<{ amount: string }>(
      "SELECT amount_micro_myr AS amount FROM ledger_entries WHERE account_id = $1 AND type = 'usage' ORDER BY created_at",
      [accountId]
    ),
    (rows) => rows.map((row) => Number(row.amount))
  )

interface LogRow {
  readonly request_id: string
  readonly api_key_id: string
  readonly public_model: string
  readonly upstream_model: string | null
  readonly routing_category: string | null
  readonly endpoint: string
  readonly status: string
  readonly input_tokens: number
  readonly output_tokens: number
  readonly reasoning_tokens: number
  readonly usage_source: string
  readonly search_count: number
  readonly cost_micro_myr: string
  readonly latency_ms: number
  readonly error_code: string | null
  readonly reservation_id: string | null
}

const logOf = (requestId: string) =>
  Effect.map(
    query<LogRow & Record<string, unknown>>("SELECT * FROM request_logs WHERE request_id = $1", [requestId]),
    (rows) => {
      expect(rows.length, `one request_logs row for ${requestId}`).toBe(1)
      return rows[0] as LogRow
    }
  )

/** Nothing happened to the account's money, no log and the upstream never heard of it. */
const expectUntouched = (accountId: string, available: number) =>
  Effect.gen(function*() {
    const upstream = yield* Upstream
    expect(upstream.requests.length, "the upstream was not called").toBe(0)
    expect(yield* reservationsOf(accountId), "no reservation").toBe(0)
    expect(yield* walletOf(accountId)).toEqual({ available, reserved: 0, spent: 0 })
    expect(yield* violations(accountId)).toEqual([])
  })

layer(TestServerWithUpstream(), { excludeTestServices: true })("model call limits", (it) => {
  describe("parameters outside the limits", () => {
    it.effect("POST /v1/responses refuses each with invalid_request naming the parameter; nothing runs", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { accountId, apiKey } = yield* caller("limits-responses@example.com", { sen: 1000 })
        const cases: ReadonlyArray<readonly [string, Record<string, unknown>, string]> = [
          ["max_output_tokens 0", responsesBody({ max_output_tokens: 0 }), "max_output_tokens"],
          ["max_output_tokens 32001", responsesBody({ max_output_tokens: 32001 }), "max_output_tokens"],
          ["max_output_tokens 1.5", responsesBody({ max_output_tokens: 1.5 }), "max_output_tokens"],
          [
            "web_search.max_results 0",
            responsesBody({ web_search: { mode: "on", max_results: 0 } }),
            "web_search.max_results"
          ],
          [
            "web_search.max_results 26",
            responsesBody({ web_search: { mode: "on", max_results: 26 } }),
            "web_search.max_results"
          ],
          [
            "web_search.max_searches 0",
            responsesBody({ web_search: { mode: "on", max_searches: 0 } }),
            "web_search.max_searches"
          ],
          [
            "web_search.max_searches 6",
            responsesBody({ web_search: { mode: "on", max_searches: 6 } }),
            "web_search.max_searches"
          ],
          [
            "web_search.content.max_pages 0",
            responsesBody({ web_search: { mode: "on", content: { enabled: true, max_pages: 0 } } }),
            "web_search.content.max_pages"
          ],
          [
            "web_search.content.max_pages 11",
            responsesBody({ web_search: { mode: "on", content: { enabled: true, max_pages: 11 } } }),
            "web_search.content.max_pages"
          ],
          ["web_search.mode sometimes", responsesBody({ web_search: { mode: "sometimes" } }), "web_search.mode"],
          ["reasoning.effort max", responsesBody({ reasoning: { effort: "max" } }), "reasoning.effort"],
          ["max_total_cost_myr 0", responsesBody({ max_total_cost_myr: 0 }), "max_total_cost_myr"],
          ["max_total_cost_myr -1", responsesBody({ max_total_cost_myr: -1 }), "max_total_cost_myr"],
          ["model gpt-4", responsesBody({ model: "gpt-4" }), "model"],
          ["missing input", { model: MODEL }, "input"],
          ["temperature 2.1", responsesBody({ temperature: 2.1 }), "temperature"]
        ]
        for (const [name, body, param] of cases) {
          expectInvalid(yield* modelCall(apiKey, RESPONSES, body), `responses ${name}`, param)
        }
        expect(yield* logCountOf(accountId), "refused bodies leave no log rows").toBe(0)
        yield* expectUntouched(accountId, TEN_RINGGIT)
      }))

    it.effect("POST /v1/chat/completions refuses each with invalid_request naming the parameter; nothing runs", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { accountId, apiKey } = yield* caller("limits-chat@example.com", { sen: 1000 })
        const cases: ReadonlyArray<readonly [string, Record<string, unknown>, string]> = [
          ["max_tokens 0", chatBody({ max_tokens: 0 }), "max_tokens"],
          ["max_tokens 32001", chatBody({ max_tokens: 32001 }), "max_tokens"],
          ["max_completion_tokens 32001", chatBody({ max_completion_tokens: 32001 }), "max_completion_tokens"],
          ["temperature -0.1", chatBody({ temperature: -0.1 }), "temperature"],
          ["temperature 2.1", chatBody({ temperature: 2.1 }), "temperature"],
          ["messages []", chatBody({ messages: [] }), "messages"],
          ["max_total_cost_myr 0", chatBody({ max_total_cost_myr: 0 }), "max_total_cost_myr"],
          ["max_total_cost_myr -1", chatBody({ max_total_cost_myr: -1 }), "max_total_cost_myr"],
          ["model gpt-4", chatBody({ model: "gpt-4" }), "model"],
          ["n 2", chatBody({ n: 2 }), "n"],
          ["messages[0].role robot", chatBody({ messages: [{ role: "robot", content: PROMPT }] }), "messages[0].role"]
        ]
        for (const [name, body, param] of cases) {
          expectInvalid(yield* modelCall(apiKey, CHAT, body), `chat ${name}`, param)
        }
        expect(yield* logCountOf(accountId), "refused bodies leave no log rows").toBe(0)
        yield* expectUntouched(accountId, TEN_RINGGIT)
      }))

    it.effect("the edges of each range pass: max_output_tokens and max_tokens 1 and 32000, temperature 0 and 2", () =>
      Effect.gen(function*() {
        const { apiKey } = yield* caller("limits-edges@example.com", { environment: "test" })
        const passing: ReadonlyArray<readonly [string, string, Record<string, unknown>]> = [
          ["responses max_output_tokens 1", RESPONSES, responsesBody({ max_output_tokens: 1 })],
          ["responses max_output_tokens 32000", RESPONSES, responsesBody({ max_output_tokens: 32000 })],
          ["chat max_tokens 1", CHAT, chatBody({ max_tokens: 1 })],
          ["chat max_tokens 32000", CHAT, chatBody({ max_tokens: 32000 })],
          ["chat max_completion_tokens 32000", CHAT, chatBody({ max_completion_tokens: 32000 })],
          ["chat temperature 0", CHAT, chatBody({ temperature: 0 })],
          ["chat temperature 2", CHAT, chatBody({ temperature: 2 })],
          ["responses temperature 0", RESPONSES, responsesBody({ temperature: 0 })],
          ["responses temperature 2", RESPONSES, responsesBody({ temperature: 2 })],
          [
            "web_search at its maxima",
            RESPONSES,
            responsesBody({
              web_search: { mode: "on", max_results: 25, max_searches: 5, content: { enabled: true, max_pages: 10 } }
            })
          ],
          [
            "web_search at its minima",
            RESPONSES,
            responsesBody({
              web_search: { mode: "on", max_results: 1, max_searches: 1, content: { enabled: true, max_pages: 1 } }
            })
          ]
        ]
        for (const [name, path, body] of passing) expectOk(yield* modelCall(apiKey, path, body), name)
        // One output token: the answer stops at the cap (the simulated model cuts at a word, so at most 1).
        const one = expectOk(yield* modelCall(apiKey, RESPONSES, responsesBody({ max_output_tokens: 1 })), "one token")
        expect(one.usage.output_tokens).toBeLessThanOrEqual(1)
        const oneChat = expectOk(yield* modelCall(apiKey, CHAT, chatBody({ max_tokens: 1 })), "one chat token")
        expect(oneChat.choices[0].finish_reason).toBe("length")
        expect(oneChat.usage.completion_tokens).toBeLessThanOrEqual(1)
      }))
  })

  describe("input the service does not take", () => {
    it.effect("unsupported_input names the item or content part; not_implemented names the field", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { accountId, apiKey } = yield* caller("limits-unsupported@example.com", { sen: 1000 })
        const unsupported: ReadonlyArray<readonly [string, string, Record<string, unknown>, string]> = [
          ["a reasoning item", RESPONSES, { input: [{ type: "reasoning", id: "rs_1", summary: [] }] }, "input[0]"],
          ["an input_file content part after text", RESPONSES, {
            input: [{
              role: "user",
              content: [{ type: "input_text", text: "Read this" }, { type: "input_file", file_id: "f1" }]
            }]
          }, "input[0].content[1]"],
          ["an image by file_id", RESPONSES, {
            input: [{ role: "user", content: [{ type: "input_image", file_id: "file_1", detail: "auto" }] }]
          }, "input[0].content[0]"],
          [
            "a file_search tool",
            RESPONSES,
            responsesBody({ tools: [{ type: "file_search", vector_store_ids: ["vs_1"] }] }),
            "tools[0]"
          ],
          [
            "a chat input_audio part",
            CHAT,
            chatBody({
              messages: [{
                role: "user",
                content: [{ type: "input_audio", input_audio: { data: "AAAA", format: "wav" } }]
              }]
            }),
            "messages[0].content[0]"
          ],
          [
            "a chat function message",
            CHAT,
            chatBody({
              messages: [{ role: "user", content: PROMPT }, { role: "function", name: "f", content: "42" }]
            }),
            "messages[1]"
          ]
        ]
        for (const [name, path, body, param] of unsupported) {
          const error = expectError(yield* modelCall(apiKey, path, body), name, {
            status: 400,
            code: "unsupported_input",
            type: "invalid_request_error",
            param
          })
          expect(error.retryable, `${name}: retryable`).toBe(false)
        }
        const notImplemented: ReadonlyArray<readonly [string, Record<string, unknown>, string]> = [
          [CHAT, chatBody({ functions: [{ name: "f", parameters: {} }] }), "functions"],
          [CHAT, chatBody({ prediction: { type: "content", content: "x" } }), "prediction"],
          // previous_response_id and item_reference are stored responses' (test/storedResponses.test.ts).
          [RESPONSES, responsesBody({ conversation: "conv_123" }), "conversation"],
          [RESPONSES, responsesBody({ background: true }), "background"]
        ]
        for (const [path, body, param] of notImplemented) {
          const name = `${path} ${param}`
          const error = expectError(yield* modelCall(apiKey, path, body), name, {
            status: 400,
            code: "not_implemented",
            type: "invalid_request_error",
            param
          })
          expect(error.retryable, `${name}: retryable`).toBe(false)
        }
        // Text parts are taken: the same shapes with text pass.
        expectOk(
          yield* modelCall(apiKey, RESPONSES, {
            input: [{ type: "message", role: "user", content: [{ type: "input_text", text: PROMPT }] }]
          }),
          "input_text parts"
        )
        expectOk(
          yield* modelCall(
            apiKey,
            CHAT,
            chatBody({ messages: [{ role: "user", content: [{ type: "text", text: PROMPT }] }] })
          ),
          "chat text parts"
        )
        expect(upstream.requests.length, "only the two text calls reached the upstream").toBe(2)
        expect(yield* logCountOf(accountId), "refused input leaves no log rows").toBe(2)
        expect(yield* violations(accountId)).toEqual([])
      }))
  })

  describe("max_total_cost_myr", () => {
    it.effect("a cap below the estimated maximum is refused before anything runs, the estimate in the guidance", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { accountId, apiKey } = yield* caller("cap-below@example.com", { sen: 1000 })
        const estimate = estimateOf(USER_PROMPT, 100)
        for (const [path, body] of [[RESPONSES, responsesBody()], [CHAT, chatBody()]] as const) {
          const cap = (estimate - 1) / 1_000_000
          const tokens = path === RESPONSES ? { max_output_tokens: 100 } : { max_tokens: 100 }
          const reply = yield* modelCall(apiKey, path, { ...body, ...tokens, max_total_cost_myr: cap })
          const error = expectInvalid(reply, `${path} cap below the estimate`, "max_total_cost_myr")
          expect(error.guidance, "the guidance names the estimate").toContain(toMyrString(estimate))
          expect(error.message).toContain(toMyrString(estimate))
          // Without max_output_tokens the estimate counts the model's 32000 output tokens.
          const defaultEstimate = estimateOf(USER_PROMPT, 32000)
          const uncapped = yield* modelCall(apiKey, path, {
            ...body,
            max_total_cost_myr: (defaultEstimate - 1) / 1_000_000
          })
          const defaultError = expectInvalid(uncapped, `${path} cap below the default estimate`, "max_total_cost_myr")
          expect(defaultError.guidance).toContain(toMyrString(defaultEstimate))
        }
        expect(yield* logCountOf(accountId), "no log rows").toBe(0)
        yield* expectUntouched(accountId, TEN_RINGGIT)
      }))

    it.effect("a cap at or above the estimate runs; the billed cost is the reported usage's, never above the cap", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { accountId, apiKey } = yield* caller("cap-above@example.com", { sen: 1000 })
        const estimate = estimateOf(USER_PROMPT, 100)
        let spent = 0
        for (
          const [path, body] of [
            [RESPONSES, responsesBody({ max_output_tokens: 100 })],
            [CHAT, chatBody({ max_tokens: 100 })]
          ] as const
        ) {
          for (const cap of [estimate, estimate * 3]) {
            const reply = yield* modelCall(apiKey, path, { ...body, max_total_cost_myr: cap / 1_000_000 })
            const out = expectOk(reply, `${path} cap ${cap}`)
            const usage = path === RESPONSES
              ? { input: out.usage.input_tokens as number, output: out.usage.output_tokens as number }
              : { input: out.usage.prompt_tokens as number, output: out.usage.completion_tokens as number }
            const priced = costOf(DEFAULT_PRICES, GENERAL, {
              inputTokens: usage.input,
              cachedTokens: 0,
              outputTokens: usage.output,
              searches: 0,
              pages: 0
            })
            const billed = micro(path === RESPONSES ? out.usage.cost_myr : out.cost_myr)
            expect(billed, "billed as reported").toBe(Math.min(priced, estimate))
            expect(billed).toBeGreaterThan(0)
            expect(billed, "never above the cap").toBeLessThanOrEqual(cap)
            const log = yield* logOf(reply.headers.get("x-request-id") ?? "")
            expect(Number(log.cost_micro_myr)).toBe(billed)
            expect(log.status).toBe("billed")
            spent += billed
          }
        }
        expect(upstream.requests.length).toBe(4)
        for (const request of upstream.requests) expect((request.body as { max_tokens: number }).max_tokens).toBe(100)
        expect(yield* walletOf(accountId)).toEqual({ available: TEN_RINGGIT - spent, reserved: 0, spent })
        expect(yield* violations(accountId)).toEqual([])
      }))

    it.effect("usage reported above the reservation is billed min(reservation, cap), on both endpoints", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        // The upstream reports far more than max_output_tokens allows: 5000 + 5000 tokens cost RM 0.042.
        upstream.setBehaviour({ kind: "ok", usage: { prompt_tokens: 5000, completion_tokens: 5000 } })
        const { accountId, apiKey } = yield* caller("cap-exceeded@example.com", { sen: 1000 })
        const reported = costOf(DEFAULT_PRICES, GENERAL, {
          inputTokens: 5000,
          cachedTokens: 0,
          outputTokens: 5000,
          searches: 0,
          pages: 0
        })
        const estimate = estimateOf(USER_PROMPT, 100)
        const cap = 2 * estimate
        expect(reported, "the reported cost is above the cap").toBeGreaterThan(cap)
        const expected = Math.min(estimate, cap)
        let spent = 0
        for (
          const [path, body] of [
            [RESPONSES, responsesBody({ max_output_tokens: 100, max_total_cost_myr: cap / 1_000_000 })],
            [CHAT, chatBody({ max_tokens: 100, max_total_cost_myr: cap / 1_000_000 })]
          ] as const
        ) {
          const reply = yield* modelCall(apiKey, path, body)
          const out = expectOk(reply, path)
          expect(micro(path === RESPONSES ? out.usage.cost_myr : out.cost_myr), `${path}: billed`).toBe(expected)
          const log = yield* logOf(reply.headers.get("x-request-id") ?? "")
          expect(Number(log.cost_micro_myr), `${path}: logged cost`).toBe(expected)
          // Reported usage is kept within the call's bounds (docs/architecture.md, "Streams"): output at most the cap asked for.
          expect(log.output_tokens, `${path}: the reported output, clamped to the call's output cap`).toBe(100)
          expect(log.input_tokens, `${path}: the reported input is within the context window, so logged as reported`)
            .toBe(5000)
          expect(log.status).toBe("billed")
          spent += expected
        }
        expect(yield* usageEntriesOf(accountId)).toEqual([-expected, -expected])
        expect(yield* walletOf(accountId)).toEqual({ available: TEN_RINGGIT - spent, reserved: 0, spent })
        expect(yield* violations(accountId)).toEqual([])
      }))
  })

  describe("spend limits and balance", () => {
    it.effect("a key whose monthly limit is below one reservation answers 402 spend_limit_exceeded and logs a failed row", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { baseUrl } = yield* TestServer
        const { accountId, apiKey, keyId } = yield* caller("spend-limit@example.com", {
          sen: 1000,
          key: { monthly_spend_limit_myr: 0.01 }
        })
        for (const [path, body] of [[RESPONSES, responsesBody()], [CHAT, chatBody()]] as const) {
          const reply = yield* modelCall(apiKey, path, body)
          const error = expectError(reply, `${path} over the spend limit`, {
            status: 402,
            code: "spend_limit_exceeded",
            type: "billing_error",
            param: null
          })
          expect(error.retryable).toBe(false)
          // The key's own edit view: its limit is what to raise.
          expect(error.action_url).toBe(`${baseUrl}/app/api-keys?edit=${keyId}`)
          const log = yield* logOf(reply.headers.get("x-request-id") ?? "")
          expect(log).toMatchObject({
            status: "failed",
            error_code: "spend_limit_exceeded",
            endpoint: path,
            api_key_id: keyId,
            public_model: MODEL,
            reservation_id: null
          })
          expect(Number(log.cost_micro_myr)).toBe(0)
        }
        yield* expectUntouched(accountId, TEN_RINGGIT)
      }))

    it.effect("a limit of exactly one reservation lets one call through; what it spent counts against the next", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const estimate = estimateOf(USER_PROMPT, 100)
        const { accountId, apiKey } = yield* caller("spend-limit-edge@example.com", {
          sen: 1000,
          key: { monthly_spend_limit_myr: estimate / 1_000_000 }
        })
        const body = responsesBody({ max_output_tokens: 100 })
        const first = expectOk(yield* modelCall(apiKey, RESPONSES, body), "the first call fits the limit")
        const spent = micro(first.usage.cost_myr)
        expect(spent).toBeGreaterThan(0)
        expectError(yield* modelCall(apiKey, RESPONSES, body), "the second call would go over", {
          status: 402,
          code: "spend_limit_exceeded",
          type: "billing_error"
        })
        expect(upstream.requests.length).toBe(1)
        expect(yield* walletOf(accountId)).toEqual({ available: TEN_RINGGIT - spent, reserved: 0, spent })
        expect(yield* violations(accountId)).toEqual([])
      }))

    it.effect("an empty wallet answers 402 insufficient_balance pointing at billing, and logs a failed row", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { baseUrl } = yield* TestServer
        const { accountId, apiKey } = yield* caller("no-balance@example.com")
        for (const [path, body] of [[RESPONSES, responsesBody()], [CHAT, chatBody()]] as const) {
          const reply = yield* modelCall(apiKey, path, body)
          const error = expectError(reply, `${path} without balance`, {
            status: 402,
            code: "insufficient_balance",
            type: "billing_error",
            param: null
          })
          expect(error.retryable).toBe(false)
          expect(error.action_url).toBe(`${baseUrl}/app/billing`)
          const log = yield* logOf(reply.headers.get("x-request-id") ?? "")
          expect(log).toMatchObject({ status: "failed", error_code: "insufficient_balance", endpoint: path })
          expect(Number(log.cost_micro_myr)).toBe(0)
        }
        yield* expectUntouched(accountId, 0)
      }))
  })

  describe("the context window", () => {
    it.effect("an input over 1,000,000 tokens answers 413 context_length_exceeded naming input or messages", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { accountId, apiKey } = yield* caller("context-over@example.com", { sen: 1000 })
        const huge = "hello ".repeat(1_100_000)
        expect(countMessages([{ role: "user", content: huge }])).toBeGreaterThan(1_000_000)
        for (
          const [path, body, param] of [
            [RESPONSES, { input: huge }, "input"],
            [CHAT, { model: MODEL, messages: [{ role: "user", content: huge }] }, "messages"]
          ] as const
        ) {
          const error = expectError(yield* modelCall(apiKey, path, body), `${path} over the window`, {
            status: 413,
            code: "context_length_exceeded",
            type: "invalid_request_error",
            param
          })
          expect(error.retryable).toBe(false)
        }
        expect(yield* logCountOf(accountId)).toBe(0)
        yield* expectUntouched(accountId, TEN_RINGGIT)
      }))

    it.effect("input plus max_output_tokens over the window answers 413; exactly the window passes", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { accountId, apiKey } = yield* caller("context-output@example.com", { sen: 1000 })
        const big = "hello ".repeat(990_000)
        const inputTokens = countMessages([{ role: "user", content: big }])
        expect(inputTokens).toBeLessThan(1_000_000)
        const room = 1_000_000 - inputTokens
        expect(room).toBeLessThan(32_000)
        for (
          const [path, body, param] of [
            [RESPONSES, { input: big, max_output_tokens: room + 1 }, "input"],
            [RESPONSES, { input: big, max_output_tokens: 32_000 }, "input"],
            [CHAT, { model: MODEL, messages: [{ role: "user", content: big }], max_tokens: room + 1 }, "messages"]
          ] as const
        ) {
          expectError(yield* modelCall(apiKey, path, body), `${path} with output over the window`, {
            status: 413,
            code: "context_length_exceeded",
            type: "invalid_request_error",
            param
          })
        }
        expect(yield* logCountOf(accountId)).toBe(0)
        yield* expectUntouched(accountId, TEN_RINGGIT)
        // A test key (no upstream, no wallet) shows the boundary: input + output = the window passes.
        const test = yield* caller("context-output-test@example.com", { environment: "test" })
        expectOk(
          yield* modelCall(test.apiKey, RESPONSES, { input: big, max_output_tokens: room }),
          "exactly the window"
        )
        expect(upstream.requests.length).toBe(0)
      }))
  })

  describe("suspended accounts", () => {
    it.effect("answer 403 permission_denied for live and test keys, reserve nothing, and run again once lifted", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { baseUrl } = yield* TestServer
        const live = yield* caller("suspended@example.com", { sen: 1000 })
        const testKey = (yield* createKey(live.token, { name: "test key", environment: "test" })).full_key
        yield* query("UPDATE accounts SET suspended_at = now() WHERE id = $1", [live.accountId])
        for (
          const [name, key, path, body] of [
            ["live responses", live.apiKey, RESPONSES, responsesBody()],
            ["live chat", live.apiKey, CHAT, chatBody()],
            ["test responses", testKey, RESPONSES, responsesBody()]
          ] as const
        ) {
          const error = expectError(yield* modelCall(key, path, body), `${name} while suspended`, {
            status: 403,
            code: "permission_denied",
            type: "permission_error",
            param: null
          })
          expect(error.retryable).toBe(false)
          expect(error.action_url).toBe(`${baseUrl}/app/billing`)
        }
        // Listing models is not a model call.
        expect((yield* call("GET", "/v1/models", { token: live.apiKey })).status).toBe(200)
        yield* expectUntouched(live.accountId, TEN_RINGGIT)
        yield* query("UPDATE accounts SET suspended_at = NULL WHERE id = $1", [live.accountId])
        expectOk(yield* modelCall(live.apiKey, RESPONSES, responsesBody()), "after the suspension is lifted")
        expect(upstream.requests.length).toBe(1)
        expect(yield* violations(live.accountId)).toEqual([])
      }))
  })

  describe("test keys", () => {
    it.effect("cost 0 and never reach the upstream, web search included; logged succeeded with tokens; no wallet needed", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { accountId, apiKey, keyId } = yield* caller("test-key@example.com", { environment: "test" })
        const calls: ReadonlyArray<readonly [string, string, Record<string, unknown>]> = [
          ["plain responses", RESPONSES, responsesBody()],
          [
            "responses with web search",
            RESPONSES,
            responsesBody({
              input: "What is the latest news about Kuala Lumpur?",
              web_search: { mode: "on", content: { enabled: true, max_pages: 2 } }
            })
          ],
          ["reasoning responses", RESPONSES, responsesBody({ reasoning: { effort: "high" } })],
          ["chat", CHAT, chatBody()]
        ]
        for (const [name, path, body] of calls) {
          const reply = yield* modelCall(apiKey, path, body)
          const out = expectOk(reply, name)
          expect(path === RESPONSES ? out.usage.cost_myr : out.cost_myr, `${name}: cost_myr`).toBe("0.000000")
          const log = yield* logOf(reply.headers.get("x-request-id") ?? "")
          expect(log, name).toMatchObject({
            status: "succeeded",
            api_key_id: keyId,
            endpoint: path,
            reservation_id: null
          })
          expect(Number(log.cost_micro_myr)).toBe(0)
          expect(log.input_tokens, `${name}: input tokens`).toBeGreaterThan(0)
          expect(log.output_tokens, `${name}: output tokens`).toBeGreaterThan(0)
          if (name === "responses with web search") {
            expect(out.citations.length).toBeGreaterThan(0)
            expect(out.routing.category).toBe("search")
            expect(log.search_count).toBeGreaterThan(0)
          }
          // Test keys are answered by the simulated model, and say so (not the configured upstream that never ran).
          expect(log.upstream_model, `${name}: upstream model`).toBe(SIMULATED_MODEL)
          if (path === RESPONSES) {
            expect(out.routing.upstream_model, `${name}: routing.upstream_model`).toBe(SIMULATED_MODEL)
          }
          if (name === "reasoning responses") {
            expect(out.routing.category).toBe("reasoning")
            expect(out.usage.reasoning_tokens).toBeGreaterThan(0)
          }
        }
        expect(upstream.requests.length, "the upstream was never called").toBe(0)
        expect(yield* reservationsOf(accountId)).toBe(0)
        expect(yield* usageEntriesOf(accountId)).toEqual([])
        expect(yield* walletOf(accountId)).toEqual({ available: 0, reserved: 0, spent: 0 })
        expect(yield* violations(accountId)).toEqual([])
      }))
  })

  describe("the request log", () => {
    it.effect("a successful live call is logged billed with its model, route, key and latency, and listed in /dashboard/logs", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { accountId, apiKey, keyId, token } = yield* caller("request-log@example.com", { sen: 1000 })
        const general = yield* modelCall(apiKey, RESPONSES, responsesBody())
        const generalOut = expectOk(general, "general call")
        const reasoning = yield* modelCall(
          apiKey,
          CHAT,
          chatBody({
            messages: [{ role: "user", content: "Explain step by step how a bill becomes law" }]
          })
        )
        const reasoningOut = expectOk(reasoning, "reasoning call")
        expect(upstream.requests.map((r) => (r.body as { model: string }).model)).toEqual([GENERAL, REASONING])
        const checks = [
          {
            reply: general,
            endpoint: RESPONSES,
            model: GENERAL,
            category: "general",
            cost: micro(generalOut.usage.cost_myr),
            input: generalOut.usage.input_tokens as number,
            output: generalOut.usage.output_tokens as number
          },
          {
            reply: reasoning,
            endpoint: CHAT,
            model: REASONING,
            category: "reasoning",
            cost: micro(reasoningOut.cost_myr),
            input: reasoningOut.usage.prompt_tokens as number,
            output: reasoningOut.usage.completion_tokens as number
          }
        ]
        expect(generalOut.request_id).toBe(general.headers.get("x-request-id"))
        const listed = yield* call("GET", "/dashboard/logs", { token })
        expect(listed.status, listed.text).toBe(200)
        expect(listed.body.total).toBe(2)
        let spent = 0
        for (const check of checks) {
          const requestId = check.reply.headers.get("x-request-id") ?? ""
          expect(requestId).not.toBe("")
          const log = yield* logOf(requestId)
          expect(log).toMatchObject({
            endpoint: check.endpoint,
            public_model: MODEL,
            upstream_model: check.model,
            routing_category: check.category,
            api_key_id: keyId,
            status: "billed",
            usage_source: "provider",
            input_tokens: check.input,
            output_tokens: check.output,
            error_code: null
          })
          expect(log.latency_ms).toBeGreaterThanOrEqual(0)
          expect(log.reservation_id).not.toBeNull()
          expect(Number(log.cost_micro_myr)).toBe(check.cost)
          const entry = (listed.body.logs as ReadonlyArray<{ requestId: string }>).find((l) =>
            l.requestId === requestId
          )
          expect(entry, `${requestId} listed`).toMatchObject({
            requestId,
            publicModel: MODEL,
            endpoint: check.endpoint,
            status: "billed",
            inputTokens: check.input,
            outputTokens: check.output,
            usageSource: "provider",
            costMicroMyr: check.cost
          })
          spent += check.cost
        }
        const billed = yield* call("GET", `/dashboard/logs?status=billed&api_key_id=${keyId}`, { token })
        expect(billed.body.total).toBe(2)
        expect(yield* usageEntriesOf(accountId)).toEqual(expect.arrayContaining(checks.map((c) => -c.cost)))
        expect(yield* walletOf(accountId)).toEqual({ available: TEN_RINGGIT - spent, reserved: 0, spent })
        expect(yield* violations(accountId)).toEqual([])
      }))
  })
})
