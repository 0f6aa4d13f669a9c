import { createAnthropic } from "@ai-sdk/anthropic"
import Anthropic from "@anthropic-ai/sdk"
import { expect, layer } from "@effect/vitest"
import { generateText, streamText } from "ai"
import { Effect } from "effect"
import { booksOf } from "../../support/Books.js"
import { call } from "../../support/Http.js"
import { caller, TestServerWithUpstream, violations, walletOf } from "../../support/Models.js"
import { query, TestServer } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * Anthropic's own SDK (and the AI SDK's Anthropic provider) as clients of the
 * real service on `POST /v1/messages`: plain and streamed answers, a tool round
 * trip each way, `countTokens`, typed errors, idempotent replays and a stream
 * cut upstream. Live keys reach the upstream double and are billed; each
 * call's books (log row, ledger entry, hold) are read back, not only its status.
 */

const MODEL = "svc/nenas-flash"
type ApiFailure = InstanceType<typeof Anthropic.APIError>

const sdk = (apiKey: string, options: { readonly bearer?: boolean } = {}) =>
  Effect.map(TestServer, ({ baseUrl }) =>
    new Anthropic({
      baseURL: baseUrl,
      maxRetries: 0,
      ...(options.bearer === true ? { apiKey: null, authToken: apiKey } : { apiKey })
    }))

/** The request id a message's id carries (`msg_<id>` for `req_<id>`), as the log keys it. */
const requestIdOf = (messageId: string) => `req_${messageId.replace(/^msg_/, "")}`

/** One call billed once: a `/v1/messages` log row billed at its cost, one ledger entry of that cost, its hold captured. */
const billedOnce = (requestId: string) =>
  Effect.gen(function*() {
    const books = yield* booksOf(requestId)
    const cost = Number(books.log.cost_micro_myr)
    expect(books.log.status).toBe("billed")
    expect(cost).toBeGreaterThan(0)
    expect(books.ledger).toEqual([-cost])
    for (const hold of books.hold) expect(hold.status).not.toBe("open")
    const [row] = yield* query<{ endpoint: string }>("SELECT endpoint FROM request_logs WHERE request_id = $1", [
      requestId
    ])
    expect(row?.endpoint).toBe("/v1/messages")
    return books
  })

const weatherTool = {
  name: "get_weather",
  description: "The weather in a city.",
  input_schema: { type: "object" as const, properties: { city: { type: "string" } }, required: ["city"] }
}

