import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import OpenAI from "openai"
import { countMessages, countText } from "../../../src/Domain/Tokens.js"
import { call } from "../../support/Http.js"
import { caller, TestServerWithUpstream, violations } from "../../support/Models.js"
import { answering, isPlanning } from "../../support/Search.js"
import { query, TestServer } from "../../support/TestServer.js"
import { Upstream, type UpstreamServer } from "../../support/Upstream.js"

/**
 * OpenAI's own Node SDK (v6) as the client of the real service: chat
 * completions and responses, plain and streamed, the `responses.stream()`
 * helper, message-item input, the model list and web search. Live keys reach
 * the local upstream double and are billed to the micro-MYR; test keys answer
 * from the built-in model and never touch the upstream or the wallet.
 */

const MODEL = "svc/nenas-flash"
const TOPUP_MICRO = 10_000_000 // 1000 sen

/** The default prices (src/Domain/Prices.ts), micro-MYR per million tokens (RM 4.20 to the dollar). */
const GENERAL = { input: 1_680_000, cached: 420_000, output: 6_720_000 }
const REASONING = { input: 4_620_000, cached: 1_155_000, output: 18_480_000 }
const PER_SEARCH = 21_000
const PER_PAGE = 4_200

const tokenCost = (price: typeof GENERAL, u: { prompt: number; cached?: number; completion: number }) =>
  Math.ceil(
    ((u.prompt - (u.cached ?? 0)) * price.input + (u.cached ?? 0) * price.cached + u.completion * price.output) /
      1_000_000
  )

/** What the service adds to OpenAI's types: read through a typed cast, never `any`. */
interface ServiceUsage {
  readonly cost_myr: string
  readonly reasoning_tokens: number
  readonly cached_tokens: number
  readonly latency_ms: number
}
interface ServiceCitation {
  readonly index: number
  readonly title: string
  readonly url: string
  readonly published_at: string | null
  readonly accessed_at: string
}
interface ServiceResponse {
  readonly usage: ServiceUsage
  readonly request_id: string
  readonly routing: { readonly category: string; readonly upstream_model: string; readonly reasoning: string }
  readonly citations: ReadonlyArray<ServiceCitation>
}
const service = (response: OpenAI.Responses.Response) => response as OpenAI.Responses.Response & ServiceResponse
const chatCost = (completion: OpenAI.Chat.ChatCompletion) =>
  (completion as OpenAI.Chat.ChatCompletion & { readonly cost_myr: string }).cost_myr
const chunkExtras = (chunk: OpenAI.Chat.ChatCompletionChunk) =>
  chunk as OpenAI.Chat.ChatCompletionChunk & {
    readonly cost_myr?: string
    readonly usage?: { readonly cached_tokens: number }
  }

/** The request the upstream double received, as the provider sends it. */
interface UpstreamChat {
  readonly model: string
  readonly messages: ReadonlyArray<{ readonly role: string; readonly content: string }>
  readonly max_tokens?: number
  readonly max_completion_tokens?: number
  readonly reasoning_effort?: string
  readonly stream?: boolean
  readonly stream_options?: { readonly include_usage?: boolean }
}
const upstreamBodies = (upstream: UpstreamServer) => upstream.requests.map((r) => r.body as UpstreamChat)

const sdk = (apiKey: string) =>
  Effect.map(TestServer, ({ baseUrl }) => new OpenAI({ apiKey, baseURL: `${baseUrl}/v1`, maxRetries: 0 }))

const collect = <A>(iterable: AsyncIterable<A>) =>
  Effect.promise(async () => {
    const items: Array<A> = []
    for await (const item of iterable) items.push(item)
    return items
  })

interface LogRow {
  readonly request_id: string
  readonly status: string
  readonly endpoint: string
  readonly upstream_model: string
  readonly routing_category: string
  readonly input_tokens: number
  readonly output_tokens: number
  readonly reasoning_tokens: number
  readonly cached_tokens: number
  readonly usage_source: string
  readonly search_count: number
  readonly content_pages: number
  readonly cost_micro_myr: string
  readonly stream: boolean
  readonly error_code: string | null
}
const logRow = (requestId: string | null) =>
  Effect.map(
    query<Record<string, unknown>>("SELECT * FROM request_logs WHERE request_id = $1", [requestId]),
    (rows) => {
      expect(rows.length, `one log row for ${requestId}`).toBe(1)
      return rows[0] as unknown as LogRow
    }
  )
