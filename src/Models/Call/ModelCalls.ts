import { Context, Effect, Exit, FiberId, FiberSet, Layer, Option, Ref } from "effect"
import { AppConfig } from "../../AppConfig.js"
import type { ApiKeyPrincipal } from "../../Auth/Api.js"
import { CurrentApiKey } from "../../Auth/Api.js"
import { ResponseCache } from "../../Cache/ResponseCache.js"
import type { ApiError } from "../../Domain/Errors.js"
import {
  errorMeta,
  InsufficientBalance,
  insufficientBalanceGuidance,
  isApiError,
  keyEditAction,
  ProviderTimeout,
  providerTimeoutGuidance,
  SpendLimitExceeded
} from "../../Domain/Errors.js"
import type { MicroMyr } from "../../Domain/Money.js"
import { targetsFor } from "../../Domain/Upstreams.js"
import type { LoggedGuardrails } from "../../Guardrails/Api.js"
import { mergeLogged, policyOfRows, Tally } from "../../Guardrails/Policy.js"
import { KeyLimitReached } from "../../Keys/LimitReached.js"
import { forkWith } from "../../Lane/Wire/PartReader.js"
import type { SelfWritingBody } from "../../Lane/Wire/SelfWritingBody.js"
import type { LoggedCache, OpenLog } from "../../Logs/RequestLogs.js"
import { ProviderKeys } from "../../ProviderKeys/ProviderKeys.js"
import { OwnKeyRouting } from "../../Providers/OwnKeys.js"
import type { ProviderError, ProviderRequest, UpstreamAttempt } from "../../Providers/Provider.js"
import { Provider, TestKeyProvider } from "../../Providers/Provider.js"
import { breatheIfLarge } from "../../Request/Breathe.js"
import { addResponseHeaders, currentRequestId } from "../../Request/Context.js"
import type { Route } from "../../Routing/Router.js"
import { Router } from "../../Routing/Router.js"
import { ImageFetcher } from "../../Search/ImageFetch.js"
import { Spending } from "../../Wallet/Spending.js"
import { isMemberBudgetRefusal } from "../../Wallet/SpendLimits.js"
import { type EmbeddingCall, makeEmbeddingCalls } from "../Embeddings/EmbeddingCalls.js"
import type { EmbeddingsResponse } from "../Embeddings/EmbeddingsApi.js"
import { PUBLIC_MODEL } from "../OpenAi/Api.js"
import type { EventRenderer } from "../OpenAi/Wire.js"
import { entryOf, replayedRoute, replayProvider, storedAnswerOf } from "./CallCache.js"
import { blockedOutput, guardAnswer, guardInput, redactedJson, StreamGuard } from "./CallGuardrails.js"
import { elapsedSince, makeSettlement, usedOf } from "./CallSettlement.js"
import { makeCallSpans } from "./CallSpan.js"
import type { BilledEndpoint, CallInput, CallResult, HeldCall, Progress } from "./CallTypes.js"
import { notStarted, providerRequest, servedCall, shownRoute, withAttempt } from "./CallTypes.js"
import { ceilingOf, countInput, estimateCall } from "./Estimate.js"
import { textView } from "./Input.js"
import { inlineRemoteImages, screenRemoteImages } from "./RemoteImages.js"
import { makeHandoffs, relayBody } from "./StreamRelay.js"
import { noSources, planSearch, searchEstimate, WebSearch } from "./WebSearch.js"

/** The output limit a caller lowers to reserve less, as each endpoint names it. */
export const OUTPUT_FIELD: Record<BilledEndpoint, string> = {
  "/v1/chat/completions": "max_tokens",
  "/v1/messages": "max_tokens",
  "/v1/responses": "max_output_tokens",
  "/v1/embeddings": "the number of input items"
}

