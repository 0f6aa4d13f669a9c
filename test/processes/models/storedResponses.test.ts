import { createOpenAI } from "@ai-sdk/openai"
import { expect, layer } from "@effect/vitest"
import { generateText, stepCountIs, streamText, tool } from "ai"
import { Effect } from "effect"
import OpenAI from "openai"
import { z } from "zod"
import { PURGE_BATCH, StoredResponses } from "../../../src/Responses/Store.js"
import { call } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream, violations } from "../../support/Models.js"
import { query, TestServer } from "../../support/TestServer.js"
import { bothListening, Instances, on, TwoInstancesLive } from "../../support/TwoInstances.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * Stored responses: `store` (the default), `previous_response_id`,
 * `item_reference` items and the stored-response endpoints, through OpenAI's
 * SDK and the Vercel AI SDK's `.responses()` with its defaults. Live keys
 * reach the upstream double, which records what each turn sent it.
 */

const MODEL = "svc/nenas-flash"
const promise = <A>(run: () => Promise<A>) => Effect.promise(run)
const sdk = (apiKey: string) =>
  Effect.map(TestServer, ({ baseUrl }) => new OpenAI({ apiKey, baseURL: `${baseUrl}/v1`, maxRetries: 0 }))

interface UpstreamMessage {
  readonly role: string
  readonly content: unknown
  readonly tool_calls?: ReadonlyArray<{ readonly id: string; readonly function: { readonly name: string } }>
  readonly tool_call_id?: string
}
const sentMessages = (upstream: Upstream["Type"]) =>
  upstream.requests.map((r) => (r.body as { readonly messages: ReadonlyArray<UpstreamMessage> }).messages)

const textOf = (content: unknown): string =>
  typeof content === "string"
    ? content
    : Array.isArray(content)
    ? content.map((part: { readonly text?: string }) => part.text ?? "").join("")
    : ""

const storedRows = (accountId: string) =>
  Effect.map(
    query<{ id: string; previous_response_id: string | null; bytes: number }>(
      "SELECT id, previous_response_id, octet_length(body) AS bytes FROM stored_responses WHERE account_id = $1 ORDER BY created_at",
      [accountId]
    ),
    (rows) => rows
  )

/** Each call of the account: one log row, billed, with one `usage` ledger entry of the same cost. */
const billedOnce = (accountId: string, calls: number) =>
  Effect.gen(function*() {
    yield* (yield* TestServer).settled
    const logs = yield* query<{ request_id: string; status: string; cost_micro_myr: string }>(
      "SELECT request_id, status, cost_micro_myr FROM request_logs WHERE account_id = $1",
      [accountId]
    )
    const entries = yield* query<{ request_id: string; amount_micro_myr: string }>(
      "SELECT request_id, amount_micro_myr FROM ledger_entries WHERE account_id = $1 AND type = 'usage'",
      [accountId]
    )
    expect(logs.length).toBe(calls)
    expect(logs.every((log) => log.status === "billed")).toBe(true)
    expect(entries.length).toBe(calls)
    for (const log of logs) {
      const entry = entries.filter((e) => e.request_id === log.request_id)
      expect(entry.map((e) => -Number(e.amount_micro_myr))).toEqual([Number(log.cost_micro_myr)])
    }
    expect(yield* violations(accountId)).toEqual([])
  })

