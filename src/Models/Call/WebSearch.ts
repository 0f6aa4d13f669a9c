import { Context, Effect, Layer, Option } from "effect"
import type { SearchError } from "../../Domain/Errors.js"
import { now } from "../../Domain/Time.js"
import type { Message } from "../../Domain/Tokens.js"
import { countMessages, countText } from "../../Domain/Tokens.js"
import { servedBy } from "../../Providers/Fallback.js"
import type { ProviderError, ProviderShape, ProviderUsage, UpstreamAttempt } from "../../Providers/Provider.js"
import type { ReadResult } from "../../Search/Planning.js"
import { DIGEST_PAGE_BOUND_CHARS, DIGEST_RESULT_CHARS, parseQueries, planningMessages } from "../../Search/Planning.js"
import type { SearchResult, SearchShape } from "../../Search/Search.js"
import { Search, simulatedSearch } from "../../Search/Search.js"
import type { Citation as CitationSchema, WebSearchConfig } from "../OpenAi/Api.js"

/** One planning call and what follows it: its queries, and the pages it may read. */
export interface SearchRound {
  readonly queries: number
  readonly pages: number
}

export interface SearchPlan {
  /** One round for every depth but `deep` and `reasoning`, which plan a second after reading the first. */
  readonly rounds: ReadonlyArray<SearchRound>
  readonly maxResults: number
  /** The most searches and pages the request allows, over all rounds: the estimate prices them. */
  readonly queries: number
  readonly pages: number
  /** The most tokens the sources may add to the prompt; the cost estimate counts them. */
  readonly maxContextTokens: number
  /** The most the planning calls may use, over all rounds: the estimate counts them too. */
  readonly planningInputTokens: number
  readonly planningOutputTokens: number
  /** Each planning call's output cap. */
  readonly planningOutputCap: number
}

/** A source the answer may cite as `[index]`: the contract's Citation. */
export type Citation = typeof CitationSchema.Type

/** Tokens the planning calls used, billed with the call. */
export interface PlanningUsage {
  readonly inputTokens: number
  readonly outputTokens: number
  readonly reasoningTokens: number
  readonly cachedTokens: number
}

/**
 * One planning call's tokens and the model that answered it (a fallback's, maybe): billed at that model's
 * prices; answered on a team's own provider key, at the fee of the call's own model's.
 */
export interface PlanningCall {
  readonly model: string
  readonly usage: PlanningUsage
  readonly providerKeyId?: string | undefined
}

export interface Sources {
  readonly searches: number
  readonly pages: number
  /** Every source the model was given, numbered as it saw them. */
  readonly found: ReadonlyArray<Citation>
  /** All planning calls' tokens, and each call's by the model that answered it. */
  readonly planning: PlanningUsage
  readonly planningCalls: ReadonlyArray<PlanningCall>
  /** The system message that carries the sources to the model. */
  readonly message?: Message
}

const NO_USAGE: PlanningUsage = { inputTokens: 0, outputTokens: 0, reasoningTokens: 0, cachedTokens: 0 }
export const noSources: Sources = { searches: 0, pages: 0, found: [], planning: NO_USAGE, planningCalls: [] }

/** What a search has cost so far: searches sent, pages read, planning calls' tokens (a call sent, not yet answered: its prompt). */
export type SearchSpent = Pick<Sources, "searches" | "pages" | "planning" | "planningCalls">

/** Whether a search has spent anything upstream: from the first planning call sent on, it has. */
export const searchSpent = (spent: SearchSpent): boolean =>
  spent.searches > 0 || spent.pages > 0 || spent.planning.inputTokens > 0 || spent.planning.outputTokens > 0

/** Characters kept per result and per page in the sources message; a token is at least one character, so these bound tokens too. */
const TITLE_CHARS = 200
const URL_CHARS = 300
const SNIPPET_CHARS = 400
const PAGE_CHARS = 6_000
const RESULT_CHARS = TITLE_CHARS + URL_CHARS + SNIPPET_CHARS + 16
const FRAMING_TOKENS = 200
/** A planner writes a few short lines; a reasoning model also thinks before it writes them. */
const PLAN_OUTPUT_TOKENS = 300
const PLAN_OUTPUT_TOKENS_REASONING = 2_000
/** Same length as any `YYYY-MM-DD`, for counting the planning prompt before the call. */
const SOME_DAY = "2026-01-01"

