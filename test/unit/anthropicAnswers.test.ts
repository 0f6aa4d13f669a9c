import { createAnthropic } from "@ai-sdk/anthropic"
import Anthropic from "@anthropic-ai/sdk"
import { generateText, streamText, tool } from "ai"
import { Schema } from "effect"
import { describe, expect, it } from "vitest"
import { z } from "zod"
import type { ApiError } from "../../src/Domain/Errors.js"
import {
  errorClasses,
  httpStatus,
  InvalidRequest,
  NotFound,
  ProviderUnavailable,
  RateLimitExceeded
} from "../../src/Domain/Errors.js"
import { microMyr } from "../../src/Domain/Money.js"
import { AnthropicMessage } from "../../src/Models/Anthropic/AnthropicApi.js"
import { anthropicErrorBody, anthropicErrorType } from "../../src/Models/Anthropic/AnthropicErrors.js"
import { anthropicEvents, anthropicMessage } from "../../src/Models/Anthropic/AnthropicWire.js"
import type { CallResult, StreamEvent } from "../../src/Models/Call/CallTypes.js"
import { parseSse } from "../support/Sse.js"

/**
 * Anthropic's Messages API answered, without a database or a server: call results to Messages,
 * stream events to Anthropic's SSE, errors to Anthropic's body; and Anthropic's SDK and the AI
 * SDK's provider read them (through a fetch that answers what the translation wrote).
 */

const MODEL = "svc/nenas-flash"

const resultOf = (fields: Partial<CallResult>): CallResult => ({
  requestId: "req_abc",
  createdAt: 1_700_000_000,
  text: "",
  toolCalls: [],
  logprobs: undefined,
  finishReason: "stop",
  usage: { inputTokens: 120, outputTokens: 30, reasoningTokens: 0, cachedTokens: 100 },
  cost: microMyr(1234),
  latencyMs: 50,
  route: {
    category: "general",
    upstreamModel: "gpt-4.1-mini",
    reasoningModel: false,
    search: false,
    reasoning: "Routed."
  },
  citations: [],
  annotations: [],
  stored: { store: false, previousResponseId: null },
  ...fields
})

const weatherCall = {
  id: "call_9",
  type: "function" as const,
  function: { name: "get_weather", arguments: "{\"city\":\"Ipoh\"}" }
}
const CITED = "Ipoh is hot [1]. It rains often. [2]"
const citedAnnotations = [
  { startIndex: 12, endIndex: 15, url: "https://a.example", title: "A" },
  { startIndex: 33, endIndex: 36, url: "https://b.example", title: "B" }
]

describe("call results become Anthropic Messages", () => {
  it("that the contract's schema decodes", () => {
    const message = anthropicMessage(resultOf({ text: CITED, annotations: citedAnnotations, toolCalls: [weatherCall] }))
    expect(Schema.decodeUnknownSync(AnthropicMessage)(message)).toEqual(message)
  })

  it("a text answer, with usage that sums to the upstream's prompt tokens, and nenas's fields", () => {
    expect(anthropicMessage(resultOf({ text: "Hello." }))).toEqual({
      id: "msg_abc",
      type: "message",
      role: "assistant",
      model: MODEL,
      content: [{ type: "text", text: "Hello." }],
      stop_reason: "end_turn",
      stop_sequence: null,
      usage: { input_tokens: 20, output_tokens: 30, cache_read_input_tokens: 100, cache_creation_input_tokens: 0 },
      routing: { category: "general", upstream_model: "gpt-4.1-mini", reasoning: "Routed.", fallback: false },
      cost_myr: "0.001234"
    })
  })

  it("tool_use blocks, with toolu_ ids and parsed input", () => {
    const message = anthropicMessage(
      resultOf({ text: "Checking.", toolCalls: [weatherCall], finishReason: "tool_calls" })
    )
    expect(message.content).toEqual([
      { type: "text", text: "Checking." },
      { type: "tool_use", id: "toolu_9", name: "get_weather", input: { city: "Ipoh" } }
    ])
    expect(message.stop_reason).toBe("tool_use")
    expect(anthropicMessage(resultOf({ toolCalls: [weatherCall], finishReason: "tool_calls" })).content).toHaveLength(1)
  })

  it("citations as web_search_result_location", () => {
    const message = anthropicMessage(resultOf({ text: CITED, annotations: citedAnnotations }))
    expect(message.content).toEqual([{
      type: "text",
      text: CITED,
      citations: [
        {
          type: "web_search_result_location",
          url: "https://a.example",
          title: "A",
          cited_text: "Ipoh is hot",
          encrypted_index: "WzFd"
        },
        {
          type: "web_search_result_location",
          url: "https://b.example",
          title: "B",
          cited_text: "It rains often.",
          encrypted_index: "WzJd"
        }
      ]
    }])
  })

  const stops: ReadonlyArray<readonly [CallResult["finishReason"], number, string]> = [
    ["stop", 0, "end_turn"],
    ["length", 0, "max_tokens"],
    ["tool_calls", 1, "tool_use"],
    ["stop", 1, "tool_use"],
    ["tool_calls", 0, "end_turn"],
    ["content_filter", 0, "refusal"]
  ]
  it.each(stops)("finish_reason %s with %i calls is %s", (finishReason, calls, stopReason) => {
    const toolCalls = calls === 0 ? [] : [weatherCall]
    expect(anthropicMessage(resultOf({ text: "x", finishReason, toolCalls })).stop_reason).toBe(stopReason)
  })

  it("an empty answer is one empty text block; no cached tokens, all input", () => {
    const message = anthropicMessage(
      resultOf({ usage: { inputTokens: 7, outputTokens: 0, reasoningTokens: 0, cachedTokens: 0 } })
    )
    expect(message.content).toEqual([{ type: "text", text: "" }])
    expect(message.usage).toEqual({
      input_tokens: 7,
      output_tokens: 0,
      cache_read_input_tokens: 0,
      cache_creation_input_tokens: 0
    })
  })
})

