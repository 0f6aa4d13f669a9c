import { type Clock, Effect, Option, Ref } from "effect"
import type { ApiKeyPrincipal } from "../../Auth/Api.js"
import { CurrentApiKey } from "../../Auth/Api.js"
import type { CacheEntry } from "../../Cache/ResponseCache.js"
import type { ResponseCache } from "../../Cache/ResponseCache.js"
import type { ApiError, IdempotencyConflict } from "../../Domain/Errors.js"
import type { MicroMyr } from "../../Domain/Money.js"
import { microMyr, toMyrString } from "../../Domain/Money.js"
import type { PriceTable } from "../../Domain/Prices.js"
import { costOfParts, withSafetyMargin } from "../../Domain/Prices.js"
import type { UpstreamConfig } from "../../Domain/Upstreams.js"
import { targetsFor } from "../../Domain/Upstreams.js"
import type { LoggedGuardrails } from "../../Guardrails/Api.js"
import { policyOfRows, Tally } from "../../Guardrails/Policy.js"
import type { LoggedCache, OpenLog, SettledUsage } from "../../Logs/RequestLogs.js"
import { toBase64 } from "../../Providers/EmbeddingVectors.js"
import { servedBy } from "../../Providers/Fallback.js"
import type { EmbeddingAnswer, ProviderShape, UpstreamAttempt, UpstreamMessage } from "../../Providers/Provider.js"
import { SIMULATED_MODEL } from "../../Providers/Simulated.js"
import { addResponseHeaders, currentRequestId } from "../../Request/Context.js"
import type { CallHold } from "../../Wallet/Spending.js"
import type { Spending } from "../../Wallet/Spending.js"
import { guardInput } from "../Call/CallGuardrails.js"
import { codeOf, elapsedSince } from "../Call/CallSettlement.js"
import type { BilledEndpoint, CacheAsk } from "../Call/CallTypes.js"
import type { EmbeddingItem } from "./EmbeddingItems.js"
import { countedItems } from "./EmbeddingItems.js"
import type { EmbeddingsRequest, EmbeddingsResponse } from "./EmbeddingsApi.js"
import { EMBEDDING_MODEL, MAX_ITEM_TOKENS, MAX_ITEMS } from "./EmbeddingsApi.js"

/**
 * An embeddings call end to end (docs/api/embeddings.md, "Billing"): its items checked and counted, the
 * guardrails on its texts, the cache, then held at the dearest embedding target's input price, the upstream
 * asked (with fallbacks), and billed per input token (the upstream's count when it gives one) within the
 * hold; a failure returns the hold. Nothing is held before the items are checked.
 */

/** An embeddings request as the call takes it. */
export interface EmbeddingCall {
  readonly payload: EmbeddingsRequest
  readonly cache?: CacheAsk | undefined
  /** As a model call's: an idempotent call confirms it still holds its key just before it is billed. */
  readonly confirmBeforeBilling?: Effect.Effect<void, IdempotencyConflict> | undefined
}

type Restore = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>

/** What the call needs of the model calls' layer. */
export interface EmbeddingDeps {
  readonly prices: PriceTable
  /** What a call answered on a team's own key costs, in basis points of nenas's price (`BYOK_FEE_BPS`). */
  readonly byokFeeBps: number
  readonly upstreams: ReadonlyArray<UpstreamConfig>
  /** The model a call is routed to when no upstream names one (`UPSTREAM_MODEL_EMBEDDING`). */
  readonly defaultModel: string
  /** The provider a key's calls use: a test key's built-in model, or a live key's upstreams (and its account's own keys). */
  readonly providerOf: (key: ApiKeyPrincipal) => ProviderShape
  readonly spending: Spending["Type"]
  readonly cache: ResponseCache["Type"]
  readonly clock: Clock.Clock
  readonly holdWorstCase: (
    key: ApiKeyPrincipal,
    log: OpenLog,
    worstCase: MicroMyr,
    startedAt: number,
    endpoint: BilledEndpoint
  ) => Effect.Effect<CallHold, ApiError>
}

