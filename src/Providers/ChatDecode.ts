import { Option } from "effect"
import { createParser } from "eventsource-parser"
import type { Completion, ProviderUsage, StreamPart, ToolCall } from "./Provider.js"
import { finishReasonOf } from "./Provider.js"

/**
 * An OpenAI-compatible upstream's answers read by hand: a completion, or an
 * event stream split into events as its bytes arrive (`eventsource-parser`),
 * each event's chunk turned into parts in plain code. Only the fields we use
 * are read; each is checked for the type chat gives it, and an answer that
 * breaks one is not chat's.
 */

/** The data of each event completed by a read (`undefined`: the body ended; an unfinished last event still counts). */
export const makeEventSplitter = () => {
  const decoder = new TextDecoder()
  let events: Array<string> = []
  const parser = createParser({ onEvent: (event) => void events.push(event.data) })
  return (bytes: Uint8Array | undefined): ReadonlyArray<string> => {
    if (bytes === undefined) {
      parser.feed(decoder.decode())
      parser.reset({ consume: true })
    } else {
      parser.feed(decoder.decode(bytes, { stream: true }))
    }
    const done = events
    events = []
    return done
  }
}

/** What one event said: its parts, that the chunk is not chat's, or the upstream's own error chunk. */
export type ChunkOutcome =
  | { readonly _tag: "Parts" }
  | { readonly _tag: "Malformed" }
  | { readonly _tag: "ErrorChunk"; readonly error: unknown }

const PARTS: ChunkOutcome = { _tag: "Parts" }
const MALFORMED: ChunkOutcome = { _tag: "Malformed" }

type Json = Record<string, unknown>

const isObject = (value: unknown): value is Json => typeof value === "object" && value !== null && !Array.isArray(value)
const absent = (value: unknown): value is null | undefined => value === undefined || value === null
const stringOrAbsent = (value: unknown): value is string | null | undefined =>
  absent(value) || typeof value === "string"
const numberOrAbsent = (value: unknown): value is number | null | undefined =>
  absent(value) || typeof value === "number"
const objectOrAbsent = (value: unknown): value is Json | null | undefined => absent(value) || isObject(value)

/** Chat's usage as ours, or undefined when it does not have chat's types (or a count is negative): then we count. */
export const usageOf = (usage: Json): ProviderUsage | undefined => {
  const prompt = usage["prompt_tokens"]
  const completion = usage["completion_tokens"]
  const promptDetails = usage["prompt_tokens_details"]
  const completionDetails = usage["completion_tokens_details"]
  // Absent counts default to 0, as before; `null` is not a count.
  if (
    (prompt !== undefined && typeof prompt !== "number") || (completion !== undefined && typeof completion !== "number")
  ) return undefined
  if ((prompt ?? 0) < 0 || (completion ?? 0) < 0) return undefined
  if (!objectOrAbsent(promptDetails) || !objectOrAbsent(completionDetails)) return undefined
  const cached = promptDetails?.["cached_tokens"]
  const reasoning = completionDetails?.["reasoning_tokens"]
  if (!numberOrAbsent(cached) || !numberOrAbsent(reasoning) || (cached ?? 0) < 0 || (reasoning ?? 0) < 0) {
    return undefined
  }
  return {
    inputTokens: Math.max(0, Math.round(prompt ?? 0)),
    outputTokens: Math.max(0, Math.round(completion ?? 0)),
    cachedTokens: Math.max(0, Math.round(cached ?? 0)),
    reasoningTokens: Math.max(0, Math.round(reasoning ?? 0))
  }
}

