import { expect, layer } from "@effect/vitest"
import { Effect, Layer, Option } from "effect"
import { costOf, DEFAULT_PRICES } from "../../../src/Domain/Prices.js"
import { caller, TestServerWithUpstream, violations, walletOf } from "../../support/Models.js"
import { answering, Searx } from "../../support/Search.js"
import { query, TestServer } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * A call cut by its client after web search began
 * (docs/money.md, "The money rules"): the planning calls, searches and pages
 * that ran were paid upstream, so the call is billed for them
 * (`usageSource: estimated`), never 0, and the wallet is charged exactly what
 * the log says.
 */
const TestServerWithSearch = Layer.unwrapEffect(Effect.map(Searx, (searx) =>
  TestServerWithUpstream({
    searchBaseUrl: Option.some(searx.baseUrl),
    fetchAllowedHosts: new Set([searx.host]),
    // `/page/slow` never answers: the call is still reading it when its client goes.
    fetchPageTimeoutMs: 60_000
  }))).pipe(Layer.provideMerge(Searx.layer))

type LogRow = {
  readonly request_id: string
  readonly status: string
  readonly upstream_model: string
  readonly input_tokens: number
  readonly output_tokens: number
  readonly usage_source: string
  readonly search_count: number
  readonly content_pages: number
  readonly cost_micro_myr: string
}

/** The account's one call once it has settled (a call running over 1 s is first written `pending`). */
const settledLog = (accountId: string) =>
  Effect.gen(function*() {
    const deadline = Date.now() + 15_000
    while (Date.now() < deadline) {
      const rows = yield* query<LogRow>(
        `SELECT request_id, status, upstream_model, input_tokens, output_tokens, usage_source, search_count, content_pages, cost_micro_myr
         FROM request_logs WHERE account_id = $1`,
        [accountId]
      )
      const row = rows[0]
      if (rows.length > 1) throw new Error(`one call expected, found ${rows.length} log rows`)
      if (row !== undefined && row.status !== "pending") return row
      yield* Effect.sleep("50 millis")
    }
    throw new Error("the cut call was never settled")
  })

/** Sends the call, waits until `cutWhen` holds, then drops the connection (as a client that gives up does). */
const cutCall = (apiKey: string, json: unknown, cutWhen: () => boolean) =>
  Effect.gen(function*() {
    const { baseUrl } = yield* TestServer
    const controller = new AbortController()
    const sent = fetch(`${baseUrl}/v1/responses`, {
      method: "POST",
      headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
      body: JSON.stringify(json),
      signal: controller.signal
    }).then(async (response) => `answered ${response.status}: ${await response.text()}`, () => "cut")
    const deadline = Date.now() + 15_000
    while (!cutWhen()) {
      if (Date.now() > deadline) throw new Error("the call never got where the test cuts it")
      yield* Effect.sleep("20 millis")
    }
    controller.abort()
    expect(yield* Effect.promise(() => sent)).toBe("cut")
  })

const DEEP = {
  mode: "on",
  search_depth: "deep",
  max_searches: 2,
  max_results: 1,
  content: { enabled: true, max_pages: 2 }
}

layer(TestServerWithSearch, { excludeTestServices: true })("a client that goes away during web search", (it) => {
  for (const stream of [false, true]) {
    it.effect(`${stream ? "streamed" : "plain"}: cut while reading the second round's page, it is billed for both planning calls, both searches and the page read`, () =>
      Effect.gen(function*() {
        const searx = yield* Searx
        const upstream = yield* Upstream
        searx.reset()
        upstream.reset()
        // Round one finds a page that loads; round two finds one that never does.
        searx.results = (
          q
        ) => [{ title: q, url: `${searx.baseUrl}/page/${q === "first query" ? "good" : "slow"}`, content: q }]
        upstream.setBehaviour({
          kind: "ok",
          text: answering((round) => round === 1 ? ["first query"] : ["second query"], "never sent"),
          usage: { prompt_tokens: 150, completion_tokens: 12 }
        })
        const { accountId, apiKey } = yield* caller(`search-cut-${stream}@example.com`, { sen: 1000 })
        // The slow page is requested only after round one's page was read and round two planned and searched.
        yield* cutCall(apiKey, {
          input: "What happened to the river?",
          max_output_tokens: 50,
          stream,
          web_search: DEEP
        }, () => searx.pages.includes("/page/slow"))

        const log = yield* settledLog(accountId)
        expect(upstream.requests).toHaveLength(2) // the two planning calls; the answer was never asked for
        const cost = costOf(DEFAULT_PRICES, log.upstream_model, {
          inputTokens: 300,
          cachedTokens: 0,
          outputTokens: 24,
          searches: 2,
          pages: 1
        })
        expect(cost).toBeGreaterThan(0)
        expect(log).toMatchObject({
          status: "billed",
          usage_source: "estimated",
          search_count: 2,
          content_pages: 1,
          input_tokens: 300,
          output_tokens: 24,
          cost_micro_myr: String(cost)
        })
        const wallet = yield* walletOf(accountId)
        expect(wallet.spent).toBe(cost)
        expect(wallet.reserved).toBe(0)
        expect(wallet.available).toBe(1000 * 10_000 - cost)
        expect(yield* violations(accountId)).toEqual([])
      }))
  }

  it.effect("cut while the first planning call runs: billed for its prompt, counted (the upstream was paid for it), never 0", () =>
    Effect.gen(function*() {
      const searx = yield* Searx
      const upstream = yield* Upstream
      searx.reset()
      upstream.reset()
      upstream.setBehaviour({ kind: "hang" })
      const { accountId, apiKey } = yield* caller("search-cut-planning@example.com", { sen: 1000 })
      yield* cutCall(
        apiKey,
        { input: "What happened to the river?", max_output_tokens: 50, web_search: DEEP },
        () => upstream.requests.length > 0
      )

      const log = yield* settledLog(accountId)
      expect(searx.queries).toEqual([])
      expect(log).toMatchObject({
        status: "billed",
        usage_source: "estimated",
        search_count: 0,
        content_pages: 0,
        output_tokens: 0
      })
      expect(log.input_tokens).toBeGreaterThan(0)
      const cost = costOf(DEFAULT_PRICES, log.upstream_model, {
        inputTokens: log.input_tokens,
        cachedTokens: 0,
        outputTokens: 0,
        searches: 0,
        pages: 0
      })
      expect(cost).toBeGreaterThan(0)
      expect(log.cost_micro_myr).toBe(String(cost))
      expect((yield* walletOf(accountId)).spent).toBe(cost)
      expect(yield* violations(accountId)).toEqual([])
    }))
})
