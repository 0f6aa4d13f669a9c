import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Either, Option, Redacted } from "effect"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { appConfig } from "../../../src/AppConfig.js"
import { DEFAULT_PRICES } from "../../../src/Domain/Prices.js"
import { parseUpstreams, targetsFor, targetsOf } from "../../../src/Domain/Upstreams.js"
import { linesOf, startService } from "../../support/ServiceProcess.js"

/**
 * `UPSTREAMS` (docs/operations.md, "Several upstreams and fallbacks"): parsed
 * with Effect Schema, a bad list refused in one line naming the entry and the
 * field, the targets of a category ordered upstream by upstream, and the
 * one-upstream shorthand equivalent to a list of one.
 */

const OPENAI = {
  name: "openai",
  base_url: "https://api.openai.com/v1",
  api_key: "sk-1",
  models: { general: ["gpt-4.1-mini"], reasoning: ["o4-mini"] }
}
const GEMINI = {
  name: "gemini",
  base_url: "https://generativelanguage.googleapis.com/v1beta/openai",
  api_key: "g-1",
  models: { general: ["gemini-2.5-flash", "gemini-2.0-flash"], reasoning: ["gemini-2.5-pro"] },
  prices: {
    "gemini-2.5-flash": { inputPerMillion: 1_260_000, cachedInputPerMillion: 315_000, outputPerMillion: 10_500_000 }
  }
}
const VLLM = { name: "local-vllm", base_url: "http://vllm:8000/v1", models: { general: ["qwen3-8b"] } }

const problem = (value: unknown) => {
  const parsed = parseUpstreams(typeof value === "string" ? value : JSON.stringify(value))
  return Either.isLeft(parsed) ? parsed.left : undefined
}

describe("parseUpstreams", () => {
  it("reads three upstreams: the targets of each category in list order, each upstream's models in order", () => {
    const upstreams = Either.getOrThrow(parseUpstreams(JSON.stringify([OPENAI, GEMINI, VLLM])))
    expect(targetsOf(upstreams, "general").map((t) => t.id)).toEqual([
      "openai/gpt-4.1-mini",
      "gemini/gemini-2.5-flash",
      "gemini/gemini-2.0-flash",
      "local-vllm/qwen3-8b"
    ])
    expect(targetsOf(upstreams, "reasoning").map((t) => t.id)).toEqual(["openai/o4-mini", "gemini/gemini-2.5-pro"])
    expect(upstreams[2]?.apiKey, "no key: none sent").toEqual(Option.none())
    expect(upstreams[0]?.apiKey.pipe(Option.map(Redacted.value))).toEqual(Option.some("sk-1"))
    // The router's pick first, then its fallbacks; another model (a router replaced in tests) alone.
    expect(targetsFor(upstreams, "general", "gpt-4.1-mini")).toHaveLength(4)
    expect(targetsFor(upstreams, "general", "gemini-2.0-flash").map((t) => t.id)).toEqual(["gemini/gemini-2.0-flash"])
  })

  const bad: ReadonlyArray<readonly [string, unknown, string]> = [
    ["bad JSON", "[{name: openai}]", "UPSTREAMS is not valid JSON: "],
    ["not a list", { name: "x" }, "UPSTREAMS must be a non-empty JSON array of upstreams"],
    ["an empty list", [], "UPSTREAMS must be a non-empty JSON array of upstreams"],
    [
      "a missing base_url",
      [OPENAI, { name: "gemini", models: { general: ["g"] } }],
      `UPSTREAMS entry 2 ("gemini"): base_url: is missing`
    ],
    [
      "a base_url that is no URL",
      [{ ...OPENAI, base_url: "api.openai.com" }],
      `UPSTREAMS entry 1 ("openai"): base_url: must be an http(s) URL`
    ],
    [
      "no models at all",
      [{ ...VLLM, models: {} }],
      `UPSTREAMS entry 1 ("local-vllm"): models: list at least one model under general or reasoning`
    ],
    [
      "empty model lists",
      [{ ...VLLM, models: { general: [], reasoning: [] } }],
      `UPSTREAMS entry 1 ("local-vllm"): models: list at least one`
    ],
    [
      "an empty model id",
      [{ ...VLLM, models: { general: [""] } }],
      `UPSTREAMS entry 1 ("local-vllm"): models.general.0: a model id must be a non-empty string`
    ],
    [
      "a negative price",
      [{
        ...GEMINI,
        prices: { "gemini-2.5-flash": { inputPerMillion: -1, cachedInputPerMillion: 0, outputPerMillion: 0 } }
      }],
      `UPSTREAMS entry 1 ("gemini"): prices.gemini-2.5-flash.inputPerMillion: `
    ],
    [
      "a price missing a field",
      [{ ...GEMINI, prices: { "gemini-2.5-flash": { inputPerMillion: 1 } } }],
      `UPSTREAMS entry 1 ("gemini"): prices.gemini-2.5-flash.cachedInputPerMillion: is missing`
    ],
    [
      "two entries of one name",
      [OPENAI, { ...VLLM, name: "openai" }],
      `UPSTREAMS entry 2 ("openai"): name: another entry is already named openai`
    ],
    ["a field it does not know", [{ ...OPENAI, model: "x" }], `UPSTREAMS entry 1 ("openai"): model: is unexpected`],
    ["no reasoning model anywhere", [VLLM], "UPSTREAMS: no upstream lists a reasoning model"],
    [
      "one model priced two ways",
      [{ ...GEMINI }, {
        ...VLLM,
        models: { general: ["gemini-2.5-flash"] },
        prices: { "gemini-2.5-flash": { inputPerMillion: 1, cachedInputPerMillion: 1, outputPerMillion: 1 } }
      }],
      `UPSTREAMS entry 2 ("local-vllm"): prices.gemini-2.5-flash: priced differently by gemini`
    ]
  ]
  for (const [what, value, line] of bad) {
    it(`refuses ${what} in one line naming the problem`, () => {
      const found = problem(value)
      expect(found).toBeDefined()
      expect(found?.startsWith(line), `${found} starts with ${line}`).toBe(true)
      expect(found?.includes("\n"), "one line").toBe(false)
    })
  }
})

