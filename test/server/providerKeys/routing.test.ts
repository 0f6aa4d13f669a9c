import Anthropic from "@anthropic-ai/sdk"
import { describe, expect, layer } from "@effect/vitest"
import { Effect, Either, Layer } from "effect"
import OpenAI from "openai"
import type { AppConfigShape } from "../../../src/AppConfig.js"
import { randomBase62 } from "../../../src/Domain/Ids.js"
import { microMyr, toMyrString } from "../../../src/Domain/Money.js"
import { costOf, DEFAULT_PRICES } from "../../../src/Domain/Prices.js"
import { parseUpstreams, withUpstreamPrices } from "../../../src/Domain/Upstreams.js"
import { EMBEDDING_MODEL } from "../../../src/Models/Embeddings/EmbeddingsApi.js"
import { PUBLIC_MODEL } from "../../../src/Models/OpenAi/Api.js"
import { makeTestBreakers } from "../../support/Breakers.js"
import { expectClientError } from "../../support/ErrorBody.js"
import { call, createKey, type Reply } from "../../support/Http.js"
import { caller, modelCall, violations, walletOf } from "../../support/Models.js"
import { readSse } from "../../support/Sse.js"
import { webhookOverrides } from "../../support/Stripe.js"
import { query, TestServer, TestServerLive } from "../../support/TestServer.js"
import { Alpha, AlphaAndBeta, Beta, CHEAP } from "../../support/TwoUpstreams.js"
import type { UpstreamServer } from "../../support/Upstream.js"

/**
 * A team's own provider keys on the call path (docs/api/provider-keys.md, "Routing" and "Billing"), through the
 * real server with two upstream stand-ins: `alpha` is nenas's one upstream, `beta` plays the team's provider
 * (allowed on 127.0.0.1 by PROVIDER_ALLOWED_HOSTS). Which stand-in received a call, and with which key, says
 * where it went; the log, the ledger and the wallet say what it cost.
 */

const FIRST_BYTE_MS = 600
const FEE_BPS = 500
const breakers = makeTestBreakers()

const UPSTREAMS = Either.getOrThrow(parseUpstreams(JSON.stringify([{
  name: "alpha",
  base_url: "http://127.0.0.1:9/v1",
  api_key: "sk-alpha",
  models: { general: ["alpha-mini"], reasoning: ["alpha-think"], embedding: ["alpha-embed"] },
  prices: {
    "alpha-mini": CHEAP,
    "alpha-embed": { inputPerMillion: 100_000, cachedInputPerMillion: 100_000, outputPerMillion: 0 }
  }
}])))
const PRICES = withUpstreamPrices(DEFAULT_PRICES, UPSTREAMS)

const configFor = (alphaUrl: string): Partial<AppConfigShape> => ({
  ...webhookOverrides,
  upstreams: UPSTREAMS.map((upstream) => ({ ...upstream, baseUrl: alphaUrl })),
  prices: PRICES,
  providerAllowedHosts: new Set(["127.0.0.1"]),
  byokFeeBps: FEE_BPS,
  upstreamFirstByteTimeoutMs: FIRST_BYTE_MS,
  upstreamTotalTimeoutMs: 5_000
})

const Server = Layer.unwrapEffect(
  Effect.map(Alpha, (alpha) => TestServerLive(configFor(alpha.baseUrl), { breakers: breakers.layer }))
).pipe(Layer.provideMerge(AlphaAndBeta))

/** Odd counts, so that the fee rounds: 1001 input and 333 output tokens. */
const USAGE = { prompt_tokens: 1001, completion_tokens: 333 }
/** What those tokens cost at nenas's alpha-mini: 1001 × RM 1 + 333 × RM 2 per million = 1667 µMYR. */
const FULL = costOf(PRICES, "alpha-mini", {
  inputTokens: 1001,
  cachedTokens: 0,
  outputTokens: 333,
  searches: 0,
  pages: 0
})
/** 5% of the exact 1667 µMYR (1 667 000 000 per million), rounded up once: 83.35 → 84. */
const FEE = Math.ceil((1001 * CHEAP.inputPerMillion + 333 * CHEAP.outputPerMillion) * FEE_BPS / 10_000 / 1_000_000)

