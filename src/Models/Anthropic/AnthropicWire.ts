import { toMyrString } from "../../Domain/Money.js"
import type { FinishReason, ToolCall } from "../../Providers/Provider.js"
import type { CallResult, CallUsage, StreamEvent } from "../Call/CallTypes.js"
import { countInput } from "../Call/Estimate.js"
import type { Conversation } from "../Call/Input.js"
import type { Annotation } from "../Call/WebSearch.js"
import { PUBLIC_MODEL } from "../OpenAi/Api.js"
import type { EventRenderer, StreamContext } from "../OpenAi/Wire.js"
import { idsOf } from "../OpenAi/Wire.js"
import type {
  AnthropicMessage,
  AnthropicStopReason,
  AnthropicTokenCount,
  AnthropicWebSearchCitation
} from "./AnthropicApi.js"
import { anthropicErrorBody } from "./AnthropicErrors.js"

/** The Messages API's answer (`POST /v1/messages`), plain and streamed, from a call's result and events. */

type Citation = typeof AnthropicWebSearchCitation.Type
type StopReason = typeof AnthropicStopReason.Type

/** A tool call's id as Anthropic names them; one sent back in a `tool_use` block keeps its name through the upstream. */
export const toolUseId = (id: string): string => id.startsWith("toolu_") ? id : `toolu_${id.replace(/^call_/, "")}`

/** Why the answer ended, when no stop sequence ended it (`firstStop`). */
export const stopReasonOf = (finishReason: FinishReason, toolCalls: number): StopReason =>
  toolCalls > 0
    ? "tool_use"
    : finishReason === "length"
    ? "max_tokens"
    : finishReason === "content_filter"
    ? "refusal"
    : "end_turn"

type StopSequences = ReadonlyArray<string> | null | undefined

/**
 * The first of the caller's stop sequences the text reaches (the one a model writing it meets first), and
 * where it begins. An OpenAI-style upstream stops before a sequence and says only `stop`, so a sequence is
 * known when the text shows it: the built-in model's, or an upstream's that ignored `stop`
 * (docs/api/anthropic.md, "Claude Code and Anthropic's SDKs").
 */
export const firstStop = (
  text: string,
  stops: StopSequences
): { readonly at: number; readonly sequence: string } | undefined => {
  let found: { readonly at: number; readonly sequence: string } | undefined
  for (const sequence of stops ?? []) {
    const at = sequence.length === 0 ? -1 : text.indexOf(sequence)
    if (at === -1) continue
    const end = at + sequence.length
    const foundEnd = found === undefined ? Infinity : found.at + found.sequence.length
    if (found === undefined || end < foundEnd || (end === foundEnd && at < found.at)) found = { at, sequence }
  }
  return found
}

/** Anthropic counts cached prompt tokens apart: the three input counts add up to the upstream's prompt tokens. */
const usageOf = (usage: CallUsage) => {
  const cached = Math.min(usage.cachedTokens, usage.inputTokens)
  return {
    input_tokens: usage.inputTokens - cached,
    output_tokens: usage.outputTokens,
    cache_read_input_tokens: cached,
    cache_creation_input_tokens: 0
  }
}

const routingOf = (result: CallResult) => ({
  category: result.route.category,
  upstream_model: result.route.upstreamModel,
  reasoning: result.route.reasoning,
  fallback: result.route.fallback === true
})

const CITED_TEXT_CHARS = 150

/** The answer's sentence that a `[n]` marker ends: what Anthropic calls the cited text. */
const citedText = (text: string, annotation: Annotation): string => {
  // Markers just before this one cite the same sentence; a marker after the full stop cites the sentence before it.
  const before = text.slice(0, annotation.startIndex).replace(/(\s*\[\d{1,4}\])+\s*$/, "").trimEnd()
  const start = Math.max(before.replace(/[.!?]+$/, "").search(/[^.!?\n]*$/), 0)
  const sentence = before.slice(start).replace(/\[\d{1,4}\]/g, "").trim()
  return sentence.length > CITED_TEXT_CHARS ? `${sentence.slice(0, CITED_TEXT_CHARS - 1)}…` : sentence
}

/** Each `[n]` the answer cites, as Anthropic's `web_search_result_location`, in the answer's order. */
const citationsOf = (text: string, annotations: ReadonlyArray<Annotation>): ReadonlyArray<Citation> =>
  annotations.map((a) => ({
    type: "web_search_result_location" as const,
    url: a.url,
    title: a.title,
    cited_text: citedText(text, a),
    encrypted_index: Buffer.from(text.slice(a.startIndex, a.endIndex)).toString("base64")
  }))

