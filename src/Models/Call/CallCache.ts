import { Effect, Option, Stream } from "effect"
import type { ApiKeyPrincipal } from "../../Auth/Api.js"
import { cacheKeyOf } from "../../Cache/CacheKey.js"
import type { CacheEntry } from "../../Cache/ResponseCache.js"
import { InvalidRequest, ProviderUnavailable } from "../../Domain/Errors.js"
import { readableParts } from "../../Lane/Wire/PartReader.js"
import type {
  Completion,
  FinishReason,
  ProviderShape,
  StreamPart,
  TokenLogprob,
  ToolCall
} from "../../Providers/Provider.js"
import type { Route } from "../../Routing/Router.js"
import type { CacheAsk, CallResult, CallUsage } from "./CallTypes.js"

/**
 * The response cache on a model call (docs/api/cache.md): what a call asks of it, what is stored of an
 * answer, and the answer replayed as if a provider gave it (a hit holds nothing and costs 0).
 */

const MIN_TTL = 60
const MAX_TTL = 86_400
const DEFAULT_TTL = 300

/** The cache's request headers, as the call's headers decoded them (strings, checked here). */
export interface CacheHeaders {
  readonly "nenas-cache"?: string | undefined
  readonly "nenas-cache-ttl"?: string | undefined
}

/** What the body holds that the cache never answers: a stored turn, web search, more than one choice. */
export interface Uncacheable {
  readonly previousResponseId: boolean
  readonly webSearch: boolean
  readonly choices: number
}

/**
 * What the call asks of the cache, from its headers and its key (docs/api/cache.md, "Turning it on"): a
 * `Nenas-Cache` other than on, off or refresh, or a `Nenas-Cache-TTL` outside 60 to 86400, is refused
 * naming the header; without the header, a key with `cache_ttl_seconds` caches; `off` neither reads nor
 * writes. The key is made only for a call the cache answers.
 */
export const cacheAskOf = (
  headers: CacheHeaders,
  key: ApiKeyPrincipal,
  endpoint: string,
  body: unknown,
  uncacheable: Uncacheable
): Effect.Effect<CacheAsk | undefined, InvalidRequest> => {
  const asked = headers["nenas-cache"]?.trim().toLowerCase()
  if (asked !== undefined && asked !== "on" && asked !== "off" && asked !== "refresh") {
    return Effect.fail(
      new InvalidRequest({ message: "Nenas-Cache must be on, off or refresh.", param: "Nenas-Cache" })
    )
  }
  const ttlHeader = headers["nenas-cache-ttl"]?.trim()
  let ttlSeconds = key.cacheTtlSeconds ?? DEFAULT_TTL
  if (ttlHeader !== undefined) {
    const ttl = /^\d{1,6}$/.test(ttlHeader) ? Number(ttlHeader) : Number.NaN
    if (!(ttl >= MIN_TTL && ttl <= MAX_TTL)) {
      return Effect.fail(
        new InvalidRequest({
          message: `Nenas-Cache-TTL must be a whole number of seconds from ${MIN_TTL} to ${MAX_TTL}.`,
          param: "Nenas-Cache-TTL"
        })
      )
    }
    ttlSeconds = ttl
  }
  const mode = asked ?? (key.cacheTtlSeconds == null ? "off" : "on")
  if (mode === "off") return Effect.succeed(undefined)
  if (uncacheable.previousResponseId || uncacheable.webSearch || uncacheable.choices > 1) {
    return Effect.succeed({ _tag: "Bypass" })
  }
  const cacheKey = cacheKeyOf({
    endpoint,
    accountId: key.accountId,
    environment: key.environment,
    policy: [key.accountGuardrails ?? null, key.keyGuardrails ?? null],
    body
  })
  if (cacheKey === undefined) return Effect.succeed({ _tag: "Bypass" })
  return Effect.succeed({ _tag: "Use", key: cacheKey, read: mode === "on", ttlSeconds })
}