layer(TestServerWithUpstream(), { excludeTestServices: true })("stored responses", (it) => {
  it.effect("the OpenAI SDK: three turns with previous_response_id, then retrieve, inputItems.list and delete", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const { accountId, apiKey } = yield* caller("stored-sdk@example.com", { sen: 1000 })
      const client = yield* sdk(apiKey)
      const first = yield* promise(() =>
        client.responses.create({ model: MODEL, instructions: "Answer in Malay.", input: "My name is Aminah." })
      )
      const second = yield* promise(() =>
        client.responses.create({ model: MODEL, previous_response_id: first.id, input: "What is my name?" })
      )
      // The upstream caches the repeated history: that part is billed at the cached-input price.
      upstream.setBehaviour({ kind: "ok", usage: { prompt_tokens: 5000, cached_tokens: 4000, completion_tokens: 10 } })
      const third = yield* promise(() =>
        client.responses.create({
          model: MODEL,
          previous_response_id: second.id,
          input: [{ role: "user", content: [{ type: "input_text", text: "And again?" }] }]
        })
      )
      // Each answer says it is stored, and which response it continues (as OpenAI's do).
      // (The SDK's Response type has no `store`; the object OpenAI answers does.)
      expect([first, second, third].map((r) => [(r as { store?: boolean }).store, r.previous_response_id])).toEqual([
        [true, null],
        [true, first.id],
        [true, second.id]
      ])
      // What reached the model: the earlier turns' input and output, then the new input; instructions only on the first.
      const sent = sentMessages(upstream)
      expect(sent[0]?.map((m) => m.role)).toEqual(["system", "user"])
      expect(sent[1]?.map((m) => [m.role, textOf(m.content)])).toEqual([
        ["user", "My name is Aminah."],
        ["assistant", first.output_text],
        ["user", "What is my name?"]
      ])
      expect(sent[2]?.map((m) => textOf(m.content))).toEqual([
        "My name is Aminah.",
        first.output_text,
        "What is my name?",
        second.output_text,
        "And again?"
      ])
      // The history is billed as input, the cached part at the cached price (gpt-4.1-mini: RM 1.68 and 0.42 per
      // million input tokens, 6.72 per million output tokens): 1000 × 1.68 + 4000 × 0.42 + 10 × 6.72 micro-MYR, rounded up.
      expect(second.usage?.input_tokens).toBeGreaterThan(first.usage?.input_tokens ?? Infinity)
      expect(third.usage).toMatchObject({
        input_tokens: 5000,
        input_tokens_details: { cached_tokens: 4000 },
        output_tokens: 10
      })
      expect((third as unknown as { usage: { cost_myr: string } }).usage.cost_myr).toBe("0.003428")
      upstream.reset()
      yield* billedOnce(accountId, 3)

      const retrieved = yield* promise(() => client.responses.retrieve(second.id))
      expect(retrieved.id).toBe(second.id)
      expect(retrieved.output_text).toBe(second.output_text)
      expect(retrieved.previous_response_id).toBe(first.id)
      expect(retrieved.usage?.input_tokens).toBe(second.usage?.input_tokens)
      expect((yield* promise(() => client.responses.retrieve(first.id))).instructions).toBe("Answer in Malay.")

      const items = yield* promise(() => client.responses.inputItems.list(third.id))
      expect(items.data.map((item) => item.type)).toEqual(["message"])
      expect(JSON.stringify(items.data[0])).toContain("And again?")
      const firstItems = yield* promise(() => client.responses.inputItems.list(first.id, { order: "asc" }))
      expect(firstItems.data.map((item) => JSON.stringify(item))).toEqual([
        expect.stringContaining("My name is Aminah.")
      ])

      yield* promise(() => client.responses.delete(second.id))
      const gone = yield* call("GET", `/v1/responses/${second.id}`, { token: apiKey })
      expect(gone.status).toBe(404)
      expect(gone.body.error.code).toBe("not_found")
      const rows = yield* storedRows(accountId)
      expect(rows.map((row) => row.id)).toEqual([first.id, third.id])
      // Kept lean: a short turn's deflated record is well under a kilobyte.
      for (const row of rows) expect(row.bytes).toBeLessThan(1024)
    }))

  it.effect("input items page as OpenAI pages them: limit, after, order, has_more", () =>
    Effect.gen(function*() {
      const { apiKey } = yield* caller("stored-paging@example.com", { environment: "test" })
      const input = ["one", "two", "three", "four", "five"].map((text) => ({ role: "user", content: text }))
      const created = yield* modelCall(apiKey, "/v1/responses", { model: MODEL, input })
      expect(created.status).toBe(200)
      const id = created.body.id as string
      const page = (params: string) =>
        Effect.map(call("GET", `/v1/responses/${id}/input_items?${params}`, { token: apiKey }), (r) => {
          expect(r.status, r.text).toBe(200)
          return r.body as {
            data: Array<{ id: string; content: Array<{ text: string }> }>
            first_id: string
            last_id: string
            has_more: boolean
          }
        })
      const texts = (p: { data: Array<{ content: Array<{ text: string }> }> }) =>
        p.data.map((item) => item.content[0]?.text)
      const newest = yield* page("limit=2")
      expect(texts(newest)).toEqual(["five", "four"])
      expect(newest.has_more).toBe(true)
      const next = yield* page(`limit=2&after=${newest.last_id}`)
      expect(texts(next)).toEqual(["three", "two"])
      const last = yield* page(`limit=2&after=${next.last_id}`)
      expect(texts(last)).toEqual(["one"])
      expect(last.has_more).toBe(false)
      expect(texts(yield* page("order=asc&limit=100"))).toEqual(["one", "two", "three", "four", "five"])
      expect(yield* page("after=msg_unknown")).toEqual({
        object: "list",
        data: [],
        first_id: null,
        last_id: null,
        has_more: false
      })
      const bad = yield* call("GET", `/v1/responses/${id}/input_items?limit=0`, { token: apiKey })
      expect(bad.status).toBe(400)
    }))

  it.effect("another account's response answers 404 everywhere; an unknown item reference answers 400 naming it", () =>
    Effect.gen(function*() {
      const owner = yield* caller("stored-owner@example.com", { environment: "test" })
      const other = yield* caller("stored-other@example.com", { environment: "test" })
      const created = yield* modelCall(owner.apiKey, "/v1/responses", { model: MODEL, input: "Secret plans." })
      const id = created.body.id as string
      const messageId = (created.body.output as Array<{ id: string }>)[0]?.id
      for (
        const [method, path] of [["GET", `/v1/responses/${id}`], ["GET", `/v1/responses/${id}/input_items`], [
          "DELETE",
          `/v1/responses/${id}`
        ]]
      ) {
        const reply = yield* call(method ?? "GET", path ?? "", { token: other.apiKey })
        expect(reply.status, `${method} ${path}`).toBe(404)
        expect(reply.body.error.code).toBe("not_found")
      }
      // Continuing it answers as an unknown id does (as OpenAI's does): 400 naming the param.
      const continued = yield* modelCall(other.apiKey, "/v1/responses", {
        model: MODEL,
        previous_response_id: id,
        input: "More?"
      })
      expect(continued.status).toBe(400)
      expect(continued.body.error).toMatchObject({ code: "invalid_request", param: "previous_response_id" })
      const referenced = yield* modelCall(other.apiKey, "/v1/responses", {
        model: MODEL,
        input: [{ role: "user", content: "Hi" }, { type: "item_reference", id: messageId }]
      })
      expect(referenced.status).toBe(400)
      expect(referenced.body.error.param).toBe("input[1]")
      expect(referenced.body.error.message).toContain(String(messageId))
      // The owner still has it, and may reference it from any of its keys.
      const own = yield* modelCall(owner.apiKey, "/v1/responses", {
        model: MODEL,
        input: [{ type: "item_reference", id: messageId }, { role: "user", content: "Go on." }]
      })
      expect(own.status, own.text).toBe(200)
      expect((yield* call("GET", `/v1/responses/${id}`, { token: owner.apiKey })).status).toBe(200)
    }))

  it.effect("store: false keeps nothing; test keys store (simulated content)", () =>
    Effect.gen(function*() {
      const { accountId, apiKey } = yield* caller("stored-off@example.com", { environment: "test" })
      const off = yield* modelCall(apiKey, "/v1/responses", { model: MODEL, input: "Forget me.", store: false })
      expect(off.body.store).toBe(false)
      expect(off.status).toBe(200)
      const streamedOff = yield* modelCall(apiKey, "/v1/responses", {
        model: MODEL,
        input: "Forget me too.",
        store: false,
        stream: true
      })
      expect(streamedOff.status).toBe(200)
      yield* (yield* TestServer).settled
      expect(yield* storedRows(accountId)).toEqual([])
      expect((yield* call("GET", `/v1/responses/${off.body.id}`, { token: apiKey })).status).toBe(404)
      const kept = yield* modelCall(apiKey, "/v1/responses", { model: MODEL, input: "Keep me." })
      expect((yield* call("GET", `/v1/responses/${kept.body.id}`, { token: apiKey })).body.output_text).toBe(
        kept.body.output_text
      )
    }))

  it.effect("a conversation over the context window answers 413 context_length_exceeded", () =>
    Effect.gen(function*() {
      const { apiKey } = yield* caller("stored-window@example.com", { environment: "test" })
      const half = "hello ".repeat(600_000)
      const first = yield* modelCall(apiKey, "/v1/responses", { model: MODEL, input: half, max_output_tokens: 16 })
      expect(first.status, first.text).toBe(200)
      const over = yield* modelCall(apiKey, "/v1/responses", {
        model: MODEL,
        previous_response_id: first.body.id,
        input: half
      })
      expect(over.status, over.text).toBe(413)
      expect(over.body.error.code).toBe("context_length_exceeded")
    }))

  it.effect("live keys' responses expire after 30 days and are deleted in batches", () =>
    Effect.gen(function*() {
      const { accountId, apiKey } = yield* caller("stored-expiry@example.com", { sen: 1000 })
      const { clock } = yield* TestServer
      const created = yield* modelCall(apiKey, "/v1/responses", { model: MODEL, input: "Short-lived." })
      const id = created.body.id as string
      clock.advance("29 days")
      expect((yield* call("GET", `/v1/responses/${id}`, { token: apiKey })).status).toBe(200)
      clock.advance("1 day")
      expect((yield* call("GET", `/v1/responses/${id}`, { token: apiKey })).status).toBe(404)
      expect((yield* storedRows(accountId)).length).toBe(1)
      // Many more expired rows than one statement deletes: the purge goes on, batch by batch, until none is left.
      yield* query(
        `INSERT INTO stored_responses (id, account_id, api_key_id, body, created_at, expires_at)
         SELECT 'resp_old' || n, $1, 'key_old', '\\x00'::bytea, now() - interval '40 days', now() - interval '10 days'
         FROM generate_series(1, $2::int) AS n`,
        [accountId, PURGE_BATCH + 500]
      )
      const purged = yield* (yield* StoredResponses).purgeExpired
      expect(purged).toBeGreaterThanOrEqual(PURGE_BATCH + 501)
      expect(yield* storedRows(accountId)).toEqual([])
    }))

  it.effect("item_reference resolves function calls and their outputs, stored by earlier turns, into the model's tool turns", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({
        kind: "ok",
        toolCalls: [{ id: "call_rain", name: "rain", arguments: "{\"city\":\"Ipoh\"}" }]
      })
      const { apiKey } = yield* caller("stored-fc@example.com", { sen: 1000 })
      const tools = [{
        type: "function",
        name: "rain",
        parameters: { type: "object", properties: { city: { type: "string" } } }
      }]
      const first = yield* modelCall(apiKey, "/v1/responses", { model: MODEL, input: "Will it rain in Ipoh?", tools })
      expect(first.status, first.text).toBe(200)
      const callItem = (first.body.output as Array<{ type: string; id: string; call_id: string }>).find((item) =>
        item.type === "function_call"
      )
      expect(callItem?.call_id).toBe("call_rain")
      // The second turn sends the call by reference and its output in full.
      const second = yield* modelCall(apiKey, "/v1/responses", {
        model: MODEL,
        tools,
        input: [
          { role: "user", content: "Will it rain in Ipoh?" },
          { type: "item_reference", id: callItem?.id },
          { type: "function_call_output", call_id: "call_rain", output: "Heavy rain after 4 pm." }
        ]
      })
      expect(second.status, second.text).toBe(200)
      const items = yield* call("GET", `/v1/responses/${second.body.id}/input_items?order=asc`, { token: apiKey })
      const stored = items.body.data as Array<{ type: string; id: string; call_id?: string }>
      expect(stored.map((item) => item.type)).toEqual(["message", "function_call", "function_call_output"])
      // The third turn references all of it: the question, the call and its output.
      const third = yield* modelCall(apiKey, "/v1/responses", {
        model: MODEL,
        tools,
        input: [...stored.map((item) => ({ type: "item_reference", id: item.id })), {
          role: "user",
          content: "Umbrella then?"
        }]
      })
      expect(third.status, third.text).toBe(200)
      const sent = sentMessages(upstream)
      expect(sent.length).toBe(3)
      for (const messages of sent.slice(1)) {
        expect(messages.find((m) => m.role === "assistant")?.tool_calls?.map((c) => [c.id, c.function.name])).toEqual([[
          "call_rain",
          "rain"
        ]])
        expect(messages.filter((m) => m.role === "tool").map((m) => [m.tool_call_id, textOf(m.content)])).toEqual([[
          "call_rain",
          "Heavy rain after 4 pm."
        ]])
      }
      expect(sent[2]?.map((m) => m.role)).toEqual(["user", "assistant", "tool", "user"])
      // OpenAI's own pattern: continue from the response that called, sending only the function's output.
      const continued = yield* modelCall(apiKey, "/v1/responses", {
        model: MODEL,
        tools,
        previous_response_id: first.body.id,
        input: [{ type: "function_call_output", call_id: "call_rain", output: "Drizzle only." }]
      })
      expect(continued.status, continued.text).toBe(200)
      expect(sentMessages(upstream)[3]?.map((m) => [m.role, textOf(m.content)])).toEqual([
        ["user", "Will it rain in Ipoh?"],
        ["assistant", ""],
        ["tool", "Drizzle only."]
      ])
      const unknown = yield* modelCall(apiKey, "/v1/responses", {
        model: MODEL,
        input: [{ role: "user", content: "Hi" }, { type: "item_reference", id: "fc_doesnotexist" }]
      })
      expect(unknown.status).toBe(400)
      expect(unknown.body.error).toMatchObject({ code: "invalid_request", param: "input[1]" })
      expect(unknown.body.error.message).toContain("fc_doesnotexist")
      upstream.reset()
    }))

  it.effect("the stored-response endpoints count against the key's rate limit", () =>
    Effect.gen(function*() {
      const { apiKey } = yield* caller("stored-rpm@example.com", { environment: "test", key: { rate_limit_rpm: 3 } })
      const created = yield* modelCall(apiKey, "/v1/responses", { model: MODEL, input: "Count me." })
      expect(created.status).toBe(200)
      const reads = []
      for (let i = 0; i < 3; i++) {
        reads.push((yield* call("GET", `/v1/responses/${created.body.id}`, { token: apiKey })).status)
      }
      expect(reads).toEqual([200, 200, 429])
    }))

  it.effect("the AI SDK's .responses() with its defaults (store: true): a tool loop and a second turn, every turn 200 and billed once", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      // Text beside the tool call, as models often answer: the SDK sends it back as an item_reference.
      upstream.setBehaviour({
        kind: "ok",
        text: (body) => {
          const messages = body["messages"] as ReadonlyArray<UpstreamMessage>
          const last = messages[messages.length - 1]
          return last?.role === "tool" ? `Forecast: ${textOf(last.content)}` : "Let me check."
        },
        toolCalls: [{ name: "weather", arguments: JSON.stringify({ city: "Melaka" }) }]
      })
      const { accountId, apiKey } = yield* caller("stored-ai-sdk@example.com", { sen: 1000 })
      // What the SDK sends: its own defaults, recorded on the way out.
      const sentByClient: Array<
        { readonly store?: boolean; readonly input: ReadonlyArray<{ readonly type?: string }> }
      > = []
      const { baseUrl } = yield* TestServer
      const model = createOpenAI({
        apiKey,
        baseURL: `${baseUrl}/v1`,
        fetch: async (url, init) => {
          if (typeof init?.body === "string") sentByClient.push(JSON.parse(init.body))
          return fetch(url, init)
        }
      }).responses(MODEL)
      const calls: Array<string> = []
      const weather = tool({
        description: "Weather for a city",
        inputSchema: z.object({ city: z.string() }),
        execute: async ({ city }) => {
          calls.push(city)
          return { forecast: "cloudy", city }
        }
      })
      const first = yield* promise(() =>
        generateText({ model, prompt: "Weather in Melaka?", tools: { weather }, stopWhen: stepCountIs(4) })
      )
      expect(first.steps.length).toBe(2)
      expect(first.text).toContain("cloudy")
      const second = yield* promise(() =>
        generateText({
          model,
          messages: [...first.response.messages, { role: "user", content: "And in Ipoh?" }],
          tools: { weather },
          stopWhen: stepCountIs(4)
        })
      )
      expect(second.text).toContain("cloudy")
      const streamed = streamText({
        model,
        messages: [...first.response.messages, ...second.response.messages, { role: "user", content: "And Kuching?" }],
        tools: { weather },
        stopWhen: stepCountIs(4)
      })
      expect(yield* promise(async () => await streamed.text)).toContain("cloudy")
      expect(calls).toEqual(["Melaka", "Melaka", "Melaka"])
      const requests = upstream.requests.map((r) => r.body as { readonly messages: ReadonlyArray<UpstreamMessage> })
      expect(requests.length).toBe(6)
      // Every turn after the first carried the earlier ones, referenced items resolved: texts, calls and their results.
      const last = requests[5]?.messages ?? []
      expect(last.filter((m) => m.role === "assistant" && textOf(m.content) === "Let me check.").length).toBe(3)
      expect(last.filter((m) => m.role === "tool").map((m) => textOf(m.content))).toEqual([
        expect.stringContaining("cloudy"),
        expect.stringContaining("cloudy"),
        expect.stringContaining("cloudy")
      ])
      for (const request of requests.slice(1)) {
        const called = new Set(request.messages.flatMap((m) => m.tool_calls?.map((c) => c.id) ?? []))
        for (const result of request.messages.filter((m) => m.role === "tool")) {
          expect(called.has(result.tool_call_id ?? "")).toBe(true)
        }
      }
      expect(sentByClient.length).toBe(6)
      expect(sentByClient.every((body) => body.store !== false)).toBe(true)
      expect(sentByClient.flatMap((body) => body.input.filter((item) => item.type === "item_reference")).length)
        .toBeGreaterThanOrEqual(6)
      yield* billedOnce(accountId, 6)
      expect((yield* storedRows(accountId)).length).toBe(6)
      upstream.reset()
    }))
})