/** The input a tool call carries, parsed; arguments that are not a JSON object (a cut answer) keep their text. */
const inputOf = (call: ToolCall): Readonly<Record<string, unknown>> => {
  try {
    const value: unknown = JSON.parse(call.function.arguments.length === 0 ? "{}" : call.function.arguments)
    return typeof value === "object" && value !== null && !Array.isArray(value)
      ? value as Record<string, unknown>
      : { value }
  } catch {
    return { _arguments: call.function.arguments }
  }
}

const toolUseBlock = (call: ToolCall) => ({
  type: "tool_use" as const,
  id: toolUseId(call.id),
  name: call.function.name,
  input: inputOf(call)
})

/**
 * The 200 body of `POST /v1/messages`: one text block (with its citations), then a block per tool call. An
 * answer that reached a stop sequence ends just before it: nothing after it is shown, tool calls neither.
 */
export const anthropicMessage = (result: CallResult, stops?: StopSequences): typeof AnthropicMessage.Type => {
  const stop = firstStop(result.text, stops)
  const shown = stop === undefined ? result.text : result.text.slice(0, stop.at)
  const annotations = stop === undefined ? result.annotations : result.annotations.filter((a) => a.endIndex <= stop.at)
  const toolCalls = stop === undefined ? result.toolCalls : []
  const citations = citationsOf(result.text, annotations)
  // eslint-disable-next-line nenas/no-spread-adding-field -- once per answer
  const text = { type: "text" as const, text: shown, ...(citations.length > 0 ? { citations } : {}) }
  return {
    id: idsOf(result.requestId).message,
    type: "message",
    role: "assistant",
    model: PUBLIC_MODEL,
    // An answer of only tool calls has no text block; an empty answer has an empty one, which clients read as "".
    content: [...(shown.length > 0 || toolCalls.length === 0 ? [text] : []), ...toolCalls.map(toolUseBlock)],
    stop_reason: stop === undefined ? stopReasonOf(result.finishReason, toolCalls.length) : "stop_sequence",
    stop_sequence: stop === undefined ? null : stop.sequence,
    usage: usageOf(result.usage),
    routing: routingOf(result),
    cost_myr: toMyrString(result.cost)
  }
}

/** How many of the text's last characters could begin a stop sequence: held back until the next text says. */
const couldBeginStop = (text: string, stops: ReadonlyArray<string>, longest: number): number => {
  for (let n = Math.min(text.length, longest - 1); n > 0; n--) {
    const tail = text.slice(text.length - n)
    if (stops.some((sequence) => sequence.startsWith(tail))) return n
  }
  return 0
}

/** The 200 body of `POST /v1/messages/count_tokens`: the input as the estimate counts it (turns, tools, format). */
export const anthropicTokenCount = (
  conversation: Pick<Conversation, "upstream" | "capabilities">
): typeof AnthropicTokenCount.Type => ({
  input_tokens: countInput(conversation.upstream, conversation.capabilities)
})

/** One server-sent event, named as Anthropic names them: the event name is also the data's `type`. */
const sse = (type: string, fields: Record<string, unknown> = {}): string =>
  // eslint-disable-next-line nenas/no-spread-adding-field -- a wire body, serialized at once
  `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`

/**
 * Anthropic's stream: `message_start` (the message with no content; the usage comes with
 * `message_delta`, once the upstream has said it), `ping`, then each block in turn —
 * `content_block_start`, its `text_delta` or `input_json_delta` fragments, `content_block_stop` —
 * with increasing `index`; then `message_delta` (`stop_reason`, usage, nenas's `routing` and
 * `cost_myr`) and `message_stop`. A failure after the first byte is an `error` event, and nothing follows.
 * With stop sequences, text that could begin one is held back until it cannot; text from a sequence on is
 * never sent, and `message_delta` names the sequence.
 */
