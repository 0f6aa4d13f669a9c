import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { costOf, DEFAULT_PRICES } from "../../../src/Domain/Prices.js"
import { CONTEXT_WINDOW, PUBLIC_MODEL } from "../../../src/Models/OpenAi/Api.js"
import { booksOf } from "../../support/Books.js"
import { caller, modelCall, TestServerWithUpstream, violations, walletOf } from "../../support/Models.js"
import { readSse } from "../../support/Sse.js"
import { TestServer } from "../../support/TestServer.js"
import { Upstream, type UsageNumbers } from "../../support/Upstream.js"

/**
 * Usage an upstream reports out of all bounds (docs/architecture.md, "Streams"): counts are
 * kept to the call's bounds (input within the context window, output within
 * the output cap) and the price saturates at the hold, so the answer is
 * billed, at most its hold, and its hold settled, plain or streamed.
 */

const MAX_TOKENS = 100

/**
 * What each upstream reports (a string count is cast: the upstream's JSON is not ours to type); `counted`: usage
 * that cannot be read (a negative count, a string) is set aside and the call billed as we count it.
 */
const CASES: ReadonlyArray<{
  readonly name: string
  readonly usage: Partial<UsageNumbers>
  readonly atHold?: true
  readonly counted?: true
}> = [
  { name: "prompt_tokens 1e20", usage: { prompt_tokens: 1e20, completion_tokens: 20 }, atHold: true },
  { name: "completion_tokens 1e20", usage: { prompt_tokens: 30, completion_tokens: 1e20 } },
  {
    name: "reasoning and cached tokens 1e20",
    usage: { prompt_tokens: 30, completion_tokens: 20, reasoning_tokens: 1e20, cached_tokens: 1e20 }
  },
  { name: "negative counts", usage: { prompt_tokens: -5, completion_tokens: -7 }, counted: true },
  { name: "fractional counts", usage: { prompt_tokens: 12.5, completion_tokens: 7.25 } },
  {
    name: "a count that is a string",
    usage: { prompt_tokens: "12abc" as unknown as number, completion_tokens: 20 },
    counted: true
  }
]

const body = (stream: boolean) => ({
  model: PUBLIC_MODEL,
  messages: [{ role: "user", content: "Say hello to the team" }],
  max_tokens: MAX_TOKENS,
  stream
})

/** One chat call, plain or streamed: its status and request id. */
const chat = (apiKey: string, stream: boolean) =>
  stream
    ? Effect.flatMap(TestServer, ({ baseUrl }) =>
      Effect.promise(async () => {
        const response = await fetch(`${baseUrl}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
          body: JSON.stringify(body(true)),
          signal: AbortSignal.timeout(20_000)
        })
        const events = await readSse(response)
        return {
          status: response.status,
          requestId: response.headers.get("x-request-id") ?? "",
          done: events.some((e) => e.data === "[DONE]")
        }
      }))
    : Effect.map(modelCall(apiKey, "/v1/chat/completions", body(false)), (reply) => ({
      status: reply.status,
      requestId: reply.headers.get("x-request-id") ?? "",
      done: reply.status === 200
    }))

layer(TestServerWithUpstream(), { excludeTestServices: true, timeout: 120_000 })(
  "usage out of bounds from the upstream",
  (it) => {
    it.effect("is billed within the call's bounds, at most its hold; the hold settled and the log billed, plain and streamed", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        for (const stream of [false, true]) {
          for (const [index, { atHold, counted, name, usage }] of CASES.entries()) {
            const label = `${name}, ${stream ? "streamed" : "plain"}`
            upstream.reset()
            upstream.setBehaviour({ kind: "ok", text: "Hello, team!", usage })
            // An account of its own: its first call holds a reservation (a row to check), not a grant.
            const { accountId, apiKey } = yield* caller(`bounds-${index}-${stream}@example.com`, { sen: 1000 })
            const reply = yield* chat(apiKey, stream)
            expect(reply.status, label).toBe(200)
            expect(reply.done, `${label}: the answer went out whole`).toBe(true)
            const { hold, ledger, log } = yield* booksOf(reply.requestId)
            expect(log.status, label).toBe("billed")
            expect(log.usage_source, label).toBe(counted ? "estimated" : "provider")
            expect(log.output_tokens, `${label}: the answer is billed`).toBeGreaterThan(0)
            expect(log.input_tokens, `${label}: input within the context window`).toBeLessThanOrEqual(CONTEXT_WINDOW)
            expect(log.input_tokens).toBeGreaterThanOrEqual(0)
            expect(log.output_tokens, `${label}: output within the cap`).toBeLessThanOrEqual(MAX_TOKENS)
            expect(log.output_tokens).toBeGreaterThanOrEqual(0)
            expect(log.reasoning_tokens).toBeLessThanOrEqual(log.output_tokens)
            expect(log.cached_tokens).toBeLessThanOrEqual(log.input_tokens)
            for (const count of [log.input_tokens, log.output_tokens, log.reasoning_tokens, log.cached_tokens]) {
              expect(Number.isInteger(count), `${label}: whole counts`).toBe(true)
            }
            const held = hold[0]?.amount ?? 0
            expect(held, `${label}: a reservation`).toBeGreaterThan(0)
            const priced = costOf(DEFAULT_PRICES, log.upstream_model, {
              inputTokens: log.input_tokens,
              cachedTokens: log.cached_tokens,
              outputTokens: log.output_tokens,
              searches: 0,
              pages: 0
            })
            const cost = Math.min(priced, held)
            if (atHold) expect(cost, `${label}: saturated at the hold`).toBe(held)
            expect(log.cost_micro_myr, label).toBe(String(cost))
            expect(ledger, label).toEqual([-cost])
            expect(hold.map((h) => [h.status, h.captured]), label).toEqual([["captured", cost]])
            expect((yield* walletOf(accountId)).reserved, `${label}: nothing left held`).toBe(0)
            expect(yield* violations(accountId), label).toEqual([])
          }
        }
      }))
  }
)
