import { Sse } from "@effect/experimental"
import { Effect, Stream } from "effect"
import { toErrorBody } from "../Domain/Errors.js"
import { toMyrString } from "../Domain/Money.js"
import { PUBLIC_MODEL } from "./Api.js"
import type { CallResult, StreamEvent } from "./Calls.js"
import type { Annotation } from "./WebSearch.js"

/** Ids of the objects a call returns, derived from its request id so a response leads back to its log. */
export const idsOf = (requestId: string) => {
  const suffix = requestId.replace(/^req_/, "")
  return { response: `resp_${suffix}`, message: `msg_${suffix}`, chat: `chatcmpl-${suffix}` }
}

/** The answer's `[n]` markers as OpenAI's Responses annotations. */
const urlCitations = (annotations: ReadonlyArray<Annotation>) =>
  annotations.map((a) => ({ type: "url_citation" as const, start_index: a.startIndex, end_index: a.endIndex, url: a.url, title: a.title }))

/** The same, as OpenAI's chat message carries them. */
const chatUrlCitations = (annotations: ReadonlyArray<Annotation>) =>
  annotations.map((a) => ({
    type: "url_citation" as const,
    url_citation: { start_index: a.startIndex, end_index: a.endIndex, url: a.url, title: a.title }
  }))

const outputMessage = (
  id: string,
  text: string,
  status: "in_progress" | "completed",
  annotations: ReadonlyArray<Annotation> = []
) => ({
  type: "message" as const,
  id,
  status,
  role: "assistant" as const,
  content: status === "completed" ? [{ type: "output_text" as const, text, annotations: urlCitations(annotations) }] : []
})

const responsesUsage = (result: CallResult) => ({
  input_tokens: result.usage.inputTokens,
  output_tokens: result.usage.outputTokens,
  reasoning_tokens: result.usage.reasoningTokens,
  cached_tokens: result.usage.cachedTokens,
  total_tokens: result.usage.inputTokens + result.usage.outputTokens,
  input_tokens_details: { cached_tokens: result.usage.cachedTokens },
  output_tokens_details: { reasoning_tokens: result.usage.reasoningTokens },
  cost_myr: toMyrString(result.cost),
  latency_ms: result.latencyMs
})

/** The 200 body of `POST /v1/responses`: the spec's fields and OpenAI's `output` array. */
export const responsesOutput = (result: CallResult) => {
  const ids = idsOf(result.requestId)
  return {
    id: ids.response,
    object: "response" as const,
    created_at: result.createdAt,
    status: "completed",
    model: PUBLIC_MODEL,
    output_text: result.text,
    output: [outputMessage(ids.message, result.text, "completed", result.annotations)],
    usage: responsesUsage(result),
    request_id: result.requestId,
    routing: {
      category: result.route.category,
      upstream_model: result.route.upstreamModel,
      reasoning: result.route.reasoning
    },
    citations: result.citations,
    incomplete_details: result.finishReason === "length" ? { reason: "max_output_tokens" } : null
  }
}

const chatUsage = (result: CallResult) => ({
  prompt_tokens: result.usage.inputTokens,
  completion_tokens: result.usage.outputTokens,
  reasoning_tokens: result.usage.reasoningTokens,
  cached_tokens: result.usage.cachedTokens,
  total_tokens: result.usage.inputTokens + result.usage.outputTokens,
  prompt_tokens_details: { cached_tokens: result.usage.cachedTokens },
  completion_tokens_details: { reasoning_tokens: result.usage.reasoningTokens }
})

/** The 200 body of `POST /v1/chat/completions`. */
export const chatCompletion = (result: CallResult) => ({
  id: idsOf(result.requestId).chat,
  object: "chat.completion" as const,
  created: result.createdAt,
  model: PUBLIC_MODEL,
  choices: [{
    index: 0,
    message: { role: "assistant" as const, content: result.text, annotations: chatUrlCitations(result.annotations) },
    finish_reason: result.finishReason
  }],
  usage: chatUsage(result),
  cost_myr: toMyrString(result.cost)
})

const encoder = new TextEncoder()
const sse = (event: string, data: unknown): Uint8Array =>
  encoder.encode(Sse.encoder.write({ _tag: "Event", event, id: undefined, data: typeof data === "string" ? data : JSON.stringify(data) }))

