import { describe, expect, it, layer } from "@effect/vitest"
import { Effect, Layer, Option, Stream } from "effect"
import { costOf, DEFAULT_PRICES } from "../../../src/Domain/Prices.js"
import { countText } from "../../../src/Domain/Tokens.js"
import {
  answeringModel,
  DEFAULT_REASONING_TOKENS_PER_SECOND,
  makeReasoningRates,
  MAX_LEARNED_RATE,
  MIN_LEARNED_RATE,
  OBSERVATIONS_TO_LEARN,
  observedRate,
  rateFrom
} from "../../../src/Models/Call/ReasoningEstimate.js"
import type { ProviderShape } from "../../../src/Providers/Provider.js"
import { TestKeyProvider } from "../../../src/Providers/Provider.js"
import { simulatedProvider } from "../../../src/Providers/Simulated.js"
import { booksOf } from "../../support/Books.js"
import { alwaysClosed } from "../../support/Breakers.js"
import { caller, reasoningStream, violations, walletOf } from "../../support/Models.js"
import { webhookOverrides } from "../../support/Stripe.js"
import { TestServerLive } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * The thinking rate a cut stream's reasoning is estimated at is learned only
 * from live streams whose upstream reported usage, per model that answered,
 * each observation held to a band and several needed before the default
 * moves: free test-key streams never set what a live cut is billed.
 */

describe("the learned reasoning rate (no database)", () => {
  const DEFAULT = DEFAULT_REASONING_TOKENS_PER_SECOND

  it("one observation is held to the band around the default, and says nothing when it has no reasoning or too short a wait", () => {
    expect(observedRate(100, 1_000)).toBe(100)
    expect(observedRate(64, 1)).toBeUndefined()
    expect(observedRate(1_000_000, 1_000)).toBe(MAX_LEARNED_RATE)
    expect(observedRate(1, 60_000)).toBe(MIN_LEARNED_RATE)
    expect(observedRate(0, 2_000)).toBeUndefined()
    expect(MIN_LEARNED_RATE).toBe(DEFAULT / 4)
    expect(MAX_LEARNED_RATE).toBe(DEFAULT * 4)
  })

  it("the rate stays at the default until enough observations, then is their median: one outlier moves it little", () => {
    expect(rateFrom([])).toBe(DEFAULT)
    expect(rateFrom(Array.from({ length: OBSERVATIONS_TO_LEARN - 1 }, () => 150))).toBe(DEFAULT)
    expect(rateFrom(Array.from({ length: OBSERVATIONS_TO_LEARN }, () => 150))).toBe(150)
    expect(rateFrom([...Array.from({ length: OBSERVATIONS_TO_LEARN }, () => 100), MAX_LEARNED_RATE])).toBe(100)
  })

  it("a model's rate: an outlier alone does not move it; several observations do; other models keep the default", () => {
    const rates = makeReasoningRates()
    rates.observe("think", 1_000_000, 1_000)
    expect(rates.rateOf("think"), "one outlier").toBe(DEFAULT)
    for (let i = 1; i < OBSERVATIONS_TO_LEARN - 1; i++) rates.observe("think", 150, 1_000)
    expect(rates.rateOf("think"), "not yet enough").toBe(DEFAULT)
    rates.observe("think", 150, 1_000)
    expect(rates.rateOf("think")).toBe(150)
    rates.observe("think", 1, 60_000)
    expect(rates.rateOf("think"), "one low outlier after learning").toBe(150)
    expect(rates.rateOf("other")).toBe(DEFAULT)
  })

  it("the model that showed its thinking is the attempt that answered, not the routed one", () => {
    const attempt = (model: string, outcome: "ok" | "cut_short" | "server_error") => ({
      target: `up/${model}`,
      model,
      outcome,
      latencyMs: 10
    })
    expect(answeringModel([attempt("a", "server_error"), attempt("b", "ok")], "routed")).toBe("b")
    expect(answeringModel([attempt("b", "cut_short")], "routed")).toBe("b")
    expect(answeringModel([attempt("a", "server_error")], "routed")).toBe("routed")
    expect(answeringModel([], "routed")).toBe("routed")
  })
})

