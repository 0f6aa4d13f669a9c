import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { costOf, DEFAULT_PRICES } from "../../../src/Domain/Prices.js"
import { countMessages } from "../../../src/Domain/Tokens.js"
import { DEFAULT_REASONING_TOKENS_PER_SECOND } from "../../../src/Models/Call/ReasoningEstimate.js"
import { booksOf, type CallBooks } from "../../support/Books.js"
import { caller, reasoningStream, TestServerWithUpstream, violations, walletOf } from "../../support/Models.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * A reasoning stream the upstream breaks before any visible output
 * (docs/architecture.md, "Streams"): the upstream billed its input and its
 * thinking so far, so the call is billed them, as the same call is when its
 * client cuts it, and its log keeps the error's code.
 */

const PROMPT = "Think hard about a greeting for the team"
const THINK_MS = 2_000

/** A call billed its input and estimated reasoning, nothing visible: the books agree, and the reasoning it was billed. */
const billedForThinking = ({ hold, ledger, log }: CallBooks, errorCode: string | null) => {
  expect(log).toMatchObject({ status: "billed", usage_source: "estimated", error_code: errorCode })
  expect(log.input_tokens, "the input").toBe(countMessages([{ role: "user", content: PROMPT }]))
  expect(log.reasoning_tokens, "the thinking so far").toBeGreaterThanOrEqual(
    Math.floor(THINK_MS / 1000 * DEFAULT_REASONING_TOKENS_PER_SECOND)
  )
  expect(log.output_tokens, "nothing visible: the output is the thinking").toBe(log.reasoning_tokens)
  const cost = costOf(DEFAULT_PRICES, log.upstream_model, {
    inputTokens: log.input_tokens,
    cachedTokens: 0,
    outputTokens: log.output_tokens,
    searches: 0,
    pages: 0
  })
  expect(cost).toBeGreaterThan(0)
  expect(log.cost_micro_myr).toBe(String(cost))
  expect(ledger).toEqual([-cost])
  expect(hold.map((h) => [h.status, h.captured])).toEqual([["captured", cost]])
  return log.reasoning_tokens
}

layer(TestServerWithUpstream({ upstreamFirstByteTimeoutMs: 5_000, upstreamTotalTimeoutMs: 10_000 }), {
  excludeTestServices: true,
  timeout: 60_000
})("a stream the upstream breaks before any visible output", (it) => {
  it.effect("is billed its input and its reasoning so far, as the same call cut by its client is", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const { accountId, apiKey } = yield* caller("broken-stream@example.com", { sen: 1000 })

      // The upstream thinks (its role chunk, then silence) and its connection breaks before any text.
      upstream.setBehaviour({ kind: "resetMidStream", afterChunks: 0, thinkMs: THINK_MS })
      const broken = yield* reasoningStream(apiKey, PROMPT)
      expect(broken.status).toBe(200)
      const last = broken.chunks[broken.chunks.length - 1]
      expect(last !== "[DONE]" && last?.error?.code, "an error event, not a clean end").toBe("provider_unavailable")
      const brokenReasoning = billedForThinking(yield* booksOf(broken.requestId), "provider_unavailable")

      // The same thinking, cut by the client instead.
      upstream.setBehaviour({ kind: "ok", thinkMs: 10_000 })
      const cut = yield* reasoningStream(apiKey, PROMPT, THINK_MS)
      expect(cut.status).toBe(200)
      const cutReasoning = billedForThinking(yield* booksOf(cut.requestId), null)
      expect(Math.abs(brokenReasoning - cutReasoning), "about the same thinking billed").toBeLessThanOrEqual(
        Math.max(brokenReasoning, cutReasoning) / 2
      )

      expect((yield* walletOf(accountId)).reserved).toBe(0)
      expect(yield* violations(accountId)).toEqual([])
    }))
})
