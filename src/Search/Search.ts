import { HttpClient, HttpClientRequest } from "@effect/platform"
import { NodeHttpClient } from "@effect/platform-node"
import { Context, Effect, Layer, Option, Schema } from "effect"
import { AppConfig } from "../AppConfig.js"
import { SearchError } from "../Domain/Errors.js"

export interface SearchResult {
  readonly title: string
  readonly url: string
  readonly snippet: string
  readonly publishedAt: string | null
}

export interface SearchShape {
  readonly search: (query: string, maxResults: number) => Effect.Effect<ReadonlyArray<SearchResult>, SearchError>
  /** A page's readable text. */
  readonly fetchPage: (url: string) => Effect.Effect<string, SearchError>
}

/** Web search: a SearXNG-compatible API when `SEARCH_BASE_URL` is set, else the simulated search. */
export class Search extends Context.Tag("nenas/Search")<Search, SearchShape>() {}

const slug = (text: string): string =>
  text.toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "").slice(0, 60) || "query"

/** Deterministic results derived from the query; no network. */
export const simulatedSearch: SearchShape = {
  search: (query, maxResults) =>
    Effect.succeed(Array.from({ length: maxResults }, (_, i) => ({
      title: `${query.slice(0, 80)} (source ${i + 1})`,
      url: `https://search.example/${slug(query)}/${i + 1}`,
      snippet: `Simulated result ${i + 1} about "${query.slice(0, 120)}".`,
      publishedAt: new Date(Date.UTC(2026, 0, 1 + i)).toISOString()
    }))),
  fetchPage: (url) => Effect.succeed(`Simulated page text of ${url}. It restates the result in more words.`)
}

const SearxResults = Schema.Struct({
  results: Schema.Array(Schema.Struct({
    title: Schema.optionalWith(Schema.String, { default: () => "" }),
    url: Schema.String,
    content: Schema.optionalWith(Schema.NullOr(Schema.String), { default: () => null }),
    publishedDate: Schema.optionalWith(Schema.NullOr(Schema.String), { default: () => null })
  }))
})

const PAGE_TIMEOUT = "10 seconds"
const MAX_PAGE_CHARS = 20_000

/** Visible text of an HTML page, roughly: scripts, styles and tags removed, whitespace collapsed. */
const pageText = (html: string): string =>
  html
    .replace(/<(script|style|noscript)[\s\S]*?<\/\1>/gi, " ")
    .replace(/<[^>]+>/g, " ")
    .replace(/&nbsp;/g, " ")
    .replace(/&amp;/g, "&")
    .replace(/&lt;/g, "<")
    .replace(/&gt;/g, ">")
    .replace(/\s+/g, " ")
    .trim()
    .slice(0, MAX_PAGE_CHARS)

export const makeSearxng = (baseUrl: string) =>
  Effect.map(HttpClient.HttpClient, (client): SearchShape => {
    const failed = (what: string) => (error: { readonly message: string }) =>
      new SearchError({ message: `Web search failed (${what}): ${error.message}` })
    return {
      search: (query, maxResults) =>
        client.get(`${baseUrl.replace(/\/+$/, "")}/search`, { urlParams: { q: query, format: "json" } }).pipe(
          Effect.filterOrFail((response) => response.status === 200, (response) =>
            new SearchError({ message: `Web search failed: the search API answered HTTP ${response.status}.` })),
          Effect.flatMap((response) => response.json),
          Effect.flatMap(Schema.decodeUnknown(SearxResults)),
          Effect.map(({ results }) =>
            results.slice(0, maxResults).map((result) => ({
              title: result.title,
              url: result.url,
              snippet: result.content ?? "",
              publishedAt: result.publishedDate
            }))
          ),
          Effect.timeout(PAGE_TIMEOUT),
          Effect.catchAll((error) => Effect.fail(error instanceof SearchError ? error : failed("search")(error)))
        ),
      fetchPage: (url) =>
        client.execute(HttpClientRequest.get(url)).pipe(
          Effect.flatMap((response) => response.text),
          Effect.map(pageText),
          Effect.timeout(PAGE_TIMEOUT),
          Effect.catchAll((error) => Effect.fail(failed(`reading ${url}`)(error)))
        )
    }
  })

export const SearchLive = Layer.unwrapEffect(Effect.gen(function*() {
  const config = yield* AppConfig
  if (Option.isSome(config.searchBaseUrl)) {
    return Layer.effect(Search, makeSearxng(config.searchBaseUrl.value)).pipe(Layer.provide(NodeHttpClient.layerUndici))
  }
  if (config.production) {
    return yield* Effect.dieMessage("NODE_ENV=production needs SEARCH_BASE_URL: the simulated search does not run in production.")
  }
  return Layer.succeed(Search, simulatedSearch)
}))