const REASONING = "o4-mini"
const PROMPT = "Say hello to the team in a friendly way"
const THINK_MS = 600
/** What the slow built-in model reports: thinking far faster than the default, so a rate learned from it would show. */
const TEST_KEY_REASONING = 3_000

/** The built-in model for test keys, thinking `THINK_MS` before its first token and reporting many reasoning tokens. */
const slowThinker: ProviderShape = {
  complete: simulatedProvider.complete,
  embed: simulatedProvider.embed,
  stream: (request) =>
    Effect.map(simulatedProvider.stream(request), (parts) =>
      Stream.concat(
        Stream.drain(Stream.fromEffect(Effect.sleep(THINK_MS))),
        Stream.map(parts, (part) =>
          part._tag === "Usage"
            ? {
              _tag: "Usage" as const,
              usage: Object.assign({}, part.usage, {
                reasoningTokens: TEST_KEY_REASONING,
                outputTokens: part.usage.outputTokens + TEST_KEY_REASONING
              })
            }
            : part)
      ))
}

const TestServerWithSlowTestKeys = Layer.unwrapEffect(Effect.map(Upstream, (upstream) =>
  TestServerLive({
    ...webhookOverrides,
    upstreamBaseUrl: Option.some(upstream.baseUrl),
    upstreamFirstByteTimeoutMs: 5_000,
    upstreamTotalTimeoutMs: 10_000
  }, { breakers: alwaysClosed, testKeyProvider: Layer.succeed(TestKeyProvider, slowThinker) }))).pipe(
    Layer.provideMerge(Upstream.layer)
  )

layer(TestServerWithSlowTestKeys, { excludeTestServices: true, timeout: 90_000 })(
  "test-key streams and a live cut",
  (it) => {
    it.effect("eight test-key streams reporting fast thinking leave the rate alone: another account's live cut is billed at the default", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const tester = yield* caller("reasoning-test-key@example.com", { environment: "test" })
        for (let i = 0; i < 8; i++) {
          const reply = yield* reasoningStream(tester.apiKey, PROMPT)
          expect(reply.status).toBe(200)
          expect((yield* booksOf(reply.requestId)).log).toMatchObject({
            usage_source: "provider",
            reasoning_tokens: TEST_KEY_REASONING
          })
        }
        expect(upstream.requests, "test keys never reach the upstream").toHaveLength(0)

        const { accountId, apiKey } = yield* caller("reasoning-live-cut@example.com", { sen: 1000 })
        upstream.setBehaviour({ kind: "resetMidStream", afterChunks: 3, thinkMs: THINK_MS })
        const reply = yield* reasoningStream(apiKey, PROMPT)
        expect(reply.status).toBe(200)
        expect(reply.text.length).toBeGreaterThan(0)
        const { hold, ledger, log } = yield* booksOf(reply.requestId)
        expect(log).toMatchObject({
          status: "billed",
          upstream_model: REASONING,
          usage_source: "estimated",
          error_code: "provider_unavailable"
        })
        // The default rate over a wait of THINK_MS and a little more; a rate learned from the test keys would be ~80x.
        expect(log.reasoning_tokens).toBeGreaterThanOrEqual(
          Math.floor(THINK_MS / 1000 * DEFAULT_REASONING_TOKENS_PER_SECOND)
        )
        expect(log.reasoning_tokens).toBeLessThanOrEqual(
          Math.ceil((THINK_MS + 1_000) / 1000 * DEFAULT_REASONING_TOKENS_PER_SECOND)
        )
        expect(log.output_tokens).toBe(countText(reply.text) + log.reasoning_tokens)
        const cost = costOf(DEFAULT_PRICES, REASONING, {
          inputTokens: log.input_tokens,
          cachedTokens: 0,
          outputTokens: log.output_tokens,
          searches: 0,
          pages: 0
        })
        expect(log.cost_micro_myr).toBe(String(cost))
        expect(ledger).toEqual([-cost])
        expect(hold.map((h) => [h.status, h.captured])).toEqual([["captured", cost]])
        expect((yield* walletOf(accountId)).reserved).toBe(0)
        expect(yield* violations(accountId)).toEqual([])
      }))
  }
)