/** What the cache keeps of a model call's answer: what its replay shows (the answer as its caller was shown it). */
interface StoredAnswer {
  readonly v: 1
  readonly text: string
  readonly toolCalls: ReadonlyArray<ToolCall>
  readonly logprobs: ReadonlyArray<TokenLogprob> | null
  readonly finishReason: FinishReason
  readonly usage: CallUsage
  readonly route: Route
}

/** A call's result as the cache stores it, made now, kept `ttlSeconds`. */
export const entryOf = (result: CallResult, ttlSeconds: number, now: number): CacheEntry => ({
  answer: JSON.stringify(
    {
      v: 1,
      text: result.text,
      toolCalls: result.toolCalls,
      logprobs: result.logprobs ?? null,
      finishReason: result.finishReason,
      usage: result.usage,
      route: result.route
    } satisfies StoredAnswer
  ),
  sourceRequestId: result.requestId,
  costMicroMyr: result.cost,
  createdAt: now,
  expiresAt: now + ttlSeconds * 1000
})

/** A stored answer read back; none when it is not one this version wrote (it is then a miss). */
export const storedAnswerOf = (entry: CacheEntry): StoredAnswer | undefined => {
  try {
    const stored = JSON.parse(entry.answer) as StoredAnswer
    return stored.v === 1 && typeof stored.text === "string" ? stored : undefined
  } catch {
    return undefined
  }
}

/** Events a replayed stream writes at a time: word by word, a few words a write. */
const PARTS_PER_WRITE = 4

/** The stored text in words, each with the space after it. */
const wordsOf = (text: string): ReadonlyArray<string> => text.match(/\s*\S+\s*/g) ?? (text === "" ? [] : [text])

/**
 * The stored answer as a provider answers it, with the original's token counts; a stream gives it word by
 * word, `PARTS_PER_WRITE` parts a read. It serves no embeddings.
 */
export const replayProvider = (stored: StoredAnswer): ProviderShape => {
  const counts = {
    inputTokens: stored.usage.inputTokens,
    outputTokens: stored.usage.outputTokens,
    reasoningTokens: stored.usage.reasoningTokens,
    cachedTokens: stored.usage.cachedTokens
  }
  const usage = Option.some(counts)
  const completion: Completion = {
    text: stored.text,
    toolCalls: stored.toolCalls,
    finishReason: stored.finishReason,
    usage,
    logprobs: stored.logprobs ?? undefined
  }
  const parts = (): ReadonlyArray<StreamPart> => [
    ...wordsOf(stored.text).map((text): StreamPart => ({ _tag: "Delta", text })),
    ...stored.toolCalls.map((call, index): StreamPart => ({
      _tag: "ToolCallDelta",
      index,
      id: call.id,
      name: call.function.name,
      arguments: call.function.arguments
    })),
    { _tag: "Finish", finishReason: stored.finishReason },
    { _tag: "Usage", usage: counts }
  ]
  return {
    complete: () => Effect.succeed(completion),
    stream: () =>
      Effect.sync(() =>
        readableParts<StreamPart, never>(() => {
          const all = parts()
          let at = 0
          return {
            next: () => {
              if (at >= all.length) return Promise.resolve(undefined)
              const batch = all.slice(at, at + PARTS_PER_WRITE)
              at += PARTS_PER_WRITE
              return Promise.resolve(batch)
            },
            cancel: () => {
              at = all.length
            }
          }
        }) as Stream.Stream<StreamPart, never>
      ),
    embed: () => Effect.fail(new ProviderUnavailable({ message: "A replayed answer serves no embeddings." }))
  }
}

/** The route a hit shows: the original's, saying where the answer came from. */
export const replayedRoute = (stored: StoredAnswer, sourceRequestId: string): Route => ({
  ...stored.route,
  reasoning: `${stored.route.reasoning} Answered from the response cache (the answer of ${sourceRequestId}).`
})
