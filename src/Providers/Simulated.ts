import { Effect, Layer, Option, Stream } from "effect"
import { createHash } from "node:crypto"
import { countText } from "../Domain/Tokens.js"
import { simulatedPlannerAnswer } from "../Search/Planning.js"
import { countResponseFormat, countToolCall, countTools, countUpstreamMessages } from "./ContentTokens.js"
import { simulatedVectors } from "./EmbeddingVectors.js"
import type {
  Completion,
  ProviderRequest,
  ProviderShape,
  StreamPart,
  TokenLogprob,
  ToolCall,
  UpstreamMessage
} from "./Provider.js"
import { TestKeyProvider } from "./Provider.js"
import { exampleOf } from "./SchemaExample.js"

const textOf = (message: UpstreamMessage): string =>
  message.content === null ? "" : typeof message.content === "string"
    ? message.content
    : message.content.map((part) => part.type === "text" ? part.text : "").join("")

const imagesIn = (message: UpstreamMessage | undefined): number =>
  message === undefined || message.content === null || typeof message.content === "string"
    ? 0
    : message.content.filter((part) => part.type === "image_url").length

const lastUser = (request: ProviderRequest): UpstreamMessage | undefined =>
  [...request.messages].reverse().find((m) => m.role === "user")

const SOURCES = /^\[(\d+)\] /m

const digestOf = (request: ProviderRequest): string =>
  createHash("sha256").update(
    JSON.stringify(request.tools === undefined ? request.messages : [request.messages, request.tools])
  )
    .digest("hex").slice(0, 8)

/**
 * A deterministic answer derived from the input: the same request always gets
 * the same text. It quotes the question's start, counts its images, answers a
 * tool result by quoting it, and cites the first source when sources were
 * given, so citations can be followed end to end.
 */
const fullAnswer = (request: ProviderRequest): string => {
  // A web search planning call: queries derived from the prompt, one a line.
  const planned = simulatedPlannerAnswer(request.messages)
  if (planned !== undefined) return planned
  const last = request.messages[request.messages.length - 1]
  const user = lastUser(request)
  const question = (user === undefined ? "" : textOf(user)).replace(/\s+/g, " ").trim()
  const quoted = question.length > 120 ? `${question.slice(0, 117)}...` : question
  const images = imagesIn(user)
  const seen = images === 0 ? "" : ` It sees ${images} image${images === 1 ? "" : "s"}.`
  const system = request.messages.filter((m) => m.role === "system").map(textOf).join("\n")
  const cites = SOURCES.test(system) ? " According to the sources found [1], this is the simulated summary." : ""
  const result = last?.role === "tool" ? ` The tool answered: ${textOf(last).replace(/\s+/g, " ").slice(0, 200)}.` : ""
  return `Simulated answer (${digestOf(request)}) from ${request.model} to: "${quoted}".${result}${seen}${cites}` +
    " This reply comes from nenas' built-in model, which runs without an upstream."
}

/** The answer in the format asked for: a value valid against the JSON schema, a JSON object, or text. */
const formatted = (request: ProviderRequest, text: string): string => {
  const format = request.responseFormat
  if (format?.type === "json_schema") return JSON.stringify(exampleOf(format.json_schema.schema))
  if (format?.type === "json_object") return JSON.stringify({ answer: text })
  return text
}

/**
 * The tool the simulated model calls: the one `tool_choice` names, or the
 * first when it is `required`; none after a tool result (it answers text),
 * with `auto` or `none`, or without tools.
 */
const toolCallFor = (request: ProviderRequest): ToolCall | undefined => {
  const tools = request.tools ?? []
  const choice = request.toolChoice
  if (tools.length === 0 || choice === undefined || choice === "none" || choice === "auto") return undefined
  if (request.messages[request.messages.length - 1]?.role === "tool") return undefined
  const tool = choice === "required" ? tools[0] : tools.find((t) => t.function.name === choice.function.name)
  if (tool === undefined) return undefined
  return {
    id: `call_${digestOf(request)}0`,
    type: "function",
    function: {
      name: tool.function.name,
      arguments: JSON.stringify(exampleOf(tool.function.parameters ?? { type: "object", properties: {} }))
    }
  }
}

