import { toErrorBody } from "../../Domain/Errors.js"
import { toMyrString } from "../../Domain/Money.js"
import type { ToolCall } from "../../Providers/Provider.js"
import type { CallResult, StreamEvent } from "../Call/CallTypes.js"
import type { Annotation } from "../Call/WebSearch.js"
import { PUBLIC_MODEL } from "./Api.js"

/** Ids of the objects a call returns, derived from its request id so a response leads back to its log. */
export const idsOf = (requestId: string) => {
  const suffix = requestId.replace(/^req_/, "")
  return { response: `resp_${suffix}`, message: `msg_${suffix}`, chat: `chatcmpl-${suffix}` }
}

/** The answer's `[n]` markers as OpenAI's Responses annotations. */
const urlCitations = (annotations: ReadonlyArray<Annotation>) =>
  annotations.map((a) => ({
    type: "url_citation" as const,
    start_index: a.startIndex,
    end_index: a.endIndex,
    url: a.url,
    title: a.title
  }))

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
  content: status === "completed"
    ? [{ type: "output_text" as const, text, annotations: urlCitations(annotations) }]
    : []
})

const functionCallItem = (id: string, call: ToolCall, status: "in_progress" | "completed") => ({
  type: "function_call" as const,
  id,
  call_id: call.id,
  name: call.function.name,
  arguments: status === "completed" ? call.function.arguments : "",
  status
})

/** A function call's output item id: one per call of the response. */
const callItemId = (requestId: string, index: number) => `fc_${requestId.replace(/^req_/, "")}_${index}`

type OutputItem = ReturnType<typeof outputMessage> | ReturnType<typeof functionCallItem>

/** OpenAI's output items: the message (when there is text, or nothing else), then each function call. */
const outputItems = (result: CallResult): ReadonlyArray<OutputItem> => {
  const ids = idsOf(result.requestId)
  const calls = result.toolCalls.map((call, i) => functionCallItem(callItemId(result.requestId, i), call, "completed"))
  return result.text.length > 0 || calls.length === 0
    ? [outputMessage(ids.message, result.text, "completed", result.annotations), ...calls]
    : calls
}

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

/** The 200 body of `POST /v1/responses`: the spec's fields and OpenAI's `output` array (in `output`'s order when streamed). */
export const responsesOutput = (result: CallResult, output: ReadonlyArray<OutputItem> = outputItems(result)) => {
  const ids = idsOf(result.requestId)
  return {
    id: ids.response,
    object: "response" as const,
    created_at: result.createdAt,
    status: "completed",
    model: PUBLIC_MODEL,
    output_text: result.text,
    output,
    usage: responsesUsage(result),
    request_id: result.requestId,
    routing: {
      category: result.route.category,
      upstream_model: result.route.upstreamModel,
      reasoning: result.route.reasoning,
      fallback: result.route.fallback === true
    },
    citations: result.citations,
    incomplete_details: result.finishReason === "length" ? { reason: "max_output_tokens" } : null,
    store: result.stored.store,
    previous_response_id: result.stored.previousResponseId
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
    // eslint-disable-next-line nenas/no-spread-adding-field -- once per answer
    message: {
      role: "assistant" as const,
      // OpenAI's answer that only calls tools has no content.
      content: result.text.length === 0 && result.toolCalls.length > 0 ? null : result.text,
      refusal: null,
      annotations: chatUrlCitations(result.annotations),
      ...(result.toolCalls.length > 0 ? { tool_calls: result.toolCalls } : {})
    },
    logprobs: result.logprobs === undefined ? null : { content: result.logprobs, refusal: null },
    finish_reason: result.finishReason
  }],
  usage: chatUsage(result),
  cost_myr: toMyrString(result.cost)
})

/** One server-sent event (`message` is the default type, so it is not named); JSON holds no line break. */
const sse = (event: string, data: unknown): string => {
  const text = typeof data === "string" ? data : JSON.stringify(data)
  return event === "message" ? `data: ${text}\n\n` : `event: ${event}\ndata: ${text}\n\n`
}