export const anthropicEvents = ({ dashboardUrl, requestId }: StreamContext, stops?: StopSequences): EventRenderer => {
  const sequences = (stops ?? []).filter((sequence) => sequence.length > 0)
  const longest = sequences.reduce((most, sequence) => Math.max(most, sequence.length), 0)
  /** Text not sent yet because it could begin a stop sequence; the sequence met, once met; the text sent. */
  let pending = ""
  let stopped: string | undefined
  let sentChars = 0
  /** The blocks opened so far, in order: a block's place is its `index`; the open one is the last, until `closed`. */
  const blocks: Array<{ readonly kind: "text" } | { readonly kind: "tool"; readonly call: number }> = []
  let closed = true
  const start = sse("message_start", {
    message: {
      id: idsOf(requestId).message,
      type: "message",
      role: "assistant",
      model: PUBLIC_MODEL,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: { input_tokens: 0, output_tokens: 0, cache_read_input_tokens: 0, cache_creation_input_tokens: 0 }
    }
  }) + sse("ping")
  const last = () => blocks[blocks.length - 1]
  const close = (): Array<string> => {
    if (closed) return []
    closed = true
    return [sse("content_block_stop", { index: blocks.length - 1 })]
  }
  const open = (block: (typeof blocks)[number], content: Record<string, unknown>): Array<string> => {
    const out = close()
    blocks.push(block)
    closed = false
    out.push(sse("content_block_start", { index: blocks.length - 1, content_block: content }))
    return out
  }
  const delta = (index: number, fields: Record<string, unknown>) => sse("content_block_delta", { index, delta: fields })
  const textOpen = () => !closed && last()?.kind === "text"

  const sendText = (text: string): Array<string> => {
    if (text.length === 0) return []
    sentChars += text.length
    const out = textOpen() ? [] : open({ kind: "text" }, { type: "text", text: "" })
    out.push(delta(blocks.length - 1, { type: "text_delta", text }))
    return out
  }
  const flush = (): Array<string> => {
    const text = pending
    pending = ""
    return sendText(text)
  }
  const onText = (text: string): Array<string> => {
    if (stopped !== undefined) return []
    if (longest === 0) return sendText(text)
    pending += text
    const stop = firstStop(pending, sequences)
    if (stop !== undefined) {
      stopped = stop.sequence
      pending = pending.slice(0, stop.at)
      return flush()
    }
    const held = couldBeginStop(pending, sequences, longest)
    const ready = pending.slice(0, pending.length - held)
    pending = pending.slice(pending.length - held)
    return sendText(ready)
  }
  const onToolCall = (event: Extract<StreamEvent, { _tag: "ToolCallDelta" }>): Array<string> => {
    if (stopped !== undefined) return []
    // The model went on to a tool call: the text held back met no sequence.
    const out = flush()
    out.push(...onToolCallBlock(event))
    return out
  }
  const onToolCallBlock = (event: Extract<StreamEvent, { _tag: "ToolCallDelta" }>): Array<string> => {
    const at = blocks.findIndex((b) => b.kind === "tool" && b.call === event.index)
    const out = at === -1
      ? open({ kind: "tool", call: event.index }, {
        type: "tool_use",
        id: toolUseId(event.id),
        name: event.name,
        input: {}
      })
      : []
    // An upstream that interleaves parallel calls (OpenAI's do not) sends a late fragment to its block's index.
    if (event.arguments.length > 0) {
      out.push(delta(at === -1 ? blocks.length - 1 : at, { type: "input_json_delta", partial_json: event.arguments }))
    }
    return out
  }
  const onCompleted = (result: CallResult): Array<string> => {
    const out = flush()
    const toolCalls = stopped === undefined ? result.toolCalls : []
    if (blocks.length === 0 && toolCalls.length === 0) out.push(...open({ kind: "text" }, { type: "text", text: "" }))
    // Citations are known once the answer is whole: they go to the text block if it is still open, else
    // (a tool call came after the text) to an empty text block of their own, so that no source is lost.
    const annotations = stopped === undefined
      ? result.annotations
      : result.annotations.filter((a) => a.endIndex <= sentChars)
    const citations = citationsOf(result.text, annotations)
    if (citations.length > 0 && !textOpen()) out.push(...open({ kind: "text" }, { type: "text", text: "" }))
    for (const citation of citations) out.push(delta(blocks.length - 1, { type: "citations_delta", citation }))
    // A call the stream did not show (an upstream that sent it whole at the end) is shown whole.
    for (const [index, call] of toolCalls.entries()) {
      if (!blocks.some((b) => b.kind === "tool" && b.call === index)) {
        out.push(
          ...onToolCallBlock({
            _tag: "ToolCallDelta",
            index,
            id: call.id,
            name: call.function.name,
            arguments: call.function.arguments
          })
        )
      }
    }
    out.push(...close())
    out.push(
      sse("message_delta", {
        delta: stopped === undefined
          ? { stop_reason: stopReasonOf(result.finishReason, toolCalls.length), stop_sequence: null }
          : { stop_reason: "stop_sequence", stop_sequence: stopped },
        usage: usageOf(result.usage),
        routing: routingOf(result),
        cost_myr: toMyrString(result.cost)
      }),
      sse("message_stop")
    )
    return out
  }
  const render = (event: StreamEvent): string => {
    switch (event._tag) {
      case "Delta":
        return onText(event.text).join("")
      case "ToolCallDelta":
        return onToolCall(event).join("")
      case "Completed":
        return onCompleted(event.result).join("")
      case "Failed": {
        const { type: _type, ...body } = anthropicErrorBody(event.error, requestId, dashboardUrl)
        return sse("error", body)
      }
    }
  }
  return { start, render }
}
