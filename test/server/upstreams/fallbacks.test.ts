import { describe, expect, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import OpenAI from "openai"
import type { AppConfigShape } from "../../../src/AppConfig.js"
import { freePort } from "../../../src/Database/EmbeddedPostgres.js"
import { fromMyr, microMyr, toMyrString } from "../../../src/Domain/Money.js"
import { costOf, DEFAULT_PRICES, withSafetyMargin } from "../../../src/Domain/Prices.js"
import { countMessages, countText } from "../../../src/Domain/Tokens.js"
import { withUpstreamPrices } from "../../../src/Domain/Upstreams.js"
import { PUBLIC_MODEL } from "../../../src/Models/OpenAi/Api.js"
import { makeTestBreakers } from "../../support/Breakers.js"
import { call } from "../../support/Http.js"
import { caller, modelCall, violations } from "../../support/Models.js"
import { readSse, type SseEvent, sseJson } from "../../support/Sse.js"
import { webhookOverrides } from "../../support/Stripe.js"
import { query, TestServer, TestServerLive } from "../../support/TestServer.js"
import { Alpha, AlphaAndBeta, Beta, TWO_UPSTREAM_PRICES, upstreamsOf } from "../../support/TwoUpstreams.js"
import { eventually } from "../../support/WebhookReceiver.js"

/**
 * Fallbacks across upstreams
 * (docs/operations.md, "Several upstreams and fallbacks";
 * docs/api/models.md, "Model API details"): the real service over HTTP with two
 * upstream stand-ins, `alpha` (the category's first target, cheap) and `beta`
 * (its fallback, dear), real timing and chunked streams, and breakers a test
 * opens by hand. Every call is billed once, at the prices of the model that
 * answered, within its hold.
 */

const FIRST_BYTE_MS = 600
const breakers = makeTestBreakers()

const configFor = (alphaUrl: string, betaUrl: string): Partial<AppConfigShape> => {
  const upstreams = upstreamsOf(alphaUrl, betaUrl)
  return {
    ...webhookOverrides,
    upstreams,
    prices: withUpstreamPrices(DEFAULT_PRICES, upstreams),
    upstreamFirstByteTimeoutMs: FIRST_BYTE_MS,
    upstreamTotalTimeoutMs: 5_000
  }
}

/** The service over alpha then beta (`alphaUrl` instead of alpha's own: an address nothing listens on). */
const serverOver = (alphaUrl?: string) =>
  Layer.unwrapEffect(Effect.gen(function*() {
    const alpha = yield* Alpha
    const beta = yield* Beta
    return TestServerLive(configFor(alphaUrl ?? alpha.baseUrl, beta.baseUrl), { breakers: breakers.layer })
  })).pipe(Layer.provideMerge(AlphaAndBeta))

const PRICES = TWO_UPSTREAM_PRICES
const PROMPT = "Say hello to the team in a friendly way"
const MESSAGES = [{ role: "user" as const, content: PROMPT }]
/** The usage beta reports: its price, not alpha's, is what the call costs. */
const USAGE = { prompt_tokens: 1000, completion_tokens: 500 }
const usageCost = (model: string) =>
  costOf(PRICES, model, { inputTokens: 1000, cachedTokens: 0, outputTokens: 500, searches: 0, pages: 0 })
/** What a call with `max_output_tokens` set holds at `model`'s prices. */
const holdAt = (model: string, maxOutput: number) =>
  costOf(PRICES, model, {
    inputTokens: withSafetyMargin(countMessages(MESSAGES)),
    cachedTokens: 0,
    outputTokens: maxOutput,
    searches: 0,
    pages: 0
  })

interface LogRow {
  readonly status: string
  readonly upstream_model: string
  readonly cost_micro_myr: string
  readonly error_code: string | null
  readonly usage_source: string
  readonly attempts:
    | ReadonlyArray<{ readonly target: string; readonly outcome: string; readonly latency_ms: number }>
    | null
}

const logOf = (requestId: string) =>
  Effect.map(
    query<LogRow & Record<string, unknown>>(
      "SELECT status, upstream_model, cost_micro_myr, error_code, usage_source, attempts FROM request_logs WHERE request_id = $1",
      [requestId]
    ),
    (rows) => rows[0]
  )

const ledgerOf = (requestId: string) =>
  Effect.map(
    query<{ amount_micro_myr: string }>(
      "SELECT amount_micro_myr FROM ledger_entries WHERE type = 'usage' AND request_id = $1",
      [requestId]
    ),
    (rows) => rows.map((r) => Number(r.amount_micro_myr))
  )

const holdOf = (requestId: string) =>
  Effect.map(
    query<{ amount_micro_myr: string; captured_micro_myr: string | null }>(
      "SELECT amount_micro_myr, captured_micro_myr FROM reservations WHERE request_id = $1",
      [requestId]
    ),
    (rows) =>
      rows.map((r) => ({
        amount: Number(r.amount_micro_myr),
        captured: r.captured_micro_myr === null ? null : Number(r.captured_micro_myr)
      }))
  )

const outcomes = (row: LogRow | undefined) => (row?.attempts ?? []).map((a) => [a.target, a.outcome])

interface ResponseBody {
  readonly output_text: string
  readonly request_id: string
  readonly usage: { readonly cost_myr: string }
  readonly routing: {
    readonly category: string
    readonly upstream_model: string
    readonly reasoning: string
    readonly fallback?: boolean
  }
  readonly error?: { readonly code: string; readonly param: string | null; readonly retry_after_seconds?: number }
}

const responses = (apiKey: string, json: Record<string, unknown> = {}, headers: Record<string, string> = {}) =>
  Effect.map(modelCall(apiKey, "/v1/responses", { model: PUBLIC_MODEL, input: PROMPT, ...json }, headers), (reply) => ({
    ...reply,
    json: reply.body as ResponseBody
  }))

const streamed = (apiKey: string, path: "/v1/chat/completions" | "/v1/responses") =>
  Effect.flatMap(TestServer, ({ baseUrl }) =>
    Effect.promise(async () => {
      const response = await fetch(`${baseUrl}${path}`, {
        method: "POST",
        headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
        body: JSON.stringify(
          path === "/v1/responses"
            ? { model: PUBLIC_MODEL, input: PROMPT, stream: true }
            : { model: PUBLIC_MODEL, messages: MESSAGES, stream: true }
        ),
        signal: AbortSignal.timeout(20_000)
      })
      const events: ReadonlyArray<SseEvent> = await readSse(response)
      return { status: response.status, requestId: response.headers.get("x-request-id") ?? "", events }
    }))

/** Both stand-ins answering, their records cleared; every breaker closed. */
const fresh = Effect.gen(function*() {
  const alpha = yield* Alpha
  const beta = yield* Beta
  alpha.reset()
  beta.reset()
  breakers.reset()
  beta.setBehaviour({ kind: "ok", text: "Hello from beta, team!", usage: USAGE })
  return { alpha, beta }
})

layer(serverOver(), { excludeTestServices: true, timeout: 120_000 })("fallbacks across upstreams", (it) => {
  describe("before the first byte, the next target answers", () => {
    const failures = [
      ["a 503", { kind: "status", status: 503 }, "server_error"],
      ["a 429 without Retry-After", { kind: "status", status: 429 }, "rate_limited"],
      ["silence past its share of the first-byte deadline", { kind: "hang" }, "first_byte_timeout"]
    ] as const
    for (const [what, behaviour, outcome] of failures) {
      it.effect(`alpha answers ${what}: beta answers, billed at beta's price; routing names beta-large and says fallback`, () =>
        Effect.gen(function*() {
          const { alpha, beta } = yield* fresh
          alpha.setBehaviour(behaviour)
          const { accountId, apiKey } = yield* caller(`fallback-${outcome}@example.com`, { sen: 1000 })
          const started = Date.now()
          const reply = yield* responses(apiKey, { max_output_tokens: 1000 })
          const took = Date.now() - started
          expect(reply.status, reply.text).toBe(200)
          expect(reply.json.output_text).toBe("Hello from beta, team!")
          expect(reply.json.routing.upstream_model).toBe("beta-large")
          expect(reply.json.routing.fallback).toBe(true)
          expect(reply.json.routing.reasoning).toContain(
            `beta/beta-large answered as a fallback after alpha/alpha-mini (${outcome.replaceAll("_", " ")})`
          )
          // Beta's price, not alpha's: 1000 input and 500 output tokens at RM 5 and RM 20 per million.
          expect(usageCost("beta-large")).toBe(15_000)
          expect(usageCost("alpha-mini")).toBe(2_000)
          expect(reply.json.usage.cost_myr).toBe(toMyrString(usageCost("beta-large")))
          expect(alpha.requests.length, "alpha was tried once").toBe(1)
          expect((beta.requests[0]?.body as { model: string }).model).toBe("beta-large")
          expect(beta.requests[0]?.headers.authorization, "beta's own key").toBe("Bearer sk-beta")
          if (outcome === "first_byte_timeout") {
            // Alpha had half of the 600 ms budget (two targets), then beta the rest.
            expect(took, "alpha's share of the deadline, then beta").toBeGreaterThanOrEqual(FIRST_BYTE_MS / 2)
            expect(took).toBeLessThan(FIRST_BYTE_MS + 1_000)
          }
          const log = yield* logOf(reply.json.request_id)
          expect(log?.status).toBe("billed")
          expect(log?.upstream_model).toBe("beta-large")
          expect(Number(log?.cost_micro_myr)).toBe(15_000)
          expect(outcomes(log)).toEqual([["alpha/alpha-mini", outcome], ["beta/beta-large", "ok"]])
          expect(yield* ledgerOf(reply.json.request_id), "one usage entry, at beta's price").toEqual([-15_000])
          // The hold covered the dearest target the call could reach.
          expect(yield* holdOf(reply.json.request_id)).toEqual([{
            amount: holdAt("beta-large", 1000),
            captured: 15_000
          }])
          expect(breakers.recorded.map((r) => [r.target, r.outcome._tag])).toEqual([
            ["alpha/alpha-mini", "Failure"],
            ["beta/beta-large", "Success"]
          ])
          expect(yield* violations(accountId)).toEqual([])
        }))
    }

    it.effect("alpha answers 429 with Retry-After: 2: beta answers; the next call skips alpha without a request, until then", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        alpha.setBehaviour({ kind: "status", status: 429, retryAfter: "2" })
        const { apiKey } = yield* caller("fallback-retry-after@example.com", { sen: 1000 })
        const first = yield* responses(apiKey)
        expect(first.status, first.text).toBe(200)
        expect(first.json.routing.upstream_model).toBe("beta-large")
        expect(breakers.recorded[0]).toEqual({
          target: "alpha/alpha-mini",
          outcome: { _tag: "Failure", retryAfterMs: 2000 }
        })
        alpha.setBehaviour({ kind: "ok" })
        const second = yield* responses(apiKey)
        expect(second.status, second.text).toBe(200)
        expect(second.json.routing.upstream_model).toBe("beta-large")
        expect(second.json.routing.reasoning).toContain("alpha/alpha-mini (breaker open)")
        expect(alpha.requests.length, "no request reached alpha on the second call").toBe(1)
        expect(beta.requests.length).toBe(2)
        expect(outcomes(yield* logOf(second.json.request_id))).toEqual([["alpha/alpha-mini", "breaker_open"], [
          "beta/beta-large",
          "ok"
        ]])
      }))

    it.effect("a streamed chat call falls back too: beta's chunks, [DONE], billed at beta's price", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        alpha.setBehaviour({ kind: "status", status: 502 })
        const { apiKey } = yield* caller("fallback-stream@example.com", { sen: 1000 })
        const reply = yield* streamed(apiKey, "/v1/chat/completions")
        expect(reply.status).toBe(200)
        const chunks = sseJson<{ choices?: ReadonlyArray<{ delta?: { content?: string } }> }>(reply.events)
        expect(chunks[chunks.length - 1]).toBe("[DONE]")
        const text = chunks.map((c) => c === "[DONE]" ? "" : c.choices?.[0]?.delta?.content ?? "").join("")
        expect(text).toBe("Hello from beta, team!")
        expect(beta.requests.length).toBe(1)
        const log = yield* logOf(reply.requestId)
        expect(log?.upstream_model).toBe("beta-large")
        expect(Number(log?.cost_micro_myr)).toBe(usageCost("beta-large"))
        expect(yield* ledgerOf(reply.requestId)).toEqual([-usageCost("beta-large")])
      }))
  })

  describe("what is not retried elsewhere", () => {
    it.effect("a 400 refusal is the caller's: 400 invalid_request, beta gets no request, nothing billed", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        alpha.setBehaviour({
          kind: "status",
          status: 400,
          body: { error: { message: "temperature is out of range", type: "invalid_request_error" } }
        })
        const { apiKey } = yield* caller("fallback-400@example.com", { sen: 1000 })
        const reply = yield* responses(apiKey)
        expect(reply.status, reply.text).toBe(400)
        expect(reply.json.error?.code).toBe("invalid_request")
        expect(beta.requests.length, "beta got no request").toBe(0)
        const requestId = reply.headers.get("x-request-id") ?? ""
        const log = yield* logOf(requestId)
        expect(log?.status).toBe("failed")
        expect(outcomes(log)).toEqual([["alpha/alpha-mini", "refused"]])
        expect(yield* ledgerOf(requestId)).toEqual([])
        // A refusal says the upstream is up.
        expect(breakers.recorded).toEqual([{ target: "alpha/alpha-mini", outcome: { _tag: "Success" } }])
      }))

    for (const path of ["/v1/chat/completions", "/v1/responses"] as const) {
      it.effect(`${path}: a stream cut after its first byte does not switch: an error at the client, billed for what came, log billed with error_code`, () =>
        Effect.gen(function*() {
          const { alpha, beta } = yield* fresh
          alpha.setBehaviour({ kind: "resetMidStream", afterChunks: 3 })
          const { accountId, apiKey } = yield* caller(`fallback-cut-${path.length}@example.com`, { sen: 1000 })
          const reply = yield* streamed(apiKey, path)
          expect(reply.status).toBe(200)
          expect(beta.requests.length, "no switch after the first byte").toBe(0)
          let produced: string
          if (path === "/v1/chat/completions") {
            const chunks = sseJson<
              { choices?: ReadonlyArray<{ delta?: { content?: string } }>; error?: { code: string } }
            >(reply.events)
            expect(chunks.includes("[DONE]"), "no [DONE]").toBe(false)
            const last = chunks[chunks.length - 1]
            expect(last !== "[DONE]" && last?.error?.code).toBe("provider_unavailable")
            produced = chunks.map((c) => c === "[DONE]" ? "" : c.choices?.[0]?.delta?.content ?? "").join("")
          } else {
            const events = reply.events.map((e) => JSON.parse(e.data) as { type: string; delta?: string })
            expect(events[events.length - 1]?.type).toBe("response.failed")
            expect(events.some((e) => e.type === "response.completed")).toBe(false)
            produced = events.map((e) => e.type === "response.output_text.delta" ? e.delta ?? "" : "").join("")
          }
          expect(produced.length, "three chunks came through").toBeGreaterThan(0)
          const cost = costOf(PRICES, "alpha-mini", {
            inputTokens: countMessages(MESSAGES),
            cachedTokens: 0,
            outputTokens: countText(produced),
            searches: 0,
            pages: 0
          })
          const log = yield* logOf(reply.requestId)
          expect(log).toMatchObject({
            status: "billed",
            error_code: "provider_unavailable",
            usage_source: "estimated",
            upstream_model: "alpha-mini"
          })
          expect(Number(log?.cost_micro_myr)).toBe(cost)
          expect(outcomes(log)).toEqual([["alpha/alpha-mini", "cut_short"]])
          expect(yield* ledgerOf(reply.requestId)).toEqual([-cost])
          expect(yield* violations(accountId)).toEqual([])
        }))
    }
  })

  it.effect("a client gone mid-stream is no failure of the upstream's: its breaker hears only the success, its attempt stays ok", () =>
    Effect.gen(function*() {
      const { alpha, beta } = yield* fresh
      alpha.setBehaviour({ kind: "ok", text: "word ".repeat(200), usage: USAGE, chunkDelayMs: 50 })
      const { accountId, apiKey } = yield* caller("fallback-client-gone@example.com", { sen: 1000 })
      const { baseUrl } = yield* TestServer
      const requestId = yield* Effect.promise(async () => {
        const aborter = new AbortController()
        const response = await fetch(`${baseUrl}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
          body: JSON.stringify({ model: PUBLIC_MODEL, messages: MESSAGES, stream: true }),
          signal: aborter.signal
        })
        const reader = response.body!.getReader()
        let received = ""
        while (received.split("\n\n").length < 5) received += new TextDecoder().decode((await reader.read()).value)
        aborter.abort()
        return response.headers.get("x-request-id") ?? ""
      })
      const log = yield* eventually(
        "the call's log settled",
        logOf(requestId),
        (row) => row !== undefined && row.status !== "pending"
      )
      expect(log).toMatchObject({
        status: "billed",
        usage_source: "estimated",
        upstream_model: "alpha-mini",
        error_code: null
      })
      expect(outcomes(log)).toEqual([["alpha/alpha-mini", "ok"]])
      expect(breakers.recorded).toEqual([{ target: "alpha/alpha-mini", outcome: { _tag: "Success" } }])
      expect(beta.requests.length).toBe(0)
      expect(yield* violations(accountId)).toEqual([])
    }))

  describe("money", () => {
    it.effect("max_total_cost_myr between alpha's and beta's estimates: refused before it runs (the dearest target counts)", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        const { apiKey } = yield* caller("fallback-cap@example.com", { sen: 1000 })
        const cheap = holdAt("alpha-mini", 1000)
        const dear = holdAt("beta-large", 1000)
        expect(cheap).toBeLessThan(dear)
        const between = Number(toMyrString(microMyr(Math.floor((cheap + dear) / 2))))
        const reply = yield* responses(apiKey, { max_output_tokens: 1000, max_total_cost_myr: between })
        expect(reply.status, reply.text).toBe(400)
        expect(reply.json.error?.code).toBe("invalid_request")
        expect(reply.json.error?.param).toBe("max_total_cost_myr")
        expect(alpha.requests.length + beta.requests.length, "nothing ran").toBe(0)
      }))

    it.effect("a dearer fallback whose usage exceeds the hold is billed the hold, never more; within max_total_cost_myr", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        alpha.setBehaviour({ kind: "status", status: 500 })
        beta.setBehaviour({
          kind: "ok",
          text: "A long answer.",
          usage: { prompt_tokens: 1000, completion_tokens: 100_000 }
        })
        const { accountId, apiKey } = yield* caller("fallback-ceiling@example.com", { sen: 1000 })
        const hold = holdAt("beta-large", 100)
        const cap = Number(toMyrString(hold)) + 0.01
        const reply = yield* responses(apiKey, { max_output_tokens: 100, max_total_cost_myr: cap })
        expect(reply.status, reply.text).toBe(200)
        expect(reply.json.routing.upstream_model).toBe("beta-large")
        expect(reply.json.usage.cost_myr, "billed the hold, not beta's 100,000 tokens").toBe(toMyrString(hold))
        expect(hold).toBeLessThanOrEqual(fromMyr(cap))
        expect(yield* ledgerOf(reply.json.request_id)).toEqual([-hold])
        expect(yield* holdOf(reply.json.request_id)).toEqual([{ amount: hold, captured: hold }])
        expect(yield* violations(accountId)).toEqual([])
      }))
  })

  describe("breakers", () => {
    it.effect("every target open: 503 provider_unavailable with retry_after_seconds to the earliest half-open, no request", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        const { apiKey } = yield* caller("fallback-all-open@example.com", { sen: 1000 })
        const now = Date.now()
        breakers.open("alpha/alpha-mini", now + 9_000)
        // Well within the last second before 5 s: the call's own time does not round it down.
        breakers.open("beta/beta-large", now + 4_700)
        const reply = yield* responses(apiKey)
        expect(reply.status, reply.text).toBe(503)
        expect(reply.json.error?.code).toBe("provider_unavailable")
        expect(reply.json.error?.retry_after_seconds).toBe(5)
        expect(reply.headers.get("retry-after")).toBe("5")
        expect(alpha.requests.length + beta.requests.length).toBe(0)
        const log = yield* logOf(reply.headers.get("x-request-id") ?? "")
        expect(log?.status).toBe("failed")
        expect(outcomes(log)).toEqual([["alpha/alpha-mini", "breaker_open"], ["beta/beta-large", "breaker_open"]])
      }))

    it.effect("the dashboard's log record lists the attempts: target, outcome, latencyMs", () =>
      Effect.gen(function*() {
        const { alpha } = yield* fresh
        alpha.setBehaviour({ kind: "status", status: 503 })
        const { apiKey, token } = yield* caller("fallback-dashboard@example.com", { sen: 1000 })
        const reply = yield* responses(apiKey)
        expect(reply.status).toBe(200)
        const page = yield* call("GET", "/dashboard/logs", { token })
        const entries = (page.body as {
          logs: ReadonlyArray<
            { requestId: string; attempts: ReadonlyArray<{ target: string; outcome: string; latencyMs: number }> }
          >
        }).logs
        const entry = entries.find((e) => e.requestId === reply.json.request_id)
        expect(entry?.attempts.map((a) => [a.target, a.outcome])).toEqual([["alpha/alpha-mini", "server_error"], [
          "beta/beta-large",
          "ok"
        ]])
        for (const attempt of entry?.attempts ?? []) {
          expect(Number.isInteger(attempt.latencyMs) && attempt.latencyMs >= 0).toBe(true)
        }
      }))
  })

  describe("test keys", () => {
    it.effect("a test key's call never reaches an upstream, whichever fails: the built-in model answers, nothing is held", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        alpha.setBehaviour({ kind: "status", status: 503 })
        const { apiKey } = yield* caller("fallback-test-key@example.com", { environment: "test" })
        const reply = yield* responses(apiKey)
        expect(reply.status, reply.text).toBe(200)
        expect(reply.json.routing.fallback).toBe(false)
        expect(alpha.requests.length + beta.requests.length).toBe(0)
        expect(yield* holdOf(reply.json.request_id)).toEqual([])
      }))
  })

  describe("replays and SDKs", () => {
    it.effect("an idempotent replay returns the first answer, beta's, though alpha answers again; billed once", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        alpha.setBehaviour({ kind: "status", status: 503 })
        const { apiKey } = yield* caller("fallback-replay@example.com", { sen: 1000 })
        const headers = { "Idempotency-Key": "fallback-replay-1" }
        const first = yield* responses(apiKey, {}, headers)
        expect(first.status, first.text).toBe(200)
        expect(first.json.routing.upstream_model).toBe("beta-large")
        alpha.setBehaviour({ kind: "ok" })
        const again = yield* responses(apiKey, {}, headers)
        expect(again.status).toBe(200)
        expect(again.headers.get("idempotent-replayed")).toBe("true")
        expect(again.text).toBe(first.text)
        expect(alpha.requests.length + beta.requests.length, "nothing ran again").toBe(2)
        expect(yield* ledgerOf(first.json.request_id)).toEqual([-usageCost("beta-large")])
      }))

    it.effect("OpenAI's SDK: responses.create while alpha fails answers from beta, routing naming it", () =>
      Effect.gen(function*() {
        const { alpha } = yield* fresh
        alpha.setBehaviour({ kind: "status", status: 503 })
        const { apiKey } = yield* caller("fallback-sdk@example.com", { sen: 1000 })
        const { baseUrl } = yield* TestServer
        const client = new OpenAI({ apiKey, baseURL: `${baseUrl}/v1`, maxRetries: 0 })
        const response = yield* Effect.promise(() => client.responses.create({ model: PUBLIC_MODEL, input: PROMPT }))
        expect(response.output_text).toBe("Hello from beta, team!")
        const routing = (response as unknown as ResponseBody).routing
        expect(routing).toMatchObject({ upstream_model: "beta-large", fallback: true, category: "general" })
        const chat = yield* Effect.promise(() =>
          client.chat.completions.create({ model: PUBLIC_MODEL, messages: MESSAGES })
        )
        expect(chat.choices[0]?.message.content).toBe("Hello from beta, team!")
      }))
  })
})

const closedPort = Effect.promise(freePort)

layer(
  Layer.unwrapEffect(Effect.map(closedPort, (port) => serverOver(`http://127.0.0.1:${port}/v1`))),
  { excludeTestServices: true, timeout: 60_000 }
)("a primary that is down", (it) => {
  it.effect("connection refused at alpha's address: beta answers at once, billed at beta's price", () =>
    Effect.gen(function*() {
      const { beta } = yield* fresh
      const { apiKey } = yield* caller("fallback-down@example.com", { sen: 1000 })
      const started = Date.now()
      const reply = yield* responses(apiKey)
      expect(reply.status, reply.text).toBe(200)
      // Waiting out alpha's deadline would take the whole of it and beta's answer besides; the first call of a
      // cold server on a loaded machine takes a few hundred milliseconds (392 ms once in CI), so the bound is the deadline.
      expect(Date.now() - started, "no deadline waited out").toBeLessThan(FIRST_BYTE_MS)
      expect(reply.json.routing.upstream_model).toBe("beta-large")
      expect(reply.json.usage.cost_myr).toBe(toMyrString(usageCost("beta-large")))
      expect(beta.requests.length).toBe(1)
      expect(outcomes(yield* logOf(reply.json.request_id))).toEqual([["alpha/alpha-mini", "connection_error"], [
        "beta/beta-large",
        "ok"
      ]])
    }))
})
