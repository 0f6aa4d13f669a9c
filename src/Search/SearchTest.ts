import { Effect, Layer } from "effect"
import { SearchError } from "../Domain/Errors.js"
import { PageFailed } from "./Fetch.js"
import type { SearchResult, SearchShape } from "./Search.js"
import { Search } from "./Search.js"

/**
 * Web search for tests: canned results per query (or one list for all), and
 * canned page texts by URL. A page not in `pages` fails as an unreachable
 * page does (the caller skips it); a query in `failing` fails as the search
 * API would. Every query and page read is recorded.
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

export const result = (url: string, title: string, snippet = `About ${title}.`): SearchResult => ({
  title,
  url,
  snippet,
  publishedAt: null
})

export const make = (canned: Canned): CannedSearch => {
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
        return text === undefined ? Effect.fail(new PageFailed({ url, reason: "the test has no page at this URL" })) : Effect.succeed(text)
      })
  }
}

export const layer = (search: CannedSearch): Layer.Layer<Search> => Layer.succeed(Search, search)