/** `search_depth` (docs/api/models.md, "Web search"): how many queries, whether pages are read, and whether a second round follows. */
const roundsFor = (config: typeof WebSearchConfig.Type): ReadonlyArray<SearchRound> => {
  const pages = config.content?.enabled === true ? config.content.max_pages : 0
  switch (config.search_depth) {
    case "instant":
      return [{ queries: 1, pages: 0 }]
    case "fast":
      return [{ queries: Math.min(2, config.max_searches), pages }]
    case "balanced":
      return [{ queries: config.max_searches, pages }]
    case "deep":
    case "reasoning": {
      // Pages are part of these depths: read unless `content` says otherwise.
      const deepPages = config.content === undefined ? 3 : pages
      if (config.max_searches < 2) return [{ queries: 1, pages: deepPages }]
      const first = { queries: Math.ceil(config.max_searches / 2), pages: Math.ceil(deepPages / 2) }
      return [first, { queries: config.max_searches - first.queries, pages: deepPages - first.pages }]
    }
  }
}

/** What a request's web search may do at most, for the estimate and the run. */
export const planSearch = (
  config: typeof WebSearchConfig.Type,
  messages: ReadonlyArray<Message>,
  reasoningModel: boolean
): SearchPlan => {
  const rounds = roundsFor(config)
  const queries = rounds.reduce((sum, round) => sum + round.queries, 0)
  const pages = rounds.reduce((sum, round) => sum + round.pages, 0)
  const planningOutputCap = reasoningModel ? PLAN_OUTPUT_TOKENS_REASONING : PLAN_OUTPUT_TOKENS
  let planningInputTokens = 0
  let before: SearchRound | undefined
  for (const round of rounds) {
    planningInputTokens += countMessages(planningMessages(messages, round.queries, SOME_DAY))
    if (before !== undefined) {
      // The second round also reads what the first found: bounded by its characters.
      planningInputTokens += 200 + before.queries * (200 + config.max_results * DIGEST_RESULT_CHARS) +
        before.pages * DIGEST_PAGE_BOUND_CHARS
    }
    before = round
  }
  return {
    rounds,
    maxResults: config.max_results,
    queries,
    pages,
    maxContextTokens: FRAMING_TOKENS + queries * config.max_results * RESULT_CHARS + pages * PAGE_CHARS,
    planningInputTokens,
    planningOutputTokens: rounds.length * planningOutputCap,
    planningOutputCap
  }
}

/** What a call's web search adds to its estimate: nothing without a plan. */
export const searchEstimate = (plan: Option.Option<SearchPlan>) =>
  Option.match(plan, {
    onNone: () => ({ contextTokens: 0, planningInputTokens: 0, planningOutputTokens: 0, searches: 0, pages: 0 }),
    onSome: (p) => ({
      contextTokens: p.maxContextTokens,
      planningInputTokens: p.planningInputTokens,
      planningOutputTokens: p.planningOutputTokens,
      searches: p.queries,
      pages: p.pages
    })
  })

/** A call's usage with its planning calls' tokens added: they are billed, logged and reported with it. */
export const withPlanning = <U extends PlanningUsage>(usage: U, sources: Sources): U => ({
  ...usage,
  inputTokens: usage.inputTokens + sources.planning.inputTokens,
  outputTokens: usage.outputTokens + sources.planning.outputTokens,
  reasoningTokens: usage.reasoningTokens + sources.planning.reasoningTokens,
  cachedTokens: usage.cachedTokens + sources.planning.cachedTokens
})

const clip = (text: string, chars: number) => text.replace(/\s+/g, " ").trim().slice(0, chars)

const sourcesMessage = (results: ReadonlyArray<ReadResult>): Message => ({
  role: "system",
  content: [
    "Web search results follow, numbered. Use them where they help. Cite a source right after the statement it supports " +
    "as its number in square brackets, for example [2]; cite only these numbers.",
    ...results.map((result, i) =>
      `[${i + 1}] ${clip(result.title, TITLE_CHARS)} (${result.url.slice(0, URL_CHARS)})\n${
        clip(result.snippet, SNIPPET_CHARS)
      }${result.page === undefined ? "" : `\n${result.page.slice(0, PAGE_CHARS)}`}`
    )
  ].join("\n\n")
})

/** The same page however a result spells it: no fragment. */
const urlKey = (url: string): string => {
  try {
    const parsed = new URL(url)
    parsed.hash = ""
    return parsed.href
  } catch {
    return url
  }
}

/** A citation marker in the answer, `[n]`, where it stands (UTF-16 offsets, as JavaScript strings index). */
export interface Annotation {
  readonly startIndex: number
  readonly endIndex: number
  readonly url: string
  readonly title: string
}

/**
 * The sources the answer cites: each `[n]` naming one of the sources becomes
 * an annotation over the marker, and `citations` lists each cited source
 * once, by `index`. Numbers no source has are left as text.
 */
