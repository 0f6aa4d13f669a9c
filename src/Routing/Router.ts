import { Context, Effect, Layer } from "effect"
import { AppConfig } from "../AppConfig.js"
import type { Message } from "../Domain/Tokens.js"
import { targetsOf } from "../Domain/Upstreams.js"

export type Effort = "low" | "medium" | "high"
export type Category = "general" | "reasoning" | "search"

export interface RouteInput {
  readonly messages: ReadonlyArray<Message>
  readonly effort: Effort
  /** `web_search.mode`; absent means off. */
  readonly webSearch: "off" | "auto" | "on"
}

export interface Route {
  readonly category: Category
  readonly upstreamModel: string
  /** Whether the reasoning model answers (it also may under `search`). */
  readonly reasoningModel: boolean
  readonly search: boolean
  /** One sentence: why (and, when a fallback answered, a second saying so). */
  readonly reasoning: string
  /** Whether a fallback answered: the category's first target failed or was skipped (Providers/Fallback.ts). */
  readonly fallback?: boolean | undefined
}

/** Signs that a prompt needs multi-step work. Checked in order; the first match is quoted. */
const MULTI_STEP: ReadonlyArray<RegExp> = [
  /\bstep[- ]by[- ]step\b/i,
  /\b(prove|proof|derive|derivation|theorem|lemma)\b/i,
  /\b(solve|calculate|compute|integrate|differentiate|optimi[sz]e)\b/i,
  /\b(debug|refactor|implement|algorithm|complexity)\b/i,
  /\b(plan|strategy|trade-?offs?|pros and cons)\b/i,
  /\b(analy[sz]e|compare)\b.{0,200}?\b(and|versus|vs\.?)\b/i,
  /\bwhy (does|do|is|are|did)\b/i,
  /```/,
  /\d{1,32}\s{0,8}[-+*/^×÷]\s{0,8}\d{1,32}/
]

/** Signs that a prompt asks about the present, which web search can answer. */
const NEEDS_FRESH: ReadonlyArray<RegExp> = [
  /\b(latest|newest|current|currently|recent|recently|today|tonight|yesterday|this (week|month|year))\b/i,
  /\b(news|headlines|price of|stock|weather|score|who won|released|announced)\b/i,
  /\b20[2-9]\d\b/
]

const LONG_PROMPT_CHARS = 12_000

const firstMatch = (patterns: ReadonlyArray<RegExp>, text: string): string | undefined => {
  for (const pattern of patterns) {
    const match = pattern.exec(text)
    if (match !== null) return match[0].trim()
  }
  return undefined
}

/**
 * The text the router reads: what the user asked, latest turn last, and no more than its last `READ_CHARS`
 * (with `length`, the whole text's, for the long-prompt rule): the patterns' work is bounded whatever the
 * request holds (docs/security.md, "Bounded work per request").
 */
const READ_CHARS = 16_000

const userText = (messages: ReadonlyArray<Message>): { readonly text: string; readonly length: number } => {
  const parts: Array<string> = []
  let length = 0
  let kept = 0
  for (let i = messages.length - 1; i >= 0; i--) {
    const message = messages[i]
    if (message === undefined || message.role !== "user") continue
    if (length > 0) length += 1
    length += message.content.length
    if (kept < READ_CHARS) {
      const part = message.content.length > READ_CHARS - kept
        ? message.content.slice(-(READ_CHARS - kept))
        : message.content
      parts.push(part)
      kept += part.length + 1
    }
  }
  return { text: parts.reverse().join("\n"), length }
}

const needsReasoning = (
  input: RouteInput,
  text: string,
  length: number
): { readonly yes: boolean; readonly why: string } => {
  if (input.effort === "high") return { yes: true, why: "reasoning.effort is high" }
  if (input.effort === "low") return { yes: false, why: "reasoning.effort is low" }
  const matched = firstMatch(MULTI_STEP, text)
  if (matched !== undefined) {
    return { yes: true, why: `the prompt asks for multi-step work ("${matched.slice(0, 40)}")` }
  }
  if (length > LONG_PROMPT_CHARS) return { yes: true, why: "the prompt is long enough to need multi-step work" }
  return { yes: false, why: "the prompt is a direct request that needs no multi-step work" }
}

const searchDecision = (input: RouteInput, text: string): { readonly yes: boolean; readonly why: string } => {
  if (input.webSearch === "on") return { yes: true, why: "web_search.mode is on" }
  if (input.webSearch === "off") return { yes: false, why: "" }
  const matched = firstMatch(NEEDS_FRESH, text)
  return matched === undefined
    ? { yes: false, why: "" }
    : { yes: true, why: `web_search.mode is auto and the prompt asks about current events ("${matched}")` }
}

/** A pure routing decision: the same input always gives the same route. */
export const decideRoute = (
  models: { readonly general: string; readonly reasoning: string },
  input: RouteInput
): Route => {
  const { length, text } = userText(input.messages)
  const reasoning = needsReasoning(input, text, length)
  const search = searchDecision(input, text)
  const upstreamModel = reasoning.yes ? models.reasoning : models.general
  const modelPart = reasoning.yes ? "the reasoning model" : "the general model"
  if (search.yes) {
    return {
      category: "search",
      upstreamModel,
      reasoningModel: reasoning.yes,
      search: true,
      reasoning: `Searched the web because ${search.why}, and ${modelPart} answers because ${reasoning.why}.`
    }
  }
  return {
    category: reasoning.yes ? "reasoning" : "general",
    upstreamModel,
    reasoningModel: reasoning.yes,
    search: false,
    reasoning: `Routed to ${modelPart} because ${reasoning.why}.`
  }
}

/**
 * A router for tests with fixed decisions (`Router.fixed`): one route for every
 * call, or a function of the input. Each input it was asked about is recorded.
 */
export interface FixedRouter {
  readonly route: (input: RouteInput) => Route
  readonly inputs: ReadonlyArray<RouteInput>
}

export class Router extends Context.Tag("nenas/Router")<Router, {
  readonly route: (input: RouteInput) => Route
}>() {
  /** A router that answers `decide` (a route, or a function of the input), recording every input. */
  static readonly fixed = (decide: Route | ((input: RouteInput) => Route)): FixedRouter => {
    const inputs: Array<RouteInput> = []
    return {
      inputs,
      route: (input) => {
        inputs.push(input)
        return typeof decide === "function" ? decide(input) : decide
      }
    }
  }

  /** A route to `upstreamModel` in `category`, with a reason that says a test fixed it. */
  static readonly fixedRoute = (
    category: Category,
    upstreamModel: string,
    reasoningModel = category === "reasoning"
  ): Route => ({
    category,
    upstreamModel,
    reasoningModel,
    search: category === "search",
    reasoning: `Routed to ${upstreamModel} because the test fixed the route.`
  })

  /** The test Layer: `router` (from `Router.fixed`) as the `Router`. */
  static readonly Test = (router: FixedRouter): Layer.Layer<Router> => Layer.succeed(Router, router)

  static readonly layer = Layer.effect(
    Router,
    Effect.map(AppConfig, (config) => {
      // Each category's first target (UPSTREAMS); the rest are its fallbacks (Providers/Fallback.ts).
      const first = (category: "general" | "reasoning", otherwise: string) =>
        targetsOf(config.upstreams, category)[0]?.model ?? otherwise
      const models = {
        general: first("general", config.upstreamModelGeneral),
        reasoning: first("reasoning", config.upstreamModelReasoning)
      }
      return { route: (input: RouteInput) => decideRoute(models, input) }
    })
  )
}
