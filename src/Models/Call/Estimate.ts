import { Either } from "effect"
import { ContextLengthExceeded, InvalidRequest } from "../../Domain/Errors.js"
import type { MicroMyr } from "../../Domain/Money.js"
import { fromMyr, microMyr, toMyrString } from "../../Domain/Money.js"
import type { BilledUsage, ModelTokens, PriceTable } from "../../Domain/Prices.js"
import { costOf, costOfParts, FULL_SHARE_BPS, withSafetyMargin } from "../../Domain/Prices.js"
import { countRequest } from "../../Providers/ContentTokens.js"
import type { Capabilities, UpstreamMessage } from "../../Providers/Provider.js"
import { CONTEXT_WINDOW, MAX_OUTPUT_TOKENS } from "../OpenAi/Api.js"

/**
 * The decisions a call makes before it runs and when it settles
 * (docs/money.md, "The money rules"): how much output it may ask for, what it
 * may cost at most, whether `max_total_cost_myr` allows that, and what it is
 * billed at the end. Plain functions of their inputs, so they are tested
 * without a database.
 */

/** The input as the model reads it: the turns (images included), the tool definitions and the answer's schema, under one budget. */
export const countInput = (messages: ReadonlyArray<UpstreamMessage>, capabilities: Capabilities): number =>
  countRequest(messages, capabilities.tools, capabilities.responseFormat)

/** The most a call's web search may add: sources in the prompt, planning calls, searches and pages (`searchEstimate`). */
export interface SearchAllowance {
  readonly contextTokens: number
  readonly planningInputTokens: number
  readonly planningOutputTokens: number
  readonly searches: number
  readonly pages: number
}

export interface EstimateInput {
  readonly prices: PriceTable
  readonly upstreamModel: string
  /**
   * The other models the call may fall back to (Providers/Fallback.ts): the worst case is the dearest
   * of them all, so the hold covers whichever answers, and `max_total_cost_myr` is checked against it.
   */
  readonly fallbackModels?: ReadonlyArray<string> | undefined
  /** The input counted with our tokenizer (`countInput`). */
  readonly inputTokens: number
  readonly search: SearchAllowance
  /** `max_output_tokens` (or chat's `max_tokens`) when given. */
  readonly maxOutputTokens: number | undefined
  readonly maxTotalCostMyr: number | undefined
  /** The field that names the prompt in errors: `input` or `messages`. */
  readonly inputParam: string
  /** The output limit the caller lowers, as the endpoint names it: `max_output_tokens` or chat's `max_tokens`. */
  readonly outputParam: string
}

/** A call that may run: its output cap, the most it may cost, and the caller's own cap on that. */
export interface Estimate {
  readonly outputCap: number
  readonly worstCase: MicroMyr
  readonly costCap: MicroMyr | undefined
}

/**
 * The output cap: as asked, else what the context window leaves after the input
 * and the sources, at most `MAX_OUTPUT_TOKENS`. Input, sources and asked output
 * that do not fit the window are refused.
 */
export const outputCapFor = (
  input: Pick<EstimateInput, "inputTokens" | "search" | "maxOutputTokens" | "inputParam">
): Either.Either<number, ContextLengthExceeded> => {
  const searchTokens = input.search.contextTokens
  const asked = input.maxOutputTokens ?? 0
  if (input.inputTokens + searchTokens + asked > CONTEXT_WINDOW) {
    return Either.left(
      new ContextLengthExceeded({
        message: `The input is ${input.inputTokens} tokens${
          searchTokens > 0 ? `, web search may add ${searchTokens}` : ""
        }${
          asked > 0 ? ` and ${asked} output tokens were asked for` : ""
        }; the model's context window is ${CONTEXT_WINDOW} tokens.`,
        param: input.inputParam
      })
    )
  }
  return Either.right(
    input.maxOutputTokens ?? Math.min(MAX_OUTPUT_TOKENS, CONTEXT_WINDOW - input.inputTokens - searchTokens)
  )
}

/**
 * The most a call may cost: its input and the sources with the tokenizer's
 * safety margin, its whole output cap, and web search's planning calls,
 * searches and pages.
 */
export const worstCaseCost = (
  prices: PriceTable,
  upstreamModel: string,
  inputTokens: number,
  outputCap: number,
  search: SearchAllowance
): MicroMyr =>
  costOf(prices, upstreamModel, {
    inputTokens: withSafetyMargin(inputTokens + search.contextTokens + search.planningInputTokens),
    cachedTokens: 0,
    outputTokens: outputCap + search.planningOutputTokens,
    searches: search.searches,
    pages: search.pages
  })

