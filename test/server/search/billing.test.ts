import { expect, layer } from "@effect/vitest"
import { Effect, Layer, Option } from "effect"
import type { AppConfigShape } from "../../../src/AppConfig.js"
import { toMyrString } from "../../../src/Domain/Money.js"
import { costOf, costOfParts, DEFAULT_PRICES } from "../../../src/Domain/Prices.js"
import { booksOf } from "../../support/Books.js"
import { alwaysClosed } from "../../support/Breakers.js"
import { caller, modelCall, TestServerWithUpstream, violations, walletOf } from "../../support/Models.js"
import { answering, isPlanning, Searx } from "../../support/Search.js"
import { webhookOverrides } from "../../support/Stripe.js"
import { TestServerLive } from "../../support/TestServer.js"
import { Alpha, AlphaAndBeta, Beta, TWO_UPSTREAM_PRICES, upstreamsOf } from "../../support/TwoUpstreams.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * Web search stopped by a failure is billed for what it spent, the deadline
 * included, never 0 (docs/money.md, "The money rules"): the main answer timing
 * out, or the search engine failing after planning ran. And a planning call a
 * fallback answered is billed at the fallback's prices. Each checks the ledger,
 * the log and the hold.
 */

const FIRST_BYTE_MS = 700

const TestServerWithSearch = Layer.unwrapEffect(Effect.map(Searx, (searx) =>
  TestServerWithUpstream({
    searchBaseUrl: Option.some(searx.baseUrl),
    fetchAllowedHosts: new Set([searx.host]),
    upstreamFirstByteTimeoutMs: FIRST_BYTE_MS,
    upstreamTotalTimeoutMs: 2_000
  }))).pipe(Layer.provideMerge(Searx.layer))

const PLANNING_USAGE = { prompt_tokens: 150, completion_tokens: 12 }
const BALANCED = {
  mode: "on",
  search_depth: "balanced",
  max_searches: 2,
  max_results: 1,
  content: { enabled: true, max_pages: 1 }
}

/** The books add up: one usage entry equal to the log's cost, the hold captured at it, the wallet holding nothing more. */
const expectBilled = (accountId: string, requestId: string, cost: number) =>
  Effect.gen(function*() {
    const books = yield* booksOf(requestId)
    expect(books.ledger, "one usage entry, the log's cost").toEqual([-cost])
    expect(books.log.cost_micro_myr).toBe(String(cost))
    expect(books.hold.map((h) => [h.status, h.captured])).toEqual([["captured", cost]])
    const wallet = yield* walletOf(accountId)
    expect(wallet.reserved).toBe(0)
    expect(wallet.spent).toBe(cost)
    expect(yield* violations(accountId)).toEqual([])
    return books
  })

