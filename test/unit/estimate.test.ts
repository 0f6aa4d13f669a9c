import { describe, expect, it } from "@effect/vitest"
import { Either } from "effect"
import { ContextLengthExceeded, InvalidRequest } from "../../src/Domain/Errors.js"
import { microMyr } from "../../src/Domain/Money.js"
import { costOfParts, DEFAULT_PRICES, withSafetyMargin } from "../../src/Domain/Prices.js"
import type { EstimateInput, SearchAllowance } from "../../src/Models/Call/Estimate.js"
import {
  billedCost,
  ceilingOf,
  costCapOf,
  estimateCall,
  outputCapFor,
  withinCostCap,
  worstCaseCost
} from "../../src/Models/Call/Estimate.js"

/**
 * The call's money decisions as plain functions (docs/money.md, "The money rules"), with
 * expectations computed by hand from the default prices: gpt-4.1-mini costs
 * 1.68 micro-MYR an input token, 0.42 a cached one and 6.72 an output token;
 * the fallback (an unknown model) 4.62, 1.155 and 18.48; a search 21,000 and a
 * page 4,200. The input side gets 10% and 16 tokens of margin.
 */

const GENERAL = "gpt-4.1-mini"
const NO_SEARCH: SearchAllowance = {
  contextTokens: 0,
  planningInputTokens: 0,
  planningOutputTokens: 0,
  searches: 0,
  pages: 0
}
const SEARCH: SearchAllowance = {
  contextTokens: 5_000,
  planningInputTokens: 300,
  planningOutputTokens: 600,
  searches: 2,
  pages: 1
}

const call = (overrides: Partial<EstimateInput> = {}): EstimateInput => ({
  prices: DEFAULT_PRICES,
  upstreamModel: GENERAL,
  inputTokens: 1_000,
  search: NO_SEARCH,
  maxOutputTokens: undefined,
  maxTotalCostMyr: undefined,
  inputParam: "input",
  outputParam: "max_output_tokens",
  ...overrides
})

describe("the output cap", () => {
  it.each([
    { name: "without max_output_tokens: the model's maximum", input: call(), cap: 32_000 },
    { name: "max_output_tokens as asked", input: call({ maxOutputTokens: 500 }), cap: 500 },
    { name: "near the window: what the window leaves", input: call({ inputTokens: 990_000 }), cap: 10_000 },
    { name: "the sources take their room too", input: call({ inputTokens: 990_000, search: SEARCH }), cap: 5_000 },
    {
      name: "input and asked output filling the window exactly",
      input: call({ inputTokens: 998_000, maxOutputTokens: 2_000 }),
      cap: 2_000
    }
  ])("$name", ({ cap, input }) => {
    expect(outputCapFor(input)).toEqual(Either.right(cap))
  })

  it.each([
    {
      name: "asked output that does not fit",
      input: call({ inputTokens: 999_000, maxOutputTokens: 2_000 }),
      message:
        "The input is 999000 tokens and 2000 output tokens were asked for; the model's context window is 1000000 tokens."
    },
    {
      name: "input over the window",
      input: call({ inputTokens: 1_000_001, inputParam: "messages" }),
      message: "The input is 1000001 tokens; the model's context window is 1000000 tokens."
    },
    {
      name: "sources that would push the input over",
      input: call({ inputTokens: 996_000, search: SEARCH }),
      message: "The input is 996000 tokens, web search may add 5000; the model's context window is 1000000 tokens."
    }
  ])("refuses $name", ({ input, message }) => {
    const refused = Either.getLeft(outputCapFor(input))
    expect(refused._tag).toBe("Some")
    if (refused._tag === "None") return
    expect(refused.value).toBeInstanceOf(ContextLengthExceeded)
    expect(refused.value.message).toBe(message)
    expect(refused.value.param).toBe(input.inputParam)
  })
})

