import { expect, layer } from "@effect/vitest"
import { Effect, Layer, Option } from "effect"
import { toMyrString } from "../../../src/Domain/Money.js"
import { costOf, DEFAULT_PRICES } from "../../../src/Domain/Prices.js"
import { caller, modelCall, TestServerWithUpstream, violations, walletOf } from "../../support/Models.js"
import { answering, Internal, isPlanning, Searx } from "../../support/Search.js"
import { parseSse, sseJson } from "../../support/Sse.js"
import { query } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * Web search end to end (docs/api/models.md, "Web search"): the service against a
 * SearXNG double that also serves the pages it finds, an "internal" server it
 * must never reach, and the upstream double, which writes the queries when
 * asked to plan and answers citing `[n]` otherwise.
 */
const TestServerWithSearch = Layer.unwrapEffect(Effect.map(Searx, (searx) =>
  TestServerWithUpstream({
    searchBaseUrl: Option.some(searx.baseUrl),
    // The double is on loopback: allowed by name and port, as a local SearXNG would be.
    fetchAllowedHosts: new Set([searx.host]),
    fetchPageTimeoutMs: 1_000
  }))).pipe(Layer.provideMerge(Layer.merge(Searx.layer, Internal.layer)))

interface SentMessage {
  readonly role: string
  readonly content: string
}
const messagesSent = (body: unknown): ReadonlyArray<SentMessage> =>
  (body as { messages: ReadonlyArray<SentMessage> }).messages

interface Annotation {
  readonly type: string
  readonly start_index: number
  readonly end_index: number
  readonly url: string
  readonly title: string
}
interface Citation {
  readonly index: number
  readonly url: string
  readonly title: string
}

/** Each annotation covers an `[n]` of the text and names source n. */
const expectAnnotationsAtMarkers = (
  text: string,
  annotations: ReadonlyArray<Annotation>,
  citations: ReadonlyArray<Citation>
) => {
  for (const annotation of annotations) {
    expect(annotation.type).toBe("url_citation")
    const marker = text.slice(annotation.start_index, annotation.end_index)
    expect(marker).toMatch(/^\[\d+\]$/)
    const cited = citations.find((c) => c.index === Number(marker.slice(1, -1)))
    expect(cited, marker).toBeDefined()
    expect(annotation.url).toBe(cited?.url)
    expect(annotation.title).toBe(cited?.title)
  }
}

const logOf = (requestId: string) =>
  Effect.map(
    query<
      {
        status: string
        search_count: number
        content_pages: number
        input_tokens: number
        output_tokens: number
        cost_micro_myr: string
      }
    >(
      `SELECT status, search_count, content_pages, input_tokens, output_tokens, cost_micro_myr FROM request_logs WHERE request_id = $1`,
      [requestId]
    ),
    (rows) => rows[0]
  )

const reset = Effect.gen(function*() {
  const searx = yield* Searx
  const upstream = yield* Upstream
  searx.reset()
  upstream.reset()
  return { searx, upstream }
})

