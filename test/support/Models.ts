import { Effect, Layer, Option } from "effect"
import type { AppConfigShape } from "../../src/AppConfig.js"
import { PUBLIC_MODEL } from "../../src/Models/OpenAi/Api.js"
import { alwaysClosed } from "./Breakers.js"
import { call, createKey } from "./Http.js"
import { readSse, sseJson } from "./Sse.js"
import { topUp, webhookOverrides } from "./Stripe.js"
import { query, TestServer, TestServerLive } from "./TestServer.js"
import { Upstream } from "./Upstream.js"
import { developer, walletInstance } from "./Wallet.js"

/**
 * The whole service pointed at the local upstream double (`Upstream`), with
 * the test webhook secret so `topUp` works; `overrides` replace configuration.
 * Its one target's circuit breaker never opens: these
 * tests provoke failures one after another on the same upstream (the
 * breakers' own tests are test/breakers*.test.ts and test/fallbacks.test.ts).
 */
export const TestServerWithUpstream = (overrides: Partial<AppConfigShape> = {}) =>
  Layer.unwrapEffect(Effect.map(Upstream, (upstream) =>
    TestServerLive({
      ...webhookOverrides,
      upstreamBaseUrl: Option.some(upstream.baseUrl),
      ...overrides
    }, { breakers: alwaysClosed }))).pipe(Layer.provideMerge(Upstream.layer))

export interface Caller {
  readonly token: string
  readonly accountId: string
  readonly keyId: string
  /** The full API key. */
  readonly apiKey: string
}

/** A developer with a key of `environment`, and (live) a wallet topped up with `sen`. */
export const caller = (
  email: string,
  options: { readonly environment?: "live" | "test"; readonly sen?: number; readonly key?: Record<string, unknown> } =
    {}
) =>
  Effect.gen(function*() {
    const { accountId, token } = yield* developer(email)
    const environment = options.environment ?? "live"
    if (options.sen !== undefined && options.sen > 0) yield* topUp(token, options.sen)
    const created = yield* createKey(token, { name: `${environment} key`, environment, ...options.key })
    return { token, accountId, keyId: created.key.id, apiKey: created.full_key } satisfies Caller
  })

/** A model call with plain fetch: `path` is `/v1/responses` or `/v1/chat/completions`. */
export const modelCall = (apiKey: string, path: string, json: unknown, headers: Record<string, string> = {}) =>
  call("POST", path, { token: apiKey, json, headers })

/**
 * The ledger invariant (docs/money.md, "The ledger invariant") for an account, checked by a second instance
 * on the same database: `[]` when it holds.
 */
export const violations = (accountId: string) =>
  Effect.scoped(Effect.gen(function*() {
    const instance = yield* walletInstance(yield* Effect.scope)
    return (yield* instance.invariant(accountId)).violations
  }))

/**
 * The wallet's balances in micro-MYR, read from the test database once the
 * server wrote its settlements, with what credit grants hold counted as
 * available (an idle account's grants hold no call).
 */
export const walletOf = (accountId: string) =>
  Effect.map(
    query<{ available: string; reserved: string; spent: string }>(
      `SELECT available_micro_myr + granted_micro_myr AS available, reserved_micro_myr AS reserved,
              lifetime_spend_micro_myr AS spent
       FROM wallets WHERE account_id = $1`,
      [accountId]
    ),
    (rows) => ({
      available: Number(rows[0]?.available),
      reserved: Number(rows[0]?.reserved),
      spent: Number(rows[0]?.spent)
    })
  )

/**
 * A reasoning-routed chat stream (`reasoning_effort: high`) of `prompt`, read to its end, or cut by its client after
 * `cutAfterMs`: its status, request id, chunks and the text of their deltas.
 */
export const reasoningStream = (apiKey: string, prompt: string, cutAfterMs?: number) =>
  Effect.flatMap(TestServer, ({ baseUrl }) =>
    Effect.promise(async () => {
      const cut = new AbortController()
      const response = await fetch(`${baseUrl}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
        body: JSON.stringify({
          model: PUBLIC_MODEL,
          messages: [{ role: "user", content: prompt }],
          reasoning_effort: "high",
          max_tokens: 4_000,
          stream: true
        }),
        signal: AbortSignal.any([cut.signal, AbortSignal.timeout(20_000)])
      })
      const requestId = response.headers.get("x-request-id") ?? ""
      if (cutAfterMs !== undefined) setTimeout(() => cut.abort(), cutAfterMs)
      const chunks = sseJson(await readSse(response).catch(() => []))
      const text = chunks.map((c) => c === "[DONE]" ? "" : c.choices?.[0]?.delta?.content ?? "").join("")
      return { status: response.status, requestId, text, chunks }
    }))
