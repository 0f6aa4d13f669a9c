import { Option } from "effect"
import { servedBy } from "../../Providers/Fallback.js"
import type { UpstreamAttempt } from "../../Providers/Provider.js"

/**
 * Reasoning tokens of a call whose upstream reported no usage (a stream cut
 * before its usage chunk, a client gone): a reasoning model thinks before its
 * first visible token, and that thinking is billed as output. They are
 * estimated from the time the upstream spent before the first visible token
 * (or before the cut, when none came) times the rate at which
 * that model has been seen to think: reported reasoning tokens per second of
 * the same wait, the median of its latest live streams on this instance, each
 * held to a band around the default, and the default until there are several.
 * Plain functions and a small in-memory table, tested without a database.
 */

/** The rate a model is assumed to think at until enough of its live streams reported usage: low, so an estimate errs for the caller. */
export const DEFAULT_REASONING_TOKENS_PER_SECOND = 50

/** Each observation is held to this band around the default: no one stream, however odd, teaches a rate outside it. */
export const MIN_LEARNED_RATE = DEFAULT_REASONING_TOKENS_PER_SECOND / 4
export const MAX_LEARNED_RATE = DEFAULT_REASONING_TOKENS_PER_SECOND * 4

/** A model's rate stays at the default until this many of its streams reported reasoning. */
export const OBSERVATIONS_TO_LEARN = 8

/** How many of a model's latest observations its rate is the median of. */
const WINDOW = 16

/** Waits shorter than this say too little about a rate to learn from it. */
const MIN_OBSERVED_MS = 50

/** When a call's upstream request went out and what the relay saw, as its progress keeps them. */
export interface Timing {
  /** Epoch ms when the first upstream attempt was sent; undefined when the upstream was never asked. */
  readonly upstreamSentAt: number | undefined
  /** Epoch ms of the first visible output (text or a tool call); undefined when none came. */
  readonly firstVisibleAt: number | undefined
  readonly attempts: ReadonlyArray<UpstreamAttempt>
}

/**
 * How long the model that answered thought: from its own attempt's start (after the attempts that failed
 * before it) to the first visible token, or to `endedAt` when none came. Undefined when the upstream was never asked.
 */
export const thinkingMsOf = (timing: Timing, endedAt: number): number | undefined => {
  if (timing.upstreamSentAt === undefined) return undefined
  let before = 0
  for (const attempt of timing.attempts) {
    if (attempt.outcome === "ok" || attempt.outcome === "cut_short") break
    before += attempt.latencyMs
  }
  return Math.max(0, (timing.firstVisibleAt ?? endedAt) - timing.upstreamSentAt - before)
}

/** Reasoning tokens for `thinkingMs` at `tokensPerSecond`, rounded down, never more than `room` (what the output cap leaves). */
export const estimateReasoningTokens = (thinkingMs: number, tokensPerSecond: number, room: number): number =>
  Math.max(0, Math.min(Math.floor(room), Math.floor(thinkingMs / 1000 * tokensPerSecond)))

/** The rate one stream showed (`reasoningTokens` after `thinkingMs`), held to the band; undefined when it says nothing. */
export const observedRate = (reasoningTokens: number, thinkingMs: number): number | undefined => {
  if (reasoningTokens <= 0 || thinkingMs < MIN_OBSERVED_MS) return undefined
  return Math.min(MAX_LEARNED_RATE, Math.max(MIN_LEARNED_RATE, reasoningTokens / (thinkingMs / 1000)))
}

/** The rate a model's latest observations say: the default until there are enough, then their median (an outlier moves it little). */
export const rateFrom = (observations: ReadonlyArray<number>): number => {
  if (observations.length < OBSERVATIONS_TO_LEARN) return DEFAULT_REASONING_TOKENS_PER_SECOND
  const sorted = [...observations].sort((a, b) => a - b)
  const middle = Math.floor(sorted.length / 2)
  const upper = sorted[middle] ?? DEFAULT_REASONING_TOKENS_PER_SECOND
  return sorted.length % 2 === 1 ? upper : ((sorted[middle - 1] ?? upper) + upper) / 2
}

/** The model whose thinking a call showed: the attempt that answered, else the one it was routed to. */
export const answeringModel = (attempts: ReadonlyArray<UpstreamAttempt>, routed: string): string =>
  Option.match(servedBy(attempts), { onNone: () => routed, onSome: (attempt) => attempt.model })

/**
 * Each upstream model's thinking rate, as this instance has seen it. The caller observes only live calls whose
 * upstream reported usage: a test key's stream ran on the built-in model, which says nothing about the real one.
 */
export const makeReasoningRates = () => {
  const learned = new Map<string, { readonly observations: Array<number>; rate: number }>()
  return {
    rateOf: (model: string): number => learned.get(model)?.rate ?? DEFAULT_REASONING_TOKENS_PER_SECOND,
    observe: (model: string, reasoningTokens: number, thinkingMs: number): void => {
      const rate = observedRate(reasoningTokens, thinkingMs)
      if (rate === undefined) return
      let entry = learned.get(model)
      if (entry === undefined) {
        entry = { observations: [], rate: DEFAULT_REASONING_TOKENS_PER_SECOND }
        learned.set(model, entry)
      }
      entry.observations.push(rate)
      if (entry.observations.length > WINDOW) entry.observations.shift()
      entry.rate = rateFrom(entry.observations)
    }
  }
}