layer(TwoInstancesLive("stored"), { excludeTestServices: true, timeout: 120_000 })(
  "stored responses on two instances",
  (it) => {
    it.effect("a turn answered by A is continued, read and referenced through B at once, plain and streamed", () =>
      Effect.gen(function*() {
        yield* bothListening
        const { a, b } = yield* Instances
        const { apiKey } = yield* caller("stored-two@example.com", { environment: "test" })
        for (const stream of [false, true]) {
          const first = yield* on(a)(
            modelCall(apiKey, "/v1/responses", { model: MODEL, input: "Remember: teh tarik.", stream })
          )
          expect(first.status).toBe(200)
          const id = stream ? /"id":"(resp_[0-9A-Za-z]+)"/.exec(first.text)?.[1] : first.body.id as string
          expect(id).toMatch(/^resp_/)
          // At once, through the other instance: no wait between A's answer and B's turn.
          const second = yield* on(b)(
            modelCall(apiKey, "/v1/responses", { model: MODEL, previous_response_id: id, input: "What did I say?" })
          )
          expect(second.status, second.text).toBe(200)
          const read = yield* on(b)(call("GET", `/v1/responses/${second.body.id}`, { token: apiKey }))
          expect(read.status, read.text).toBe(200)
          expect(read.body.previous_response_id).toBe(id)
          const items = yield* on(a)(call("GET", `/v1/responses/${id}/input_items`, { token: apiKey }))
          expect(JSON.stringify(items.body.data)).toContain("teh tarik")
          const messageId = (second.body.output as Array<{ id: string }>)[0]?.id
          const referenced = yield* on(a)(modelCall(apiKey, "/v1/responses", {
            model: MODEL,
            input: [{ type: "item_reference", id: messageId }, { role: "user", content: "Thanks." }]
          }))
          expect(referenced.status, referenced.text).toBe(200)
        }
      }))
  }
)
