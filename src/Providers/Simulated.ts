import { createHash } from "node:crypto"
import { Effect, Option, Stream } from "effect"
import { countMessages, countText } from "../Models/Tokens.js"
import { simulatedPlannerAnswer } from "../Search/Planning.js"
import type { Completion, ProviderRequest, ProviderShape, StreamPart } from "./Provider.js"

const lastUserText = (request: ProviderRequest): string =>
  [...request.messages].reverse().find((m) => m.role === "user")?.content ?? ""

const SOURCES = /^\[(\d+)\] /m

/**
 * A deterministic answer derived from the input: the same request always gets
 * the same text. It quotes the question's start, and cites the first source
 * when sources were given, so citations can be followed end to end.
 */
const fullAnswer = (request: ProviderRequest): string => {
  // A web search planning call: queries derived from the prompt, one a line.
  const planned = simulatedPlannerAnswer(request.messages)
  if (planned !== undefined) return planned
  const question = lastUserText(request).replace(/\s+/g, " ").trim()
  const digest = createHash("sha256").update(JSON.stringify(request.messages)).digest("hex").slice(0, 8)
  const quoted = question.length > 120 ? `${question.slice(0, 117)}...` : question
  const system = request.messages.filter((m) => m.role === "system").map((m) => m.content).join("\n")
  const cites = SOURCES.test(system) ? " According to the sources found [1], this is the simulated summary." : ""
  return `Simulated answer (${digest}) from ${request.model} to: "${quoted}".${cites}` +
    " This reply comes from nenas' built-in model, which runs without an upstream."
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

const complete = (request: ProviderRequest): Completion => {
  const { text, truncated } = capped(fullAnswer(request), request.maxOutputTokens)
  const outputTokens = countText(text)
  const reasoningTokens = request.reasoningModel ? Math.max(Math.min(64, request.maxOutputTokens - outputTokens), 0) : 0
  return {
    text,
    finishReason: truncated ? "length" : "stop",
    usage: Option.some({
      inputTokens: countMessages(request.messages),
      outputTokens: outputTokens + reasoningTokens,
      reasoningTokens,
      cachedTokens: 0
    })
  }
}

const CHUNK_WORDS = 3

/** The built-in model: no network, deterministic text, usage counted with the tokenizer, streamed in chunks of words. */
export const simulatedProvider: ProviderShape = {
  complete: (request) => Effect.sync(() => complete(request)),
  stream: (request) =>
    Effect.sync(() => {
      const result = complete(request)
      const words = result.text.split(/(?<= )/)
      const deltas: Array<StreamPart> = []
      for (let i = 0; i < words.length; i += CHUNK_WORDS) {
        deltas.push({ _tag: "Delta", text: words.slice(i, i + CHUNK_WORDS).join("") })
      }
      const tail: Array<StreamPart> = [{ _tag: "Finish", finishReason: result.finishReason }]
      if (Option.isSome(result.usage)) tail.push({ _tag: "Usage", usage: result.usage.value })
      return Stream.fromIterable([...deltas, ...tail])
    })
}
