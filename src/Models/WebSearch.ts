import { Clock, Context, Effect, Layer } from "effect"
import type { SearchError } from "../Domain/Errors.js"
import type { SearchResult } from "../Search/Search.js"
import { Search, simulatedSearch } from "../Search/Search.js"
import type { Citation as CitationSchema, WebSearchConfig } from "./Api.js"
import type { Message } from "./Tokens.js"

export interface SearchPlan {
  readonly queries: number
  readonly maxResults: number
  readonly pages: number
  /** The most tokens the sources may add to the prompt; the cost estimate counts them. */
  readonly maxContextTokens: number
}

/** A source the answer may cite as `[index]`: the contract's Citation. */
export type Citation = typeof CitationSchema.Type

export interface Sources {
  readonly searches: number
  readonly pages: number
  readonly citations: ReadonlyArray<Citation>
  /** The system message that carries the sources to the model. */
  readonly message?: Message
}

/** Characters kept per result snippet and per page; a token is at least one character, so these bound tokens too. */
const SNIPPET_CHARS = 400
const PAGE_CHARS = 6_000
const FRAMING_TOKENS = 200

/** `search_depth`: how many of the allowed queries run. */
const QUERIES_BY_DEPTH = { instant: 1, fast: 1, balanced: 2, deep: 5, reasoning: 5 } as const

export const planSearch = (config: typeof WebSearchConfig.Type): SearchPlan => {
  const queries = Math.min(config.max_searches, QUERIES_BY_DEPTH[config.search_depth])
  const pages = config.content?.enabled === true ? config.content.max_pages : 0
  return {
    queries,
    maxResults: config.max_results,
    pages,
    maxContextTokens: FRAMING_TOKENS + queries * config.max_results * (SNIPPET_CHARS + 40) + pages * PAGE_CHARS
  }
}

const ANGLES = ["", "latest", "background", "analysis", "sources"]

/** The queries: the user's latest question, then the same from other angles. */
const queriesFor = (messages: ReadonlyArray<Message>, count: number): ReadonlyArray<string> => {
  const question = ([...messages].reverse().find((m) => m.role === "user")?.content ?? "").replace(/\s+/g, " ").trim().slice(0, 200)
  return Array.from({ length: count }, (_, i) => `${question} ${ANGLES[i] ?? ""}`.trim())
}

const sourcesMessage = (results: ReadonlyArray<SearchResult>, pages: ReadonlyMap<string, string>): Message => ({
  role: "system",
  content: [
    "Web search results follow. Use them where they help, and cite each one you use as [n].",
    ...results.map((result, i) => {
      const page = pages.get(result.url)
      return `[${i + 1}] ${result.title.slice(0, 200)} (${result.url.slice(0, 300)})\n${result.snippet.slice(0, SNIPPET_CHARS)}${
        page === undefined ? "" : `\n${page.slice(0, PAGE_CHARS)}`
      }`
    })
  ].join("\n\n")
})

/**
 * Web search for a call (DESIGN.md, Model API details): up to `max_searches`
 * queries of up to `max_results` results each, and, when `content.enabled`,
 * up to `max_pages` pages read; the sources go to the model as numbered
 * entries and come back as `citations`.
 */
export class WebSearch extends Context.Tag("nenas/WebSearch")<WebSearch, {
  readonly run: (plan: SearchPlan, messages: ReadonlyArray<Message>, simulated: boolean) => Effect.Effect<Sources, SearchError>
}>() {
  static readonly layer = Layer.effect(
    WebSearch,
    Effect.map(Search, (search) => ({
      run: (plan, messages, simulated) =>
        Effect.gen(function*() {
          const engine = simulated ? simulatedSearch : search
          const queries = queriesFor(messages, plan.queries)
          const found = yield* Effect.forEach(queries, (query) => engine.search(query, plan.maxResults), { concurrency: 3 })
          const seen = new Set<string>()
          const results = found.flat().filter((result) => !seen.has(result.url) && seen.add(result.url) !== undefined)
          const read = yield* Effect.forEach(
            results.slice(0, plan.pages),
            (result) => Effect.map(engine.fetchPage(result.url), (text) => [result.url, text] as const),
            { concurrency: 3 }
          )
          const accessedAt = new Date(yield* Clock.currentTimeMillis).toISOString()
          const sources: Sources = {
            searches: queries.length,
            pages: read.length,
            citations: results.map((result, i) => ({
              index: i + 1,
              title: result.title,
              url: result.url,
              published_at: result.publishedAt,
              accessed_at: accessedAt
            })),
            ...(results.length > 0 ? { message: sourcesMessage(results, new Map(read)) } : {})
          }
          return sources
        })
    }))
  )
}
