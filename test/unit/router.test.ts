import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { AppConfig } from "../../src/AppConfig.js"
import type { Category, Effort, RouteInput } from "../../src/Routing/Router.js"
import { decideRoute, Router } from "../../src/Routing/Router.js"

const models = { general: "general-model", reasoning: "reasoning-model" }

const input = (prompt: string, effort: Effort = "medium", webSearch: RouteInput["webSearch"] = "off"): RouteInput => ({
  messages: [{ role: "system", content: "Prove everything step by step." }, { role: "user", content: prompt }],
  effort,
  webSearch
})

const table: ReadonlyArray<readonly [string, Effort, RouteInput["webSearch"], Category, string, RegExp]> = [
  ["What is the capital of Malaysia?", "medium", "off", "general", "general-model", /direct request/],
  ["Write a haiku about rain.", "medium", "off", "general", "general-model", /direct request/],
  ["Translate 'good morning' into Malay.", "medium", "off", "general", "general-model", /direct request/],
  [
    "Prove that there are infinitely many primes.",
    "medium",
    "off",
    "reasoning",
    "reasoning-model",
    /multi-step work \("Prove"\)/
  ],
  ["Explain step by step how to bake bread.", "medium", "off", "reasoning", "reasoning-model", /"step by step"/],
  ["Solve x^2 - 4 = 0.", "medium", "off", "reasoning", "reasoning-model", /"Solve"/],
  ["Debug this function for me.", "medium", "off", "reasoning", "reasoning-model", /"Debug"/],
  ["What is 17 * 23?", "medium", "off", "reasoning", "reasoning-model", /"17 \* 23"/],
  ["Why does ice float on water?", "medium", "off", "reasoning", "reasoning-model", /"Why does"/],
  ["Compare Rust and Go for web servers.", "medium", "off", "reasoning", "reasoning-model", /multi-step/],
  ["```ts\nconst x = 1\n```", "medium", "off", "reasoning", "reasoning-model", /"```"/],
  ["x".repeat(12_001), "medium", "off", "reasoning", "reasoning-model", /long enough/],
  ["Hello there", "high", "off", "reasoning", "reasoning-model", /reasoning\.effort is high/],
  [
    "Prove that there are infinitely many primes.",
    "low",
    "off",
    "general",
    "general-model",
    /reasoning\.effort is low/
  ],
  ["Hello there", "medium", "on", "search", "general-model", /web_search\.mode is on/],
  ["Prove the latest theorem.", "medium", "on", "search", "reasoning-model", /web_search\.mode is on.*reasoning model/],
  ["What is the latest news in Kuala Lumpur?", "medium", "auto", "search", "general-model", /mode is auto.*"latest"/],
  ["Who won the match yesterday?", "medium", "auto", "search", "general-model", /current events/],
  ["Write a haiku about rain.", "medium", "auto", "general", "general-model", /direct request/],
  ["What is the latest news in Kuala Lumpur?", "medium", "off", "general", "general-model", /direct request/]
]

describe("Router", () => {
  for (const [prompt, effort, webSearch, category, model, why] of table) {
    it(`${JSON.stringify(prompt.slice(0, 40))} (effort ${effort}, search ${webSearch}) → ${category} on ${model}`, () => {
      const route = decideRoute(models, input(prompt, effort, webSearch))
      expect(route.category).toBe(category)
      expect(route.upstreamModel).toBe(model)
      expect(route.search).toBe(category === "search")
      expect(route.reasoning).toMatch(why)
      // One sentence: it ends with a full stop and holds no other sentence end.
      expect(route.reasoning).toMatch(/^[A-Z][^]*\.$/)
      expect(route.reasoning.slice(0, -1)).not.toMatch(/\.\s+[A-Z]/)
    })
  }

  it("is deterministic: the same input always gives the same route", () => {
    for (const [prompt, effort, webSearch] of table) {
      const routes = Array.from({ length: 5 }, () => decideRoute(models, input(prompt, effort, webSearch)))
      for (const route of routes) expect(route).toEqual(routes[0])
    }
  })

  it("reads only what the user wrote: a system prompt asking for proofs does not make a question multi-step", () => {
    expect(decideRoute(models, input("Hi")).category).toBe("general")
  })

  // Before, `compare … and` was matched with `.*` over the whole text: 320 KB of "compare " took 11.8 s.
  it("reads a bounded tail of the prompt: megabytes of pattern starts route at once, by the whole text's length", () => {
    for (const prompt of ["compare ".repeat(1_000_000), "1".repeat(8_000_000), `1${" ".repeat(8_000_000)}`]) {
      const route = decideRoute(models, input(JSON.parse(JSON.stringify(prompt)) as string))
      expect(route.category).toBe("reasoning")
    }
    // The latest turn is what the search rule reads, though earlier ones hold megabytes.
    const turns: RouteInput = {
      messages: [{ role: "user", content: "x ".repeat(2_000_000) }, {
        role: "user",
        content: "What is the latest news?"
      }],
      effort: "low",
      webSearch: "auto"
    }
    expect(decideRoute(models, turns).category).toBe("search")
  })

  it.effect("the Layer takes the upstream models from configuration", () =>
    Effect.gen(function*() {
      const router = yield* Router
      expect(router.route(input("Hi")).upstreamModel).toBe("cfg-general")
      expect(router.route(input("Hi", "high")).upstreamModel).toBe("cfg-reasoning")
    }).pipe(Effect.provide(Router.layer.pipe(Layer.provide(AppConfig.layerWith({
      upstreamModelGeneral: "cfg-general",
      upstreamModelReasoning: "cfg-reasoning"
    }))))))
})