/** A streamed call's wire format, kept per call: its opening, and each event's text (empty when it writes nothing). */
export interface EventRenderer {
  readonly start: string
  readonly render: (event: StreamEvent) => string
}

/** Where a stream is going and what to name it: the stream outlives the request's fiber, so nothing is read from it. */
export interface StreamContext {
  readonly requestId: string
  readonly createdAt: number
  readonly dashboardUrl: string
}

/**
 * OpenAI's Responses stream: `response.created` … `response.completed` (or
 * `response.failed`), each event with its `type` and an increasing
 * `sequence_number`. Output items open as their first fragment arrives: the
 * message at its first text, each function call at its first fragment.
 */
export const responsesEvents = ({ createdAt, dashboardUrl, requestId }: StreamContext): EventRenderer => {
  const ids = idsOf(requestId)
  let sequence = 0
  let text = ""
  /** The output items in the order they were opened; a call by its index in the answer. */
  const opened: Array<{ readonly kind: "message" } | { readonly kind: "call"; readonly index: number }> = []
  const emit = (type: string, fields: Record<string, unknown>) =>
    // eslint-disable-next-line nenas/no-spread-adding-field -- a wire body, serialized at once
    sse(type, { type, sequence_number: sequence++, ...fields })
  const shell = (status: string) => ({
    id: ids.response,
    object: "response",
    created_at: createdAt,
    status,
    model: PUBLIC_MODEL,
    output: [],
    request_id: requestId
  })
  const part = (value: string, annotations: ReadonlyArray<Annotation> = []) => ({
    type: "output_text",
    text: value,
    annotations: urlCitations(annotations)
  })
  const messageAt = () => ({
    item_id: ids.message,
    output_index: opened.findIndex((o) => o.kind === "message"),
    content_index: 0
  })
  const callAt = (index: number) => opened.findIndex((o) => o.kind === "call" && o.index === index)
  const openMessage = (): Array<string> => {
    if (opened.some((o) => o.kind === "message")) return []
    opened.push({ kind: "message" })
    const at = messageAt()
    return [
      emit("response.output_item.added", {
        output_index: at.output_index,
        item: outputMessage(ids.message, "", "in_progress")
      }),
      // eslint-disable-next-line nenas/no-spread-adding-field -- once per answer's text part
      emit("response.content_part.added", { ...at, part: part("") })
    ]
  }
  const start = [
    emit("response.created", { response: shell("in_progress") }),
    emit("response.in_progress", { response: shell("in_progress") })
  ]
  const close = (result: CallResult): Array<string> => {
    const out: Array<string> = []
    if (opened.length === 0) out.push(...openMessage())
    const items: Array<OutputItem> = []
    for (const [outputIndex, item] of opened.entries()) {
      if (item.kind === "message") {
        const at = messageAt()
        const done = outputMessage(ids.message, result.text, "completed", result.annotations)
        items.push(done)
        out.push(
          // eslint-disable-next-line nenas/no-spread-adding-field -- once per answer's text part
          emit("response.output_text.done", { ...at, text: result.text }),
          // eslint-disable-next-line nenas/no-spread-adding-field -- once per answer's text part
          emit("response.content_part.done", { ...at, part: part(result.text, result.annotations) }),
          emit("response.output_item.done", { output_index: outputIndex, item: done })
        )
      } else {
        const call = result.toolCalls[item.index]
        if (call === undefined) continue
        const itemId = callItemId(requestId, item.index)
        const done = functionCallItem(itemId, call, "completed")
        items.push(done)
        out.push(
          emit("response.function_call_arguments.done", {
            item_id: itemId,
            output_index: outputIndex,
            name: call.function.name,
            arguments: call.function.arguments
          }),
          emit("response.output_item.done", { output_index: outputIndex, item: done })
        )
      }
    }
    out.push(emit("response.completed", { response: responsesOutput(result, items) }))
    return out
  }
  function eventParts(event: StreamEvent): Array<string> {
    switch (event._tag) {
      case "Delta": {
        text += event.text
        const out = openMessage()
        // Onto the new object, not a spread that adds a field: Node 20 builds that on a slow path, here once a delta.
        out.push(emit("response.output_text.delta", Object.assign(messageAt(), { delta: event.text })))
        return out
      }
      case "ToolCallDelta": {
        const out: Array<string> = []
        const itemId = callItemId(requestId, event.index)
        if (callAt(event.index) === -1) {
          opened.push({ kind: "call", index: event.index })
          const call: ToolCall = { id: event.id, type: "function", function: { name: event.name, arguments: "" } }
          out.push(
            emit("response.output_item.added", {
              output_index: callAt(event.index),
              item: functionCallItem(itemId, call, "in_progress")
            })
          )
        }
        if (event.arguments.length > 0) {
          out.push(
            emit("response.function_call_arguments.delta", {
              item_id: itemId,
              output_index: callAt(event.index),
              delta: event.arguments
            })
          )
        }
        return out
      }
      case "Completed":
        return close(event.result)
      case "Failed":
        return [emit("response.failed", {
          // eslint-disable-next-line nenas/no-spread-adding-field -- once per answer
          response: {
            ...shell("failed"),
            output_text: text,
            error: toErrorBody(event.error, requestId, dashboardUrl).error
          }
        })]
    }
  }
  return { start: start.join(""), render: (event) => eventParts(event).join("") }
}