const CONTEXT = { requestId: "req_abc", createdAt: 1_700_000_000, dashboardUrl: "https://dash.example" }
const streamOf = (events: ReadonlyArray<StreamEvent>): string => {
  const renderer = anthropicEvents(CONTEXT)
  return renderer.start + events.map(renderer.render).join("")
}
const ev = (type: string, fields: Record<string, unknown> = {}) =>
  `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`
const START = ev("message_start", {
  message: {
    id: "msg_abc",
    type: "message",
    role: "assistant",
    model: MODEL,
    content: [],
    stop_reason: null,
    stop_sequence: null,
    usage: { input_tokens: 0, output_tokens: 0, cache_read_input_tokens: 0, cache_creation_input_tokens: 0 }
  }
}) + ev("ping")
const USAGE = { input_tokens: 20, output_tokens: 30, cache_read_input_tokens: 100, cache_creation_input_tokens: 0 }
const ROUTING = { category: "general", upstream_model: "gpt-4.1-mini", reasoning: "Routed.", fallback: false }
const end = (stopReason: string) =>
  ev("message_delta", {
    delta: { stop_reason: stopReason, stop_sequence: null },
    usage: USAGE,
    routing: ROUTING,
    cost_myr: "0.001234"
  }) +
  ev("message_stop")