describe("the worst-case cost", () => {
  it.each([
    // (1000 * 1.1 + 16) * 1.68 + 32000 * 6.72 = 1874.88 + 215040 = 216914.88, rounded up
    {
      name: "the whole output cap is priced",
      model: GENERAL,
      input: 1_000,
      outputCap: 32_000,
      search: NO_SEARCH,
      cost: 216_915
    },
    // 1116 * 1.68 + 500 * 6.72 = 1874.88 + 3360
    { name: "a smaller cap costs less", model: GENERAL, input: 1_000, outputCap: 500, search: NO_SEARCH, cost: 5_235 },
    // 1116 * 4.62 + 500 * 18.48 = 5155.92 + 9240
    {
      name: "an unknown model at the fallback price",
      model: "unknown-model",
      input: 1_000,
      outputCap: 500,
      search: NO_SEARCH,
      cost: 14_396
    },
    // input 1000 + 5000 sources + 300 planning = 6300 tokens; 6300 * 1.1 is 6930.000000000001 in floating point, so the
    // margin rounds up to 6931, + 16 = 6947 tokens: 11670.96; output 1000 + 600 planning: 10752; 2 searches 42000, 1 page 4200
    {
      name: "web search: sources, planning, searches and pages",
      model: GENERAL,
      input: 1_000,
      outputCap: 1_000,
      search: SEARCH,
      cost: 68_623
    },
    // (0 * 1.1 + 16) * 1.68 = 26.88
    { name: "an empty call still pays the margin", model: GENERAL, input: 0, outputCap: 0, search: NO_SEARCH, cost: 27 }
  ])("$name", ({ cost, input, model, outputCap, search }) => {
    expect(worstCaseCost(DEFAULT_PRICES, model, input, outputCap, search)).toBe(cost)
  })
})

describe("max_total_cost_myr", () => {
  const breakdown = { inputTokens: 1_000, outputCap: 32_000, search: NO_SEARCH, outputParam: "max_output_tokens" }

  it("is micro-MYR when given", () => {
    expect(costCapOf(undefined)).toBeUndefined()
    expect(costCapOf(0.2)).toBe(200_000)
    expect(costCapOf(0.216915)).toBe(216_915)
  })

  it("allows a worst case at or under it, and no cap at all", () => {
    expect(Either.isRight(withinCostCap(microMyr(216_915), microMyr(216_915), breakdown))).toBe(true)
    expect(Either.isRight(withinCostCap(microMyr(216_915), undefined, breakdown))).toBe(true)
  })

  it("refuses a worst case above it, saying how it was estimated", () => {
    const refused = Either.getLeft(withinCostCap(microMyr(216_915), microMyr(216_914), breakdown))
    expect(refused._tag).toBe("Some")
    if (refused._tag === "None") return
    expect(refused.value).toBeInstanceOf(InvalidRequest)
    expect(refused.value.param).toBe("max_total_cost_myr")
    expect(refused.value.message).toBe(
      "This request may cost up to RM 0.216915, above max_total_cost_myr (RM 0.216914)."
    )
    expect(refused.value.guidance).toBe(
      "The estimated maximum cost is RM 0.216915 (1116 input tokens: 1000 counted plus a safety margin, 32000 output tokens). " +
        "Raise max_total_cost_myr to at least 0.216915, or lower max_output_tokens."
    )
  })

  it("names the searches and pages when web search is priced in", () => {
    const refused = Either.getLeft(
      withinCostCap(microMyr(68_623), microMyr(50_000), {
        inputTokens: 1_000,
        outputCap: 1_000,
        search: SEARCH,
        outputParam: "max_tokens"
      })
    )
    // 1000 input, 5000 of sources and 300 of planning, margined; 1000 output and 600 of planning.
    expect(refused._tag === "Some" ? refused.value.guidance : "").toContain(
      `(${
        withSafetyMargin(6_300)
      } input tokens: 6300 counted plus a safety margin, 1600 output tokens, 2 searches, 1 pages). Raise max_total_cost_myr to at least 0.068623, or lower max_tokens.`
    )
  })
})

describe("estimateCall", () => {
  it("is the output cap, the worst case and the cap together", () => {
    expect(estimateCall(call({ maxOutputTokens: 500, maxTotalCostMyr: 1 }))).toEqual(
      Either.right({ outputCap: 500, worstCase: 5_235, costCap: 1_000_000 })
    )
  })

  it("refuses the context window before the cost", () => {
    const refused = Either.getLeft(
      estimateCall(call({ inputTokens: 999_000, maxOutputTokens: 2_000, maxTotalCostMyr: 0.000001 }))
    )
    expect(refused._tag === "Some" ? refused.value._tag : "none").toBe("ContextLengthExceeded")
  })

  it("refuses a cost above the cap", () => {
    const refused = Either.getLeft(estimateCall(call({ maxTotalCostMyr: 0.2 })))
    expect(refused._tag === "Some" ? refused.value._tag : "none").toBe("InvalidRequest")
  })

  // o4-mini: 1116 input * 4.62 + 500 output * 18.48 = 5155.92 + 9240, rounded up.
  it("with fallbacks, is the dearest target's worst case; a cheaper fallback changes nothing", () => {
    expect(estimateCall(call({ maxOutputTokens: 500, fallbackModels: ["o4-mini"] }))).toEqual(
      Either.right({ outputCap: 500, worstCase: 14_396, costCap: undefined })
    )
    expect(estimateCall(call({ upstreamModel: "o4-mini", maxOutputTokens: 500, fallbackModels: [GENERAL] }))).toEqual(
      Either.right({ outputCap: 500, worstCase: 14_396, costCap: undefined })
    )
  })

  it("checks max_total_cost_myr against the dearest target: a cap between the two estimates is refused", () => {
    expect(
      Either.isRight(estimateCall(call({ maxOutputTokens: 500, maxTotalCostMyr: 0.01 }))),
      "the primary alone fits"
    ).toBe(true)
    const refused = Either.getLeft(
      estimateCall(call({ maxOutputTokens: 500, maxTotalCostMyr: 0.01, fallbackModels: ["o4-mini"] }))
    )
    expect(refused._tag === "Some" ? refused.value.message : "").toContain("RM 0.014396")
  })
})