layer(TestServerWithSearch, { excludeTestServices: true, timeout: 60_000 })("web search stopped by a failure", (it) => {
  for (const stream of [false, true]) {
    it.effect(`${stream ? "streamed" : "plain"}: the answer times out after planning, 2 searches and a page: 504 provider_timeout, billed for them`, () =>
      Effect.gen(function*() {
        const searx = yield* Searx
        const upstream = yield* Upstream
        searx.reset()
        upstream.reset()
        searx.results = (q) => [{ title: q, url: `${searx.baseUrl}/page/${q.replace(/\W+/g, "-")}`, content: q }]
        // Planning calls answer at once; the answer itself never starts.
        upstream.setBehaviour({
          kind: "perRequest",
          choose: (body) =>
            isPlanning(body)
              ? { kind: "ok", text: answering(["river levels", "flood roads"], "unused"), usage: PLANNING_USAGE }
              : { kind: "hang" }
        })
        const { accountId, apiKey } = yield* caller(`search-deadline-${stream}@example.com`, { sen: 1000 })
        const reply = yield* modelCall(apiKey, "/v1/responses", {
          input: "What happened to the river?",
          max_output_tokens: 50,
          stream,
          web_search: BALANCED
        })
        expect(reply.status, reply.text).toBe(504)
        expect(reply.body.error.code).toBe("provider_timeout")
        expect(searx.queries).toHaveLength(2)
        expect(upstream.requests.filter((r) => !isPlanning(r.body))).toHaveLength(1)

        const requestId = reply.headers.get("x-request-id") ?? ""
        const { log } = yield* booksOf(requestId)
        const cost = costOf(DEFAULT_PRICES, log.upstream_model, {
          inputTokens: 150,
          cachedTokens: 0,
          outputTokens: 12,
          searches: 2,
          pages: 1
        })
        expect(cost).toBeGreaterThan(0)
        expect(log).toMatchObject({
          status: "billed",
          error_code: "provider_timeout",
          usage_source: "estimated",
          input_tokens: 150,
          output_tokens: 12,
          search_count: 2,
          content_pages: 1
        })
        yield* expectBilled(accountId, requestId, cost)
      }))
  }

  it.effect("streamed: the answer's stream breaks off before any output, after planning and a search: an error event, billed for the search and the input sent", () =>
    Effect.gen(function*() {
      const searx = yield* Searx
      const upstream = yield* Upstream
      searx.reset()
      upstream.reset()
      upstream.setBehaviour({
        kind: "perRequest",
        choose: (body) =>
          isPlanning(body)
            ? { kind: "ok", text: answering(["river levels"], "unused"), usage: PLANNING_USAGE }
            : { kind: "resetMidStream", afterChunks: 0 }
      })
      const { accountId, apiKey } = yield* caller("search-stream-broke@example.com", { sen: 1000 })
      const reply = yield* modelCall(apiKey, "/v1/responses", {
        input: "What happened to the river?",
        max_output_tokens: 50,
        stream: true,
        web_search: { mode: "on", search_depth: "fast", max_searches: 1, max_results: 1 }
      })
      expect(reply.status, reply.text).toBe(200)
      expect(reply.text).toContain("response.failed")
      const requestId = reply.headers.get("x-request-id") ?? ""
      const { log } = yield* booksOf(requestId)
      // A stream the upstream breaks is billed what was used so far, as a client's cut is (docs/architecture.md, "Streams"): the
      // planning call (150 in, 12 out), the search, and the input the answering call was sent, on the same model.
      expect(log.input_tokens, "the answering call's input is counted beside the planning call's").toBeGreaterThan(150)
      const cost = costOf(DEFAULT_PRICES, log.upstream_model, {
        inputTokens: log.input_tokens,
        cachedTokens: 0,
        outputTokens: 12,
        searches: 1,
        pages: 0
      })
      expect(log).toMatchObject({
        status: "billed",
        error_code: "provider_unavailable",
        usage_source: "estimated",
        search_count: 1,
        output_tokens: 12
      })
      yield* expectBilled(accountId, requestId, cost)
    }))

  it.effect("the search engine fails after planning ran: 502 search_error, billed for the planning call (not the failed search)", () =>
    Effect.gen(function*() {
      const searx = yield* Searx
      const upstream = yield* Upstream
      searx.reset()
      upstream.reset()
      searx.failWith = 500
      upstream.setBehaviour({ kind: "ok", text: answering(["river levels"], "never asked"), usage: PLANNING_USAGE })
      const { accountId, apiKey } = yield* caller("search-engine-down@example.com", { sen: 1000 })
      const reply = yield* modelCall(apiKey, "/v1/responses", {
        input: "What happened to the river?",
        max_output_tokens: 50,
        web_search: { ...BALANCED, max_searches: 1 }
      })
      expect(reply.status, reply.text).toBe(502)
      expect(reply.body.error.code).toBe("search_error")
      expect(upstream.requests).toHaveLength(1) // the planning call only
      expect(searx.queries).toEqual(["river levels"])

      const requestId = reply.headers.get("x-request-id") ?? ""
      const { log } = yield* booksOf(requestId)
      const cost = costOf(DEFAULT_PRICES, log.upstream_model, {
        inputTokens: 150,
        cachedTokens: 0,
        outputTokens: 12,
        searches: 0,
        pages: 0
      })
      expect(cost).toBeGreaterThan(0)
      expect(log).toMatchObject({
        status: "billed",
        error_code: "search_error",
        usage_source: "estimated",
        input_tokens: 150,
        output_tokens: 12,
        search_count: 0,
        content_pages: 0
      })
      yield* expectBilled(accountId, requestId, cost)
    }))
})