/** Where a stream is going and what to name it: the stream outlives the request's fiber, so nothing is read from it. */
export interface StreamContext {
  readonly requestId: string
  readonly createdAt: number
  readonly dashboardUrl: string
}

/**
 * OpenAI's Responses stream: `response.created` … `response.completed` (or
 * `response.failed`), each event with its `type` and an increasing `sequence_number`.
 */
export const responsesStream = ({ createdAt, dashboardUrl, requestId }: StreamContext, events: Stream.Stream<StreamEvent>) =>
  Stream.suspend(() => {
    const ids = idsOf(requestId)
    let sequence = 0
    let text = ""
    const emit = (type: string, fields: Record<string, unknown>) => sse(type, { type, sequence_number: sequence++, ...fields })
    const shell = (status: string) => ({
      id: ids.response, object: "response", created_at: createdAt, status, model: PUBLIC_MODEL, output: [], request_id: requestId
    })
    const part = (value: string, annotations: ReadonlyArray<Annotation> = []) =>
      ({ type: "output_text", text: value, annotations: urlCitations(annotations) })
    const at = { item_id: ids.message, output_index: 0, content_index: 0 }
    const start = [
      emit("response.created", { response: shell("in_progress") }),
      emit("response.in_progress", { response: shell("in_progress") }),
      emit("response.output_item.added", { output_index: 0, item: outputMessage(ids.message, "", "in_progress") }),
      emit("response.content_part.added", { ...at, part: part("") })
    ]
    const body = Stream.mapEffect(events, (event) => {
      switch (event._tag) {
        case "Delta":
          text += event.text
          return Effect.succeed([emit("response.output_text.delta", { ...at, delta: event.text })])
        case "Completed":
          return Effect.succeed([
            emit("response.output_text.done", { ...at, text: event.result.text }),
            emit("response.content_part.done", { ...at, part: part(event.result.text, event.result.annotations) }),
            emit("response.output_item.done", {
              output_index: 0,
              item: outputMessage(ids.message, event.result.text, "completed", event.result.annotations)
            }),
            emit("response.completed", { response: responsesOutput(event.result) })
          ])
        case "Failed":
          return Effect.succeed([emit("response.failed", {
            response: { ...shell("failed"), output_text: text, error: toErrorBody(event.error, requestId, dashboardUrl).error }
          })])
      }
    })
    return Stream.concat(Stream.fromIterable(start), Stream.flattenIterables(body))
  })

/**
 * OpenAI's chat stream: `chat.completion.chunk` objects, a last chunk with
 * `choices: []`, `usage` and `cost_myr` (always sent), then `[DONE]`; a failure
 * after the first byte is a chunk with a top-level `error`.
 */
export const chatStream = ({ createdAt, dashboardUrl, requestId }: StreamContext, events: Stream.Stream<StreamEvent>) =>
  Stream.suspend(() => {
    const chunk = (choices: ReadonlyArray<unknown>, extra: Record<string, unknown> = {}) =>
      sse("message", { id: idsOf(requestId).chat, object: "chat.completion.chunk", created: createdAt, model: PUBLIC_MODEL, choices, ...extra })
    const first = chunk([{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }])
    const body = Stream.mapEffect(events, (event) => {
      switch (event._tag) {
        case "Delta":
          return Effect.succeed([chunk([{ index: 0, delta: { content: event.text }, finish_reason: null }])])
        case "Completed":
          return Effect.succeed([
            chunk([{
              index: 0,
              // The citations arrive with the last content chunk, once the whole answer is known.
              delta: event.result.annotations.length > 0 ? { annotations: chatUrlCitations(event.result.annotations) } : {},
              finish_reason: event.result.finishReason
            }]),
            chunk([], { usage: chatUsage(event.result), cost_myr: toMyrString(event.result.cost) }),
            sse("message", "[DONE]")
          ])
        case "Failed":
          return Effect.succeed([sse("message", { error: toErrorBody(event.error, requestId, dashboardUrl).error })])
      }
    })
    return Stream.concat(Stream.make(first), Stream.flattenIterables(body))
  })