describe("stream events become Anthropic's SSE", () => {
  it("a text stream", () => {
    expect(streamOf([
      { _tag: "Delta", text: "Hel" },
      { _tag: "Delta", text: "" },
      { _tag: "Delta", text: "lo." },
      { _tag: "Completed", result: resultOf({ text: "Hello." }) }
    ])).toBe(
      START +
        ev("content_block_start", { index: 0, content_block: { type: "text", text: "" } }) +
        ev("content_block_delta", { index: 0, delta: { type: "text_delta", text: "Hel" } }) +
        ev("content_block_delta", { index: 0, delta: { type: "text_delta", text: "lo." } }) +
        ev("content_block_stop", { index: 0 }) +
        end("end_turn")
    )
  })

  it("text, then a tool call streamed in fragments", () => {
    const fragment = (args: string): StreamEvent => ({
      _tag: "ToolCallDelta",
      index: 0,
      id: "call_9",
      name: "get_weather",
      arguments: args
    })
    const text = streamOf([
      { _tag: "Delta", text: "Checking." },
      fragment(""),
      fragment("{\"city\":"),
      fragment("\"Ipoh\"}"),
      {
        _tag: "Completed",
        result: resultOf({ text: "Checking.", toolCalls: [weatherCall], finishReason: "tool_calls" })
      }
    ])
    expect(text).toBe(
      START +
        ev("content_block_start", { index: 0, content_block: { type: "text", text: "" } }) +
        ev("content_block_delta", { index: 0, delta: { type: "text_delta", text: "Checking." } }) +
        ev("content_block_stop", { index: 0 }) +
        ev("content_block_start", {
          index: 1,
          content_block: { type: "tool_use", id: "toolu_9", name: "get_weather", input: {} }
        }) +
        ev("content_block_delta", { index: 1, delta: { type: "input_json_delta", partial_json: "{\"city\":" } }) +
        ev("content_block_delta", { index: 1, delta: { type: "input_json_delta", partial_json: "\"Ipoh\"}" } }) +
        ev("content_block_stop", { index: 1 }) +
        end("tool_use")
    )
    // What a client assembles: the fragments make the call's input.
    const partial = parseSse(text).map((e) => JSON.parse(e.data)).filter((d) => d.delta?.type === "input_json_delta")
    expect(JSON.parse(partial.map((d) => d.delta.partial_json).join(""))).toEqual({ city: "Ipoh" })
  })

  it("citations arrive before the text block stops", () => {
    const text = streamOf([
      { _tag: "Delta", text: CITED },
      { _tag: "Completed", result: resultOf({ text: CITED, annotations: citedAnnotations }) }
    ])
    const events = parseSse(text)
    expect(events.map((e) => e.event)).toEqual([
      "message_start",
      "ping",
      "content_block_start",
      "content_block_delta",
      "content_block_delta",
      "content_block_delta",
      "content_block_stop",
      "message_delta",
      "message_stop"
    ])
    expect(JSON.parse(events[4]?.data ?? "").delta).toEqual({
      type: "citations_delta",
      citation: {
        type: "web_search_result_location",
        url: "https://a.example",
        title: "A",
        cited_text: "Ipoh is hot",
        encrypted_index: "WzFd"
      }
    })
  })

  it("a failure after the first byte is an error event, with no message_stop", () => {
    const error = new ProviderUnavailable({ message: "The upstream stopped mid-answer." })
    expect(streamOf([{ _tag: "Delta", text: "Hel" }, { _tag: "Failed", error }])).toBe(
      START +
        ev("content_block_start", { index: 0, content_block: { type: "text", text: "" } }) +
        ev("content_block_delta", { index: 0, delta: { type: "text_delta", text: "Hel" } }) +
        ev("error", {
          error: {
            type: "overloaded_error",
            message: "The upstream stopped mid-answer.",
            code: "provider_unavailable",
            param: null,
            guidance: "The model provider is unavailable; retry with backoff.",
            action_url: null,
            retryable: true
          },
          request_id: "req_abc"
        })
    )
  })
})

describe("errors in Anthropic's body", () => {
  const cases: ReadonlyArray<readonly [ApiError, number | string, string]> = [
    [new InvalidRequest({ message: "bad", param: "messages[0]" }), 400, "invalid_request_error"],
    [new NotFound({ message: "no model", param: "model" }), 404, "not_found_error"],
    [new RateLimitExceeded({ message: "slow", retry_after_seconds: 3 }), 429, "rate_limit_error"]
  ]
  it.each(cases)("%s", (error, _status, type) => {
    const body = anthropicErrorBody(error, "req_1", "https://dash.example")
    expect(body).toMatchObject({
      type: "error",
      error: { type, message: error.message, param: error.param },
      request_id: "req_1"
    })
  })
  it("keeps nenas's guidance, action_url and retry_after_seconds", () => {
    expect(
      anthropicErrorBody(new RateLimitExceeded({ message: "slow", retry_after_seconds: 3 }), "req_1", "https://d").error
    ).toEqual({
      type: "rate_limit_error",
      message: "slow",
      code: "rate_limit_exceeded",
      param: null,
      guidance: "Slow down and retry after `retry_after_seconds`.",
      action_url: null,
      retryable: true,
      retry_after_seconds: 3
    })
  })

  it("give every error code Anthropic's type for its status", () => {
    expect(Object.fromEntries(errorClasses.map((cls) => [cls._tag, anthropicErrorType(httpStatus(cls))]))).toEqual({
      InvalidRequest: "invalid_request_error",
      UnsupportedInput: "invalid_request_error",
      ContentBlocked: "invalid_request_error",
      NotImplemented: "invalid_request_error",
      ContextLengthExceeded: "request_too_large",
      NotFound: "not_found_error",
      AuthenticationError: "authentication_error",
      InvalidApiKey: "authentication_error",
      ExpiredApiKey: "authentication_error",
      RevokedApiKey: "authentication_error",
      PermissionDenied: "permission_error",
      InsufficientBalance: "billing_error",
      SpendLimitExceeded: "billing_error",
      BillingError: "api_error",
      IdempotencyConflict: "invalid_request_error",
      RateLimitExceeded: "rate_limit_error",
      ProviderUnavailable: "overloaded_error",
      ProviderKeyRefused: "api_error",
      ProviderTimeout: "api_error",
      SearchError: "api_error",
      InternalError: "api_error"
    })
  })
})

