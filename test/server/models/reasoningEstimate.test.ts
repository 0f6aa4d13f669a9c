import { describe, expect, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import { costOf, DEFAULT_PRICES } from "../../../src/Domain/Prices.js"
import { countMessages, countText } from "../../../src/Domain/Tokens.js"
import {
  DEFAULT_REASONING_TOKENS_PER_SECOND,
  estimateReasoningTokens,
  makeReasoningRates,
  MAX_LEARNED_RATE,
  OBSERVATIONS_TO_LEARN,
  thinkingMsOf
} from "../../../src/Models/Call/ReasoningEstimate.js"
import { booksOf } from "../../support/Books.js"
import { caller, reasoningStream, TestServerWithUpstream, violations, walletOf } from "../../support/Models.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * Reasoning tokens of a stream cut before its usage chunk: a reasoning model
 * thinks before its first visible token, and the upstream bills that thinking
 * as output. Without usage it is estimated from the wait before the first
 * visible token, at the rate the model was seen to think over several live
 * streams (`src/Models/Call/ReasoningEstimate.ts`), never beyond the output cap or the hold.
 */

describe("the reasoning estimate (no database)", () => {
  const ok = (latencyMs: number) => ({ target: "up/think", model: "think", outcome: "ok" as const, latencyMs })
  const failed = (latencyMs: number) => ({
    target: "up/other",
    model: "other",
    outcome: "first_byte_timeout" as const,
    latencyMs
  })

  it("thinking runs from the answering attempt's start to the first visible output, or to the end when none came", () => {
    expect(thinkingMsOf({ upstreamSentAt: 1_000, firstVisibleAt: 3_000, attempts: [ok(100)] }, 9_000)).toBe(2_000)
    // The attempts that failed before it took their time first.
    expect(thinkingMsOf({ upstreamSentAt: 1_000, firstVisibleAt: 3_000, attempts: [failed(500), ok(100)] }, 9_000))
      .toBe(1_500)
    expect(thinkingMsOf({ upstreamSentAt: 1_000, firstVisibleAt: undefined, attempts: [ok(100)] }, 4_000)).toBe(3_000)
    expect(thinkingMsOf({ upstreamSentAt: undefined, firstVisibleAt: undefined, attempts: [] }, 4_000)).toBeUndefined()
  })

  it("tokens are the thinking time at the rate, rounded down, never more than the room the output cap leaves", () => {
    expect(estimateReasoningTokens(2_000, 300, 32_000)).toBe(600)
    expect(estimateReasoningTokens(1_999, 1, 32_000)).toBe(1)
    expect(estimateReasoningTokens(60_000, 1_000, 500)).toBe(500)
    expect(estimateReasoningTokens(1_000, 100, -5)).toBe(0)
  })

  it("a model's rate starts at the default, learns from several streams' reported reasoning, and ignores what says nothing", () => {
    const rates = makeReasoningRates()
    expect(rates.rateOf("think")).toBe(DEFAULT_REASONING_TOKENS_PER_SECOND)
    rates.observe("think", 150, 1_000)
    expect(rates.rateOf("think"), "one stream is not enough").toBe(DEFAULT_REASONING_TOKENS_PER_SECOND)
    rates.observe("think", 0, 2_000) // a stream that did not reason
    rates.observe("think", 600, 10) // too short a wait to say anything
    for (let i = 2; i < OBSERVATIONS_TO_LEARN; i++) rates.observe("think", 150, 1_000)
    expect(rates.rateOf("think"), "one short of enough").toBe(DEFAULT_REASONING_TOKENS_PER_SECOND)
    rates.observe("think", 300, 2_000)
    expect(rates.rateOf("think")).toBe(150)
    expect(rates.rateOf("other")).toBe(DEFAULT_REASONING_TOKENS_PER_SECOND)
  })
})

const REASONING = "o4-mini"
const PROMPT = "Say hello to the team in a friendly way"
const THINK_MS = 600
const MAX_TOKENS = 4_000

layer(TestServerWithUpstream({ upstreamFirstByteTimeoutMs: 5_000, upstreamTotalTimeoutMs: 10_000 }), {
  excludeTestServices: true,
  timeout: 60_000
})("a reasoning stream cut before its usage chunk", (it) => {
  it.effect("billed for the visible text and an estimate of its reasoning: at the default rate first, then at the rate the model showed", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const { accountId, apiKey } = yield* caller("reasoning-cut@example.com", { sen: 1000 })

      /** One cut stream: its books, checked, and the reasoning tokens it was billed. */
      const cutOnce = Effect.gen(function*() {
        upstream.setBehaviour({ kind: "resetMidStream", afterChunks: 3, thinkMs: THINK_MS })
        const reply = yield* reasoningStream(apiKey, PROMPT)
        expect(reply.status).toBe(200)
        expect(reply.chunks.some((c) => c !== "[DONE]" && c.error !== undefined), "an error chunk, not a clean end")
          .toBe(true)
        expect(reply.text.length).toBeGreaterThan(0)
        const { hold, ledger, log } = yield* booksOf(reply.requestId)
        const visible = countText(reply.text)
        expect(log).toMatchObject({
          status: "billed",
          upstream_model: REASONING,
          usage_source: "estimated",
          error_code: "provider_unavailable"
        })
        expect(log.reasoning_tokens, "reasoning estimated").toBeGreaterThan(0)
        expect(log.output_tokens).toBe(visible + log.reasoning_tokens)
        expect(log.output_tokens).toBeLessThanOrEqual(MAX_TOKENS)
        const cost = costOf(DEFAULT_PRICES, REASONING, {
          inputTokens: log.input_tokens,
          cachedTokens: 0,
          outputTokens: log.output_tokens,
          searches: 0,
          pages: 0
        })
        expect(log.input_tokens).toBe(countMessages([{ role: "user", content: PROMPT }]))
        expect(log.cost_micro_myr).toBe(String(cost))
        expect(ledger).toEqual([-cost])
        expect(hold.map((h) => [h.status, h.captured])).toEqual([["captured", cost]])
        expect(cost).toBeLessThanOrEqual(hold[0]?.amount ?? 0)
        return log.reasoning_tokens
      })

      // No stream of this model has reported usage yet: the default rate over the ~600 ms wait.
      const first = yield* cutOnce
      expect(first).toBeGreaterThanOrEqual(Math.floor(THINK_MS / 1000 * DEFAULT_REASONING_TOKENS_PER_SECOND))

      expect(first).toBeLessThanOrEqual(Math.ceil((THINK_MS + 1_000) / 1000 * DEFAULT_REASONING_TOKENS_PER_SECOND))

      // Whole streams with the same wait report 3000 reasoning tokens: about 5000 a second, held to the most a rate may be.
      const reported = 3_000
      upstream.setBehaviour({
        kind: "ok",
        thinkMs: THINK_MS,
        usage: { completion_tokens: reported + 20, reasoning_tokens: reported }
      })
      for (let i = 0; i < OBSERVATIONS_TO_LEARN; i++) {
        const whole = yield* reasoningStream(apiKey, PROMPT)
        expect(whole.status).toBe(200)
        expect((yield* booksOf(whole.requestId)).log).toMatchObject({
          usage_source: "provider",
          reasoning_tokens: reported
        })
      }

      // After enough of them the same cut estimates at the learned rate.
      const second = yield* cutOnce
      expect(second).toBeGreaterThan(first)
      expect(second).toBeGreaterThanOrEqual(Math.floor(THINK_MS / 1000 * MAX_LEARNED_RATE))
      expect(second).toBeLessThanOrEqual(Math.ceil((THINK_MS + 1_000) / 1000 * MAX_LEARNED_RATE))

      const wallet = yield* walletOf(accountId)
      expect(wallet.reserved).toBe(0)
      expect(yield* violations(accountId)).toEqual([])
    }))
})