export const citedSources = (
  text: string,
  found: ReadonlyArray<Citation>
): { readonly citations: ReadonlyArray<Citation>; readonly annotations: ReadonlyArray<Annotation> } => {
  if (found.length === 0) return { citations: [], annotations: [] }
  const byIndex = new Map(found.map((citation) => [citation.index, citation]))
  const cited = new Map<number, Citation>()
  const annotations: Array<Annotation> = []
  for (const match of text.matchAll(/\[(\d{1,4})\]/g)) {
    const citation = byIndex.get(Number(match[1]))
    if (citation === undefined) continue
    cited.set(citation.index, citation)
    annotations.push({
      startIndex: match.index,
      endIndex: match.index + match[0].length,
      url: citation.url,
      title: citation.title
    })
  }
  return { citations: [...cited.values()].sort((a, b) => a.index - b.index), annotations }
}

export interface SearchCall {
  /** Test keys: the simulated search engine. */
  readonly simulated: boolean
  /** Who writes the queries: the call's own provider and model. */
  readonly provider: ProviderShape
  readonly model: string
  readonly reasoningModel: boolean
  /** Told after each step (planning call sent or answered, search sent, page read): a call cut mid-search is billed for it. */
  readonly spent: (sofar: SearchSpent) => Effect.Effect<void>
}

const addUsage = (a: PlanningUsage, b: PlanningUsage): PlanningUsage => ({
  inputTokens: a.inputTokens + b.inputTokens,
  outputTokens: a.outputTokens + b.outputTokens,
  reasoningTokens: a.reasoningTokens + b.reasoningTokens,
  cachedTokens: a.cachedTokens + b.cachedTokens
})

const planningUsageOf = (
  messages: ReadonlyArray<Message>,
  text: string,
  usage: Option.Option<ProviderUsage>
): PlanningUsage =>
  Option.match(usage, {
    // An upstream that reports no usage is counted with the tokenizer, as the answer would be.
    onNone: () => ({
      inputTokens: countMessages(messages),
      outputTokens: countText(text),
      reasoningTokens: 0,
      cachedTokens: 0
    }),
    onSome: (reported) => ({
      inputTokens: reported.inputTokens,
      outputTokens: reported.outputTokens,
      reasoningTokens: Math.min(reported.reasoningTokens, reported.outputTokens),
      cachedTokens: Math.min(reported.cachedTokens, reported.inputTokens)
    })
  })

/** A planning call's tokens, at the model that answered it (`served`; none yet: the call's own model). */
const planningCallOf = (model: string, served: UpstreamAttempt | undefined, usage: PlanningUsage): PlanningCall =>
  served?.providerKeyId === undefined
    ? { model: served?.model ?? model, usage }
    : { model, usage, providerKeyId: served.providerKeyId }

/** The user's last message, as a query of last resort when the planner writes none. */
const lastQuestion = (messages: ReadonlyArray<Message>): string =>
  clip([...messages].reverse().find((message) => message.role === "user")?.content ?? "", 200)