/** `max_total_cost_myr` in micro-MYR, when given. */
export const costCapOf = (maxTotalCostMyr: number | undefined): MicroMyr | undefined =>
  maxTotalCostMyr === undefined ? undefined : fromMyr(maxTotalCostMyr)

/** A call that may cost more than `max_total_cost_myr` is refused before it holds anything, saying how the estimate was made. */
export const withinCostCap = (
  worstCase: MicroMyr,
  costCap: MicroMyr | undefined,
  breakdown: {
    readonly inputTokens: number
    readonly outputCap: number
    readonly search: SearchAllowance
    readonly outputParam: string
  }
): Either.Either<void, InvalidRequest> => {
  if (costCap === undefined || worstCase <= costCap) return Either.void
  const { search } = breakdown
  // The count priced is the margined one: shown as priced, with the count it was made from.
  const counted = breakdown.inputTokens + search.contextTokens + search.planningInputTokens
  return Either.left(
    new InvalidRequest({
      message: `This request may cost up to RM ${toMyrString(worstCase)}, above max_total_cost_myr (RM ${
        toMyrString(costCap)
      }).`,
      param: "max_total_cost_myr",
      guidance: `The estimated maximum cost is RM ${toMyrString(worstCase)} (${
        withSafetyMargin(counted)
      } input tokens: ${counted} counted plus a safety margin, ${
        breakdown.outputCap + search.planningOutputTokens
      } output tokens${
        search.searches > 0 ? `, ${search.searches} searches, ${search.pages} pages` : ""
      }). Raise max_total_cost_myr to at least ${toMyrString(worstCase)}, or lower ${breakdown.outputParam}.`
    })
  )
}

/** The estimate of a call, or why it may not run: too long for the context window, or above its cost cap. */
export const estimateCall = (input: EstimateInput): Either.Either<Estimate, ContextLengthExceeded | InvalidRequest> =>
  Either.gen(() => estimating(input))

/**
 * One generator function for every call, not one made per call
 * (docs/performance.md, "What kept a request's objects through young collections").
 */
function* estimating(input: EstimateInput) {
  const outputCap = yield* outputCapFor(input)
  const worstCase = microMyr(Math.max(
    ...[input.upstreamModel, ...(input.fallbackModels ?? [])].map((model) =>
      worstCaseCost(input.prices, model, input.inputTokens, outputCap, input.search)
    )
  ))
  const costCap = costCapOf(input.maxTotalCostMyr)
  yield* withinCostCap(worstCase, costCap, {
    inputTokens: input.inputTokens,
    outputCap,
    search: input.search,
    outputParam: input.outputParam
  })
  return { outputCap, worstCase, costCap }
}

/** The most a call may be billed: what it holds, and `max_total_cost_myr`. */
export const ceilingOf = (heldMicroMyr: number, costCap: MicroMyr | undefined): number =>
  Math.min(heldMicroMyr, costCap ?? Number.MAX_SAFE_INTEGER)

/**
 * What a call is billed: its usage priced, never above its ceiling; nothing when
 * it held nothing (`usage` null: a test key, or a model priced at nothing). The
 * parts of `usage` another model answered (`elsewhere`: web search's planning
 * calls a fallback answered) are priced at that model's prices; `tokenShareBps` of
 * the tokens' price is billed (a team's own provider key's fee), searches and
 * pages in full.
 */
export const billedCost = (
  prices: PriceTable,
  upstreamModel: string,
  usage: BilledUsage | null,
  ceiling: number,
  elsewhere: ReadonlyArray<ModelTokens> = [],
  tokenShareBps?: number
): MicroMyr => {
  if (usage === null) return microMyr(0)
  // Parts at another model's prices, or at another share of them (a planning call on another provider).
  const moved = elsewhere.filter((part) =>
    part.model !== upstreamModel || (part.shareBps ?? FULL_SHARE_BPS) !== (tokenShareBps ?? FULL_SHARE_BPS)
  )
  const less = (pick: (part: ModelTokens) => number) => moved.reduce((sum, part) => sum + pick(part), 0)
  const own: ModelTokens = {
    model: upstreamModel,
    inputTokens: Math.max(0, usage.inputTokens - less((part) => part.inputTokens)),
    cachedTokens: Math.max(0, usage.cachedTokens - less((part) => part.cachedTokens)),
    outputTokens: Math.max(0, usage.outputTokens - less((part) => part.outputTokens))
  }
  return microMyr(
    Math.min(costOfParts(prices, [own, ...moved], usage.searches, usage.pages, tokenShareBps), ceiling)
  )
}