/** A fetch that answers every Messages call with what the translation writes for these events. */
const answering =
  (events: ReadonlyArray<StreamEvent>, result: CallResult, failure?: ApiError) =>
  async (_url: unknown, init?: RequestInit): Promise<Response> => {
    const stream = (JSON.parse(String(init?.body)) as { stream?: boolean }).stream === true
    if (failure !== undefined && !stream) {
      return Response.json(anthropicErrorBody(failure, "req_abc", "https://d"), { status: httpStatus(failure) })
    }
    const body = stream
      ? streamOf(failure === undefined ? events : [...events, { _tag: "Failed", error: failure }])
      : anthropicMessage(result)
    return stream
      ? new Response(body as string, { headers: { "content-type": "text/event-stream" } })
      : Response.json(body)
  }

const TOOL_RESULT = resultOf({
  text: CITED,
  annotations: citedAnnotations,
  toolCalls: [weatherCall],
  finishReason: "tool_calls"
})
const TOOL_EVENTS: ReadonlyArray<StreamEvent> = [
  { _tag: "Delta", text: CITED },
  { _tag: "ToolCallDelta", index: 0, id: "call_9", name: "get_weather", arguments: "{\"city\":" },
  { _tag: "ToolCallDelta", index: 0, id: "call_9", name: "get_weather", arguments: "\"Ipoh\"}" },
  { _tag: "Completed", result: TOOL_RESULT }
]
const PARAMS = { model: MODEL, max_tokens: 100, messages: [{ role: "user" as const, content: "Weather?" }] }
const sdk = (failure?: ApiError) =>
  new Anthropic({
    apiKey: "k",
    baseURL: "http://nenas.test",
    fetch: answering(TOOL_EVENTS, TOOL_RESULT, failure),
    maxRetries: 0
  })

describe("Anthropic's SDK and the AI SDK read the answers", () => {
  it("messages.create and messages.stream().finalMessage() agree", async () => {
    const plain = await sdk().messages.create(PARAMS)
    const streamed = await sdk().messages.stream(PARAMS).finalMessage()
    expect(streamed.content.filter((b) => b.type === "tool_use")).toEqual(
      plain.content.filter((b) => b.type === "tool_use")
    )
    expect(streamed.content.flatMap((b) => b.type === "text" ? b.citations ?? [] : [])).toEqual(
      plain.content.flatMap((b) => b.type === "text" ? b.citations ?? [] : [])
    )
    expect([streamed.stop_reason, streamed.usage]).toEqual([plain.stop_reason, plain.usage])
  })

  it("typed errors, plain and after the first byte", async () => {
    await expect(sdk(new RateLimitExceeded({ message: "slow" })).messages.create(PARAMS)).rejects.toBeInstanceOf(
      Anthropic.RateLimitError
    )
    await expect(sdk(new NotFound({ message: "no", param: "model" })).messages.create(PARAMS)).rejects.toBeInstanceOf(
      Anthropic.NotFoundError
    )
    await expect(sdk(new ProviderUnavailable({ message: "cut" })).messages.stream(PARAMS).finalMessage()).rejects
      .toMatchObject({
        error: { type: "error", error: { type: "overloaded_error", code: "provider_unavailable" } }
      })
  })

  it("the AI SDK's provider: generateText and streamText", async () => {
    const provider = createAnthropic({
      apiKey: "k",
      baseURL: "http://nenas.test/v1",
      fetch: answering(TOOL_EVENTS, TOOL_RESULT)
    })
    // One step (the default): the tool runs, and its call is the answer's; no second request is made.
    const tools = {
      get_weather: tool({
        description: "Weather",
        inputSchema: z.object({ city: z.string() }),
        execute: async () => "31°C"
      })
    }
    const options = { model: provider(MODEL), prompt: "Weather?", tools, maxOutputTokens: 100, maxRetries: 0 }
    const plain = await generateText(options)
    const streamed = streamText(options)
    for (
      const answer of [plain, {
        toolCalls: await streamed.toolCalls,
        usage: await streamed.usage,
        sources: await streamed.sources
      }]
    ) {
      expect(answer.toolCalls.map((c) => [c.toolCallId, c.input])).toEqual([["toolu_9", { city: "Ipoh" }]])
      expect(answer.usage).toMatchObject({ inputTokens: 120, outputTokens: 30, cachedInputTokens: 100 })
      expect(answer.sources.map((source) => source.sourceType === "url" && source.url)).toEqual([
        "https://a.example",
        "https://b.example"
      ])
    }
    expect(plain.text).toBe(CITED)
    expect(await streamed.text).toBe(CITED)
  })
})