/** A refusal that tells this caller what to change: its endpoint's output field, its key's edit view. */
export const forCaller = (error: ApiError, endpoint: BilledEndpoint, apiKeyId: string): ApiError => {
  if (error._tag === "InsufficientBalance" && error.guidance === undefined) {
    // Fields by name: an error's `message` is not an own enumerable property, so a spread would drop it.
    return new InsufficientBalance({
      message: error.message,
      param: error.param,
      guidance: insufficientBalanceGuidance(OUTPUT_FIELD[endpoint])
    })
  }
  if (error._tag === "ProviderTimeout" && error.guidance === undefined) {
    return new ProviderTimeout({
      message: error.message,
      param: error.param,
      retryable: error.retryable,
      retry_after_seconds: error.retry_after_seconds,
      guidance: providerTimeoutGuidance(OUTPUT_FIELD[endpoint])
    })
  }
  if (error._tag === "SpendLimitExceeded" && error.action === undefined) {
    return new SpendLimitExceeded({
      message: error.message,
      param: error.param,
      guidance: error.guidance,
      action: keyEditAction(apiKeyId)
    })
  }
  return error
}

/** The log's record of a miss and of a bypass. */
const cacheLogged = {
  Use: { status: "miss", sourceRequestId: null, savedMicroMyr: 0 },
  Bypass: { status: "bypass", sourceRequestId: null, savedMicroMyr: 0 }
} as const satisfies Record<string, LoggedCache>

/** The call's log row as it opens: who called, and where the router sent it. */
/** What `Effect.uninterruptibleMask` hands its body: an effect run interruptibly again. */
type Restore = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>

const openLog = (
  input: CallInput,
  key: ApiKeyPrincipal,
  requestId: string,
  route: Route,
  inputTokens: number,
  guardrails: LoggedGuardrails | undefined,
  cache?: LoggedCache | undefined
): OpenLog => ({
  requestId,
  accountId: key.accountId,
  apiKeyId: key.keyId,
  publicModel: PUBLIC_MODEL,
  upstreamModel: shownRoute(route, key.environment).upstreamModel,
  routingCategory: route.category,
  endpoint: input.endpoint,
  stream: input.stream,
  inputTokens,
  environment: key.environment,
  metadata: input.metadata ?? null,
  // The log keeps a bounded end-user id; what goes upstream is the caller's own.
  endUser: input.user === undefined ? null : input.user.slice(0, 256),
  guardrails,
  cache
})

/**
 * Runs model calls end to end (docs/money.md, "A call's money";
 * docs/money.md, "Request lifecycle and logs"): route, count, estimate, cap,
 * reserve, log, search, call the provider, then capture what was used (never
 * above the reservation) or release. Settlement runs exactly once,
 * uninterruptibly, whether the call succeeds, fails, or its client goes away.
 */