/** One choice's parts, appended to `out`; false when it is not chat's shape. */
const choiceParts = (choice: unknown, out: Array<StreamPart>): boolean => {
  if (!isObject(choice)) return false
  const delta = choice["delta"]
  const finish = choice["finish_reason"]
  const logprobs = choice["logprobs"]
  if (!objectOrAbsent(delta) || !stringOrAbsent(finish) || !objectOrAbsent(logprobs)) return false
  const tokens = logprobs?.["content"]
  if (!absent(tokens) && !Array.isArray(tokens)) return false
  const text = delta?.["content"]
  const calls = delta?.["tool_calls"]
  if (!stringOrAbsent(text) || (!absent(calls) && !Array.isArray(calls))) return false
  if (typeof text === "string" && text.length > 0) out.push({ _tag: "Delta", text, logprobs: tokens ?? undefined })
  for (const call of calls ?? []) {
    if (!isObject(call)) return false
    const index = call["index"] === undefined ? 0 : call["index"]
    const id = call["id"]
    const fn = call["function"]
    if (typeof index !== "number" || !Number.isSafeInteger(index) || !stringOrAbsent(id) || !objectOrAbsent(fn)) {
      return false
    }
    const name = fn?.["name"]
    const args = fn?.["arguments"]
    if (!stringOrAbsent(name) || !stringOrAbsent(args)) return false
    out.push({ _tag: "ToolCallDelta", index, id: id ?? undefined, name: name ?? undefined, arguments: args ?? "" })
  }
  if (typeof finish === "string") out.push({ _tag: "Finish", finishReason: finishReasonOf(finish) })
  return true
}

/** The parts of one event's chunk, appended to `out` only when the whole chunk is chat's. */
export const chunkParts = (data: string, out: Array<StreamPart>): ChunkOutcome => {
  let chunk: unknown
  try {
    chunk = JSON.parse(data)
  } catch {
    return MALFORMED
  }
  if (!isObject(chunk)) return MALFORMED
  const choices = chunk["choices"] === undefined ? [] : chunk["choices"]
  const usage = chunk["usage"]
  if (!Array.isArray(choices) || !objectOrAbsent(usage)) return MALFORMED
  const parts: Array<StreamPart> = []
  for (const choice of choices) {
    if (!choiceParts(choice, parts)) return MALFORMED
  }
  if (!absent(usage)) {
    // Usage we cannot read does not void the answer: the call is billed as we count it.
    const reported = usageOf(usage)
    if (reported !== undefined) parts.push({ _tag: "Usage", usage: reported })
  }
  const error = chunk["error"]
  if (!absent(error)) return { _tag: "ErrorChunk", error }
  for (const part of parts) out.push(part)
  return PARTS
}

/** A completion's tool call, or undefined when it is not chat's shape. */
const toolCallOf = (call: unknown): ToolCall | undefined => {
  if (!isObject(call) || typeof call["id"] !== "string" || !isObject(call["function"])) return undefined
  const { arguments: args, name } = call["function"]
  if (typeof name !== "string" || (args !== undefined && typeof args !== "string")) return undefined
  return { id: call["id"], type: "function", function: { name, arguments: args ?? "" } }
}

/** The fields of a chat completion we use, or undefined when the body is not one. */
export const completionOf = (text: string): Completion | undefined => {
  let body: unknown
  try {
    body = JSON.parse(text)
  } catch {
    return undefined
  }
  if (!isObject(body) || !Array.isArray(body["choices"]) || !objectOrAbsent(body["usage"])) return undefined
  const choices: Array<unknown> = body["choices"]
  for (const choice of choices) {
    if (!isObject(choice) || !isObject(choice["message"]) || !stringOrAbsent(choice["finish_reason"])) return undefined
    const logprobs = choice["logprobs"]
    if (!objectOrAbsent(logprobs) || (!absent(logprobs?.["content"]) && !Array.isArray(logprobs?.["content"]))) {
      return undefined
    }
    const { content, tool_calls: calls } = choice["message"]
    if (!stringOrAbsent(content) || (!absent(calls) && !Array.isArray(calls))) return undefined
  }
  const usage = absent(body["usage"]) ? undefined : usageOf(body["usage"])
  const first = choices[0] as Json | undefined
  const message = first?.["message"] as Json | undefined
  const toolCalls: Array<ToolCall> = []
  for (const call of (message?.["tool_calls"] ?? []) as Array<unknown>) {
    const parsed = toolCallOf(call)
    if (parsed === undefined) return undefined
    toolCalls.push(parsed)
  }
  return {
    text: (message?.["content"] ?? "") as string,
    toolCalls,
    logprobs: ((first?.["logprobs"] as Json | null | undefined)?.["content"] ?? undefined) as
      | ReadonlyArray<unknown>
      | undefined,
    finishReason: finishReasonOf(first?.["finish_reason"]),
    usage: usage === undefined ? Option.none() : Option.some(usage)
  }
}
