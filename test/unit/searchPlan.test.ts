import { describe, expect, it } from "@effect/vitest"
import { Schema } from "effect"
import { citedSources, planSearch } from "../../src/Models/Call/WebSearch.js"
import type { Citation } from "../../src/Models/Call/WebSearch.js"
import { WebSearchConfig } from "../../src/Models/OpenAi/Api.js"
import { parseQueries, planningMessages, simulatedPlannerAnswer } from "../../src/Search/Planning.js"

const config = Schema.decodeUnknownSync(WebSearchConfig)
const conversation = [{ role: "user" as const, content: "What changed in Kuala Lumpur's LRT fares this month?" }]

describe("planSearch: search_depth decides rounds, queries and pages", () => {
  const cases = [
    {
      name: "instant: 1 query, no pages even when asked",
      web: { search_depth: "instant", max_searches: 5, content: { enabled: true } },
      rounds: [[1, 0]]
    },
    {
      name: "fast: at most 2",
      web: { search_depth: "fast", max_searches: 5, content: { enabled: true, max_pages: 4 } },
      rounds: [[2, 4]]
    },
    { name: "fast without content reads no page", web: { search_depth: "fast", max_searches: 1 }, rounds: [[1, 0]] },
    { name: "balanced: max_searches", web: { search_depth: "balanced", max_searches: 5 }, rounds: [[5, 0]] },
    {
      name: "deep: two rounds, pages by default",
      web: { search_depth: "deep", max_searches: 5 },
      rounds: [[3, 2], [2, 1]]
    },
    {
      name: "reasoning: two rounds, max_pages",
      web: { search_depth: "reasoning", max_searches: 2, content: { enabled: true, max_pages: 10 } },
      rounds: [[1, 5], [1, 5]]
    },
    {
      name: "deep with content disabled reads no page",
      web: { search_depth: "deep", max_searches: 4, content: { enabled: false } },
      rounds: [[2, 0], [2, 0]]
    },
    { name: "deep with one search has one round", web: { search_depth: "deep", max_searches: 1 }, rounds: [[1, 3]] }
  ] as const
  for (const c of cases) {
    it(c.name, () => {
      const plan = planSearch(config({ mode: "on", ...c.web }), conversation, false)
      expect(plan.rounds.map((r) => [r.queries, r.pages])).toEqual(c.rounds)
      expect(plan.queries).toBe(c.rounds.reduce((sum, [q]) => sum + q, 0))
      expect(plan.pages).toBe(c.rounds.reduce((sum, [, p]) => sum + p, 0))
      expect(plan.planningOutputTokens).toBe(c.rounds.length * plan.planningOutputCap)
    })
  }

  it("counts the planning prompt, and a second round also the first round's findings", () => {
    const one = planSearch(config({ mode: "on", search_depth: "balanced", max_searches: 4 }), conversation, false)
    const two = planSearch(config({ mode: "on", search_depth: "deep", max_searches: 4 }), conversation, false)
    const prompt = planningMessages(conversation, 4, "2026-11-22").reduce((sum, m) => sum + m.content.length, 0)
    expect(one.planningInputTokens).toBeGreaterThan(10)
    expect(one.planningInputTokens).toBeLessThanOrEqual(prompt + 20)
    expect(two.planningInputTokens).toBeGreaterThan(2 * one.planningInputTokens)
    // A reasoning model thinks before it writes: its planning cap is larger.
    expect(planSearch(config({ mode: "on" }), conversation, true).planningOutputCap).toBeGreaterThan(
      one.planningOutputCap
    )
  })
})

describe("planning", () => {
  it("reads queries one a line, list markers and quotes stripped, repeats dropped, at most the count", () => {
    expect(
      parseQueries(
        "1. \"KL LRT fares\"\n- kl lrt fares\n\n* rapidkl fare change november 2026\n2) touch n go\nextra",
        3
      )
    )
      .toEqual(["KL LRT fares", "rapidkl fare change november 2026", "touch n go"])
  })

  it("the simulated model answers a planning call with the asked number of queries from the prompt, deterministically", () => {
    const messages = planningMessages(conversation, 3, "2026-11-22")
    const answer = simulatedPlannerAnswer(messages)
    expect(answer).toBe(simulatedPlannerAnswer(planningMessages(conversation, 3, "2030-01-01")))
    const queries = parseQueries(answer ?? "", 5)
    expect(queries).toHaveLength(3)
    for (const query of queries) expect(query).toContain("kuala lumpur's lrt fares")
    expect(simulatedPlannerAnswer(conversation)).toBeUndefined()
  })

  it("keeps the planning prompt bounded: the last turns, each cut short", () => {
    const long = Array.from(
      { length: 20 },
      (_, i) => ({ role: i % 2 === 0 ? "user" as const : "assistant" as const, content: "x".repeat(10_000) })
    )
    const messages = planningMessages(long, 2, "2026-11-22")
    expect(messages).toHaveLength(7)
    for (const message of messages.slice(1)) expect(message.content.length).toBeLessThanOrEqual(2_000)
  })
})

describe("citedSources", () => {
  const found: ReadonlyArray<Citation> = [1, 2, 3].map((index) => ({
    index,
    title: `Source ${index}`,
    url: `https://example.com/${index}`,
    published_at: null,
    accessed_at: "2026-11-22T00:00:00.000Z"
  }))

  it("lists each cited source once by index, and annotates every [n] where it stands; unknown numbers stay text", () => {
    const text = "Héllo 🌏 [3]. Then [1][3] and [7] and [x]."
    const { annotations, citations } = citedSources(text, found)
    expect(citations.map((c) => c.index)).toEqual([1, 3])
    expect(annotations.map((a) => text.slice(a.startIndex, a.endIndex))).toEqual(["[3]", "[1]", "[3]"])
    expect(annotations.map((a) => a.url)).toEqual([
      "https://example.com/3",
      "https://example.com/1",
      "https://example.com/3"
    ])
  })

  it("an answer citing nothing has no citations", () => {
    expect(citedSources("No sources used.", found)).toEqual({ citations: [], annotations: [] })
    expect(citedSources("See [1].", [])).toEqual({ citations: [], annotations: [] })
  })
})