export class ModelCalls extends Context.Tag("nenas/ModelCalls")<ModelCalls, {
  readonly complete: (input: CallInput) => Effect.Effect<CallResult, ApiError, CurrentApiKey>
  /**
   * Fails before the first byte as `complete` does; then the client's body, as `renderer` writes its events
   * (failures after the first byte are `Failed` events); `closed` runs once the body is done.
   */
  readonly stream: (
    input: CallInput,
    renderer: EventRenderer,
    closed: Effect.Effect<void>
  ) => Effect.Effect<SelfWritingBody, ApiError, CurrentApiKey>
  /** An embeddings call (`Embeddings/EmbeddingCalls.ts`), held and billed as a model call is. */
  readonly embed: (call: EmbeddingCall) => Effect.Effect<EmbeddingsResponse, ApiError, CurrentApiKey>
}>() {
  static readonly layer = Layer.scoped(
    ModelCalls,
    Effect.gen(function*() {
      const config = yield* AppConfig
      const router = yield* Router
      const spending = yield* Spending
      const limitReached = yield* KeyLimitReached
      const webSearch = yield* WebSearch
      const images = yield* ImageFetcher
      // Test keys always use the built-in model, cost nothing and never touch the wallet.
      const providers = { live: yield* Provider, test: yield* TestKeyProvider }
      // A live call of an account with its own provider keys goes through them (docs/api/provider-keys.md, "Routing").
      const ownKeys = yield* OwnKeyRouting
      const providerKeys = yield* ProviderKeys
      const providerOf = (key: ApiKeyPrincipal) =>
        key.environment === "live"
          ? ownKeys.around(providerKeys.forAccount(key.accountId), providers.live)
          : providers.test
      const settlement = yield* makeSettlement
      // Streams' settlements run on the service's fibers: awaited (after the handoffs below) before the wallet's last flush.
      const fork = forkWith(yield* FiberSet.makeRuntime<never>())
      const handoffs = yield* makeHandoffs(config.streamHandoffTimeoutMs)
      const spans = makeCallSpans(Option.isSome(config.otlpEndpoint))
      // Read directly on every call (docs/performance.md, "The clock read directly on the call path").
      const clock = yield* Effect.clock
      const cache = yield* ResponseCache

      /** Holds what the call may cost at most; a refusal is logged as a failed call. */
      const holdWorstCase = (
        key: ApiKeyPrincipal,
        log: OpenLog,
        worstCase: MicroMyr,
        startedAt: number,
        endpoint: BilledEndpoint
      ) => {
        // Test keys hold nothing; a model priced at nothing holds nothing, and settles as a call with nothing to charge.
        const money = key.environment === "live"
          ? {
            accountId: key.accountId,
            apiKeyId: key.keyId,
            requestId: log.requestId,
            amountMicroMyr: worstCase,
            monthlySpendLimitMicroMyr: key.monthlySpendLimitMicroMyr,
            memberId: key.memberId,
            memberMonthlySpendLimitMicroMyr: key.memberMonthlySpendLimitMicroMyr
          }
          : null
        // One handler of the failure (a held call passes one step, not one a stage): a refusal is logged, the key's
        // own monthly limit announced, and the error named for the endpoint; anything else is a defect.
        return Effect.catchAll(spending.hold(money, log), (error) => {
          if (!isApiError(error)) return Effect.die(error)
          const logged = Effect.suspend(() =>
            spending.refused(log, errorMeta(error).code, elapsedSince(clock, startedAt))
          )
          // `key.limit_reached` is the key's own limit's; a member's budget is not the key's.
          const announced = error._tag === "SpendLimitExceeded" && !isMemberBudgetRefusal(error)
            ? limitReached.announce(key.keyId)
            : Effect.void
          return Effect.zipRight(Effect.zipRight(logged, announced), Effect.fail(forCaller(error, endpoint, key.keyId)))
        })
      }

      /**
       * The input under the key's guardrail policy (docs/api/guardrails.md, "Calls"): redacted where it
       * redacts, or refused (`content_blocked`, logged, nothing held or sent) where it blocks.
       */
      const guarded = (
        given: CallInput,
        key: ApiKeyPrincipal,
        requestId: string,
        startedAt: number
      ): Effect.Effect<{ readonly input: CallInput; readonly logged: LoggedGuardrails | undefined }, ApiError> => {
        const policy = policyOfRows(key.accountGuardrails ?? null, key.keyGuardrails ?? null)
        if (policy?.input === undefined) {
          return Effect.succeed({ input: given, logged: policy === undefined ? undefined : new Tally().logged() })
        }
        const scanner = policy.input
        const result = guardInput(scanner, given.upstream, given.paths ?? [], given.inputParam)
        if (result._tag === "Blocked") {
          // Logged with no tokens: nothing was counted, held or sent.
          const route = router.route({ messages: [], effort: given.effort, webSearch: "off" })
          const log = openLog(given, key, requestId, route, 0, result.tally.logged())
          return Effect.zipRight(
            spending.refused(log, "content_blocked", elapsedSince(clock, startedAt)),
            Effect.fail(result.error)
          )
        }
        const logged = result.tally.logged()
        if (logged.rules.every((rule) => rule.action !== "redact")) return Effect.succeed({ input: given, logged })
        const store = given.store
        return Effect.succeed({
          input: Object.assign({}, given, {
            upstream: result.upstream,
            messages: textView(result.upstream),
            // What is stored is what the upstream got (docs/api/guardrails.md, "Logs").
            store: store === undefined ? undefined : {
              input: redactedJson(scanner, store.input),
              instructions: store.instructions === null ? null : redactedJson(scanner, store.instructions),
              previousResponseId: store.previousResponseId
            }
          }),
          logged
        })
      }

      /** Auth, route, estimate, hold: the call accepted and its maximum held, or refused (and logged) with why. */
      const accept = Effect.fnUntraced(function*(given: CallInput) {
        const key = yield* CurrentApiKey
        const requestId = yield* currentRequestId
        const startedAt = clock.unsafeCurrentTimeMillis()
        const policy = policyOfRows(key.accountGuardrails ?? null, key.keyGuardrails ?? null)
        const { input, logged } = policy === undefined
          ? { input: given, logged: undefined }
          : yield* guarded(given, key, requestId, startedAt)
        // The cache is read after the guardrails (a blocked input is never answered), before anything is held.
        const ask = input.cache
        if (ask?._tag === "Use" && ask.read) {
          const hit = yield* cache.lookup(key.accountId, ask.key)
          const stored = Option.isSome(hit) ? storedAnswerOf(hit.value) : undefined
          if (Option.isSome(hit) && stored !== undefined) {
            const entry = hit.value
            yield* addResponseHeaders({
              "nenas-cache": "HIT",
              age: String(Math.max(0, Math.floor((startedAt - entry.createdAt) / 1000)))
            })
            const route = replayedRoute(stored, entry.sourceRequestId)
            const log = openLog(input, key, requestId, route, stored.usage.inputTokens, logged, {
              status: "hit",
              sourceRequestId: entry.sourceRequestId,
              savedMicroMyr: entry.costMicroMyr
            })
            // Nothing is held: the answer costs 0 (its hold of nothing settles at nothing).
            const hold = yield* Effect.orDie(spending.hold(null, log))
            return {
              input,
              key,
              requestId,
              startedAt,
              route,
              plan: Option.none(),
              provider: replayProvider(stored),
              outputCap: Math.max(1, stored.usage.outputTokens),
              hold,
              ceiling: 0,
              guardrails: policy,
              inputGuardrails: logged,
              keepAs: undefined
            } satisfies HeldCall
          }
        }
        if (ask !== undefined) yield* addResponseHeaders({ "nenas-cache": ask._tag === "Use" ? "MISS" : "BYPASS" })
        const route = router.route({
          messages: input.messages,
          effort: input.effort,
          webSearch: input.webSearch?.mode ?? "off"
        })
        const plan = route.search && input.webSearch !== undefined
          ? Option.some(planSearch(input.webSearch, input.messages, route.reasoningModel))
          : Option.none()
        if (key.environment === "live") yield* screenRemoteImages(images, input.remoteImages)
        yield* breatheIfLarge
        const inputTokens = countInput(input.upstream, input.capabilities)
        yield* breatheIfLarge
        // A live call may fall back to any of its category's targets: it holds (and is capped at) the dearest.
        const fallbackModels = key.environment === "live"
          ? targetsFor(config.upstreams, route.reasoningModel ? "reasoning" : "general", route.upstreamModel).map((t) =>
            t.model
          )
          : []
        const estimate = yield* estimateCall({
          prices: config.prices,
          upstreamModel: route.upstreamModel,
          fallbackModels,
          inputTokens,
          search: searchEstimate(plan),
          maxOutputTokens: input.maxOutputTokens,
          maxTotalCostMyr: input.maxTotalCostMyr,
          inputParam: input.inputParam,
          outputParam: OUTPUT_FIELD[input.endpoint]
        })
        const log = openLog(
          input,
          key,
          requestId,
          route,
          inputTokens,
          logged,
          ask === undefined ? undefined : cacheLogged[ask._tag]
        )
        const hold = yield* holdWorstCase(key, log, estimate.worstCase, startedAt, input.endpoint)
        return {
          input,
          key,
          requestId,
          startedAt,
          route,
          plan,
          provider: providerOf(key),
          outputCap: estimate.outputCap,
          hold,
          ceiling: ceilingOf(hold.amountMicroMyr, estimate.costCap),
          guardrails: policy,
          inputGuardrails: logged,
          keepAs: ask?._tag === "Use" ? { key: ask.key, ttlSeconds: ask.ttlSeconds } : undefined
        } satisfies HeldCall
      })

      /** A whole answer kept in the cache, when its call asked it to. */
      const keep = (call: HeldCall, result: CallResult): Effect.Effect<void> =>
        call.keepAs === undefined
          ? Effect.void
          : cache.put(
            call.key.accountId,
            call.keepAs.key,
            entryOf(result, call.keepAs.ttlSeconds, clock.unsafeCurrentTimeMillis())
          )

      /**
       * Remote images, then search, then the upstream: from here on the call has cost something. Images are
       * inlined once the call is held (a caller who cannot pay has nothing fetched), and only for the upstream:
       * test keys' built-in model fetches nothing.
       */
      const begin = Effect.fnUntraced(function*<A>(
        call: HeldCall,
        progress: Ref.Ref<Progress>,
        ask: (request: ProviderRequest) => Effect.Effect<A, ProviderError>
      ) {
        const remote = call.input.remoteImages
        const upstream =
          config.upstreamImageUrls === "inline" && call.key.environment === "live" && remote !== undefined
            ? yield* inlineRemoteImages(images, call.input.upstream, remote)
            : call.input.upstream
        const sources = yield* Option.match(call.plan, {
          onNone: () => Effect.succeed(noSources),
          onSome: (plan) =>
            webSearch.run(plan, call.input.messages, {
              simulated: call.key.environment === "test",
              provider: call.provider,
              model: call.route.upstreamModel,
              reasoningModel: call.route.reasoningModel,
              // What the search spent so far is the call's: a call cut mid-search is billed for it.
              spent: (sofar) =>
                Ref.update(progress, (current) => ({ ...current, sources: { ...current.sources, ...sofar } }))
            })
        })
        const upstreamSentAt = clock.unsafeCurrentTimeMillis()
        // eslint-disable-next-line nenas/no-spread-adding-field -- once per call, not per chunk
        yield* Ref.update(progress, (current) => ({ ...current, sources, upstreamStarted: true, upstreamSentAt }))
        const request = providerRequest(
          { ...call, input: { ...call.input, upstream } },
          sources,
          (attempt: UpstreamAttempt, amend: boolean) =>
            Ref.update(progress, (current) => withAttempt(current, attempt, amend))
        )
        return { sources, answer: yield* ask(request) }
      })

      // Between the reservation and the hook that settles it, nothing may interrupt: a reservation no hook
      // settles would be renewed by this process for as long as its lease allows.
      const complete = (input: CallInput): Effect.Effect<CallResult, ApiError, CurrentApiKey> =>
        spans.complete(input, run(input))
      // One generator function for every call (`Effect.fnUntraced`), not one made per call
      // (docs/performance.md, "What kept a request's objects through young collections").
      const completing = Effect.fnUntraced(function*(input: CallInput, restore: Restore) {
        const call = yield* accept(input)
        const progress = yield* Ref.make(notStarted)
        return yield* restore(begin(call, progress, (request) => call.provider.complete(request))).pipe(
          Effect.flatMap(({ answer, sources }) =>
            Effect.zipRight(
              input.confirmBeforeBilling ?? Effect.void,
              Effect.flatMap(Ref.get(progress), ({ attempts }): Effect.Effect<CallResult, ApiError> => {
                // Billed at the prices of the model that answered (a fallback's, maybe), for what it produced.
                const served = servedCall(call, attempts)
                const used = usedOf(served, sources, answer, answer.usage)
                const scanner = call.guardrails?.output
                if (scanner === undefined) {
                  return Effect.tap(
                    settlement.settleOnce(progress, settlement.settleAnswer(served, used, answer)),
                    (result) => keep(call, result)
                  )
                }
                const tally = new Tally()
                const checked = guardAnswer(scanner, tally, answer)
                const guardrails = mergeLogged(call.inputGuardrails, tally.logged()) ?? undefined
                if ("blocked" in checked) {
                  // Billed for what the upstream produced; the caller gets the refusal, not the answer.
                  const logged = Object.assign({}, answer, { guardrails })
                  return Effect.zipRight(
                    settlement.settleOnce(
                      progress,
                      settlement.settleUsed(served, used, logged, false, "content_blocked")
                    ),
                    Effect.fail(blockedOutput(checked.blocked))
                  )
                }
                return Effect.tap(
                  settlement.settleOnce(
                    progress,
                    settlement.settleAnswer(served, used, Object.assign({}, checked.answer, { guardrails }))
                  ),
                  (result) => keep(call, result)
                )
              })
            )
          ),
          Effect.onExit(settlement.settleOnExit(call, progress)),
          // A refusal at settlement (the wallet cannot pay what the answer cost) names this endpoint's field too.
          Effect.mapError((error) => forCaller(error, input.endpoint, call.key.keyId))
        )
      })
      const run = (input: CallInput): Effect.Effect<CallResult, ApiError, CurrentApiKey> =>
        Effect.uninterruptibleMask((restore) => completing(input, restore))

      /** The upstream is answering before the first byte goes out: failures until then are HTTP errors, as OpenAI's are. */
      const stream = (input: CallInput, renderer: EventRenderer, closed: Effect.Effect<void>) =>
        spans.stream(input, renderer, closed, (renderer, closed) => relay(input, renderer, closed))
      const starting = Effect.fnUntraced(function*(input: CallInput, closed: Effect.Effect<void>, restore: Restore) {
        const call = yield* accept(input)
        const progress = yield* Ref.make(notStarted)
        const { answer: parts } = yield* restore(begin(call, progress, call.provider.stream)).pipe(
          Effect.onError((cause) => settlement.settleOnExit(call, progress)(Exit.failCause(cause))),
          Effect.mapError((error) => forCaller(error, input.endpoint, call.key.keyId))
        )
        const abandon = settlement.settleOnExit(call, progress)(Exit.interrupt(FiberId.none))
        // A body never read is never closed either: the watchdog also ends what `closed` ends (a rate-limit slot).
        const handoff = handoffs.watch(() => fork(Effect.ensuring(abandon, closed), () => {}))
        const scanner = call.guardrails?.output
        return {
          call,
          progress,
          parts,
          handoff,
          guard: scanner === undefined ? undefined : new StreamGuard(scanner),
          keep
        }
      })
      const relay = (input: CallInput, renderer: EventRenderer, closed: Effect.Effect<void>) =>
        Effect.map(
          Effect.uninterruptibleMask((restore) => starting(input, closed, restore)),
          (started) => relayBody(settlement, started, renderer, fork, closed, config.streamWriteStallMs)
        )

      const embed = makeEmbeddingCalls({
        prices: config.prices,
        byokFeeBps: config.byokFeeBps,
        upstreams: config.upstreams,
        defaultModel: config.upstreamModelEmbedding,
        providerOf,
        spending,
        cache,
        clock,
        holdWorstCase
      })

      return { complete, stream, embed }
    })
  )
}