const TEAM_MODELS = { general: "team-general", reasoning: "team-think", embedding: "team-embed" }

interface LogRow {
  readonly status: string
  readonly upstream_model: string
  readonly cost_micro_myr: string
  readonly error_code: string | null
  readonly provider_key_id: string | null
  readonly byok_fee_micro_myr: string
  readonly attempts: ReadonlyArray<{ readonly target: string; readonly outcome: string }> | null
}

const logOf = (requestId: string) =>
  Effect.map(
    query<LogRow & Record<string, unknown>>(
      `SELECT status, upstream_model, cost_micro_myr, error_code, provider_key_id, byok_fee_micro_myr, attempts
       FROM request_logs WHERE request_id = $1`,
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

const outcomes = (row: LogRow | undefined) => (row?.attempts ?? []).map((a) => [a.target, a.outcome])

/** Both stand-ins answering with `USAGE`, their records cleared; every breaker closed. */
const fresh = Effect.gen(function*() {
  const alpha = yield* Alpha
  const beta = yield* Beta
  alpha.reset()
  beta.reset()
  breakers.reset()
  alpha.setBehaviour({ kind: "ok", text: "Hello from nenas's upstream.", usage: USAGE })
  beta.setBehaviour({ kind: "ok", text: "Hello from the team's own provider.", usage: USAGE })
  return { alpha, beta }
})

/** A developer with a funded live key, and a provider key on beta in `mode`; its id and its secret. */
const teamWithKey = (
  email: string,
  mode: "first" | "fallback" | "only",
  models: Record<string, unknown> = TEAM_MODELS
) =>
  Effect.gen(function*() {
    const beta = yield* Beta
    const team = yield* caller(email, { sen: 1000 })
    const secret = `sk-team-${randomBase62(24)}`
    const made = yield* call("POST", "/dashboard/provider-keys", {
      token: team.token,
      json: { name: "our provider", base_url: beta.baseUrl, api_key: secret, models, mode }
    })
    expect(made.status, made.text).toBe(201)
    beta.reset()
    beta.setBehaviour({ kind: "ok", text: "Hello from the team's own provider.", usage: USAGE })
    const providerKeyId = (made.body.provider_key as { id: string }).id
    return { ...team, providerKeyId, secret }
  })

type Answer = Reply & { readonly requestId: string }

const answered = (reply: Reply): Answer => ({ ...reply, requestId: reply.headers.get("x-request-id") ?? "" })

const chat = (apiKey: string): Effect.Effect<Answer, never, TestServer> =>
  Effect.map(
    modelCall(apiKey, "/v1/chat/completions", {
      model: PUBLIC_MODEL,
      messages: [{ role: "user", content: "Say hello to the team" }],
      max_tokens: 1000
    }),
    answered
  )

const keyOf = (token: string, id: string) =>
  Effect.map(
    call("GET", "/dashboard/provider-keys", { token }),
    (reply) =>
      (reply.body.provider_keys as ReadonlyArray<{ id: string; status: string; last_error: string | null }>).find((k) =>
        k.id === id
      )
  )

const authorizations = (upstream: UpstreamServer) => upstream.requests.map((r) => r.headers.authorization)

/** The call's cost as its log, its ledger entry and its answer say: all equal to `expected`. */
const expectBilled = (reply: Answer, expected: number) =>
  Effect.gen(function*() {
    const log = yield* logOf(reply.requestId)
    expect(log?.status).toBe("billed")
    expect(Number(log?.cost_micro_myr)).toBe(expected)
    expect(yield* ledgerOf(reply.requestId), "one usage entry").toEqual([-expected])
    expect(reply.body.cost_myr).toBe(toMyrString(microMyr(expected)))
    return log
  })

layer(Server, { excludeTestServices: true, timeout: 120_000 })("provider keys on the call path", (it) => {
  it("the fee is exact: 5% of 1667 µMYR rounds up once to 84", () => {
    expect(FULL).toBe(1667)
    expect(FEE).toBe(84)
  })

  describe("mode first", () => {
    it.effect("the team's provider answers with the team's key and model; billed the fee alone; logged with the key", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        const team = yield* teamWithKey("byok-first@example.com", "first")
        const before = yield* walletOf(team.accountId)
        const reply = yield* chat(team.apiKey)
        expect(reply.status, reply.text).toBe(200)
        expect(JSON.stringify(reply.body)).toContain("Hello from the team's own provider.")
        expect(alpha.requests, "nenas's upstream is not asked").toHaveLength(0)
        expect(authorizations(beta)).toEqual([`Bearer ${team.secret}`])
        expect((beta.requests[0]?.body as { model: string }).model).toBe("team-general")
        const log = yield* expectBilled(reply, FEE)
        expect(log?.provider_key_id).toBe(team.providerKeyId)
        expect(Number(log?.byok_fee_micro_myr)).toBe(FEE)
        expect(log?.upstream_model).toBe("team-general")
        expect(outcomes(log)).toEqual([[`${team.providerKeyId}/team-general`, "ok"]])
        const after = yield* walletOf(team.accountId)
        expect(before.available - after.available).toBe(FEE)
        expect(after.reserved).toBe(0)
        expect(yield* violations(team.accountId)).toEqual([])
        expect((yield* keyOf(team.token, team.providerKeyId))?.status).toBe("ok")
        // The dashboard's log shows the key and the fee.
        const logs = yield* call("GET", "/dashboard/logs?limit=1", { token: team.token })
        const row = (logs.body.logs as ReadonlyArray<Record<string, unknown>>)[0]
        expect(row?.providerKeyId).toBe(team.providerKeyId)
        expect(row?.byokFeeMicroMyr).toBe(FEE)
        expect(row?.costMicroMyr).toBe(FEE)
        // The key's own spend counts the fee, as its monthly limit does.
        const keys = (yield* call("GET", "/dashboard/api-keys", { token: team.token })).body.keys as ReadonlyArray<
          { id: string; month_to_date_spend_micro_myr: number }
        >
        expect(keys.find((k) => k.id === team.keyId)?.month_to_date_spend_micro_myr).toBe(FEE)
        // Usage and the overview count the call apart from nenas-answered ones.
        const overview = yield* call("GET", "/dashboard/overview", { token: team.token })
        const today = overview.body.today_usage as Record<string, number>
        expect([today.requests, today.byokCalls, today.byokFeeMicroMyr, today.costMicroMyr]).toEqual([1, 1, FEE, FEE])
      }))

    it.effect("a 401 from the team's key moves the call to nenas's upstream at nenas's price; the key shows refused", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        const team = yield* teamWithKey("byok-401@example.com", "first")
        beta.setBehaviour({ kind: "status", status: 401, body: { error: { message: "Incorrect API key provided" } } })
        const reply = yield* chat(team.apiKey)
        expect(reply.status, reply.text).toBe(200)
        expect(authorizations(beta)).toEqual([`Bearer ${team.secret}`])
        expect(authorizations(alpha)).toEqual(["Bearer sk-alpha"])
        const log = yield* expectBilled(reply, FULL)
        expect(log?.provider_key_id).toBeNull()
        expect(Number(log?.byok_fee_micro_myr)).toBe(0)
        expect(outcomes(log)).toEqual([[`${team.providerKeyId}/team-general`, "server_error"], [
          "alpha/alpha-mini",
          "ok"
        ]])
        const key = yield* keyOf(team.token, team.providerKeyId)
        expect(key?.status).toBe("refused")
        expect(key?.last_error).toContain("not available")
        expect(key?.last_error ?? "").not.toContain(team.secret)
      }))

    it.effect("a 503 from the team's provider moves the call on; a stream on the key is billed the fee", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        const team = yield* teamWithKey("byok-503@example.com", "first")
        beta.setBehaviour({ kind: "status", status: 503 })
        const moved = yield* chat(team.apiKey)
        expect(moved.status, moved.text).toBe(200)
        expect(alpha.requests).toHaveLength(1)
        yield* expectBilled(moved, FULL)
        expect((yield* keyOf(team.token, team.providerKeyId))?.status).toBe("failing")

        breakers.reset()
        alpha.reset()
        beta.reset()
        beta.setBehaviour({ kind: "ok", text: "Streamed from the team's own provider.", usage: USAGE })
        const { baseUrl } = yield* TestServer
        const streamed = yield* Effect.promise(async () => {
          const response = await fetch(`${baseUrl}/v1/chat/completions`, {
            method: "POST",
            headers: { authorization: `Bearer ${team.apiKey}`, "content-type": "application/json" },
            body: JSON.stringify({
              model: PUBLIC_MODEL,
              messages: [{ role: "user", content: "Say hello" }],
              stream: true,
              stream_options: { include_usage: true }
            }),
            signal: AbortSignal.timeout(20_000)
          })
          return { requestId: response.headers.get("x-request-id") ?? "", events: await readSse(response) }
        })
        expect(streamed.events.length).toBeGreaterThan(2)
        expect(alpha.requests).toHaveLength(0)
        expect(authorizations(beta)).toEqual([`Bearer ${team.secret}`])
        const log = yield* Effect.flatMap(Effect.sleep("300 millis"), () => logOf(streamed.requestId))
        expect(Number(log?.cost_micro_myr)).toBe(FEE)
        expect(Number(log?.byok_fee_micro_myr)).toBe(FEE)
        expect(yield* ledgerOf(streamed.requestId)).toEqual([-FEE])
        expect((yield* keyOf(team.token, team.providerKeyId))?.status).toBe("ok")
      }))

    it.effect("the key's breaker open: the key is skipped without a request; /readyz shows nenas's breakers only", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        const team = yield* teamWithKey("byok-breaker@example.com", "first")
        const target = `${team.providerKeyId}/team-general`
        breakers.open(`provider_key:${target}`, Date.now() + 60_000)
        breakers.open("alpha/alpha-think", Date.now() + 60_000)
        const reply = yield* chat(team.apiKey)
        expect(reply.status, reply.text).toBe(200)
        expect(beta.requests).toHaveLength(0)
        expect(alpha.requests).toHaveLength(1)
        expect(outcomes(yield* logOf(reply.requestId))).toEqual([[target, "breaker_open"], ["alpha/alpha-mini", "ok"]])
        const ready = yield* call("GET", "/readyz")
        const open = (ready.body.upstreams as { open: ReadonlyArray<{ target: string }> }).open.map((o) => o.target)
        expect(open).toEqual(["alpha/alpha-think"])
        const metrics = yield* call("GET", "/metrics")
        expect(metrics.text).not.toContain(team.providerKeyId)
        breakers.reset()
      }))
  })

  describe("mode fallback", () => {
    it.effect("nenas's upstream answers first; when it fails, the team's key answers and the call costs the fee", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        const team = yield* teamWithKey("byok-fallback@example.com", "fallback")
        const first = yield* chat(team.apiKey)
        expect(first.status, first.text).toBe(200)
        expect(beta.requests, "the team's key waits behind nenas's").toHaveLength(0)
        yield* expectBilled(first, FULL)

        alpha.setBehaviour({ kind: "status", status: 503 })
        const moved = yield* chat(team.apiKey)
        expect(moved.status, moved.text).toBe(200)
        expect(authorizations(beta)).toEqual([`Bearer ${team.secret}`])
        const log = yield* expectBilled(moved, FEE)
        expect(log?.provider_key_id).toBe(team.providerKeyId)
        expect(outcomes(log)).toEqual([["alpha/alpha-mini", "server_error"], [
          `${team.providerKeyId}/team-general`,
          "ok"
        ]])
      }))
  })

  describe("mode only", () => {
    it.effect("nenas's upstream is never asked, even down; the real openai SDK gets the team's answer at the fee", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        alpha.setBehaviour({ kind: "status", status: 503 })
        const team = yield* teamWithKey("byok-only@example.com", "only")
        const { baseUrl } = yield* TestServer
        const client = new OpenAI({ apiKey: team.apiKey, baseURL: `${baseUrl}/v1`, maxRetries: 0 })
        const answer = yield* Effect.promise(() =>
          client.chat.completions.create({ model: PUBLIC_MODEL, messages: [{ role: "user", content: "Hello" }] })
        )
        expect(answer.choices[0]?.message.content).toBe("Hello from the team's own provider.")
        expect(alpha.requests).toHaveLength(0)
        expect(authorizations(beta)).toEqual([`Bearer ${team.secret}`])
        const rows = yield* query<{ byok_fee_micro_myr: string; provider_key_id: string }>(
          "SELECT byok_fee_micro_myr, provider_key_id FROM request_logs WHERE account_id = $1",
          [team.accountId]
        )
        expect(rows.map((r) => [r.provider_key_id, Number(r.byok_fee_micro_myr)])).toEqual([[team.providerKeyId, FEE]])
      }))

    it.effect("a refused key answers 502 provider_key_refused, costs nothing, and nenas's upstream is not asked", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        const team = yield* teamWithKey("byok-only-401@example.com", "only")
        const before = yield* walletOf(team.accountId)
        beta.setBehaviour({ kind: "status", status: 403, body: { error: { message: "forbidden" } } })
        const reply = yield* chat(team.apiKey)
        expectClientError(reply, { status: 502, code: "provider_key_refused" })
        expect((reply.body.error as { guidance: string }).guidance).toContain("/dashboard/provider-keys")
        expect((reply.body.error as { retryable: boolean }).retryable).toBe(false)
        expect(alpha.requests).toHaveLength(0)
        const log = yield* logOf(reply.requestId)
        expect(log?.status).toBe("failed")
        expect(log?.error_code).toBe("provider_key_refused")
        expect(Number(log?.cost_micro_myr)).toBe(0)
        expect(yield* ledgerOf(reply.requestId)).toEqual([])
        const after = yield* walletOf(team.accountId)
        expect(after.available).toBe(before.available)
        expect(after.reserved).toBe(0)
        expect((yield* keyOf(team.token, team.providerKeyId))?.status).toBe("refused")
      }))

    it.effect("embeddings go to the key's embedding model and cost the fee of nenas's embedding price", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        const team = yield* teamWithKey("byok-embed@example.com", "only")
        const reply = answered(
          yield* modelCall(team.apiKey, "/v1/embeddings", { model: EMBEDDING_MODEL, input: "hello team" })
        )
        expect(reply.status, reply.text).toBe(200)
        expect(alpha.requests).toHaveLength(0)
        expect(beta.requests.map((r) => [r.path, (r.body as { model: string }).model])).toEqual([[
          "/v1/embeddings",
          "team-embed"
        ]])
        const log = yield* logOf(reply.requestId)
        expect(log?.provider_key_id).toBe(team.providerKeyId)
        expect(Number(log?.byok_fee_micro_myr)).toBe(Number(log?.cost_micro_myr))
      }))
  })

  describe("who is routed", () => {
    it.effect("another account's calls and the team's test keys never reach the team's provider", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        const team = yield* teamWithKey("byok-owner@example.com", "only")
        const testKey = yield* createKey(team.token, { name: "test key", environment: "test" })
        const simulated = yield* chat(testKey.full_key)
        expect(simulated.status, simulated.text).toBe(200)
        expect(beta.requests, "a test key's call runs on the built-in model").toHaveLength(0)
        expect(alpha.requests).toHaveLength(0)
        const other = yield* caller("byok-other@example.com", { sen: 1000 })
        const reply = yield* chat(other.apiKey)
        expect(reply.status, reply.text).toBe(200)
        expect(beta.requests).toHaveLength(0)
        expect(authorizations(alpha)).toEqual(["Bearer sk-alpha"])
        yield* expectBilled(reply, FULL)
      }))
  })

  describe("every endpoint", () => {
    it.effect("Messages (Anthropic's SDK) and Responses with tools go to the team's key, each billed the fee", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        const team = yield* teamWithKey("byok-endpoints@example.com", "first")
        const { baseUrl } = yield* TestServer
        const anthropic = new Anthropic({ baseURL: baseUrl, apiKey: team.apiKey, maxRetries: 0 })
        const message = yield* Effect.promise(() =>
          anthropic.messages.create({
            model: PUBLIC_MODEL,
            max_tokens: 1000,
            messages: [{ role: "user", content: "Say hello to the team" }]
          })
        )
        expect(message.content[0]?.type === "text" ? message.content[0].text : "").toBe(
          "Hello from the team's own provider."
        )

        beta.setBehaviour({
          kind: "ok",
          usage: USAGE,
          toolCalls: [{ name: "get_weather", arguments: "{\"city\":\"Ipoh\"}" }]
        })
        const tools = answered(
          yield* modelCall(team.apiKey, "/v1/responses", {
            model: PUBLIC_MODEL,
            input: "What is the weather in Ipoh?",
            tools: [{
              type: "function",
              name: "get_weather",
              parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] }
            }]
          })
        )
        expect(tools.status, tools.text).toBe(200)
        expect(JSON.stringify(tools.body.output)).toContain("get_weather")
        const sent = beta.requests.map((r) => r.body as { model: string; tools?: ReadonlyArray<unknown> })
        expect(sent.map((body) => [body.model, body.tools?.length ?? 0])).toEqual([["team-general", 0], [
          "team-general",
          1
        ]])
        expect(alpha.requests).toHaveLength(0)
        const rows = yield* query<{ endpoint: string; byok_fee_micro_myr: string; cost_micro_myr: string }>(
          "SELECT endpoint, byok_fee_micro_myr, cost_micro_myr FROM request_logs WHERE account_id = $1 ORDER BY created_at",
          [team.accountId]
        )
        expect(rows.map((r) => [r.endpoint, Number(r.byok_fee_micro_myr), Number(r.cost_micro_myr)])).toEqual([
          ["/v1/messages", FEE, FEE],
          ["/v1/responses", FEE, FEE]
        ])
      }))
  })

  describe("under concurrency", () => {
    it.effect("24 calls at once, every other one refused by the team's key: each billed once, fee or full, none lost", () =>
      Effect.gen(function*() {
        const { alpha, beta } = yield* fresh
        const team = yield* teamWithKey("byok-race@example.com", "first")
        let asked = 0
        beta.setBehaviour({
          kind: "perRequest",
          choose: () =>
            asked++ % 2 === 0
              ? { kind: "ok", text: "Hello from the team's own provider.", usage: USAGE }
              : { kind: "status", status: 503 }
        })
        const before = yield* walletOf(team.accountId)
        const replies = yield* Effect.all(Array.from({ length: 24 }, () => chat(team.apiKey)), {
          concurrency: "unbounded"
        })
        expect(replies.map((r) => r.status)).toEqual(replies.map(() => 200))
        expect(beta.requests).toHaveLength(24)
        expect(alpha.requests, "the 12 the key refused").toHaveLength(12)
        const costs = yield* Effect.forEach(replies, (reply) =>
          Effect.gen(function*() {
            const log = yield* logOf(reply.requestId)
            const ledger = yield* ledgerOf(reply.requestId)
            const cost = Number(log?.cost_micro_myr)
            expect(ledger, "one usage entry, the log's cost").toEqual([-cost])
            expect(Number(log?.byok_fee_micro_myr)).toBe(log?.provider_key_id === null ? 0 : FEE)
            return cost
          }))
        expect([...costs].sort((x, y) => x - y)).toEqual([...Array(12).fill(FEE), ...Array(12).fill(FULL)])
        const after = yield* walletOf(team.accountId)
        expect(before.available - after.available).toBe(12 * FEE + 12 * FULL)
        expect(after.reserved).toBe(0)
        expect(yield* violations(team.accountId)).toEqual([])
      }))
  })
})
