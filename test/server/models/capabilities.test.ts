import { createOpenAI } from "@ai-sdk/openai"
import { expect, layer } from "@effect/vitest"
import { generateObject, generateText, stepCountIs, streamText, tool } from "ai"
import { Effect } from "effect"
import OpenAI from "openai"
import { zodResponseFormat, zodTextFormat } from "openai/helpers/zod"
import { z } from "zod"
import { costOf, DEFAULT_PRICES, withSafetyMargin } from "../../../src/Domain/Prices.js"
import { countMessages } from "../../../src/Domain/Tokens.js"
import {
  countImage,
  countToolCall,
  countTools,
  countUpstreamMessages,
  MAX_IMAGE_TOKENS
} from "../../../src/Providers/ContentTokens.js"
import { caller, modelCall, TestServerWithUpstream, violations, walletOf } from "../../support/Models.js"
import { query, TestServer } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * Capabilities beyond text
 * (docs/api/models.md, "Tools, structured output and images";
 * docs/api/models.md, "Model API details"): tools, structured output, images
 * and sampling fields, on both endpoints, plain and streamed, through OpenAI's
 * Node SDK and the Vercel AI SDK. Test keys answer from the built-in model
 * (free, deterministic); live keys reach the local upstream double, which
 * records what was forwarded, and are billed its usage.
 */

const MODEL = "svc/nenas-flash"
const GENERAL = "gpt-4.1-mini"

/** A 1 × 1 PNG: its data URL must reach the upstream byte for byte. */
const PNG_1X1 =
  "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="

const WEATHER_PARAMETERS: Record<string, unknown> = {
  type: "object",
  properties: {
    city: { type: "string", minLength: 2 },
    unit: { type: "string", enum: ["celsius", "fahrenheit"] },
    days: { type: "integer", minimum: 1, maximum: 7 }
  },
  required: ["city", "unit", "days"],
  additionalProperties: false
}

const weatherSchema = z.object({
  city: z.string().min(2),
  unit: z.enum(["celsius", "fahrenheit"]),
  days: z.number().int().min(1).max(7)
})

const sdk = (apiKey: string) =>
  Effect.map(TestServer, ({ baseUrl }) => new OpenAI({ apiKey, baseURL: `${baseUrl}/v1`, maxRetries: 0 }))
const aiSdk = (apiKey: string) =>
  Effect.map(TestServer, ({ baseUrl }) => createOpenAI({ apiKey, baseURL: `${baseUrl}/v1` }))

const promise = <A>(run: () => Promise<A>) => Effect.promise(run)

interface UpstreamBody {
  readonly [field: string]: unknown
  readonly messages: ReadonlyArray<Record<string, unknown>>
}
const sentBodies = (upstream: Upstream["Type"]) => upstream.requests.map((r) => r.body as UpstreamBody)

const reservationOf = (requestId: string) =>
  Effect.map(
    query<{ amount_micro_myr: string; captured_micro_myr: string | null }>(
      "SELECT amount_micro_myr, captured_micro_myr FROM reservations WHERE request_id = $1",
      [requestId]
    ),
    (rows) => ({ amount: Number(rows[0]?.amount_micro_myr), captured: Number(rows[0]?.captured_micro_myr) })
  )

