import { Layer } from "effect"
import type { Category, Route, RouteInput } from "./Router.js"
import { Router } from "./Router.js"

/**
 * A router for tests with fixed decisions: one route for every call, or a
 * function of the input. Each input it was asked about is recorded.
 */
export interface FixedRouter {
  readonly route: (input: RouteInput) => Route
  readonly inputs: ReadonlyArray<RouteInput>
}

export const make = (decide: Route | ((input: RouteInput) => Route)): FixedRouter => {
  const inputs: Array<RouteInput> = []
  return {
    inputs,
    route: (input) => {
      inputs.push(input)
      return typeof decide === "function" ? decide(input) : decide
    }
  }
}

/** A route to `upstreamModel` in `category`, with a reason that says it was fixed by a test. */
export const route = (category: Category, upstreamModel: string, reasoningModel = category === "reasoning"): Route => ({
  category,
  upstreamModel,
  reasoningModel,
  search: category === "search",
  reasoning: `Routed to ${upstreamModel} because the test fixed the route.`
})

export const layer = (router: FixedRouter): Layer.Layer<Router> => Layer.succeed(Router, router)