const loaded = (variables: Record<string, string>) =>
  Effect.withConfigProvider(appConfig, ConfigProvider.fromMap(new Map(Object.entries(variables))))

describe("AppConfig's upstreams", () => {
  it.effect("UPSTREAM_BASE_URL with UPSTREAM_MODEL_* is a list of one, named upstream", () =>
    Effect.gen(function*() {
      const config = yield* loaded({
        UPSTREAM_BASE_URL: "http://127.0.0.1:9/v1",
        UPSTREAM_MODEL_GENERAL: "m-general",
        UPSTREAM_MODEL_REASONING: "m-reason"
      })
      expect(config.upstreams.map((u) => ({ name: u.name, baseUrl: u.baseUrl, models: u.models }))).toEqual([
        {
          name: "upstream",
          baseUrl: "http://127.0.0.1:9/v1",
          models: { general: ["m-general"], reasoning: ["m-reason"], embedding: ["text-embedding-3-small"] }
        }
      ])
      expect(config.prices, "no prices of its own").toEqual(DEFAULT_PRICES)
    }))

  it.effect("UPSTREAMS overrides the shorthand, and its prices override the table's", () =>
    Effect.gen(function*() {
      const config = yield* loaded({
        UPSTREAM_BASE_URL: "http://127.0.0.1:9/v1",
        UPSTREAMS: JSON.stringify([OPENAI, GEMINI, VLLM])
      })
      expect(config.upstreams.map((u) => u.name)).toEqual(["openai", "gemini", "local-vllm"])
      expect(config.prices.models["gemini-2.5-flash"]).toEqual(GEMINI.prices["gemini-2.5-flash"])
      expect(config.prices.models["gpt-4.1-mini"]).toEqual(DEFAULT_PRICES.models["gpt-4.1-mini"])
    }))

  it.effect("nothing set: no upstream, the simulated model", () =>
    Effect.map(loaded({}), (config) => expect(config.upstreams).toEqual([])))

  it.effect("a bad UPSTREAMS fails the configuration with its one line", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(loaded({ UPSTREAMS: JSON.stringify([{ ...OPENAI, models: { general: [] } }]) }))
      expect(String(error)).toContain(
        `UPSTREAMS entry 1 ("openai"): models: list at least one model under general or reasoning`
      )
    }))
})

describe("starting with a bad UPSTREAMS", () => {
  it("the process exits non-zero, its output naming the entry and the field", async () => {
    const dataDir = await mkdtemp(join(tmpdir(), "nenas-upstreams-"))
    try {
      const service = await startService({
        env: { DATA_DIR: dataDir, UPSTREAMS: JSON.stringify([OPENAI, { name: "gemini", models: { general: ["g"] } }]) },
        until: "spawned"
      })
      const exit = await service.closed
      expect(exit.code, service.output()).not.toBe(0)
      const lines = linesOf(service.output()).filter((line) => line.includes("UPSTREAMS entry"))
      expect(lines, service.output()).toHaveLength(1)
      expect(lines[0]).toContain(`UPSTREAMS entry 2 ("gemini"): base_url: is missing`)
    } finally {
      await rm(dataDir, { recursive: true, force: true })
    }
  }, 60_000)
})