layer(TestServerWithUpstream(), { excludeTestServices: true, timeout: 60_000 })(
  "Anthropic's SDK on /v1/messages",
  (it) => {
    it.effect("messages.create: the upstream's answer in Anthropic's shape, usage summed as Anthropic's clients add it, billed once", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({
          kind: "ok",
          text: "Selamat pagi!",
          usage: { prompt_tokens: 30, cached_tokens: 10, completion_tokens: 6 }
        })
        const who = yield* caller("anthropic-create@example.com", { sen: 1000 })
        const client = yield* sdk(who.apiKey)
        const message = yield* Effect.promise(() =>
          client.messages.create({
            model: MODEL,
            max_tokens: 100,
            system: "Answer in Malay.",
            messages: [{ role: "user", content: "Good morning?" }],
            metadata: { user_id: "end-user-42" }
          })
        )
        expect(message).toMatchObject({
          type: "message",
          role: "assistant",
          model: MODEL,
          content: [{ type: "text", text: "Selamat pagi!" }],
          stop_reason: "end_turn",
          usage: { input_tokens: 20, cache_read_input_tokens: 10, output_tokens: 6 }
        })
        expect(message._request_id).toBe(requestIdOf(message.id))
        expect(upstream.requests[0]?.body).toMatchObject({
          messages: [{ role: "system", content: "Answer in Malay." }, { role: "user", content: "Good morning?" }],
          max_tokens: 100
        })
        const books = yield* billedOnce(requestIdOf(message.id))
        expect(books.log).toMatchObject({
          input_tokens: 30,
          cached_tokens: 10,
          output_tokens: 6,
          usage_source: "provider"
        })
        const [tags] = yield* query<{ end_user: string }>("SELECT end_user FROM request_logs WHERE request_id = $1", [
          requestIdOf(message.id)
        ])
        expect(tags?.end_user).toBe("end-user-42")
        expect((yield* walletOf(who.accountId)).reserved).toBe(0)
        expect(yield* violations(who.accountId)).toEqual([])
      }))

    it.effect("messages.stream().finalMessage(): the text assembled from its deltas, with a Bearer token instead of x-api-key", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({
          kind: "ok",
          text: "One, two, three, four.",
          usage: { prompt_tokens: 12, completion_tokens: 8 }
        })
        const who = yield* caller("anthropic-stream@example.com", { sen: 1000 })
        const client = yield* sdk(who.apiKey, { bearer: true })
        const events: Array<string> = []
        const message = yield* Effect.promise(() => {
          const stream = client.messages.stream({
            model: MODEL,
            max_tokens: 50,
            messages: [{ role: "user", content: "Count to four." }]
          })
          stream.on("streamEvent", (event) => events.push(event.type))
          return stream.finalMessage()
        })
        expect(message.content).toEqual([{ type: "text", text: "One, two, three, four." }])
        expect(message.usage).toMatchObject({ input_tokens: 12, output_tokens: 8 })
        expect(events[0]).toBe("message_start")
        expect(events).toContain("content_block_delta")
        expect(events.slice(-2)).toEqual(["message_delta", "message_stop"])
        yield* billedOnce(requestIdOf(message.id))
      }))

    for (const stream of [false, true]) {
      it.effect(`a tool round trip${stream ? ", streamed (input_json_delta assembled)" : ""}: tool_use, then the answer from its tool_result`, () =>
        Effect.gen(function*() {
          const upstream = yield* Upstream
          upstream.reset()
          upstream.setBehaviour({
            kind: "ok",
            text: "It is 31 degrees in Ipoh.",
            toolCalls: [{ id: "call_abc", name: "get_weather", arguments: "{\"city\":\"Ipoh\"}" }]
          })
          const who = yield* caller(`anthropic-tools-${stream}@example.com`, { sen: 1000 })
          const client = yield* sdk(who.apiKey)
          const ask = (messages: Array<Anthropic.MessageParam>) =>
            Effect.promise(() =>
              stream
                ? client.messages.stream({ model: MODEL, max_tokens: 100, tools: [weatherTool], messages })
                  .finalMessage()
                : client.messages.create({ model: MODEL, max_tokens: 100, tools: [weatherTool], messages })
            )
          const question: Anthropic.MessageParam = { role: "user", content: "Weather in Ipoh?" }
          const first = yield* ask([question])
          expect(first.stop_reason).toBe("tool_use")
          const use = first.content.find((block) => block.type === "tool_use")
          expect(use).toMatchObject({ type: "tool_use", name: "get_weather", input: { city: "Ipoh" } })
          expect(use?.id).toMatch(/^toolu_/)
          const second = yield* ask([
            question,
            { role: "assistant", content: first.content },
            { role: "user", content: [{ type: "tool_result", tool_use_id: use?.id ?? "", content: "31°C, sunny" }] }
          ])
          expect(second.stop_reason).toBe("end_turn")
          expect(second.content).toMatchObject([{ type: "text", text: "It is 31 degrees in Ipoh." }])
          // The upstream saw the call and its result as OpenAI's chat carries them.
          const sent = upstream.requests[1]?.body as {
            messages: ReadonlyArray<Record<string, unknown>>
            tools: ReadonlyArray<unknown>
          }
          expect(sent.messages.slice(1)).toMatchObject([
            {
              role: "assistant",
              tool_calls: [{ type: "function", function: { name: "get_weather", arguments: "{\"city\":\"Ipoh\"}" } }]
            },
            { role: "tool", content: "31°C, sunny" }
          ])
          expect(sent.tools).toEqual([{
            type: "function",
            function: {
              name: "get_weather",
              description: "The weather in a city.",
              parameters: weatherTool.input_schema
            }
          }])
          yield* billedOnce(requestIdOf(first.id))
          yield* billedOnce(requestIdOf(second.id))
        }))
    }

    it.effect("countTokens: the estimate's input tokens, free and not logged as a call", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const who = yield* caller("anthropic-count@example.com", { sen: 1000 })
        const client = yield* sdk(who.apiKey)
        const counted = yield* Effect.promise(() =>
          client.messages.countTokens({
            model: MODEL,
            system: "Be brief.",
            messages: [{ role: "user", content: "How many tokens is this?" }]
          })
        )
        expect(counted.input_tokens).toBeGreaterThan(5)
        expect(upstream.requests).toHaveLength(0)
        const logs = yield* query("SELECT 1 FROM request_logs WHERE api_key_id = $1", [who.keyId])
        expect(logs).toHaveLength(0)
        expect((yield* walletOf(who.accountId)).spent).toBe(0)
      }))

    it.effect("typed errors: a bad key, an unknown model, an empty wallet and a rate limit raise the SDK's error classes", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({ kind: "ok", text: "ok" })
        const body = { model: MODEL, max_tokens: 10, messages: [{ role: "user" as const, content: "hi" }] }
        const failure = (client: Anthropic, request: Anthropic.MessageCreateParamsNonStreaming = body) =>
          Effect.promise(() => client.messages.create(request).then(() => undefined, (error: unknown) => error))

        const badKey = yield* failure(yield* sdk("nns_live_" + "x".repeat(40)))
        expect(badKey).toBeInstanceOf(Anthropic.AuthenticationError)
        expect((badKey as ApiFailure).error).toMatchObject({
          type: "error",
          error: { type: "authentication_error", code: "invalid_api_key" }
        })

        const funded = yield* caller("anthropic-errors@example.com", { sen: 1000 })
        const unknown = yield* failure(yield* sdk(funded.apiKey), { ...body, model: "claude-sonnet-4-5" })
        expect(unknown).toBeInstanceOf(Anthropic.NotFoundError)
        expect((unknown as ApiFailure).error).toMatchObject({
          error: { type: "not_found_error", code: "not_found", param: "model" }
        })

        const broke = yield* caller("anthropic-broke@example.com")
        const empty = yield* failure(yield* sdk(broke.apiKey))
        expect(empty).toBeInstanceOf(Anthropic.APIError)
        expect((empty as ApiFailure).status).toBe(402)
        expect((empty as ApiFailure).error).toMatchObject({
          error: { type: "billing_error", code: "insufficient_balance" }
        })

        const limited = yield* caller("anthropic-limited@example.com", { sen: 1000, key: { rate_limit_rpm: 1 } })
        const limitedClient = yield* sdk(limited.apiKey)
        expect(yield* failure(limitedClient)).toBeUndefined()
        const refused = yield* failure(limitedClient)
        expect(refused).toBeInstanceOf(Anthropic.RateLimitError)
        expect((refused as ApiFailure).error).toMatchObject({
          error: { type: "rate_limit_error", code: "rate_limit_exceeded" }
        })
        expect((refused as ApiFailure).headers?.get("retry-after")).toMatch(/^\d+$/)
      }))

    it.effect("an Idempotency-Key replays the first answer, billed once", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({ kind: "ok", text: "Once only." })
        const who = yield* caller("anthropic-idempotent@example.com", { sen: 1000 })
        const client = yield* sdk(who.apiKey)
        const request = { model: MODEL, max_tokens: 20, messages: [{ role: "user" as const, content: "Say it once." }] }
        const headers = { headers: { "idempotency-key": "anthropic-once-1" } }
        const first = yield* Effect.promise(() => client.messages.create(request, headers))
        const again = yield* Effect.promise(() => client.messages.create(request, headers).withResponse())
        expect(again.data).toEqual(first)
        expect(again.response.headers.get("idempotent-replayed")).toBe("true")
        expect(upstream.requests).toHaveLength(1)
        yield* billedOnce(requestIdOf(first.id))
      }))

    it.effect("a stream cut upstream ends in an error event, never message_stop, and is billed as estimated", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({ kind: "resetMidStream", afterChunks: 3 })
        const who = yield* caller("anthropic-cut@example.com", { sen: 1000 })
        const reply = yield* call("POST", "/v1/messages?beta=true", {
          headers: { "x-api-key": who.apiKey, "anthropic-version": "2023-06-01" },
          json: {
            model: MODEL,
            max_tokens: 100,
            stream: true,
            messages: [{ role: "user", content: "Tell a long story." }]
          }
        })
        expect(reply.status).toBe(200)
        const types = [...reply.text.matchAll(/^event: (.+)$/gm)].map((match) => match[1])
        expect(types[0]).toBe("message_start")
        expect(types.at(-1)).toBe("error")
        expect(types).not.toContain("message_stop")
        const error = JSON.parse(/event: error\ndata: (.+)/.exec(reply.text)?.[1] ?? "{}")
        expect(error).toMatchObject({ type: "error", error: { type: expect.any(String), message: expect.any(String) } })
        const books = yield* booksOf(reply.headers.get("x-request-id") ?? "")
        expect(books.log.usage_source).toBe("estimated")
        expect(books.ledger).toEqual([-Number(books.log.cost_micro_myr)])
        expect((yield* walletOf(who.accountId)).reserved).toBe(0)
      }))

    it.effect("a test key answers from the simulated model, free", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const who = yield* caller("anthropic-testkey@example.com", { environment: "test" })
        const client = yield* sdk(who.apiKey)
        const message = yield* Effect.promise(() =>
          client.messages.create({ model: MODEL, max_tokens: 50, messages: [{ role: "user", content: "Hello" }] })
        )
        expect(message.content[0]).toMatchObject({ type: "text" })
        expect(upstream.requests).toHaveLength(0)
        const books = yield* booksOf(requestIdOf(message.id))
        expect(books.log.cost_micro_myr).toBe("0")
        expect(books.ledger).toEqual([])
      }))
  }
)