describe("what a call is billed", () => {
  // 800 uncached * 1.68 + 200 cached * 0.42 + 300 output * 6.72 = 1344 + 84 + 2016; 1 search 21000, 2 pages 8400
  const usage = { inputTokens: 1_000, cachedTokens: 200, outputTokens: 300, searches: 1, pages: 2 }

  it.each([
    { name: "its usage priced, under the ceiling", usage, ceiling: 100_000, billed: 32_844 },
    { name: "never above its ceiling", usage, ceiling: 30_000, billed: 30_000 },
    { name: "nothing when it held nothing", usage: null, ceiling: 100_000, billed: 0 },
    // 1.68, rounded up
    {
      name: "a fraction of a micro-MYR rounded up",
      usage: { inputTokens: 1, cachedTokens: 0, outputTokens: 0, searches: 0, pages: 0 },
      ceiling: 100,
      billed: 2
    }
  ])("$name", ({ billed, ceiling, usage }) => {
    expect(billedCost(DEFAULT_PRICES, GENERAL, usage, ceiling)).toBe(billed)
  })

  it("the ceiling is the hold, lowered by max_total_cost_myr", () => {
    expect(ceilingOf(216_915, undefined)).toBe(216_915)
    expect(ceilingOf(216_915, microMyr(200_000))).toBe(200_000)
    expect(ceilingOf(0, microMyr(200_000))).toBe(0)
  })
})

describe("a call answered on a team's own provider key: a share of its tokens' price", () => {
  const usage = { inputTokens: 1_000, cachedTokens: 200, outputTokens: 300, searches: 1, pages: 2 }

  it("5% of the tokens (3444 µMYR: 172.2, rounded up once to 173), searches and pages in full beside it", () => {
    expect(billedCost(DEFAULT_PRICES, GENERAL, usage, 100_000, [], 500)).toBe(173 + 21_000 + 8_400)
  })

  it("one rounding over every part: a full part of 1.68 and a shared one of 0.336 bill 3, not 2 + 1", () => {
    const planning = [{ model: GENERAL, inputTokens: 1, cachedTokens: 0, outputTokens: 0, shareBps: 10_000 }]
    // The call's own output token on the key: 6.72 × 5% = 0.336; its planning call's input on nenas: 1.68.
    const call = { inputTokens: 1, cachedTokens: 0, outputTokens: 1, searches: 0, pages: 0 }
    expect(billedCost(DEFAULT_PRICES, GENERAL, call, 100, planning, 500)).toBe(3)
    expect(costOfParts(
      DEFAULT_PRICES,
      [
        { model: GENERAL, inputTokens: 1, cachedTokens: 0, outputTokens: 0 },
        { model: GENERAL, inputTokens: 0, cachedTokens: 0, outputTokens: 1, shareBps: 500 }
      ],
      0,
      0
    )).toBe(3)
  })

  it("exact past 2^53: a million output tokens at the fallback's price, 0.01% of it", () => {
    // 1e6 × 18 480 000 = 1.848e13 per million; × 1 bp = 1848 µMYR exactly.
    const big = { model: "unknown-model", inputTokens: 0, cachedTokens: 0, outputTokens: 1_000_000 }
    expect(costOfParts(DEFAULT_PRICES, [big], 0, 0, 1)).toBe(1_848)
    expect(costOfParts(DEFAULT_PRICES, [big], 0, 0, 0)).toBe(0)
  })

  it("never above the ceiling", () => {
    expect(billedCost(DEFAULT_PRICES, GENERAL, usage, 20_000, [], 500)).toBe(20_000)
  })
})
