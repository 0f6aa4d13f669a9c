import type { UpstreamAttempt } from "../Providers/Provider.js"

/**
 * Reasoning tokens of a call whose upstream reported no usage (a stream cut
 * before its usage chunk, a client gone): a reasoning model thinks before its
 * first visible token, and that thinking is billed as output (DESIGN.md,
 * Money). They are estimated from the time the upstream spent before the first
 * visible token (or before the cut, when none came) times the rate at which
 * that model has been seen to think: reported reasoning tokens per second of
 * the same wait, over its recent whole streams on this instance. Plain
 * functions and a small in-memory table, tested without a database.
 */

/** The rate a model is assumed to think at before any of its streams reported usage: low, so an estimate errs for the caller. */
export const DEFAULT_REASONING_TOKENS_PER_SECOND = 50

/** How much a new observation moves a model's rate (an exponential moving average). */
const WEIGHT = 0.2

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

/** A model's rate after one more stream that reported `reasoningTokens` after `thinkingMs`: unchanged when that says nothing. */
export const nextRate = (previous: number | undefined, reasoningTokens: number, thinkingMs: number): number | undefined => {
  if (reasoningTokens <= 0 || thinkingMs < MIN_OBSERVED_MS) return previous
  const observed = reasoningTokens / (thinkingMs / 1000)
  return previous === undefined ? observed : previous + WEIGHT * (observed - previous)
}

/** Each upstream model's thinking rate, as this instance has seen it. */
export const makeReasoningRates = () => {
  const rates = new Map<string, number>()
  return {
    rateOf: (model: string): number => rates.get(model) ?? DEFAULT_REASONING_TOKENS_PER_SECOND,
    observe: (model: string, reasoningTokens: number, thinkingMs: number): void => {
      const next = nextRate(rates.get(model), reasoningTokens, thinkingMs)
      if (next !== undefined) rates.set(model, next)
    }
  }
}

export type ReasoningRates = ReturnType<typeof makeReasoningRates>