/**
 * OpenAI's chat stream: `chat.completion.chunk` objects (text in `delta.content`,
 * tool calls in `delta.tool_calls`: index, id, type and name first, then
 * argument fragments), a last chunk with `choices: []`, `usage` and `cost_myr`
 * (always sent), then `[DONE]`; a failure after the first byte is a chunk with a
 * top-level `error`.
 */
export const chatEvents = ({ createdAt, dashboardUrl, requestId }: StreamContext): EventRenderer => {
  const chunk = (choices: ReadonlyArray<unknown>, extra: Record<string, unknown> = {}) =>
    // eslint-disable-next-line nenas/no-spread-adding-field -- once per answer
    sse("message", {
      id: idsOf(requestId).chat,
      object: "chat.completion.chunk",
      created: createdAt,
      model: PUBLIC_MODEL,
      choices,
      ...extra
    })
  const first = chunk([{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }])
  const started = new Set<number>()
  function eventParts(event: StreamEvent): Array<string> {
    switch (event._tag) {
      case "Delta":
        // eslint-disable-next-line nenas/no-spread-adding-field -- a wire body, serialized at once
        return [chunk([{
          index: 0,
          delta: { content: event.text },
          ...(event.logprobs === undefined ? {} : { logprobs: { content: event.logprobs, refusal: null } }),
          finish_reason: null
        }])]
      case "ToolCallDelta": {
        const fresh = !started.has(event.index)
        started.add(event.index)
        const call = fresh
          ? {
            index: event.index,
            id: event.id,
            type: "function",
            function: { name: event.name, arguments: event.arguments }
          }
          : { index: event.index, function: { arguments: event.arguments } }
        return [chunk([{ index: 0, delta: { tool_calls: [call] }, finish_reason: null }])]
      }
      case "Completed":
        return [
          chunk([{
            index: 0,
            // The citations arrive with the last content chunk, once the whole answer is known.
            delta: event.result.annotations.length > 0
              ? { annotations: chatUrlCitations(event.result.annotations) }
              : {},
            finish_reason: event.result.finishReason
          }]),
          chunk([], { usage: chatUsage(event.result), cost_myr: toMyrString(event.result.cost) }),
          sse("message", "[DONE]")
        ]
      case "Failed":
        return [sse("message", { error: toErrorBody(event.error, requestId, dashboardUrl).error })]
    }
  }
  return { start: first, render: (event) => eventParts(event).join("") }
}