const PRICES = TWO_UPSTREAM_PRICES

const TwoUpstreamsWithSearch = Layer.unwrapEffect(Effect.gen(function*() {
  const alpha = yield* Alpha
  const beta = yield* Beta
  const searx = yield* Searx
  const upstreams = upstreamsOf(alpha.baseUrl, beta.baseUrl)
  const config: Partial<AppConfigShape> = {
    ...webhookOverrides,
    upstreams,
    prices: TWO_UPSTREAM_PRICES,
    searchBaseUrl: Option.some(searx.baseUrl),
    fetchAllowedHosts: new Set([searx.host])
  }
  return TestServerLive(config, { breakers: alwaysClosed })
})).pipe(Layer.provideMerge(Layer.merge(AlphaAndBeta, Searx.layer)))

layer(TwoUpstreamsWithSearch, { excludeTestServices: true, timeout: 60_000 })(
  "a planning call a fallback answered",
  (it) => {
    it.effect("alpha fails the planning call, beta plans, alpha answers: the planning call at beta's prices, the answer at alpha's", () =>
      Effect.gen(function*() {
        const alpha = yield* Alpha
        const beta = yield* Beta
        const searx = yield* Searx
        alpha.reset()
        beta.reset()
        searx.reset()
        alpha.setBehaviour({
          kind: "perRequest",
          choose: (body) =>
            isPlanning(body)
              ? { kind: "status", status: 503 }
              : { kind: "ok", text: "The river rose [1].", usage: { prompt_tokens: 1000, completion_tokens: 500 } }
        })
        beta.setBehaviour({
          kind: "ok",
          text: answering(["river levels"], "beta never answers"),
          usage: { prompt_tokens: 400, completion_tokens: 100 }
        })
        const { accountId, apiKey } = yield* caller("search-planning-fallback@example.com", { sen: 1000 })
        const reply = yield* modelCall(apiKey, "/v1/responses", {
          input: "What happened to the river?",
          max_output_tokens: 1000,
          web_search: { mode: "on", search_depth: "fast", max_searches: 1, max_results: 1 }
        })
        expect(reply.status, reply.text).toBe(200)
        expect(reply.body.routing.upstream_model).toBe("alpha-mini")
        expect(beta.requests.map((r) => isPlanning(r.body))).toEqual([true])
        expect(alpha.requests.map((r) => isPlanning(r.body))).toEqual([true, false])

        const cost = costOfParts(
          PRICES,
          [
            { model: "alpha-mini", inputTokens: 1000, cachedTokens: 0, outputTokens: 500 },
            { model: "beta-large", inputTokens: 400, cachedTokens: 0, outputTokens: 100 }
          ],
          1,
          0
        )
        // What it was billed before: everything at alpha's prices.
        const allAtAlpha = costOf(PRICES, "alpha-mini", {
          inputTokens: 1400,
          cachedTokens: 0,
          outputTokens: 600,
          searches: 1,
          pages: 0
        })
        expect(cost).toBeGreaterThan(allAtAlpha)
        expect(reply.body.usage.cost_myr).toBe(toMyrString(cost))
        const { log } = yield* expectBilled(accountId, reply.body.request_id, cost)
        expect(log).toMatchObject({
          status: "billed",
          upstream_model: "alpha-mini",
          usage_source: "provider",
          input_tokens: 1400,
          output_tokens: 600,
          search_count: 1
        })
      }))
  }
)