/** Honours the output cap as a real model would: stops at the cap with finish_reason "length". */
const capped = (text: string, maxTokens: number): { readonly text: string; readonly truncated: boolean } => {
  if (countText(text) <= maxTokens) return { text, truncated: false }
  let kept = ""
  for (const word of text.split(" ")) {
    const next = kept === "" ? word : `${kept} ${word}`
    if (countText(next) > maxTokens) break
    kept = next
  }
  return { text: kept, truncated: true }
}

/** Chat's logprobs for a piece of text: certain (0), the piece itself as the only candidate. */
const logprobsOf = (request: ProviderRequest, text: string): ReadonlyArray<TokenLogprob> => {
  const entry = { token: text, logprob: 0, bytes: [...Buffer.from(text, "utf8")] }
  return [{ ...entry, top_logprobs: (request.topLogprobs ?? 0) > 0 ? [entry] : [] }]
}

const complete = (request: ProviderRequest): Completion => {
  const call = toolCallFor(request)
  const { text, truncated } = call === undefined
    ? capped(formatted(request, fullAnswer(request)), request.maxOutputTokens)
    : { text: "", truncated: false }
  const outputTokens = countText(text) + (call === undefined ? 0 : countToolCall(call))
  const reasoningTokens = request.reasoningModel ? Math.max(Math.min(64, request.maxOutputTokens - outputTokens), 0) : 0
  return {
    text,
    toolCalls: call === undefined ? [] : [call],
    logprobs: request.logprobs === true && text.length > 0 ? logprobsOf(request, text) : undefined,
    finishReason: call !== undefined ? "tool_calls" : truncated ? "length" : "stop",
    usage: Option.some({
      inputTokens: countUpstreamMessages(request.messages) + countTools(request.tools) +
        countResponseFormat(request.responseFormat),
      outputTokens: outputTokens + reasoningTokens,
      reasoningTokens,
      cachedTokens: 0
    })
  }
}

const CHUNK_WORDS = 3
const ARGUMENT_CHARS = 16

/** The built-in model's name, as a test key's answer and log row report where it was routed. */
export const SIMULATED_MODEL = "nenas-simulated"

/**
 * The built-in model: no network, deterministic answers, usage counted with the tokenizer, streamed in small
 * pieces. Its embeddings are deterministic unit vectors (EmbeddingVectors.ts) with no usage: the call bills
 * its own count, which is what counting again here would give, at twice the tokenizer's time.
 */
export const simulatedProvider: ProviderShape = {
  complete: (request) => Effect.sync(() => complete(request)),
  stream: (request) =>
    Effect.sync(() => {
      const result = complete(request)
      const parts: Array<StreamPart> = []
      const words = result.text.split(/(?<= )/)
      for (let i = 0; i < words.length; i += CHUNK_WORDS) {
        const text = words.slice(i, i + CHUNK_WORDS).join("")
        if (text.length > 0) {
          parts.push({
            _tag: "Delta",
            text,
            logprobs: request.logprobs === true ? logprobsOf(request, text) : undefined
          })
        }
      }
      for (const [index, call] of result.toolCalls.entries()) {
        // As OpenAI streams a call: id and name with empty arguments, then the arguments in fragments.
        parts.push({ _tag: "ToolCallDelta", index, id: call.id, name: call.function.name, arguments: "" })
        for (let i = 0; i < call.function.arguments.length; i += ARGUMENT_CHARS) {
          parts.push({ _tag: "ToolCallDelta", index, arguments: call.function.arguments.slice(i, i + ARGUMENT_CHARS) })
        }
      }
      parts.push({ _tag: "Finish", finishReason: result.finishReason })
      if (Option.isSome(result.usage)) parts.push({ _tag: "Usage", usage: result.usage.value })
      return Stream.fromIterable(parts)
    }),
  embed: (request) =>
    Effect.sync(() => ({ vectors: simulatedVectors(request.input, request.dimensions), inputTokens: Option.none() }))
}

/** The built-in model under its own name, as `routing.upstream_model` reports a test key's call (`shownRoute` in `Models/Call/CallTypes.ts`). */
const asSimulatedModel = (request: ProviderRequest): ProviderRequest => ({ ...request, model: SIMULATED_MODEL })

/** Test keys always call the built-in model, and its text names it as their routing does. */
export const TestKeyProviderLive = Layer.succeed(TestKeyProvider, {
  complete: (request) => simulatedProvider.complete(asSimulatedModel(request)),
  stream: (request) => simulatedProvider.stream(asSimulatedModel(request)),
  // The simulated vectors do not depend on the model named.
  embed: simulatedProvider.embed
})