const logRows = (accountId: string) =>
  Effect.map(
    query<Record<string, unknown>>("SELECT * FROM request_logs WHERE account_id = $1 ORDER BY created_at", [accountId]),
    (rows) => rows as unknown as ReadonlyArray<LogRow>
  )

const usageEntries = (accountId: string) =>
  Effect.map(
    query<{ amount_micro_myr: string; request_id: string }>(
      "SELECT amount_micro_myr, request_id FROM ledger_entries WHERE account_id = $1 AND type = 'usage' ORDER BY created_at",
      [accountId]
    ),
    (rows) => rows.map((r) => ({ amount: Number(r.amount_micro_myr), requestId: r.request_id }))
  )

const wallet = (token: string) =>
  Effect.map(call("GET", "/dashboard/billing/balance", { token }), (reply) => {
    expect(reply.status, reply.text).toBe(200)
    return reply.body.wallet as {
      availableMicroMyr: number
      reservedMicroMyr: number
      lifetimeTopupMicroMyr: number
      lifetimeSpendMicroMyr: number
    }
  })

/** A live call billed `cost`: the wallet, the ledger's one `usage` entry and the `billed` log row agree. */
const expectBilled = (who: { token: string; accountId: string }, requestId: string | null, cost: number) =>
  Effect.gen(function*() {
    expect(yield* wallet(who.token)).toEqual({
      availableMicroMyr: TOPUP_MICRO - cost,
      reservedMicroMyr: 0,
      lifetimeTopupMicroMyr: TOPUP_MICRO,
      lifetimeSpendMicroMyr: cost
    })
    expect(yield* usageEntries(who.accountId)).toEqual([{ amount: -cost, requestId }])
    const row = yield* logRow(requestId)
    expect(row.status).toBe("billed")
    expect(Number(row.cost_micro_myr)).toBe(cost)
    expect(yield* violations(who.accountId)).toEqual([])
    return row
  })

const myr = (micro: number) => `0.${String(micro).padStart(6, "0")}`

