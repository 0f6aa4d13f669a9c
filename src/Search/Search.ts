import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import * as HttpClient from "@effect/platform/HttpClient"
import { Context, Duration, Effect, Layer, Option, Schema } from "effect"
import { Worker } from "node:worker_threads"
import { AppConfig } from "../AppConfig.js"
import { SearchError } from "../Domain/Errors.js"
import type { FetchedPage, PageError } from "./Fetch.js"
import { HostResolver, PageFailed, PageFetcher } from "./Fetch.js"

export interface SearchResult {
  readonly title: string
  readonly url: string
  readonly snippet: string
  readonly publishedAt: string | null
}

export interface SearchShape {
  readonly search: (query: string, maxResults: number) => Effect.Effect<ReadonlyArray<SearchResult>, SearchError>
  /** A page's main text; a page that is refused or fails is the caller's to skip. */
  readonly readPage: (url: string) => Effect.Effect<string, PageError>
}

/**
 * Web search for tests (`Search.canned`): canned results per query (or one list
 * for all), and canned page texts by URL. A page not in `pages` fails as an
 * unreachable page does (the caller skips it); a query in `failing` fails as
 * the search API would. Every query and page read is recorded.
 */
export interface CannedSearch extends SearchShape {
  readonly queries: ReadonlyArray<{ readonly query: string; readonly maxResults: number }>
  readonly pagesRead: ReadonlyArray<string>
}

export interface Canned {
  readonly results: ReadonlyArray<SearchResult> | ((query: string) => ReadonlyArray<SearchResult>)
  readonly pages?: Readonly<Record<string, string>>
  readonly failing?: ReadonlyArray<string>
}

/** Web search: a SearXNG-compatible API when `SEARCH_BASE_URL` is set, else the simulated search. */
export class Search extends Context.Tag("nenas/Search")<Search, SearchShape>() {
  static readonly canned = (canned: Canned): CannedSearch => {
    const queries: Array<{ query: string; maxResults: number }> = []
    const pagesRead: Array<string> = []
    return {
      queries,
      pagesRead,
      search: (query, maxResults) =>
        Effect.suspend(() => {
          queries.push({ query, maxResults })
          if (canned.failing?.includes(query) === true) {
            return Effect.fail(new SearchError({ message: "Web search failed: the search API answered HTTP 503." }))
          }
          const all = typeof canned.results === "function" ? canned.results(query) : canned.results
          return Effect.succeed(all.slice(0, maxResults))
        }),
      readPage: (url) =>
        Effect.suspend(() => {
          pagesRead.push(url)
          const text = canned.pages?.[url]
          return text === undefined
            ? Effect.fail(new PageFailed({ url, reason: "the test has no page at this URL" }))
            : Effect.succeed(text)
        })
    }
  }

  /** A canned result: `url` titled `title`. */
  static readonly cannedResult = (url: string, title: string, snippet = `About ${title}.`): SearchResult => ({
    title,
    url,
    snippet,
    publishedAt: null
  })

  /** The test Layer: `search` (from `Search.canned`) as the `Search`. */
  static readonly Test = (search: CannedSearch): Layer.Layer<Search> => Layer.succeed(Search, search)
}

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
  readPage: (url) => Effect.succeed(`Simulated page text of ${url}. It restates the result in more words.`)
}

const SearxResults = Schema.Struct({
  results: Schema.Array(Schema.Struct({
    title: Schema.optionalWith(Schema.String, { default: () => "" }),
    url: Schema.String,
    content: Schema.optionalWith(Schema.NullOr(Schema.String), { default: () => null }),
    publishedDate: Schema.optionalWith(Schema.NullOr(Schema.String), { default: () => null })
  }))
})

const SEARCH_TIMEOUT = "10 seconds"

/**
 * The worker's entry. Compiled, the JavaScript file; from TypeScript (development
 * and tests), a bootstrap that registers tsx in the worker first, since a
 * worker does not inherit the loader its parent was started with.
 */