/** What the cache keeps of an embeddings answer: its data as rendered, and its input tokens. */
interface StoredEmbeddings {
  readonly v: 1
  readonly kind: "embeddings"
  readonly data: EmbeddingsResponse["data"]
  readonly inputTokens: number
}

const storedOf = (entry: CacheEntry): StoredEmbeddings | undefined => {
  try {
    const stored = JSON.parse(entry.answer) as StoredEmbeddings
    return stored.v === 1 && stored.kind === "embeddings" && Array.isArray(stored.data) ? stored : undefined
  } catch {
    return undefined
  }
}

const rendered = (data: EmbeddingsResponse["data"], inputTokens: number, cost: number): EmbeddingsResponse => ({
  object: "list",
  data,
  model: EMBEDDING_MODEL,
  usage: { prompt_tokens: inputTokens, total_tokens: inputTokens },
  cost_myr: toMyrString(microMyr(cost))
})

const usageOf = (inputTokens: number, cost: number, latencyMs: number, attempts: ReadonlyArray<UpstreamAttempt>) =>
  ({
    inputTokens,
    outputTokens: 0,
    reasoningTokens: 0,
    cachedTokens: 0,
    usageSource: "provider",
    searchCount: 0,
    contentPages: 0,
    costMicroMyr: cost,
    latencyMs,
    attempts: attempts.map(({ latencyMs, outcome, target }) => ({ target, outcome, latencyMs }))
  }) satisfies SettledUsage

/** What billing an answer needs of its call. */
interface Billing {
  readonly call: EmbeddingCall
  readonly key: ApiKeyPrincipal
  readonly requestId: string
  readonly startedAt: number
  readonly hold: CallHold
  readonly attempts: Ref.Ref<ReadonlyArray<UpstreamAttempt>>
  readonly settled: Ref.Ref<boolean>
  readonly model: string
  readonly live: boolean
  readonly tokens: number
  readonly logged: LoggedGuardrails | undefined
}

const cacheLogged = {
  Use: { status: "miss", sourceRequestId: null, savedMicroMyr: 0 },
  Bypass: { status: "bypass", sourceRequestId: null, savedMicroMyr: 0 }
} as const satisfies Record<string, LoggedCache>