layer(TestServerWithUpstream(), { excludeTestServices: true })("OpenAI's Node SDK against the service", (it) => {
  it.effect("chat.completions.create: the upstream's text and usage, cost_myr from the price table, billed once", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({
        kind: "ok",
        text: "Hello! Nice to meet you.",
        usage: { prompt_tokens: 1000, completion_tokens: 500, cached_tokens: 200, reasoning_tokens: 100 }
      })
      const who = yield* caller("sdk-chat@example.com", { sen: 1000 })
      const client = yield* sdk(who.apiKey)
      const messages: Array<OpenAI.Chat.ChatCompletionMessageParam> = [
        { role: "system", content: "You are terse." },
        { role: "user", content: "Say hello to me" }
      ]
      const { data: completion, request_id, response } = yield* Effect.promise(() =>
        client.chat.completions.create({ model: MODEL, messages }).withResponse()
      )
      expect(response.status).toBe(200)
      expect(request_id).toMatch(/^req_/)
      expect(completion.object).toBe("chat.completion")
      expect(completion.model).toBe(MODEL)
      expect(completion.id).toBe(`chatcmpl-${request_id?.slice(4)}`)
      expect(completion.choices).toHaveLength(1)
      expect(completion.choices[0]?.message.content).toBe("Hello! Nice to meet you.")
      expect(completion.choices[0]?.message.role).toBe("assistant")
      expect(completion.choices[0]?.finish_reason).toBe("stop")
      expect(completion.usage?.prompt_tokens).toBe(1000)
      expect(completion.usage?.completion_tokens).toBe(500)
      expect(completion.usage?.total_tokens).toBe(1500)
      expect(completion.usage?.prompt_tokens_details?.cached_tokens).toBe(200)
      expect(completion.usage?.completion_tokens_details?.reasoning_tokens).toBe(100)

      // (1000 - 200) × 1.68 + 200 × 0.42 + 500 × 6.72 micro-MYR per token-million = 4788 micro-MYR.
      const cost = tokenCost(GENERAL, { prompt: 1000, cached: 200, completion: 500 })
      expect(cost).toBe(4788)
      expect(chatCost(completion)).toBe("0.004788")

      const row = yield* expectBilled(who, request_id, cost)
      expect(row).toMatchObject({
        endpoint: "/v1/chat/completions",
        upstream_model: "gpt-4.1-mini",
        routing_category: "general",
        input_tokens: 1000,
        output_tokens: 500,
        cached_tokens: 200,
        reasoning_tokens: 100,
        usage_source: "provider",
        stream: false,
        error_code: null
      })

      const sent = upstreamBodies(upstream)
      expect(sent).toHaveLength(1)
      expect(sent[0]?.model).toBe("gpt-4.1-mini")
      expect(sent[0]?.messages).toEqual([
        { role: "system", content: "You are terse." },
        { role: "user", content: "Say hello to me" }
      ])
      // No max_tokens from the client: the model's 32000 goes upstream, as max_tokens for the general model.
      expect(sent[0]?.max_tokens).toBe(32_000)
      expect(sent[0]).not.toHaveProperty("max_completion_tokens")
      expect(sent[0]).not.toHaveProperty("reasoning_effort")
      expect(upstream.requests[0]?.path).toBe("/v1/chat/completions")
    }))

  it.effect("chat.completions.create with reasoning_effort high: o4-mini gets max_completion_tokens and reasoning_effort", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({
        kind: "ok",
        text: "Thought about it.",
        // Within the reservation (29 input tokens with the margin, 700 output): the upstream's usage is billed as is.
        usage: { prompt_tokens: 20, completion_tokens: 500, reasoning_tokens: 300 }
      })
      const who = yield* caller("sdk-chat-reasoning@example.com", { sen: 1000 })
      const client = yield* sdk(who.apiKey)
      const { data: completion, request_id } = yield* Effect.promise(() =>
        client.chat.completions.create({
          model: MODEL,
          messages: [{ role: "user", content: "Say hello to me" }],
          reasoning_effort: "high",
          max_completion_tokens: 700
        }).withResponse()
      )
      expect(completion.choices[0]?.message.content).toBe("Thought about it.")
      expect(completion.usage?.completion_tokens_details?.reasoning_tokens).toBe(300)
      const cost = tokenCost(REASONING, { prompt: 20, completion: 500 })
      expect(cost).toBe(9333) // 20 × 4.62 + 500 × 18.48 = 9332.4, rounded up
      expect(chatCost(completion)).toBe(myr(cost))

      const sent = upstreamBodies(upstream)
      expect(sent).toHaveLength(1)
      expect(sent[0]?.model).toBe("o4-mini")
      expect(sent[0]?.max_completion_tokens).toBe(700)
      expect(sent[0]).not.toHaveProperty("max_tokens")
      expect(sent[0]?.reasoning_effort).toBe("high")
      expect(sent[0]?.messages).toEqual([{ role: "user", content: "Say hello to me" }])

      const row = yield* expectBilled(who, request_id, cost)
      expect(row).toMatchObject({
        upstream_model: "o4-mini",
        routing_category: "reasoning",
        reasoning_tokens: 300,
        usage_source: "provider"
      })
    }))

  it.effect("chat.completions.create with stream: deltas join to the upstream's text; the last chunk carries usage and cost_myr, with or without stream_options", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const text = "Streaming hello from the upstream, in small pieces."
      upstream.setBehaviour({ kind: "ok", text, usage: { prompt_tokens: 40, completion_tokens: 12 } })
      const who = yield* caller("sdk-chat-stream@example.com", { sen: 1000 })
      const client = yield* sdk(who.apiKey)
      const cost = tokenCost(GENERAL, { prompt: 40, completion: 12 })
      expect(cost).toBe(148)

      const runs: Array<{ requestId: string | null; chunks: ReadonlyArray<OpenAI.Chat.ChatCompletionChunk> }> = []
      for (const withOptions of [true, false]) {
        const { data: stream, request_id } = yield* Effect.promise(() =>
          client.chat.completions.create({
            model: MODEL,
            messages: [{ role: "user", content: "Say hello to me" }],
            stream: true,
            ...(withOptions ? { stream_options: { include_usage: true } } : {})
          }).withResponse()
        )
        runs.push({ requestId: request_id, chunks: yield* collect(stream) })
      }

      for (const [i, { chunks, requestId }] of runs.entries()) {
        const label = i === 0 ? "with stream_options" : "without stream_options"
        expect(chunks.every((c) => c.object === "chat.completion.chunk" && c.model === MODEL), label).toBe(true)
        expect(new Set(chunks.map((c) => c.id)), label).toEqual(new Set([`chatcmpl-${requestId?.slice(4)}`]))
        expect(chunks.map((c) => c.choices[0]?.delta.content ?? "").join(""), label).toBe(text)
        expect(chunks[0]?.choices[0]?.delta.role, label).toBe("assistant")
        const last = chunks[chunks.length - 1]
        const beforeLast = chunks[chunks.length - 2]
        expect(beforeLast?.choices[0]?.finish_reason, label).toBe("stop")
        // Only the last chunk has usage; it has no choices.
        expect(chunks.filter((c) => c.usage !== undefined && c.usage !== null).length, label).toBe(1)
        expect(last?.choices, label).toEqual([])
        expect(last?.usage?.prompt_tokens, label).toBe(40)
        expect(last?.usage?.completion_tokens, label).toBe(12)
        expect(last?.usage?.total_tokens, label).toBe(52)
        expect(last === undefined ? undefined : chunkExtras(last).cost_myr, label).toBe(myr(cost))
        const row = yield* logRow(requestId)
        expect(row, label).toMatchObject({
          status: "billed",
          stream: true,
          input_tokens: 40,
          output_tokens: 12,
          usage_source: "provider",
          cost_micro_myr: String(cost)
        })
      }

      // Upstream, every stream asks for usage whatever the client asked.
      const sent = upstreamBodies(upstream)
      expect(sent).toHaveLength(2)
      for (const body of sent) {
        expect(body.stream).toBe(true)
        expect(body.stream_options).toEqual({ include_usage: true })
      }
      expect(yield* wallet(who.token)).toMatchObject({ availableMicroMyr: TOPUP_MICRO - 2 * cost, reservedMicroMyr: 0 })
      expect(yield* usageEntries(who.accountId)).toEqual(runs.map((r) => ({ amount: -cost, requestId: r.requestId })))
      expect(yield* violations(who.accountId)).toEqual([])
    }))

  it.effect("responses.create: output_text, usage, cost_myr, routing, request_id equal to X-Request-Id, no citations", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({
        kind: "ok",
        text: "Kuala Lumpur is the capital.",
        usage: { prompt_tokens: 300, completion_tokens: 90, cached_tokens: 100 }
      })
      const who = yield* caller("sdk-responses@example.com", { sen: 1000 })
      const client = yield* sdk(who.apiKey)
      const { data, request_id, response } = yield* Effect.promise(() =>
        client.responses.create({ model: MODEL, input: "What is the capital of Malaysia?" }).withResponse()
      )
      const out = service(data)
      expect(out.object).toBe("response")
      expect(out.status).toBe("completed")
      expect(out.model).toBe(MODEL)
      expect(out.output_text).toBe("Kuala Lumpur is the capital.")
      expect(out.output[0]).toMatchObject({ type: "message", role: "assistant", status: "completed" })
      expect(out.usage?.input_tokens).toBe(300)
      expect(out.usage?.output_tokens).toBe(90)
      expect(out.usage?.total_tokens).toBe(390)
      expect(out.usage?.input_tokens_details.cached_tokens).toBe(100)
      expect(out.usage.cached_tokens).toBe(100)
      const cost = tokenCost(GENERAL, { prompt: 300, cached: 100, completion: 90 })
      expect(cost).toBe(983) // 200 × 1.68 + 100 × 0.42 + 90 × 6.72 = 336 + 42 + 604.8 = 982.8, rounded up
      expect(out.usage.cost_myr).toBe(myr(cost))
      expect(out.routing.category).toBe("general")
      expect(out.routing.upstream_model).toBe("gpt-4.1-mini")
      expect(out.request_id).toBe(response.headers.get("x-request-id"))
      expect(out.request_id).toBe(request_id)
      expect(out.id).toBe(`resp_${out.request_id.slice(4)}`)
      expect(out.citations).toEqual([])

      expect(upstreamBodies(upstream)[0]?.messages).toEqual([{
        role: "user",
        content: "What is the capital of Malaysia?"
      }])
      const row = yield* expectBilled(who, request_id, cost)
      expect(row).toMatchObject({
        endpoint: "/v1/responses",
        input_tokens: 300,
        output_tokens: 90,
        cached_tokens: 100,
        stream: false
      })
    }))

  it.effect("responses.create with stream: OpenAI's event order, sequence numbers from 0, the completed response with usage and cost_myr", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const text = "A streamed answer, eight characters per chunk upstream."
      upstream.setBehaviour({ kind: "ok", text, usage: { prompt_tokens: 25, completion_tokens: 14 } })
      const who = yield* caller("sdk-responses-stream@example.com", { sen: 1000 })
      const client = yield* sdk(who.apiKey)
      const { data: stream, request_id } = yield* Effect.promise(() =>
        client.responses.create({ model: MODEL, input: "Say something short", stream: true }).withResponse()
      )
      const events = yield* collect(stream)
      const deltas = events.filter((e): e is OpenAI.Responses.ResponseTextDeltaEvent =>
        e.type === "response.output_text.delta"
      )
      // The upstream double sends the text in chunks of 8 characters; each becomes one delta.
      expect(deltas.length).toBe(Math.ceil(text.length / 8))
      expect(events.map((e) => e.type)).toEqual([
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        ...deltas.map(() => "response.output_text.delta"),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed"
      ])
      expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i))
      expect(deltas.map((d) => d.delta).join("")).toBe(text)

      const created = events[0]
      expect(created?.type === "response.created" ? created.response.status : undefined).toBe("in_progress")
      const added = events[2]
      const itemId = added?.type === "response.output_item.added" ? added.item.id : undefined
      expect(itemId).toMatch(/^msg_/)
      for (const d of deltas) {
        expect({ item_id: d.item_id, output_index: d.output_index, content_index: d.content_index }).toEqual({
          item_id: itemId,
          output_index: 0,
          content_index: 0
        })
      }
      const done = events.find((e): e is OpenAI.Responses.ResponseTextDoneEvent =>
        e.type === "response.output_text.done"
      )
      expect(done?.text).toBe(text)

      const completed = events[events.length - 1]
      if (completed?.type !== "response.completed") throw new Error(`last event is ${completed?.type}`)
      const final = service(completed.response)
      expect(final.id).toBe(created?.type === "response.created" ? created.response.id : "")
      expect(final.status).toBe("completed")
      expect(final.output_text).toBe(text)
      expect(final.request_id).toBe(request_id)
      expect(final.usage.input_tokens).toBe(25)
      expect(final.usage.output_tokens).toBe(14)
      const cost = tokenCost(GENERAL, { prompt: 25, completion: 14 })
      expect(final.usage.cost_myr).toBe(myr(cost))
      expect(final.citations).toEqual([])

      const row = yield* expectBilled(who, request_id, cost)
      expect(row).toMatchObject({ endpoint: "/v1/responses", stream: true, usage_source: "provider" })
    }))

  it.effect("responses.stream() helper: finalResponse().output_text equals the joined deltas and the upstream's text", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const text = "The helper accumulates this text from deltas."
      upstream.setBehaviour({ kind: "ok", text, usage: { prompt_tokens: 20, completion_tokens: 10 } })
      const who = yield* caller("sdk-responses-helper@example.com", { sen: 1000 })
      const client = yield* sdk(who.apiKey)
      const { deltas, final } = yield* Effect.promise(async () => {
        const stream = client.responses.stream({ model: MODEL, input: "Say something short" })
        const deltas: Array<string> = []
        stream.on("response.output_text.delta", (event) => deltas.push(event.delta))
        const final = await stream.finalResponse()
        return { deltas, final }
      })
      expect(deltas.length).toBeGreaterThan(1)
      expect(deltas.join("")).toBe(text)
      expect(final.output_text).toBe(text)
      const out = service(final)
      expect(out.status).toBe("completed")
      const cost = tokenCost(GENERAL, { prompt: 20, completion: 10 })
      expect(out.usage.cost_myr).toBe(myr(cost))
      yield* expectBilled(who, out.request_id, cost)
    }))

  it.effect("responses.create with input message items and instructions: the upstream gets the system messages first", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({ kind: "ok", text: "Hi.", usage: { prompt_tokens: 30, completion_tokens: 2 } })
      const who = yield* caller("sdk-responses-items@example.com", { sen: 1000 })
      const client = yield* sdk(who.apiKey)
      const { data, request_id } = yield* Effect.promise(() =>
        client.responses.create({
          model: MODEL,
          instructions: "Answer in English.",
          input: [
            { role: "system", content: "be brief" },
            { role: "user", content: [{ type: "input_text", text: "hi" }] }
          ]
        }).withResponse()
      )
      expect(data.output_text).toBe("Hi.")
      const sent = upstreamBodies(upstream)
      expect(sent).toHaveLength(1)
      expect(sent[0]?.messages).toEqual([
        { role: "system", content: "Answer in English." },
        { role: "system", content: "be brief" },
        { role: "user", content: "hi" }
      ])
      yield* expectBilled(who, request_id, tokenCost(GENERAL, { prompt: 30, completion: 2 }))
    }))

  it.effect("a test key: the same SDK calls answer from the built-in model at cost 0; no upstream, no wallet", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const who = yield* caller("sdk-test-key@example.com", { environment: "test", sen: 1000 })
      const client = yield* sdk(who.apiKey)
      const before = upstream.requests.length
      const messages = [{ role: "user" as const, content: "Say hello to me" }]

      const chat = yield* Effect.promise(() =>
        client.chat.completions.create({ model: MODEL, messages }).withResponse()
      )
      const content = chat.data.choices[0]?.message.content ?? ""
      expect(content).toMatch(/^Simulated answer \(/)
      expect(chat.data.usage?.prompt_tokens).toBe(countMessages(messages))
      expect(chat.data.usage?.completion_tokens).toBe(countText(content))
      expect(chatCost(chat.data)).toBe("0.000000")

      const chatStream = yield* Effect.promise(() =>
        client.chat.completions.create({ model: MODEL, messages, stream: true }).withResponse()
      )
      const chunks = yield* collect(chatStream.data)
      expect(chunks.map((c) => c.choices[0]?.delta.content ?? "").join("")).toBe(content)
      const lastChunk = chunks[chunks.length - 1]
      expect(lastChunk === undefined ? undefined : chunkExtras(lastChunk).cost_myr).toBe("0.000000")

      const responses = yield* Effect.promise(() =>
        client.responses.create({ model: MODEL, input: "Say hello to me" }).withResponse()
      )
      expect(responses.data.output_text).toBe(content)
      expect(service(responses.data).usage.cost_myr).toBe("0.000000")

      const helper = yield* Effect.promise(() =>
        client.responses.stream({ model: MODEL, input: "Say hello to me" }).finalResponse()
      )
      expect(helper.output_text).toBe(content)
      const helperOut = service(helper)
      expect(helperOut.usage.cost_myr).toBe("0.000000")

      expect(upstream.requests.length).toBe(before)
      expect(yield* wallet(who.token)).toEqual({
        availableMicroMyr: TOPUP_MICRO,
        reservedMicroMyr: 0,
        lifetimeTopupMicroMyr: TOPUP_MICRO,
        lifetimeSpendMicroMyr: 0
      })
      expect(yield* usageEntries(who.accountId)).toEqual([])
      const reservations = yield* query("SELECT id FROM reservations WHERE account_id = $1", [who.accountId])
      expect(reservations).toEqual([])

      const rows = yield* logRows(who.accountId)
      expect(rows.map((r) => r.request_id).sort()).toEqual(
        [chat.request_id, chatStream.request_id, responses.request_id, helperOut.request_id].sort()
      )
      for (const row of rows) {
        expect(row, row.request_id).toMatchObject({
          status: "succeeded",
          cost_micro_myr: "0",
          usage_source: "provider",
          error_code: null
        })
        expect(row.output_tokens, row.request_id).toBe(countText(content))
      }
      expect(yield* violations(who.accountId)).toEqual([])
    }))

  it.effect("models.list(): svc/nenas-flash with its window, output cap and exactly the working capabilities, then svc/nenas-embed", () =>
    Effect.gen(function*() {
      const who = yield* caller("sdk-models@example.com", { environment: "test" })
      const client = yield* sdk(who.apiKey)
      const page = yield* Effect.promise(() => client.models.list())
      const models = page.data as Array<
        OpenAI.Models.Model & { context_window: number; max_output_tokens: number; capabilities: ReadonlyArray<string> }
      >
      expect(models).toHaveLength(2)
      expect(models[0]).toEqual({
        id: MODEL,
        object: "model",
        owned_by: "svc",
        context_window: 1_000_000,
        max_output_tokens: 32_000,
        capabilities: ["text", "vision", "reasoning", "web_search", "streaming", "tools", "structured_output"],
        endpoints: ["/v1/responses", "/v1/chat/completions", "/v1/messages"],
        response_storage: {
          default_store: true,
          retention_days: 30,
          opt_out: "Send store: false with a /v1/responses call."
        }
      })
      expect(models[1]).toEqual({
        id: "svc/nenas-embed",
        object: "model",
        owned_by: "svc",
        context_window: 8192,
        max_output_tokens: 0,
        capabilities: ["embeddings"],
        endpoints: ["/v1/embeddings"],
        dimensions: 1536
      })
      const all = yield* collect(client.models.list())
      expect(all.map((m) => m.id)).toEqual([MODEL, "svc/nenas-embed"])
    }))

  it.effect("web search through responses.create: routing search, the planned query, cited source 1 annotated, sources sent upstream, planning, searches and pages billed", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({
        kind: "ok",
        // The planning call writes the query; the answer cites [1].
        text: answering(["tallest building kuala lumpur"], "The tallest is Merdeka 118 [1]."),
        usage: { prompt_tokens: 2000, completion_tokens: 300 }
      })
      const who = yield* caller("sdk-web-search@example.com", { sen: 1000 })
      const client = yield* sdk(who.apiKey)
      const question = "What is the tallest building in Kuala Lumpur?"
      // The SDK passes fields it does not know through; the cast only silences its types.
      const params = {
        model: MODEL,
        input: question,
        web_search: { mode: "on", max_results: 3, content: { enabled: true, max_pages: 2 } }
      } as OpenAI.Responses.ResponseCreateParamsNonStreaming
      const { data, request_id } = yield* Effect.promise(() => client.responses.create(params).withResponse())
      const out = service(data)
      expect(out.output_text).toBe("The tallest is Merdeka 118 [1].")
      expect(out.routing.category).toBe("search")
      expect(out.routing.upstream_model).toBe("gpt-4.1-mini")

      const slug = "tallest-building-kuala-lumpur"
      const urls = [1, 2, 3].map((i) => `https://search.example/${slug}/${i}`)
      expect(out.citations.map((c) => c.index)).toEqual([1])
      expect(out.citations.map((c) => c.url)).toEqual(urls.slice(0, 1))
      expect(
        data.output[0]?.type === "message" && data.output[0].content[0]?.type === "output_text" &&
          data.output[0].content[0].annotations
      )
        .toEqual([{
          type: "url_citation",
          start_index: 27,
          end_index: 30,
          url: urls[0],
          title: "tallest building kuala lumpur (source 1)"
        }])
      for (const citation of out.citations) {
        expect(citation.title).toBe(`tallest building kuala lumpur (source ${citation.index})`)
        expect(citation.published_at).toBe(new Date(Date.UTC(2026, 0, citation.index)).toISOString())
        expect(new Date(citation.accessed_at).toISOString()).toBe(citation.accessed_at)
      }

      const sent = upstreamBodies(upstream)
      expect(sent).toHaveLength(2)
      expect(isPlanning(sent[0])).toBe(true)
      expect(sent[1]?.model).toBe("gpt-4.1-mini")
      const [sources, user, ...rest] = sent[1]?.messages ?? []
      expect(rest).toEqual([])
      expect(user).toEqual({ role: "user", content: question })
      expect(sources?.role).toBe("system")
      for (const [i, url] of urls.entries()) {
        expect(sources?.content).toContain(`[${i + 1}] tallest building kuala lumpur (source ${i + 1}) (${url})`)
      }
      // Two pages read: the first two results' text is in the prompt, the third's is not.
      expect(sources?.content).toContain(`Simulated page text of ${urls[0]}`)
      expect(sources?.content).toContain(`Simulated page text of ${urls[1]}`)
      expect(sources?.content).not.toContain(`Simulated page text of ${urls[2]}`)

      // Both calls' tokens: the planning call's and the answer's.
      const tokens = tokenCost(GENERAL, { prompt: 4000, completion: 600 })
      expect(tokens).toBe(10_752)
      const cost = tokens + 1 * PER_SEARCH + 2 * PER_PAGE
      expect(cost).toBe(40_152)
      expect(out.usage.cost_myr).toBe("0.040152")
      const row = yield* expectBilled(who, request_id, cost)
      expect(row).toMatchObject({
        routing_category: "search",
        search_count: 1,
        content_pages: 2,
        input_tokens: 4000,
        output_tokens: 600,
        usage_source: "provider"
      })
    }))
})