layer(TestServerWithUpstream(), { excludeTestServices: true })("capabilities beyond text", (it) => {
  // -------------------------------------------------------------------------
  // Test keys: the built-in model, through OpenAI's SDK

  it.effect("test key, OpenAI SDK chat: tool_choice required calls the first tool with schema-valid arguments, plain and streamed", () =>
    Effect.gen(function*() {
      const { apiKey } = yield* caller("cap-chat-tools@example.com", { environment: "test" })
      const client = yield* sdk(apiKey)
      const tools: Array<OpenAI.Chat.ChatCompletionTool> = [
        {
          type: "function",
          function: {
            name: "get_weather",
            description: "Weather for a city",
            parameters: WEATHER_PARAMETERS,
            strict: true
          }
        },
        {
          type: "function",
          function: { name: "get_time", parameters: { type: "object", properties: { zone: { type: "string" } } } }
        }
      ]
      const messages: Array<OpenAI.Chat.ChatCompletionMessageParam> = [{
        role: "user",
        content: "Weather in Kuala Lumpur?"
      }]
      const plain = yield* promise(() =>
        client.chat.completions.create({ model: MODEL, messages, tools, tool_choice: "required" })
      )
      const choice = plain.choices[0]
      expect(choice?.finish_reason).toBe("tool_calls")
      expect(choice?.message.content).toBeNull()
      const call = choice?.message.tool_calls?.[0]
      expect(call?.type).toBe("function")
      if (call?.type !== "function") return
      expect(call.id).toMatch(/^call_/)
      expect(call.function.name).toBe("get_weather")
      expect(weatherSchema.safeParse(JSON.parse(call.function.arguments)).success, call.function.arguments).toBe(true)
      // Named: that tool.
      const named = yield* promise(() =>
        client.chat.completions.create({
          model: MODEL,
          messages,
          tools,
          tool_choice: { type: "function", function: { name: "get_time" } }
        })
      )
      const namedCall = named.choices[0]?.message.tool_calls?.[0]
      expect(namedCall?.type === "function" ? namedCall.function.name : undefined).toBe("get_time")
      // auto and none: text.
      for (const choiceOf of ["auto", "none"] as const) {
        const text = yield* promise(() =>
          client.chat.completions.create({ model: MODEL, messages, tools, tool_choice: choiceOf })
        )
        expect(text.choices[0]?.finish_reason, choiceOf).toBe("stop")
        expect(text.choices[0]?.message.tool_calls, choiceOf).toBeUndefined()
      }
      // Streamed: the SDK's accumulator rebuilds the same call from delta.tool_calls fragments.
      const stream = client.chat.completions.stream({
        model: MODEL,
        messages,
        tools,
        tool_choice: "required",
        stream_options: { include_usage: true }
      })
      const fragments: Array<string> = []
      stream.on("tool_calls.function.arguments.delta", (event) => fragments.push(event.arguments_delta))
      const final = yield* promise(() => stream.finalChatCompletion())
      expect(final.choices[0]?.finish_reason).toBe("tool_calls")
      const streamedCall = final.choices[0]?.message.tool_calls?.[0]
      expect(
        streamedCall?.type === "function"
          ? { name: streamedCall.function.name, arguments: streamedCall.function.arguments }
          : undefined
      )
        .toEqual(call.function)
      expect(streamedCall?.id).toBe(call.id)
      expect(fragments.length, "arguments arrive in fragments").toBeGreaterThan(1)
      // Deterministic: the same request, the same call.
      const again = yield* promise(() =>
        client.chat.completions.create({ model: MODEL, messages, tools, tool_choice: "required" })
      )
      expect(again.choices[0]?.message.tool_calls).toEqual(choice?.message.tool_calls)
    }))

  it.effect("test key, OpenAI SDK: runTools completes a tool loop; after the tool result the model answers text", () =>
    Effect.gen(function*() {
      const { apiKey } = yield* caller("cap-run-tools@example.com", { environment: "test" })
      const client = yield* sdk(apiKey)
      const seen: Array<unknown> = []
      const runner = client.chat.completions.runTools({
        model: MODEL,
        messages: [{ role: "user", content: "Weather in Penang?" }],
        tool_choice: "required",
        tools: [{
          type: "function",
          function: {
            name: "get_weather",
            description: "Weather for a city",
            parameters: WEATHER_PARAMETERS,
            parse: (text: string) => weatherSchema.parse(JSON.parse(text)),
            function: (args: z.infer<typeof weatherSchema>) => {
              seen.push(args)
              return { forecast: "sunny", city: args.city }
            }
          }
        }]
      })
      const content = yield* promise(() => runner.finalContent())
      expect(seen).toHaveLength(1)
      expect(content).toContain("The tool answered:")
      expect(content).toContain("sunny")
      const messages = runner.messages
      expect(messages.map((m) => m.role)).toEqual(["user", "assistant", "tool", "assistant"])
    }))

  it.effect("test key, OpenAI SDK: chat.completions.parse and responses.parse answer values valid against the JSON schema", () =>
    Effect.gen(function*() {
      const { apiKey } = yield* caller("cap-parse@example.com", { environment: "test" })
      const client = yield* sdk(apiKey)
      const Event = z.object({
        name: z.string(),
        date: z.string(),
        attendees: z.array(z.string()).min(2),
        confirmed: z.boolean()
      })
      const chat = yield* promise(() =>
        client.chat.completions.parse({
          model: MODEL,
          messages: [{ role: "user", content: "Alice and Bob meet on Friday for lunch." }],
          response_format: zodResponseFormat(Event, "event")
        })
      )
      const parsed = chat.choices[0]?.message.parsed
      expect(Event.safeParse(parsed).success, JSON.stringify(parsed)).toBe(true)
      const responses = yield* promise(() =>
        client.responses.parse({
          model: MODEL,
          input: "Alice and Bob meet on Friday.",
          text: { format: zodTextFormat(Event, "event") }
        })
      )
      expect(Event.safeParse(responses.output_parsed).success, JSON.stringify(responses.output_parsed)).toBe(true)
      // json_object: a JSON object.
      const object = yield* promise(() =>
        client.chat.completions.create({
          model: MODEL,
          messages: [{ role: "user", content: "Answer in JSON." }],
          response_format: { type: "json_object" }
        })
      )
      expect(typeof JSON.parse(object.choices[0]?.message.content ?? "null")).toBe("object")
    }))

  it.effect("test key, OpenAI SDK responses: function tools, a function_call_output follow-up, and responses.stream() with tool calls", () =>
    Effect.gen(function*() {
      const { apiKey } = yield* caller("cap-responses-tools@example.com", { environment: "test" })
      const client = yield* sdk(apiKey)
      const tools: Array<OpenAI.Responses.FunctionTool> = [
        {
          type: "function",
          name: "get_weather",
          description: "Weather for a city",
          parameters: WEATHER_PARAMETERS,
          strict: true
        }
      ]
      const first = yield* promise(() =>
        client.responses.create({ model: MODEL, input: "Weather in Ipoh?", tools, tool_choice: "required" })
      )
      expect(first.output).toHaveLength(1)
      const call = first.output[0]
      expect(call?.type).toBe("function_call")
      if (call?.type !== "function_call") return
      expect(call).toMatchObject({ name: "get_weather", status: "completed" })
      expect(call.id).toMatch(/^fc_/)
      expect(call.call_id).toMatch(/^call_/)
      expect(weatherSchema.safeParse(JSON.parse(call.arguments)).success).toBe(true)
      expect(first.output_text).toBe("")
      const followUp = yield* promise(() =>
        client.responses.create({
          model: MODEL,
          tools,
          tool_choice: "required",
          input: [
            { role: "user", content: "Weather in Ipoh?" },
            call,
            { type: "function_call_output", call_id: call.call_id, output: JSON.stringify({ forecast: "rain" }) }
          ]
        })
      )
      expect(followUp.output.map((item) => item.type)).toEqual(["message"])
      expect(followUp.output_text).toContain("rain")
      // Streamed with the SDK's helper: the events it checks, and the same call in the final response.
      const stream = client.responses.stream({
        model: MODEL,
        input: "Weather in Ipoh?",
        tools,
        tool_choice: "required"
      })
      const types: Array<string> = []
      const deltas: Array<string> = []
      yield* promise(async () => {
        for await (const event of stream) {
          types.push(event.type)
          if (event.type === "response.function_call_arguments.delta") deltas.push(event.delta)
        }
      })
      const final = yield* promise(() => stream.finalResponse())
      expect(types[0]).toBe("response.created")
      expect(types).toContain("response.output_item.added")
      expect(types).toContain("response.function_call_arguments.done")
      expect(types).not.toContain("response.output_text.delta")
      expect(types[types.length - 1]).toBe("response.completed")
      expect(deltas.join("")).toBe(call.arguments)
      const streamedCall = final.output[0]
      expect(
        streamedCall?.type === "function_call"
          ? { name: streamedCall.name, arguments: streamedCall.arguments }
          : undefined
      )
        .toEqual({ name: call.name, arguments: call.arguments })
    }))

  it.effect("test key: images are accepted (chat image_url, Responses input_image), and a web_search tool runs web search", () =>
    Effect.gen(function*() {
      const { apiKey } = yield* caller("cap-images@example.com", { environment: "test" })
      const client = yield* sdk(apiKey)
      const chat = yield* promise(() =>
        client.chat.completions.create({
          model: MODEL,
          messages: [{
            role: "user",
            content: [{ type: "text", text: "What is in this picture?" }, {
              type: "image_url",
              image_url: { url: PNG_1X1, detail: "high" }
            }]
          }]
        })
      )
      expect(chat.choices[0]?.message.content).toContain("It sees 1 image.")
      const responses = yield* promise(() =>
        client.responses.create({
          model: MODEL,
          input: [{
            role: "user",
            content: [
              { type: "input_text", text: "Compare these." },
              { type: "input_image", image_url: "https://example.com/a.png", detail: "low" },
              { type: "input_image", image_url: PNG_1X1, detail: "auto" }
            ]
          }]
        })
      )
      expect(responses.output_text).toContain("It sees 2 images.")
      const searched = yield* promise(() =>
        client.responses.create({
          model: MODEL,
          input: "Latest news on Kuala Lumpur transit",
          tools: [{ type: "web_search" }]
        })
      )
      const extra = searched as OpenAI.Responses.Response & {
        readonly routing: { readonly category: string }
        readonly citations: ReadonlyArray<unknown>
      }
      expect(extra.routing.category).toBe("search")
      expect(extra.citations.length).toBeGreaterThan(0)
    }))

  it.effect("test key, neutral defaults clients send never fail: n 1, penalties 0, logprobs false, response_format text, tool_choice none", () =>
    Effect.gen(function*() {
      const { apiKey } = yield* caller("cap-neutral@example.com", { environment: "test" })
      const reply = yield* modelCall(apiKey, "/v1/chat/completions", {
        model: MODEL,
        messages: [{ role: "user", content: "Hello" }],
        n: 1,
        presence_penalty: 0,
        frequency_penalty: 0,
        logprobs: false,
        response_format: { type: "text" },
        tool_choice: "none",
        parallel_tool_calls: true,
        modalities: ["text"]
      })
      expect(reply.status, reply.text).toBe(200)
      expect(reply.body.choices[0].logprobs).toBeNull()
      const responses = yield* modelCall(apiKey, "/v1/responses", {
        model: MODEL,
        input: "Hello",
        text: { format: { type: "text" }, verbosity: "medium" },
        tool_choice: "none",
        tools: [],
        parallel_tool_calls: false
      })
      expect(responses.status, responses.text).toBe(200)
      // logprobs asked for: returned.
      const withLogprobs = yield* modelCall(apiKey, "/v1/chat/completions", {
        model: MODEL,
        messages: [{ role: "user", content: "Hello" }],
        logprobs: true,
        top_logprobs: 2
      })
      expect(withLogprobs.status, withLogprobs.text).toBe(200)
      expect(withLogprobs.body.choices[0].logprobs.content.length).toBeGreaterThan(0)
    }))

  it.effect("tool input is checked as OpenAI checks it: a named tool_choice among the tools, unique names, results after calls", () =>
    Effect.gen(function*() {
      const { apiKey } = yield* caller("cap-tool-errors@example.com", { environment: "test" })
      const tool = { type: "function", function: { name: "f", parameters: { type: "object", properties: {} } } }
      const cases: ReadonlyArray<readonly [string, Record<string, unknown>, string]> = [
        ["a named choice not among the tools", {
          tools: [tool],
          tool_choice: { type: "function", function: { name: "g" } }
        }, "tool_choice"],
        ["required without tools", { tool_choice: "required" }, "tool_choice"],
        ["a name used twice", { tools: [tool, tool] }, "tools[1]"],
        ["a tool result without its call", {
          messages: [{ role: "user", content: "hi" }, { role: "tool", tool_call_id: "call_x", content: "42" }]
        }, "messages[1]"],
        [
          "a bad function name",
          { tools: [{ type: "function", function: { name: "has space" } }] },
          "tools.0.function.name"
        ]
      ]
      for (const [name, extra, param] of cases) {
        const reply = yield* modelCall(apiKey, "/v1/chat/completions", {
          model: MODEL,
          messages: [{ role: "user", content: "hi" }],
          ...extra
        })
        expect(reply.status, `${name}: ${reply.text}`).toBe(400)
        expect(reply.body.error.code, name).toBe("invalid_request")
        if (param !== "tools.0.function.name") expect(reply.body.error.param, name).toBe(param)
      }
      const badImage = yield* modelCall(apiKey, "/v1/chat/completions", {
        model: MODEL,
        messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "ftp://example.com/cat.png" } }] }]
      })
      expect(badImage.status).toBe(400)
      expect(badImage.body.error.param).toBe("messages[0].content[0].image_url.url")
    }))

  // -------------------------------------------------------------------------
  // Test keys through the Vercel AI SDK, `.chat()` and `.responses()`

  for (const flavour of ["chat", "responses"] as const) {
    it.effect(`test key, AI SDK .${flavour}(): generateText finishes a multi-step tool loop, streamText streams tool calls, generateObject follows a zod schema`, () =>
      Effect.gen(function*() {
        const { apiKey } = yield* caller(`cap-ai-sdk-${flavour}@example.com`, { environment: "test" })
        const provider = yield* aiSdk(apiKey)
        const model = flavour === "chat" ? provider.chat(MODEL) : provider.responses(MODEL)
        const calls: Array<unknown> = []
        const weather = tool({
          description: "Weather for a city",
          inputSchema: weatherSchema,
          execute: async (input) => {
            calls.push(input)
            return { forecast: "cloudy", city: input.city }
          }
        })
        // The AI SDK checks that a `required` step called a tool, so the first step requires one and the next may answer.
        const prepareStep = ({ stepNumber }: { readonly stepNumber: number }) => ({
          toolChoice: stepNumber === 0 ? "required" as const : "auto" as const
        })
        const generated = yield* promise(() =>
          generateText({
            model,
            prompt: "Weather in Melaka?",
            tools: { weather },
            prepareStep,
            stopWhen: stepCountIs(4)
          })
        )
        expect(generated.steps.length).toBe(2)
        expect(generated.steps[0]?.toolCalls.map((c) => c.toolName)).toEqual(["weather"])
        expect(generated.steps[0]?.finishReason).toBe("tool-calls")
        expect(calls).toHaveLength(1)
        expect(weatherSchema.safeParse(calls[0]).success).toBe(true)
        expect(generated.text).toContain("cloudy")
        expect(generated.finishReason).toBe("stop")

        const streamed = streamText({
          model,
          prompt: "Weather in Melaka?",
          tools: { weather },
          prepareStep,
          stopWhen: stepCountIs(4)
        })
        const kinds = new Set<string>()
        yield* promise(async () => {
          for await (const part of streamed.fullStream) kinds.add(part.type)
        })
        expect(kinds.has("tool-call")).toBe(true)
        expect(kinds.has("tool-result")).toBe(true)
        expect(kinds.has("text-delta")).toBe(true)
        expect(yield* promise(async () => await streamed.text)).toContain("cloudy")
        expect(calls).toHaveLength(2)

        const Recipe = z.object({
          name: z.string(),
          servings: z.number().int().min(1),
          steps: z.array(z.string()).min(1),
          vegetarian: z.boolean()
        })
        const object = yield* promise(() =>
          generateObject({ model, schema: Recipe, prompt: "A recipe for nasi lemak." })
        )
        expect(Recipe.safeParse(object.object).success, JSON.stringify(object.object)).toBe(true)
      }))
  }

  // -------------------------------------------------------------------------
  // Live keys: forwarded to the upstream and billed its usage

  it.effect("live key: sampling fields go upstream, logprobs come back (plain and streamed); neutral tool fields without tools stay home", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const { apiKey } = yield* caller("cap-live-sampling@example.com", { sen: 1000 })
      const client = yield* sdk(apiKey)
      const body = {
        model: MODEL,
        messages: [{ role: "user" as const, content: "Hello" }],
        presence_penalty: 0.5,
        frequency_penalty: -0.5,
        logit_bias: { "1234": -100 },
        seed: 7,
        logprobs: true,
        top_logprobs: 3,
        tool_choice: "none" as const,
        parallel_tool_calls: false
      }
      const plain = yield* promise(() => client.chat.completions.create(body))
      expect(plain.choices[0]?.logprobs?.content?.[0]).toMatchObject({ logprob: -0.25 })
      const sent = sentBodies(upstream)[0]
      expect(sent).toMatchObject({
        presence_penalty: 0.5,
        frequency_penalty: -0.5,
        logit_bias: { "1234": -100 },
        seed: 7,
        logprobs: true,
        top_logprobs: 3
      })
      expect(sent, "tool fields without tools are not sent (OpenAI refuses them)").not.toHaveProperty("tool_choice")
      expect(sent).not.toHaveProperty("parallel_tool_calls")
      const chunks = yield* promise(async () => {
        const out: Array<OpenAI.Chat.ChatCompletionChunk> = []
        for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) out.push(chunk)
        return out
      })
      const streamedLogprobs = chunks.flatMap((c) => c.choices[0]?.logprobs?.content ?? [])
      expect(streamedLogprobs.map((l) => l.token).join("")).toBe(plain.choices[0]?.message.content)
    }))

  it.effect("live key, chat: tools, tool_choice and parallel_tool_calls forwarded; the upstream's calls returned plain and streamed; billed its usage", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const usage = { prompt_tokens: 900, completion_tokens: 40, reasoning_tokens: 0, cached_tokens: 0 }
      const toolCalls = [
        { id: "call_up_1", name: "get_weather", arguments: "{\"city\":\"Kuching\",\"unit\":\"celsius\",\"days\":2}" },
        { id: "call_up_2", name: "get_weather", arguments: "{\"city\":\"Miri\",\"unit\":\"celsius\",\"days\":1}" }
      ]
      upstream.setBehaviour({ kind: "ok", usage, toolCalls, text: "Checking both." })
      const { accountId, apiKey } = yield* caller("cap-live-chat-tools@example.com", { sen: 1000 })
      const client = yield* sdk(apiKey)
      const tools: Array<OpenAI.Chat.ChatCompletionTool> = [
        {
          type: "function",
          function: { name: "get_weather", description: "Weather", parameters: WEATHER_PARAMETERS, strict: true }
        }
      ]
      const messages: Array<OpenAI.Chat.ChatCompletionMessageParam> = [
        { role: "system", content: "Be brief." },
        { role: "user", content: "Weather in Kuching and Miri?" }
      ]
      const plain = yield* promise(() =>
        client.chat.completions.create({
          model: MODEL,
          messages,
          tools,
          tool_choice: "auto",
          parallel_tool_calls: true
        })
      )
      expect(plain.choices[0]?.finish_reason).toBe("tool_calls")
      // A tool call mixed with text, as OpenAI may answer: both kept.
      expect(plain.choices[0]?.message.content).toBe("Checking both.")
      expect(plain.choices[0]?.message.tool_calls).toEqual(toolCalls.map((c) => ({
        id: c.id,
        type: "function",
        function: { name: c.name, arguments: c.arguments }
      })))
      const sent = sentBodies(upstream)[0]
      expect(sent?.["tools"]).toEqual(tools)
      expect(sent).toMatchObject({ tool_choice: "auto", parallel_tool_calls: true })
      const requestId = plain.id.replace(/^chatcmpl-/, "req_")
      const expected = costOf(DEFAULT_PRICES, GENERAL, {
        inputTokens: 900,
        cachedTokens: 0,
        outputTokens: 40,
        searches: 0,
        pages: 0
      })
      expect((yield* reservationOf(requestId)).captured).toBe(expected)

      const stream = client.chat.completions.stream({ model: MODEL, messages, tools, tool_choice: "auto" })
      const final = yield* promise(() => stream.finalChatCompletion())
      // The SDK's stream helper adds parsed_arguments for strict tools.
      expect(
        final.choices[0]?.message.tool_calls?.map((c) =>
          c.type === "function" ? { id: c.id, name: c.function.name, arguments: c.function.arguments } : c
        )
      )
        .toEqual(toolCalls)
      expect(final.choices[0]?.message.content).toBe("Checking both.")
      expect(final.choices[0]?.finish_reason).toBe("tool_calls")
      const streamedId = final.id.replace(/^chatcmpl-/, "req_")
      expect((yield* reservationOf(streamedId)).captured).toBe(expected)

      // The follow-up: the assistant's tool calls and the tool results go upstream as chat carries them.
      upstream.reset()
      upstream.setBehaviour({ kind: "ok", usage })
      const followUp = yield* promise(() =>
        client.chat.completions.create({
          model: MODEL,
          tools,
          messages: [
            ...messages,
            { role: "assistant", content: null, tool_calls: plain.choices[0]?.message.tool_calls ?? [] },
            { role: "tool", tool_call_id: "call_up_1", content: "30C" },
            { role: "tool", tool_call_id: "call_up_2", content: "28C" }
          ]
        })
      )
      expect(followUp.choices[0]?.finish_reason).toBe("stop")
      expect(sentBodies(upstream)[0]?.messages.slice(2)).toEqual([
        { role: "assistant", content: null, tool_calls: plain.choices[0]?.message.tool_calls },
        { role: "tool", tool_call_id: "call_up_1", content: "30C" },
        { role: "tool", tool_call_id: "call_up_2", content: "28C" }
      ])
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.effect("live key, responses: function tools and text.format go upstream in chat's shape; calls come back as function_call items, streamed too", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const usage = { prompt_tokens: 700, completion_tokens: 30, reasoning_tokens: 12, cached_tokens: 0 }
      upstream.setBehaviour({
        kind: "ok",
        usage,
        toolCalls: [{
          id: "call_r1",
          name: "get_weather",
          arguments: "{\"city\":\"Sibu\",\"unit\":\"celsius\",\"days\":3}"
        }]
      })
      const { apiKey } = yield* caller("cap-live-responses-tools@example.com", { sen: 1000 })
      const client = yield* sdk(apiKey)
      const tools: Array<OpenAI.Responses.FunctionTool> = [
        { type: "function", name: "get_weather", description: "Weather", parameters: WEATHER_PARAMETERS, strict: true }
      ]
      const first = yield* promise(() =>
        client.responses.create({
          model: MODEL,
          instructions: "Be brief.",
          input: "Weather in Sibu?",
          tools,
          tool_choice: { type: "function", name: "get_weather" }
        })
      )
      expect(first.output).toEqual([{
        type: "function_call",
        id: expect.stringMatching(/^fc_/),
        call_id: "call_r1",
        name: "get_weather",
        arguments: "{\"city\":\"Sibu\",\"unit\":\"celsius\",\"days\":3}",
        status: "completed"
      }])
      expect(sentBodies(upstream)[0]).toMatchObject({
        tools: [{
          type: "function",
          function: { name: "get_weather", description: "Weather", parameters: WEATHER_PARAMETERS, strict: true }
        }],
        tool_choice: { type: "function", function: { name: "get_weather" } }
      })
      const call = first.output[0]
      if (call?.type !== "function_call") return expect.fail("a function call")
      upstream.reset()
      upstream.setBehaviour({ kind: "ok", usage, text: "{\"summary\":\"Rain\"}" })
      const followUp = yield* promise(() =>
        client.responses.create({
          model: MODEL,
          tools,
          text: {
            format: {
              type: "json_schema",
              name: "summary",
              schema: {
                type: "object",
                properties: { summary: { type: "string" } },
                required: ["summary"],
                additionalProperties: false
              },
              strict: true
            }
          },
          input: [
            { role: "user", content: "Weather in Sibu?" },
            call,
            { type: "function_call_output", call_id: call.call_id, output: "rain all day" }
          ]
        })
      )
      expect(followUp.output_text).toBe("{\"summary\":\"Rain\"}")
      const sent = sentBodies(upstream)[0]
      expect(sent?.messages).toEqual([
        { role: "user", content: "Weather in Sibu?" },
        {
          role: "assistant",
          content: null,
          tool_calls: [{
            id: "call_r1",
            type: "function",
            function: { name: "get_weather", arguments: call.arguments }
          }]
        },
        { role: "tool", tool_call_id: "call_r1", content: "rain all day" }
      ])
      expect(sent?.["response_format"]).toEqual({
        type: "json_schema",
        json_schema: {
          name: "summary",
          schema: {
            type: "object",
            properties: { summary: { type: "string" } },
            required: ["summary"],
            additionalProperties: false
          },
          strict: true
        }
      })
      // Streamed through responses.stream(): the call's events, and the upstream's usage billed, reasoning included.
      upstream.reset()
      upstream.setBehaviour({
        kind: "ok",
        usage,
        toolCalls: [{
          id: "call_r2",
          name: "get_weather",
          arguments: "{\"city\":\"Bintulu\",\"unit\":\"celsius\",\"days\":1}"
        }]
      })
      const stream = client.responses.stream({
        model: MODEL,
        input: "Weather in Bintulu?",
        tools,
        tool_choice: "required"
      })
      const final = yield* promise(() => stream.finalResponse())
      expect(final.output).toMatchObject([{
        type: "function_call",
        call_id: "call_r2",
        name: "get_weather",
        status: "completed"
      }])
      expect(final.usage).toMatchObject({
        input_tokens: 700,
        output_tokens: 30,
        output_tokens_details: { reasoning_tokens: 12 }
      })
      const expected = costOf(DEFAULT_PRICES, GENERAL, {
        inputTokens: 700,
        cachedTokens: 0,
        outputTokens: 30,
        searches: 0,
        pages: 0
      })
      expect((yield* reservationOf((final as unknown as { readonly request_id: string }).request_id)).captured).toBe(
        expected
      )
    }))

  it.effect("live key, structured output: chat response_format json_schema and json_object go upstream as sent", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({ kind: "ok", text: "{\"name\":\"x\"}" })
      const { apiKey } = yield* caller("cap-live-format@example.com", { sen: 1000 })
      const format = {
        type: "json_schema",
        json_schema: {
          name: "thing",
          schema: { type: "object", properties: { name: { type: "string" } } },
          strict: true
        }
      }
      for (const responseFormat of [format, { type: "json_object" }]) {
        upstream.reset()
        const reply = yield* modelCall(apiKey, "/v1/chat/completions", {
          model: MODEL,
          messages: [{ role: "user", content: "Name a thing, in JSON." }],
          response_format: responseFormat
        })
        expect(reply.status, reply.text).toBe(200)
        expect(sentBodies(upstream)[0]?.["response_format"]).toEqual(responseFormat)
      }
    }))

  it.effect("live key, images: a PNG data URL reaches the upstream byte for byte on both endpoints, and the estimate counts images as OpenAI does", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      const { accountId, apiKey } = yield* caller("cap-live-images@example.com", { sen: 1000 })
      upstream.reset()
      const chat = yield* modelCall(apiKey, "/v1/chat/completions", {
        model: MODEL,
        messages: [{
          role: "user",
          content: [{ type: "text", text: "Describe." }, {
            type: "image_url",
            image_url: { url: PNG_1X1, detail: "high" }
          }]
        }]
      })
      expect(chat.status, chat.text).toBe(200)
      expect(sentBodies(upstream)[0]?.messages).toEqual([
        {
          role: "user",
          content: [{ type: "text", text: "Describe." }, {
            type: "image_url",
            image_url: { url: PNG_1X1, detail: "high" }
          }]
        }
      ])
      upstream.reset()
      const responses = yield* modelCall(apiKey, "/v1/responses", {
        model: MODEL,
        input: [{
          role: "user",
          content: [{ type: "input_text", text: "Describe." }, {
            type: "input_image",
            image_url: PNG_1X1,
            detail: "low"
          }]
        }]
      })
      expect(responses.status, responses.text).toBe(200)
      expect(sentBodies(upstream)[0]?.messages).toEqual([
        {
          role: "user",
          content: [{ type: "text", text: "Describe." }, {
            type: "image_url",
            image_url: { url: PNG_1X1, detail: "low" }
          }]
        }
      ])
      // OpenAI's image tokens: 85 for low; a 1 × 1 image at high detail is one tile (85 + 170); an unseen remote image the most.
      expect(countImage(PNG_1X1, "low")).toBe(85)
      expect(countImage(PNG_1X1, "high")).toBe(255)
      expect(countImage("https://example.com/cat.png", "auto")).toBe(MAX_IMAGE_TOKENS)
      expect(MAX_IMAGE_TOKENS).toBe(1445)
      // The reservation: the text's tokens plus the image's, with the margin, and the output cap.
      const reservationFor = (imageTokens: number) =>
        costOf(DEFAULT_PRICES, GENERAL, {
          inputTokens: withSafetyMargin(countMessages([{ role: "user", content: "Describe." }]) + imageTokens),
          cachedTokens: 0,
          outputTokens: 32_000,
          searches: 0,
          pages: 0
        })
      const remote = yield* modelCall(apiKey, "/v1/chat/completions", {
        model: MODEL,
        max_tokens: 32_000,
        messages: [{
          role: "user",
          content: [{ type: "text", text: "Describe." }, {
            type: "image_url",
            image_url: { url: "https://example.com/cat.png" }
          }]
        }]
      })
      expect(remote.status, remote.text).toBe(200)
      expect((yield* reservationOf(remote.headers.get("x-request-id") ?? "")).amount).toBe(reservationFor(1445))
      const low = yield* modelCall(apiKey, "/v1/chat/completions", {
        model: MODEL,
        max_tokens: 32_000,
        messages: [{
          role: "user",
          content: [{ type: "text", text: "Describe." }, {
            type: "image_url",
            image_url: { url: "https://example.com/cat.png", detail: "low" }
          }]
        }]
      })
      expect((yield* reservationOf(low.headers.get("x-request-id") ?? "")).amount).toBe(reservationFor(85))
      expect(yield* violations(accountId)).toEqual([])
      expect((yield* walletOf(accountId)).reserved).toBe(0)
    }))

  it.effect("live key: an upstream that reports no usage is billed its tool calls and the tool definitions, counted (estimated), plain and streamed", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const call = {
        id: "call_e1",
        name: "get_weather",
        arguments: "{\"city\":\"Kuantan\",\"unit\":\"celsius\",\"days\":4}"
      }
      upstream.setBehaviour({ kind: "ok", usage: "none", toolCalls: [call] })
      const { accountId, apiKey } = yield* caller("cap-live-estimated-tools@example.com", { sen: 1000 })
      const tools = [{ type: "function" as const, function: { name: "get_weather", parameters: WEATHER_PARAMETERS } }]
      const messages = [{ role: "user" as const, content: "Weather in Kuantan?" }]
      const inputTokens = countUpstreamMessages(messages) + countTools(tools)
      const outputTokens = countToolCall({
        id: call.id,
        type: "function",
        function: { name: call.name, arguments: call.arguments }
      })
      const expected = costOf(DEFAULT_PRICES, GENERAL, {
        inputTokens,
        cachedTokens: 0,
        outputTokens,
        searches: 0,
        pages: 0
      })
      for (const stream of [false, true]) {
        const reply = yield* modelCall(apiKey, "/v1/chat/completions", { model: MODEL, messages, tools, stream })
        expect(reply.status, reply.text).toBe(200)
        const requestId = reply.headers.get("x-request-id") ?? ""
        const rows = yield* query<
          { usage_source: string; input_tokens: number; output_tokens: number; cost_micro_myr: string }
        >(
          "SELECT usage_source, input_tokens, output_tokens, cost_micro_myr FROM request_logs WHERE request_id = $1",
          [requestId]
        )
        expect(rows[0], `stream ${stream}`).toEqual({
          usage_source: "estimated",
          input_tokens: inputTokens,
          output_tokens: outputTokens,
          cost_micro_myr: String(expected)
        })
        expect((yield* reservationOf(requestId)).captured, `stream ${stream}`).toBe(expected)
      }
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.effect("live key: tool definitions count toward the estimate; max_total_cost_myr below it refuses before the upstream is called", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const { apiKey } = yield* caller("cap-live-tool-estimate@example.com", { sen: 1000 })
      const base = { model: MODEL, max_tokens: 10, messages: [{ role: "user", content: "Hi" }] }
      const bigTools = Array.from({ length: 20 }, (_, i) => ({
        type: "function",
        function: {
          name: `tool_${i}`,
          description: "A tool with a long description. ".repeat(40),
          parameters: WEATHER_PARAMETERS
        }
      }))
      const without = yield* modelCall(apiKey, "/v1/chat/completions", base)
      const withTools = yield* modelCall(apiKey, "/v1/chat/completions", { ...base, tools: bigTools })
      const plainReserved = (yield* reservationOf(without.headers.get("x-request-id") ?? "")).amount
      const toolsReserved = (yield* reservationOf(withTools.headers.get("x-request-id") ?? "")).amount
      expect(toolsReserved).toBeGreaterThan(plainReserved * 5)
      const sent = upstream.requests.length
      const capped = yield* modelCall(apiKey, "/v1/chat/completions", {
        ...base,
        tools: bigTools,
        max_total_cost_myr: plainReserved / 1_000_000 * 2
      })
      expect(capped.status, capped.text).toBe(400)
      expect(capped.body.error.param).toBe("max_total_cost_myr")
      expect(upstream.requests.length).toBe(sent)
    }))
})
