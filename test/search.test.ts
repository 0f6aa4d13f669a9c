import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { expect, layer } from "@effect/vitest"
import { Context, Effect, Layer, Option } from "effect"
import { caller, modelCall, TestServerWithUpstream, violations } from "./support/Models.js"
import { query } from "./support/TestServer.js"
import { Upstream } from "./support/Upstream.js"

interface SearchDouble {
  baseUrl: string
  readonly queries: Array<string>
  readonly pages: Array<string>
  failWith: number | undefined
}

/** A SearXNG-compatible search API (`GET /search?q=…&format=json`) that also serves the pages it finds. */
class Searx extends Context.Tag("test/Searx")<Searx, SearchDouble>() {
  static readonly layer = Layer.scoped(
    Searx,
    Effect.acquireRelease(
      Effect.promise(() =>
        new Promise<{ double: SearchDouble; close: () => void }>((resolve) => {
          const double: SearchDouble = { baseUrl: "", queries: [], pages: [], failWith: undefined }
          const server = createServer((request, response) => {
            const url = new URL(request.url ?? "/", "http://localhost")
            if (url.pathname === "/search") {
              double.queries.push(url.searchParams.get("q") ?? "")
              if (double.failWith !== undefined) {
                response.writeHead(double.failWith).end("down")
                return
              }
              expect(url.searchParams.get("format")).toBe("json")
              response.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({
                results: [1, 2, 3, 4].map((n) => ({
                  title: `Kuala Lumpur report ${n}`,
                  url: `${double.baseUrl}/page/${n}`,
                  content: `Snippet ${n} about the city.`,
                  publishedDate: n === 1 ? "2026-11-20T00:00:00" : null
                }))
              }))
              return
            }
            double.pages.push(url.pathname)
            response.writeHead(200, { "content-type": "text/html" }).end(
              `<html><head><script>var hidden = 1</script><style>p{}</style></head><body><h1>Page ${url.pathname}</h1><p>Readable &amp; plain text.</p></body></html>`
            )
          })
          server.listen(0, "127.0.0.1", () => {
            double.baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
            resolve({ double, close: () => server.close() })
          })
        })
      ),
      ({ close }) => Effect.sync(close)
    ).pipe(Effect.map(({ double }) => double))
  )
}

const TestServerWithSearch = Layer.unwrapEffect(Effect.map(Searx, (searx) =>
  TestServerWithUpstream({ searchBaseUrl: Option.some(searx.baseUrl) }))).pipe(Layer.provideMerge(Searx.layer))

interface Sent {
  readonly messages: ReadonlyArray<{ readonly role: string; readonly content: string }>
}

layer(TestServerWithSearch, { excludeTestServices: true })("web search through a SearXNG API", (it) => {
  it.effect("results and read pages go to the model as numbered sources and come back as citations, billed per search and page", () =>
    Effect.gen(function*() {
      const searx = yield* Searx
      const upstream = yield* Upstream
      upstream.reset()
      const { accountId, apiKey } = yield* caller("search@example.com", { sen: 1000 })
      const reply = yield* modelCall(apiKey, "/v1/responses", {
        input: "What happened in Kuala Lumpur?",
        max_output_tokens: 100,
        web_search: { mode: "on", max_results: 3, content: { enabled: true, max_pages: 2 } }
      })
      expect(reply.status, reply.text).toBe(200)
      expect(searx.queries).toEqual(["What happened in Kuala Lumpur?"])
      expect(searx.pages).toEqual(["/page/1", "/page/2"])
      expect(reply.body.routing.category).toBe("search")
      expect(reply.body.citations.map((c: { index: number; url: string }) => [c.index, c.url])).toEqual([
        [1, `${searx.baseUrl}/page/1`],
        [2, `${searx.baseUrl}/page/2`],
        [3, `${searx.baseUrl}/page/3`]
      ])
      expect(reply.body.citations[0].published_at).toBe("2026-11-20T00:00:00")
      expect(reply.body.citations[1].published_at).toBeNull()
      const sent = upstream.requests[0]?.body as Sent
      const sources = sent.messages[0]
      expect(sources?.role).toBe("system")
      expect(sources?.content).toContain(`[1] Kuala Lumpur report 1 (${searx.baseUrl}/page/1)`)
      expect(sources?.content).toContain("Readable & plain text.")
      expect(sources?.content).not.toContain("hidden")
      expect(sources?.content).not.toContain("[4]")
      const [log] = yield* query<{ search_count: number; content_pages: number; status: string }>(
        "SELECT search_count, content_pages, status FROM request_logs WHERE request_id = $1",
        [reply.body.request_id]
      )
      expect(log).toEqual({ search_count: 1, content_pages: 2, status: "billed" })
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.effect("a failing search API answers 502 search_error, retryable; the upstream is not called and nothing is billed", () =>
    Effect.gen(function*() {
      const searx = yield* Searx
      const upstream = yield* Upstream
      upstream.reset()
      searx.failWith = 500
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
      expect(upstream.requests).toHaveLength(0)
      const [wallet] = yield* query<{ available: string; reserved: string }>(
        "SELECT available_micro_myr AS available, reserved_micro_myr AS reserved FROM wallets WHERE account_id = $1",
        [accountId]
      )
      expect(wallet).toEqual({ available: "10000000", reserved: "0" })
      const [log] = yield* query<{ status: string; error_code: string; cost_micro_myr: string }>(
        "SELECT status, error_code, cost_micro_myr FROM request_logs WHERE request_id = $1",
        [reply.body.error.request_id]
      )
      expect(log).toEqual({ status: "failed", error_code: "search_error", cost_micro_myr: "0" })
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.effect("test keys use the simulated search, never the configured one", () =>
    Effect.gen(function*() {
      const searx = yield* Searx
      const before = searx.queries.length
      const { apiKey } = yield* caller("search-test@example.com", { environment: "test" })
      const reply = yield* modelCall(apiKey, "/v1/responses", { input: "What is new?", web_search: { mode: "on", max_results: 2 } })
      expect(reply.status, reply.text).toBe(200)
      expect(reply.body.citations).toHaveLength(2)
      expect(reply.body.citations[0].url).toMatch(/^https:\/\/search\.example\//)
      expect(searx.queries.length).toBe(before)
    }))
})