const runSearch = Effect.fnUntraced(
  function*(engine: SearchShape, plan: SearchPlan, messages: ReadonlyArray<Message>, call: SearchCall) {
    const today = (yield* now).toISOString().slice(0, 10)
    const queriesRun: Array<string> = []
    const results: Array<ReadResult & { readonly publishedAt: string | null }> = []
    const seen = new Set<string>()
    let planning = NO_USAGE
    const planningCalls: Array<PlanningCall> = []
    // A planning call in flight: its prompt counts (a call cut now is billed for it), at the model it went to.
    let planningSent = NO_USAGE
    let planningAnsweredBy: UpstreamAttempt | undefined
    let searchesSent = 0
    let pagesRead = 0
    let pagesPlanned = 0
    const tell = Effect.suspend(() =>
      call.spent({
        searches: searchesSent,
        pages: pagesRead,
        planning: addUsage(planning, planningSent),
        planningCalls: planningSent === NO_USAGE
          ? [...planningCalls]
          : [...planningCalls, planningCallOf(call.model, planningAnsweredBy, planningSent)]
      })
    )
    for (const [round, budget] of plan.rounds.entries()) {
      if (budget.queries <= 0) continue
      const earlier = round === 0 ? undefined : { queries: queriesRun, results }
      const prompt = planningMessages(messages, budget.queries, today, earlier)
      planningSent = { ...NO_USAGE, inputTokens: countMessages(prompt) }
      planningAnsweredBy = undefined
      yield* tell
      // The fallback provider tells which target answered, as it does for the call itself.
      const attempts: Array<UpstreamAttempt> = []
      // Refused by every target (no answer began): the upstream ran nothing, so the prompt no longer counts.
      const unlessAccepted = Effect.suspend(() => {
        const accepted = servedBy(attempts)
        if (Option.isSome(accepted)) planningAnsweredBy = accepted.value
        else planningSent = NO_USAGE
        return tell
      })
      const answer = yield* call.provider.complete({
        model: call.model,
        messages: prompt,
        maxOutputTokens: plan.planningOutputCap,
        reasoningEffort: call.reasoningModel ? "low" : undefined,
        reasoningModel: call.reasoningModel,
        attempted: (attempt) => Effect.sync(() => attempts.push(attempt))
      }).pipe(Effect.tapError(() => unlessAccepted))
      const used = planningUsageOf(prompt, answer.text, answer.usage)
      planning = addUsage(planning, used)
      planningCalls.push(planningCallOf(call.model, Option.getOrUndefined(servedBy(attempts)), used))
      planningSent = NO_USAGE
      yield* tell
      const written = parseQueries(answer.text, budget.queries + queriesRun.length)
        .filter((query) => !queriesRun.some((done) => done.toLowerCase() === query.toLowerCase()))
        .slice(0, budget.queries)
      const queries = written.length > 0 ? written : round === 0 ? [lastQuestion(messages) || "news"] : []
      // A search counts once sent; one the engine failed is not billed. Each runs to its end, then the first failure fails the call.
      const outcomes = yield* Effect.forEach(queries, (query) =>
        Effect.zipRight(
          Effect.suspend(() => {
            searchesSent += 1
            return tell
          }),
          engine.search(query, plan.maxResults).pipe(
            Effect.tapError(() =>
              Effect.suspend(() => {
                searchesSent -= 1
                return tell
              })
            ),
            Effect.either
          )
        ), { concurrency: 3 })
      const found = yield* Effect.all(outcomes)
      queriesRun.push(...queries)
      const fresh: Array<SearchResult> = []
      for (const result of found.flatMap((list) => list.slice(0, plan.maxResults))) {
        const key = urlKey(result.url)
        if (seen.has(key)) continue
        seen.add(key)
        fresh.push(result)
      }
      // Pages are read concurrently, each with its deadline; one that fails is skipped, not retried with another.
      // A round may read what earlier rounds left unread of theirs. Each page read counts as it arrives.
      pagesPlanned += budget.pages
      const toRead = fresh.slice(0, Math.max(0, pagesPlanned - pagesRead))
      const read = yield* Effect.forEach(toRead, (result) =>
        engine.readPage(result.url).pipe(
          Effect.tap((text) =>
            Effect.suspend(() => {
              if (text.length === 0) return Effect.void
              pagesRead += 1
              return tell
            })
          ),
          Effect.tapError((error) => Effect.logInfo(`web page skipped: ${error.url}: ${error.reason}`)),
          Effect.option
        ), { concurrency: Math.max(1, toRead.length) })
      const pages = new Map(toRead.flatMap((result, i) => {
        const text = read[i]
        return text !== undefined && Option.isSome(text) && text.value.length > 0
          ? [[result.url, text.value] as const]
          : []
      }))
      results.push(...fresh.map((result) => ({ ...result, page: pages.get(result.url) })))
    }
    const accessedAt = (yield* now).toISOString()
    const sources: Sources = {
      searches: queriesRun.length,
      pages: pagesRead,
      found: results.map((result, i) => ({
        index: i + 1,
        title: result.title,
        url: result.url,
        published_at: result.publishedAt,
        accessed_at: accessedAt
      })),
      planning,
      planningCalls,
      ...(results.length > 0 ? { message: sourcesMessage(results) } : {})
    }
    return sources
  }
)

/**
 * Web search for a call (docs/api/models.md, "Web search"): the model writes up
 * to `max_searches` queries in a planning call (and, at `deep`/`reasoning`
 * depth, more after reading the first results); each returns up to
 * `max_results`, de-duplicated by URL; when pages are read, up to `max_pages`
 * of them, concurrently, skipping those that fail. The sources go to the
 * model as numbered entries; the answer's `[n]` become its citations.
 */
export class WebSearch extends Context.Tag("nenas/WebSearch")<WebSearch, {
  readonly run: (
    plan: SearchPlan,
    messages: ReadonlyArray<Message>,
    call: SearchCall
  ) => Effect.Effect<Sources, SearchError | ProviderError>
}>() {
  static readonly layer = Layer.effect(
    WebSearch,
    Effect.map(Search, (search) => ({
      run: (plan, messages, call) => runSearch(call.simulated ? simulatedSearch : search, plan, messages, call)
    }))
  )
}