const fromTypeScript = import.meta.url.endsWith(".ts")
const WORKER: URL | string = fromTypeScript
  ? `import("tsx/esm/api")` +
    `.then((tsx) => { tsx.register(); return import(${
      JSON.stringify(new URL("./ExtractWorker.ts", import.meta.url).href)
    }) })`
  : new URL("./ExtractWorker.js", import.meta.url)
/** Reading a page is CPU work that grows with it: bounded in time, off the event loop that serves every call. */
const EXTRACT_TIMEOUT = Duration.seconds(10)

/**
 * A fetched page's main text (`mainText`: Readability on linkedom; text as it
 * is), worked out in a worker thread that is ended when it is done or late,
 * so that a large or hostile page never stalls other requests.
 */
const readable = (page: FetchedPage): Effect.Effect<string, PageFailed> =>
  Effect.async<string, PageFailed>((resume) => {
    let settled = false
    const settle = (result: Effect.Effect<string, PageFailed>) => {
      if (settled) return
      settled = true
      resume(result)
    }
    const failed = (reason: string) => settle(Effect.fail(new PageFailed({ url: page.url, reason })))
    const worker = new Worker(WORKER, {
      workerData: { kind: page.kind, body: page.body },
      eval: fromTypeScript,
      resourceLimits: { maxOldGenerationSizeMb: 512 }
    })
    worker.once("message", (text: unknown) => {
      settle(
        typeof text === "string"
          ? Effect.succeed(text)
          : Effect.fail(new PageFailed({ url: page.url, reason: "no text" }))
      )
      void worker.terminate()
    })
    worker.once("error", (error) => failed(`its text could not be read: ${error.message}`))
    worker.once("exit", (code) => code === 0 ? undefined : failed(`its reader stopped (${code})`))
    return Effect.promise(() => worker.terminate())
  }).pipe(
    Effect.timeoutFail({
      duration: EXTRACT_TIMEOUT,
      onTimeout: () =>
        new PageFailed({
          url: page.url,
          reason: `its text took longer than ${Duration.format(EXTRACT_TIMEOUT)} to read`
        })
    })
  )

export const makeSearxng = (baseUrl: string) =>
  Effect.gen(function*() {
    const client = yield* HttpClient.HttpClient
    const pages = yield* PageFetcher
    // The search API's errors name SEARCH_BASE_URL: logged in full, answered in generic words.
    const failed = (error: { readonly message: string }) =>
      Effect.zipRight(
        Effect.logWarning(`web search failed: ${error.message}`),
        Effect.fail(new SearchError({ message: "Web search failed: the search API could not be used." }))
      )
    const shape: SearchShape = {
      search: (query, maxResults) =>
        client.get(`${baseUrl.replace(/\/+$/, "")}/search`, { urlParams: { q: query, format: "json" } }).pipe(
          Effect.filterOrFail((response) => response.status === 200, (response) =>
            new SearchError({ message: `Web search failed: the search API answered HTTP ${response.status}.` })),
          Effect.flatMap((response) =>
            response.json
          ),
          Effect.flatMap(Schema.decodeUnknown(SearxResults)),
          Effect.map(({ results }) =>
            results.slice(0, maxResults).map((result) => ({
              title: result.title,
              url: result.url,
              snippet: result.content ?? "",
              publishedAt: result.publishedDate
            }))
          ),
          Effect.timeout(SEARCH_TIMEOUT),
          Effect.catchAll((error) => error instanceof SearchError ? Effect.fail(error) : failed(error))
        ),
      readPage: (url) => Effect.flatMap(pages.fetch(url), readable)
    }
    return shape
  })

export const SearchLive = Layer.unwrapEffect(Effect.gen(function*() {
  const config = yield* AppConfig
  if (Option.isSome(config.searchBaseUrl)) {
    return Layer.effect(Search, makeSearxng(config.searchBaseUrl.value)).pipe(
      Layer.provide(NodeHttpClient.layerUndici),
      Layer.provide(PageFetcher.layer),
      Layer.provide(HostResolver.system)
    )
  }
  if (config.production) {
    return yield* Effect.dieMessage(
      "NODE_ENV=production needs SEARCH_BASE_URL: the simulated search does not run in production."
    )
  }
  return Layer.succeed(Search, simulatedSearch)
}))