layer(TestServerWithUpstream(), { excludeTestServices: true, timeout: 60_000 })(
  "the AI SDK's Anthropic provider on /v1/messages",
  (it) => {
    it.effect("generateText and streamText", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({
          kind: "ok",
          text: "Hello from nenas.",
          usage: { prompt_tokens: 9, completion_tokens: 4 }
        })
        const who = yield* caller("aisdk-anthropic@example.com", { sen: 1000 })
        const { baseUrl } = yield* TestServer
        const provider = createAnthropic({ baseURL: `${baseUrl}/v1`, apiKey: who.apiKey })
        const generated = yield* Effect.promise(() =>
          generateText({ model: provider(MODEL), prompt: "Greet me.", maxRetries: 0 })
        )
        expect(generated.text).toBe("Hello from nenas.")
        expect(generated.usage).toMatchObject({ inputTokens: 9, outputTokens: 4 })
        const streamed = streamText({ model: provider(MODEL), prompt: "Greet me again.", maxRetries: 0 })
        const text = yield* Effect.promise(() => streamed.text)
        expect(text).toBe("Hello from nenas.")
        const logs = yield* query<{ endpoint: string; status: string }>(
          "SELECT endpoint, status FROM request_logs WHERE api_key_id = $1 ORDER BY created_at",
          [who.keyId]
        )
        expect(logs).toEqual([{ endpoint: "/v1/messages", status: "billed" }, {
          endpoint: "/v1/messages",
          status: "billed"
        }])
      }))
  }
)
