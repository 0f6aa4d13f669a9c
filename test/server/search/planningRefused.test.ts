import { expect, layer } from "@effect/vitest"
import { Effect, Layer, Option } from "effect"
import { costOf, DEFAULT_PRICES } from "../../../src/Domain/Prices.js"
import { booksOf } from "../../support/Books.js"
import { caller, modelCall, TestServerWithUpstream, violations, walletOf } from "../../support/Models.js"
import { isPlanning, Searx } from "../../support/Search.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * A planning call the upstream refused was never paid upstream: the call
 * answers the refusal and bills nothing, however often the caller retries
 * (docs/operations.md, "Using real services": web search).
 */

const TestServerWithSearch = Layer.unwrapEffect(Effect.map(Searx, (searx) =>
  TestServerWithUpstream({
    searchBaseUrl: Option.some(searx.baseUrl),
    fetchAllowedHosts: new Set([searx.host]),
    upstreamFirstByteTimeoutMs: 2_000,
    upstreamTotalTimeoutMs: 4_000
  }))).pipe(Layer.provideMerge(Searx.layer))

layer(TestServerWithSearch, { excludeTestServices: true, timeout: 60_000 })(
  "a planning call the upstream refuses",
  (it) => {
    for (const stream of [false, true]) {
      it.effect(`${stream ? "streamed" : "plain"}: 503 on planning answers 503 and bills 0, twice in a row`, () =>
        Effect.gen(function*() {
          const searx = yield* Searx
          const upstream = yield* Upstream
          searx.reset()
          upstream.reset()
          upstream.setBehaviour({
            kind: "perRequest",
            choose: (body) => isPlanning(body) ? { kind: "status", status: 503 } : { kind: "ok", text: "never asked" }
          })
          const { accountId, apiKey } = yield* caller(`search-planning-refused-${stream}@example.com`, { sen: 1000 })
          const before = yield* walletOf(accountId)
          for (const attempt of [1, 2]) {
            const reply = yield* modelCall(apiKey, "/v1/responses", {
              input: "What happened to the river?",
              max_output_tokens: 50,
              stream,
              web_search: { mode: "on", search_depth: "fast", max_searches: 1, max_results: 1 }
            })
            expect(reply.status, `attempt ${attempt}: ${reply.text}`).toBe(503)
            expect(reply.body.error.code).toBe("provider_unavailable")
            const requestId = reply.headers.get("x-request-id") ?? ""
            const books = yield* booksOf(requestId)
            expect(books.ledger, `attempt ${attempt}: no usage entry`).toEqual([])
            expect(books.hold.map((h) => [h.status, h.captured]), `attempt ${attempt}: the hold released`).toEqual([[
              "released",
              null
            ]])
            expect(books.log).toMatchObject({
              error_code: "provider_unavailable",
              cost_micro_myr: "0",
              search_count: 0
            })
            expect(books.log.status).not.toBe("billed")
          }
          expect(searx.queries).toEqual([])
          expect(upstream.requests.filter((r) => !isPlanning(r.body))).toHaveLength(0)
          const after = yield* walletOf(accountId)
          expect(after).toEqual({ available: before.available, reserved: 0, spent: before.spent })
          expect(yield* violations(accountId)).toEqual([])
        }))
    }

    it.effect("deep: the second round's planning call refused, the call answers 503, billed for the first round alone", () =>
      Effect.gen(function*() {
        const searx = yield* Searx
        const upstream = yield* Upstream
        searx.reset()
        upstream.reset()
        searx.results = (q) => [{ title: q, url: `${searx.baseUrl}/page/${q.replace(/\W+/g, "-")}`, content: q }]
        upstream.setBehaviour({
          kind: "perRequest",
          choose: (body) => {
            const second = JSON.stringify(body).includes("Searches already run:")
            return second
              ? { kind: "status", status: 503 }
              : { kind: "ok", text: "river levels", usage: { prompt_tokens: 150, completion_tokens: 12 } }
          }
        })
        const { accountId, apiKey } = yield* caller("search-planning-refused-deep@example.com", { sen: 1000 })
        const reply = yield* modelCall(apiKey, "/v1/responses", {
          input: "What happened to the river?",
          max_output_tokens: 50,
          web_search: {
            mode: "on",
            search_depth: "deep",
            max_searches: 2,
            max_results: 1,
            content: { enabled: false, max_pages: 1 }
          }
        })
        expect(reply.status, reply.text).toBe(503)
        expect(upstream.requests.map((r) => isPlanning(r.body))).toEqual([true, true])
        expect(searx.queries).toEqual(["river levels"])
        const requestId = reply.headers.get("x-request-id") ?? ""
        const { hold, ledger, log } = yield* booksOf(requestId)
        const cost = costOf(DEFAULT_PRICES, log.upstream_model, {
          inputTokens: 150,
          cachedTokens: 0,
          outputTokens: 12,
          searches: 1,
          pages: 0
        })
        expect(log).toMatchObject({
          status: "billed",
          error_code: "provider_unavailable",
          input_tokens: 150,
          output_tokens: 12,
          search_count: 1,
          cost_micro_myr: String(cost)
        })
        expect(ledger).toEqual([-cost])
        expect(hold.map((h) => [h.status, h.captured])).toEqual([["captured", cost]])
        expect((yield* walletOf(accountId)).reserved).toBe(0)
        expect(yield* violations(accountId)).toEqual([])
      }))
  }
)