export const makeEmbeddingCalls = (deps: EmbeddingDeps) => {
  const { cache, clock, prices, spending } = deps

  const openLog = (
    key: ApiKeyPrincipal,
    requestId: string,
    payload: EmbeddingsRequest,
    model: string,
    inputTokens: number,
    guardrails: LoggedGuardrails | undefined,
    logged: LoggedCache | undefined
  ): OpenLog => ({
    requestId,
    accountId: key.accountId,
    apiKeyId: key.keyId,
    publicModel: EMBEDDING_MODEL,
    upstreamModel: model,
    routingCategory: "embedding",
    endpoint: "/v1/embeddings",
    stream: false,
    inputTokens,
    environment: key.environment,
    metadata: null,
    endUser: payload.user === undefined ? null : payload.user.slice(0, 256),
    guardrails,
    cache: logged
  })

  /** The texts under the key's guardrail policy: redacted where it redacts, refused (and logged) where it blocks. */
  const guarded = (
    key: ApiKeyPrincipal,
    requestId: string,
    payload: EmbeddingsRequest,
    items: ReadonlyArray<EmbeddingItem>,
    paths: ReadonlyArray<string>,
    startedAt: number
  ): Effect.Effect<
    { readonly items: ReadonlyArray<EmbeddingItem>; readonly logged: LoggedGuardrails | undefined },
    ApiError
  > => {
    const policy = policyOfRows(key.accountGuardrails ?? null, key.keyGuardrails ?? null)
    if (policy === undefined) return Effect.succeed({ items, logged: undefined })
    if (policy.input === undefined) return Effect.succeed({ items, logged: new Tally().logged() })
    // Token arrays carry no text to scan.
    const messages = items.map((item): UpstreamMessage => ({
      role: "user",
      content: typeof item === "string" ? item : ""
    }))
    const result = guardInput(policy.input, messages, paths, "input")
    if (result._tag === "Blocked") {
      const log = openLog(key, requestId, payload, EMBEDDING_MODEL, 0, result.tally.logged(), undefined)
      return Effect.zipRight(
        spending.refused(log, "content_blocked", elapsedSince(clock, startedAt)),
        Effect.fail(result.error)
      )
    }
    const logged = result.tally.logged()
    if (logged.rules.every((rule) => rule.action !== "redact")) return Effect.succeed({ items, logged })
    return Effect.succeed({
      items: items.map((item, i) => {
        const content = result.upstream[i]?.content
        return typeof item === "string" && typeof content === "string" ? content : item
      }),
      logged
    })
  }

  /** A hit: the stored data, logged `billed` at 0 under this request, nothing held. */
  const answerHit = Effect.fnUntraced(function*(
    key: ApiKeyPrincipal,
    requestId: string,
    payload: EmbeddingsRequest,
    entry: CacheEntry,
    stored: StoredEmbeddings,
    guardrails: LoggedGuardrails | undefined,
    startedAt: number
  ) {
    yield* addResponseHeaders({
      "nenas-cache": "HIT",
      age: String(Math.max(0, Math.floor((startedAt - entry.createdAt) / 1000)))
    })
    const log = openLog(key, requestId, payload, EMBEDDING_MODEL, stored.inputTokens, guardrails, {
      status: "hit",
      sourceRequestId: entry.sourceRequestId,
      savedMicroMyr: entry.costMicroMyr
    })
    const hold = yield* Effect.orDie(spending.hold(null, log))
    yield* Effect.orDie(spending.settle(
      hold,
      microMyr(0),
      `Embeddings ${requestId} (${EMBEDDING_MODEL}, from the cache)`,
      Object.assign(usageOf(stored.inputTokens, 0, elapsedSince(clock, startedAt), []), { guardrails }),
      "bill what it can"
    ))
    return rendered(stored.data, stored.inputTokens, 0)
  })

  const priced = (tokens: number, at: string, shareBps?: number) =>
    costOfParts(prices, [{ model: at, inputTokens: tokens, cachedTokens: 0, outputTokens: 0 }], 0, 0, shareBps)

  /** An answer billed (within the hold), logged, kept in the cache when asked, and rendered. */
  const billed = Effect.fnUntraced(function*(
    { attempts, call, hold, key, live, logged, model, requestId, settled, startedAt, tokens }: Billing,
    answer: EmbeddingAnswer
  ) {
    const { payload } = call
    const ask = call.cache

    yield* call.confirmBeforeBilling ?? Effect.void
    const tried = yield* Ref.get(attempts)
    const answered = servedBy(tried)
    const served = Option.match(answered, { onNone: () => model, onSome: (attempt) => attempt.model })
    // On a team's own key: its fee at the price of nenas's embedding model (docs/api/provider-keys.md, "Billing").
    const ownKeyId = Option.getOrUndefined(answered)?.providerKeyId
    const inputTokens = Option.match(answer.inputTokens, {
      onNone: () => tokens,
      onSome: (reported) => Math.min(Math.max(0, Math.round(reported)), MAX_ITEMS * MAX_ITEM_TOKENS)
    })
    const cost = hold.source._tag === "None"
      ? 0
      : Math.min(
        ownKeyId === undefined ? priced(inputTokens, served) : priced(inputTokens, model, deps.byokFeeBps),
        hold.amountMicroMyr
      )
    const latencyMs = elapsedSince(clock, startedAt)
    const data = answer.vectors.map((vector, index) => ({
      object: "embedding" as const,
      index,
      embedding: payload.encoding_format === "base64" ? toBase64(vector) : vector
    }))
    const usage = Object.assign(usageOf(inputTokens, cost, latencyMs, tried), {
      answeredBy: live ? served : SIMULATED_MODEL,
      guardrails: logged,
      ownKey: ownKeyId === undefined ? undefined : { providerKeyId: ownKeyId, feeMicroMyr: cost }
    })
    const charged = yield* Effect.uninterruptible(spending.settle(
      hold,
      microMyr(cost),
      `Embeddings ${requestId} (${EMBEDDING_MODEL})`,
      usage,
      "refuse"
    ))
    yield* Ref.set(settled, true)
    if (ask?._tag === "Use") {
      const now = clock.unsafeCurrentTimeMillis()
      yield* cache.put(key.accountId, ask.key, {
        answer: JSON.stringify({ v: 1, kind: "embeddings", data, inputTokens } satisfies StoredEmbeddings),
        sourceRequestId: requestId,
        costMicroMyr: charged,
        createdAt: now,
        expiresAt: now + ask.ttlSeconds * 1000
      })
    }
    return rendered(data, inputTokens, charged)
  })

  const run = Effect.fnUntraced(function*(call: EmbeddingCall, restore: Restore) {
    const { payload } = call
    const key = yield* CurrentApiKey
    const requestId = yield* currentRequestId
    const startedAt = clock.unsafeCurrentTimeMillis()
    const counted = yield* countedItems(payload.input)
    const { items, logged } = yield* guarded(key, requestId, payload, counted.items, counted.paths, startedAt)
    const ask = call.cache
    if (ask?._tag === "Use" && ask.read) {
      const hit = yield* cache.lookup(key.accountId, ask.key)
      const stored = Option.isSome(hit) ? storedOf(hit.value) : undefined
      if (Option.isSome(hit) && stored !== undefined) {
        return yield* answerHit(key, requestId, payload, hit.value, stored, logged, startedAt)
      }
    }
    if (ask !== undefined) yield* addResponseHeaders({ "nenas-cache": ask._tag === "Use" ? "MISS" : "BYPASS" })
    const live = key.environment === "live"
    // A live call may fall back to any embedding target: it holds (and is capped at) the dearest.
    const targets = live ? targetsFor(deps.upstreams, "embedding", deps.defaultModel) : []
    const model = live ? targets[0]?.model ?? deps.defaultModel : SIMULATED_MODEL
    const margin = withSafetyMargin(counted.tokens)
    const worstCase = microMyr(Math.max(
      0,
      ...(targets.length === 0 ? [model] : targets.map((t) => t.model)).map((m) => priced(margin, m))
    ))
    const log = openLog(
      key,
      requestId,
      payload,
      model,
      counted.tokens,
      logged,
      ask === undefined ? undefined : cacheLogged[ask._tag]
    )
    const hold = yield* deps.holdWorstCase(key, log, worstCase, startedAt, "/v1/embeddings")
    const attempts = yield* Ref.make<ReadonlyArray<UpstreamAttempt>>([])
    const provider = deps.providerOf(key)
    const settled = yield* Ref.make(false)
    const failed = (code: string) =>
      Effect.flatMap(Ref.get(attempts), (tried) =>
        spending.fail(
          hold,
          code,
          elapsedSince(clock, startedAt),
          tried.map(({ latencyMs, outcome, target }) => ({ target, outcome, latencyMs }))
        ))
    return yield* restore(provider.embed({
      model,
      input: items,
      dimensions: payload.dimensions,
      user: payload.user,
      attempted: (attempt, amend) =>
        Ref.update(
          attempts,
          (sofar) => amend && sofar.length > 0 ? [...sofar.slice(0, -1), attempt] : [...sofar, attempt]
        )
    })).pipe(
      Effect.flatMap((answer) =>
        billed({
          call,
          key,
          requestId,
          startedAt,
          hold,
          attempts,
          settled,
          model,
          live,
          tokens: counted.tokens,
          logged
        }, answer)
      ),
      Effect.onExit((exit) =>
        Effect.flatMap(Ref.get(settled), (done) => {
          if (done || exit._tag === "Success") return Effect.void
          return failed(codeOf(exit.cause))
        })
      )
    )
  })

  /** Runs one embeddings call; between its hold and its settlement nothing interrupts it. */
  return (call: EmbeddingCall): Effect.Effect<EmbeddingsResponse, ApiError, CurrentApiKey> =>
    Effect.uninterruptibleMask((restore) => run(call, restore))
}