layer(TestServerWithSearch, { excludeTestServices: true })("web search through a SearXNG API", (it) => {
  it.effect("the model's planned queries reach the engine; only cited sources come back, annotated at their [n]; planning is billed", () =>
    Effect.gen(function*() {
      const { searx, upstream } = yield* reset
      upstream.setBehaviour({
        kind: "ok",
        text: answering(
          ["kuala lumpur floods november", "klang river level"],
          "Roads closed [2]. The river rose [1]; again [2]. See [9]."
        ),
        usage: { prompt_tokens: 100, completion_tokens: 20 }
      })
      const { accountId, apiKey } = yield* caller("search@example.com", { sen: 1000 })
      const reply = yield* modelCall(apiKey, "/v1/responses", {
        input: "What happened in Kuala Lumpur this week?",
        max_output_tokens: 100,
        web_search: {
          mode: "on",
          search_depth: "balanced",
          max_searches: 3,
          max_results: 3,
          content: { enabled: true, max_pages: 2 }
        }
      })
      expect(reply.status, reply.text).toBe(200)
      expect(reply.body.routing.category).toBe("search")
      // One planning call, then the answer.
      expect(upstream.requests).toHaveLength(2)
      const planning = messagesSent(upstream.requests[0]?.body)
      expect(isPlanning(upstream.requests[0]?.body)).toBe(true)
      expect(planning.at(-1)).toEqual({ role: "user", content: "What happened in Kuala Lumpur this week?" })
      expect(searx.queries).toEqual(["kuala lumpur floods november", "klang river level"])
      // Three results each, the shared one once: five sources; the first two pages read.
      expect([...searx.pages].sort()).toEqual(["/page/kuala-lumpur-floods-november-2", "/page/shared"])
      const sources = messagesSent(upstream.requests[1]?.body)[0]
      expect(sources?.role).toBe("system")
      expect(sources?.content).toContain(`[1] Shared report (${searx.baseUrl}/page/shared)`)
      expect(sources?.content).toContain(
        `[5] Report 3 on klang river level (${searx.baseUrl}/page/klang-river-level-3)`
      )
      expect(sources?.content).not.toContain("[6]")
      expect(sources?.content).toContain("Readable & plain text.")
      expect(sources?.content).not.toMatch(/SCRIPT-TEXT|NAV-MENU|FOOTER-TEXT/)
      // Cited only: [1] and [2]; [9] names no source.
      const text = "Roads closed [2]. The river rose [1]; again [2]. See [9]."
      expect(reply.body.output_text).toBe(text)
      expect(reply.body.citations.map((c: Citation) => [c.index, c.url])).toEqual([
        [1, `${searx.baseUrl}/page/shared`],
        [2, `${searx.baseUrl}/page/kuala-lumpur-floods-november-2`]
      ])
      expect(reply.body.citations[0].published_at).toBe("2026-11-20T00:00:00")
      expect(reply.body.citations[1].published_at).toBeNull()
      const annotations: ReadonlyArray<Annotation> = reply.body.output[0].content[0].annotations
      expect(annotations.map((a) => [a.start_index, a.end_index])).toEqual([[13, 16], [33, 36], [44, 47]])
      expectAnnotationsAtMarkers(text, annotations, reply.body.citations)
      // Both upstream calls' tokens are the call's: reported, logged and billed with 2 searches and 2 pages.
      expect(reply.body.usage.input_tokens).toBe(200)
      expect(reply.body.usage.output_tokens).toBe(40)
      const cost = costOf(DEFAULT_PRICES, reply.body.routing.upstream_model, {
        inputTokens: 200,
        cachedTokens: 0,
        outputTokens: 40,
        searches: 2,
        pages: 2
      })
      expect(reply.body.usage.cost_myr).toBe(toMyrString(cost))
      expect(yield* logOf(reply.body.request_id)).toEqual({
        status: "billed",
        search_count: 2,
        content_pages: 2,
        input_tokens: 200,
        output_tokens: 40,
        cost_micro_myr: String(cost)
      })
      expect((yield* walletOf(accountId)).spent).toBe(cost)
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.effect("search_depth: instant runs one query and reads no page; fast at most 2; balanced honours max_searches, max_results and max_pages", () =>
    Effect.gen(function*() {
      const { apiKey } = yield* caller("search-depth@example.com", { sen: 1000 })
      const cases = [
        { depth: "instant", max_searches: 5, max_results: 4, max_pages: 3, searches: 1, sources: 4, pages: 0 },
        { depth: "fast", max_searches: 5, max_results: 4, max_pages: 3, searches: 2, sources: 7, pages: 3 },
        { depth: "balanced", max_searches: 3, max_results: 2, max_pages: 1, searches: 3, sources: 4, pages: 1 }
      ] as const
      for (const c of cases) {
        const { searx, upstream } = yield* reset
        upstream.setBehaviour({
          kind: "ok",
          text: answering(["q one", "q two", "q three", "q four", "q five"], "Answer [1].")
        })
        const reply = yield* modelCall(apiKey, "/v1/responses", {
          input: "Tell me the news",
          max_output_tokens: 50,
          web_search: {
            mode: "on",
            search_depth: c.depth,
            max_searches: c.max_searches,
            max_results: c.max_results,
            content: { enabled: true, max_pages: c.max_pages }
          }
        })
        expect(reply.status, `${c.depth}: ${reply.text}`).toBe(200)
        expect(searx.queries, c.depth).toEqual(["q one", "q two", "q three", "q four", "q five"].slice(0, c.searches))
        expect(searx.pages.length, c.depth).toBe(c.pages)
        expect(messagesSent(upstream.requests[0]?.body)[0]?.content, c.depth).toContain(
          `write up to ${c.searches} web search`
        )
        const sources = messagesSent(upstream.requests[1]?.body)[0]?.content ?? ""
        expect(sources, c.depth).toContain(`[${c.sources}] `)
        expect(sources, c.depth).not.toContain(`[${c.sources + 1}] `)
        expect(yield* logOf(reply.body.request_id), c.depth).toMatchObject({
          search_count: c.searches,
          content_pages: c.pages
        })
      }
    }))

  it.effect("search_depth deep plans a second round after reading the first results, and reads pages", () =>
    Effect.gen(function*() {
      const { searx, upstream } = yield* reset
      upstream.setBehaviour({
        kind: "ok",
        text: answering(
          (round) => round === 1 ? ["first a", "first b", "first c"] : ["first a", "second a", "second b"],
          "Deep answer [4]."
        )
      })
      const { accountId, apiKey } = yield* caller("search-deep@example.com", { sen: 1000 })
      const reply = yield* modelCall(apiKey, "/v1/responses", {
        input: "Compare flood defences in Kuala Lumpur and Jakarta",
        max_output_tokens: 50,
        web_search: { mode: "on", search_depth: "deep", max_searches: 4, max_results: 2 }
      })
      expect(reply.status, reply.text).toBe(200)
      expect(upstream.requests).toHaveLength(3)
      const second = messagesSent(upstream.requests[1]?.body)
      expect(isPlanning(upstream.requests[1]?.body)).toBe(true)
      const found = second.at(-1)?.content ?? ""
      expect(found).toContain("Searches already run: first a; first b.")
      expect(found).toContain("This page reports on") // the first round's pages were read before planning again
      // Two queries a round; the repeat the planner wrote is dropped; 3 pages (the default), 2 then 1.
      expect(searx.queries).toEqual(["first a", "first b", "second a", "second b"])
      expect(searx.pages).toHaveLength(3)
      expect(yield* logOf(reply.body.request_id)).toMatchObject({ status: "billed", search_count: 4, content_pages: 3 })
      expect(reply.body.citations.map((c: Citation) => c.index)).toEqual([4])
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.effect("pages that 500, hang, weigh 5 MiB or are PDFs do not fail the call: failures are skipped, contentPages counts pages read", () =>
    Effect.gen(function*() {
      const { searx, upstream } = yield* reset
      upstream.setBehaviour({ kind: "ok", text: answering(["river levels"], "Fine [5].") })
      searx.results = () =>
        ["error", "slow", "huge", "doc.pdf", "good"].map((name) => ({
          title: name,
          url: `${searx.baseUrl}/page/${name}`,
          content: name
        }))
      const { accountId, apiKey } = yield* caller("search-pages@example.com", { sen: 1000 })
      const reply = yield* modelCall(apiKey, "/v1/responses", {
        input: "River levels?",
        max_output_tokens: 50,
        web_search: { mode: "on", max_searches: 1, content: { enabled: true, max_pages: 5 } }
      })
      expect(reply.status, reply.text).toBe(200)
      expect([...searx.pages].sort()).toEqual([
        "/page/doc.pdf",
        "/page/error",
        "/page/good",
        "/page/huge",
        "/page/slow"
      ])
      const sources = messagesSent(upstream.requests[1]?.body)[0]?.content ?? ""
      expect(sources).toContain("This page reports on /page/good")
      expect(sources).not.toContain("%PDF")
      // The 5 MiB page was read up to the cap; the model gets a bounded excerpt of it.
      expect(sources.length).toBeLessThan(20_000)
      expect(yield* logOf(reply.body.request_id)).toMatchObject({ status: "billed", search_count: 1, content_pages: 2 })
      expect(reply.body.citations.map((c: Citation) => c.url)).toEqual([`${searx.baseUrl}/page/good`])
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.effect("results pointing inside (loopback not allowed, a name resolving to loopback, a redirect inward, file:) are never fetched", () =>
    Effect.gen(function*() {
      const { searx, upstream } = yield* reset
      const internal = yield* Internal
      const port = new URL(searx.baseUrl).port
      upstream.setBehaviour({ kind: "ok", text: answering(["anything"], "Answer [5].") })
      searx.results = () => [
        { title: "internal", url: `${internal.baseUrl}/admin` },
        { title: "named", url: `http://localhost:${port}/page/named` },
        { title: "redirect", url: `${searx.baseUrl}/redirect?to=${encodeURIComponent(`${internal.baseUrl}/admin`)}` },
        { title: "metadata", url: "http://169.254.169.254/latest/meta-data/" },
        { title: "good", url: `${searx.baseUrl}/page/good` },
        { title: "file", url: "file:///etc/passwd" }
      ]
      const before = internal.hits.length
      const { apiKey } = yield* caller("search-ssrf@example.com", { sen: 1000 })
      const reply = yield* modelCall(apiKey, "/v1/responses", {
        input: "Anything?",
        max_output_tokens: 50,
        web_search: { mode: "on", max_searches: 1, max_results: 6, content: { enabled: true, max_pages: 6 } }
      })
      expect(reply.status, reply.text).toBe(200)
      expect(internal.hits.length).toBe(before)
      expect(searx.pages).not.toContain("/page/named")
      const sources = messagesSent(upstream.requests[1]?.body)[0]?.content ?? ""
      expect(sources).not.toContain("INTERNAL-SECRET")
      expect(yield* logOf(reply.body.request_id)).toMatchObject({ content_pages: 1 })
    }))

  it.effect("a failing search engine answers 502 search_error, retryable; the answer is never asked for; the planning call that ran is billed", () =>
    Effect.gen(function*() {
      const { searx, upstream } = yield* reset
      searx.failWith = 500
      upstream.setBehaviour({
        kind: "ok",
        text: answering(["kuala lumpur"], "never asked"),
        usage: { prompt_tokens: 100, completion_tokens: 20 }
      })
      const { accountId, apiKey } = yield* caller("search-down@example.com", { sen: 1000 })
      const reply = yield* modelCall(apiKey, "/v1/responses", {
        input: "What happened in Kuala Lumpur?",
        max_output_tokens: 100,
        web_search: { mode: "on" }
      })
      searx.failWith = undefined
      expect(reply.status, reply.text).toBe(502)
      expect(reply.body.error.code).toBe("search_error")
      expect(reply.body.error.retryable).toBe(true)
      // Only the planning call reached the upstream; it was paid for there, so it is billed
      // (docs/money.md, "The money rules"), the failed search is not.
      expect(upstream.requests.filter((r) => !isPlanning(r.body))).toHaveLength(0)
      const [log] = yield* query<
        { status: string; error_code: string; cost_micro_myr: string; upstream_model: string; search_count: number }
      >(
        "SELECT status, error_code, cost_micro_myr, upstream_model, search_count FROM request_logs WHERE request_id = $1",
        [reply.body.error.request_id]
      )
      const cost = costOf(DEFAULT_PRICES, log?.upstream_model ?? "", {
        inputTokens: 100,
        cachedTokens: 0,
        outputTokens: 20,
        searches: 0,
        pages: 0
      })
      expect(log).toMatchObject({
        status: "billed",
        error_code: "search_error",
        cost_micro_myr: String(cost),
        search_count: 0
      })
      expect(yield* walletOf(accountId)).toEqual({ available: 10_000_000 - cost, reserved: 0, spent: cost })
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.effect("the estimate holds the planning calls, the most searches and pages allowed, and their context", () =>
    Effect.gen(function*() {
      const { upstream } = yield* reset
      upstream.setBehaviour({ kind: "ok", text: answering(["one"], "Short [1].") })
      const { accountId, apiKey } = yield* caller("search-estimate@example.com", { sen: 1000 })
      const webSearch = {
        mode: "on",
        search_depth: "deep",
        max_searches: 4,
        max_results: 5,
        content: { enabled: true, max_pages: 3 }
      }
      const refused = yield* modelCall(apiKey, "/v1/responses", {
        input: "Hi",
        max_output_tokens: 10,
        max_total_cost_myr: 0.05,
        web_search: webSearch
      })
      expect(refused.status, refused.text).toBe(400)
      expect(refused.body.error.param).toBe("max_total_cost_myr")
      expect(refused.body.error.guidance).toContain("4 searches, 3 pages")
      const reply = yield* modelCall(apiKey, "/v1/responses", {
        input: "Hi",
        max_output_tokens: 10,
        web_search: webSearch
      })
      expect(reply.status, reply.text).toBe(200)
      const [held] = yield* query<{ amount: string }>(
        "SELECT amount_micro_myr AS amount FROM reservations WHERE request_id = $1",
        [reply.body.request_id]
      )
      const model = reply.body.routing.upstream_model
      // At least: two planning calls' output caps and the answer's, 4 searches, 3 pages, and 3 pages' worth of context.
      const floor = costOf(DEFAULT_PRICES, model, {
        inputTokens: 3 * 6_000,
        cachedTokens: 0,
        outputTokens: 10 + 2 * 300,
        searches: 4,
        pages: 3
      })
      expect(Number(held?.amount)).toBeGreaterThanOrEqual(floor)
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.effect("streamed: the Responses stream's final events and the chat stream's last content chunk carry the annotations", () =>
    Effect.gen(function*() {
      const { upstream } = yield* reset
      const text = "The river rose [1] and roads closed [3]."
      upstream.setBehaviour({ kind: "ok", text: answering(["kl floods"], text) })
      const { accountId, apiKey } = yield* caller("search-stream@example.com", { sen: 1000 })
      const webSearch = { mode: "on", max_searches: 1, max_results: 4 }

      const responses = sseJson(
        parseSse(
          (yield* modelCall(apiKey, "/v1/responses", { input: "Floods?", stream: true, web_search: webSearch })).text
        )
      )
      const completed = responses.find((e) => e.type === "response.completed")
      expect(completed?.response.output_text).toBe(text)
      expect(completed?.response.citations.map((c: Citation) => c.index)).toEqual([1, 3])
      const done = responses.find((e) => e.type === "response.content_part.done")
      expect(done?.part.annotations).toHaveLength(2)
      expectAnnotationsAtMarkers(text, done?.part.annotations, completed?.response.citations)
      expect(responses.find((e) => e.type === "response.output_item.done")?.item.content[0].annotations).toEqual(
        done?.part.annotations
      )
      expect(completed?.response.output[0].content[0].annotations).toEqual(done?.part.annotations)

      const chat = sseJson(parseSse(
        (yield* modelCall(apiKey, "/v1/chat/completions", {
          model: "svc/nenas-flash",
          messages: [{ role: "user", content: "Floods?" }],
          stream: true,
          web_search: webSearch
        })).text
      ))
      const content = chat.filter((c) => c !== "[DONE]" && c.choices?.[0]?.delta?.content !== undefined).map((c) =>
        c.choices[0].delta.content
      ).join("")
      expect(content).toBe(text)
      const withAnnotations = chat.filter((c) => c !== "[DONE]" && c.choices?.[0]?.delta?.annotations !== undefined)
      expect(withAnnotations).toHaveLength(1)
      expect(withAnnotations[0].choices[0].finish_reason).toBe("stop")
      const chatAnnotations = withAnnotations[0].choices[0].delta.annotations
      expect(chatAnnotations.map((a: { type: string; url_citation: Annotation }) => a.type)).toEqual([
        "url_citation",
        "url_citation"
      ])
      expectAnnotationsAtMarkers(
        text,
        chatAnnotations.map((a: { url_citation: Annotation }) => ({ ...a.url_citation, type: "url_citation" })),
        completed?.response.citations
      )

      const plain = yield* modelCall(apiKey, "/v1/chat/completions", {
        model: "svc/nenas-flash",
        messages: [{ role: "user", content: "Floods?" }],
        web_search: webSearch
      })
      expect(plain.status, plain.text).toBe(200)
      expect(plain.body.choices[0].message.annotations.map((a: { url_citation: Annotation }) => a.url_citation))
        .toEqual(
          chatAnnotations.map((a: { url_citation: Annotation }) => a.url_citation)
        )
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.effect("test keys: the simulated model plans and the simulated search answers, deterministically and free; the configured ones are untouched", () =>
    Effect.gen(function*() {
      const { searx, upstream } = yield* reset
      const { accountId, apiKey } = yield* caller("search-test@example.com", { environment: "test" })
      const body = {
        input: "What is new in Kuala Lumpur transport?",
        web_search: { mode: "on", max_searches: 2, max_results: 2 }
      }
      const first = yield* modelCall(apiKey, "/v1/responses", body)
      const again = yield* modelCall(apiKey, "/v1/responses", body)
      expect(first.status, first.text).toBe(200)
      expect(searx.queries).toEqual([])
      expect(upstream.requests).toEqual([])
      // The simulated answer cites [1]: that source alone is listed, annotated where the [1] stands.
      expect(first.body.citations).toHaveLength(1)
      expect(first.body.citations[0]).toMatchObject({ index: 1 })
      expect(first.body.citations[0].url).toMatch(/^https:\/\/search\.example\/new-kuala-lumpur-transport/)
      expectAnnotationsAtMarkers(
        first.body.output_text,
        first.body.output[0].content[0].annotations,
        first.body.citations
      )
      expect(first.body.output[0].content[0].annotations).toHaveLength(1)
      expect(again.body.citations.map((c: Citation) => c.url)).toEqual(first.body.citations.map((c: Citation) => c.url))
      expect(again.body.output_text).toBe(first.body.output_text)
      expect(first.body.usage.cost_myr).toBe("0.000000")
      expect(yield* logOf(first.body.request_id)).toMatchObject({
        status: "succeeded",
        search_count: 2,
        cost_micro_myr: "0"
      })
      expect(yield* walletOf(accountId)).toEqual({ available: 0, reserved: 0, spent: 0 })
    }))
})
