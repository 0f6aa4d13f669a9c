import { Cause, Clock, Context, Effect, Exit, FiberId, Layer, Option, Ref, type Scope, Stream } from "effect"
import { AppConfig } from "../AppConfig.js"
import type { ApiKeyPrincipal } from "../Auth/Api.js"
import { CurrentApiKey } from "../Auth/Api.js"
import type { ApiError } from "../Domain/Errors.js"
import { ContextLengthExceeded, errorMeta, InternalError, InvalidRequest, isApiError } from "../Domain/Errors.js"
import type { MicroMyr } from "../Domain/Money.js"
import { fromMyr, microMyr, toMyrString } from "../Domain/Money.js"
import { currentRequestId } from "../Request/Context.js"
import type {
  Capabilities,
  FinishReason,
  ProviderError,
  ProviderRequest,
  ProviderShape,
  ProviderUsage,
  StreamPart,
  TokenLogprob,
  ToolCall,
  UpstreamMessage
} from "../Providers/Provider.js"
import { Provider } from "../Providers/Provider.js"
import { simulatedProvider } from "../Providers/Simulated.js"
import type { Effort, Route } from "../Routing/Router.js"
import { Router } from "../Routing/Router.js"
import type { LoggedUsage, OpenLog } from "../Logs/RequestLogs.js"
import type { CallHold } from "../Wallet/Spending.js"
import { Spending } from "../Wallet/Spending.js"
import { CONTEXT_WINDOW, MAX_OUTPUT_TOKENS, PUBLIC_MODEL } from "./Api.js"
import type { WebSearchConfig } from "./Api.js"
import { costOf, withSafetyMargin } from "../Domain/Prices.js"
import type { Annotation, Citation, SearchPlan, Sources } from "./WebSearch.js"
import { citedSources, noSources, planSearch, searchEstimate, withPlanning, WebSearch } from "./WebSearch.js"
import type { Message } from "../Domain/Tokens.js"
import { countText } from "../Domain/Tokens.js"
import { countResponseFormat, countToolCall, countTools, countUpstreamMessages } from "../Providers/ContentTokens.js"

export type Endpoint = "/v1/responses" | "/v1/chat/completions"

/** A model call, whichever endpoint it came through. */
export interface CallInput {
  readonly endpoint: Endpoint
  /** The text of the conversation, for routing and search. */
  readonly messages: ReadonlyArray<Message>
  /** The conversation as the upstream takes it: images and tool turns included. */
  readonly upstream: ReadonlyArray<UpstreamMessage>
  readonly capabilities: Capabilities
  readonly effort: Effort
  readonly maxOutputTokens: number | undefined
  readonly maxTotalCostMyr: number | undefined
  readonly webSearch: typeof WebSearchConfig.Type | undefined
  readonly temperature?: number | null | undefined
  readonly topP?: number | null | undefined
  readonly stop?: string | ReadonlyArray<string> | null | undefined
  readonly user?: string | undefined
  readonly stream: boolean
  /** The field that names the prompt in errors: `input` or `messages`. */
  readonly inputParam: string
}

export interface CallUsage {
  readonly inputTokens: number
  readonly outputTokens: number
  readonly reasoningTokens: number
  readonly cachedTokens: number
}

export interface CallResult {
  readonly requestId: string
  /** Unix seconds. */
  readonly createdAt: number
  readonly text: string
  readonly toolCalls: ReadonlyArray<ToolCall>
  readonly logprobs: ReadonlyArray<TokenLogprob> | undefined
  readonly finishReason: FinishReason
  readonly usage: CallUsage
  readonly cost: MicroMyr
  readonly latencyMs: number
  readonly route: Route
  /** The sources the answer cites, and where it cites them. */
  readonly citations: ReadonlyArray<Citation>
  readonly annotations: ReadonlyArray<Annotation>
}

export type StreamEvent =
  | { readonly _tag: "Delta"; readonly text: string; readonly logprobs?: ReadonlyArray<TokenLogprob> | undefined }
  | { readonly _tag: "ToolCallDelta"; readonly index: number; readonly id: string; readonly name: string; readonly arguments: string }
  | { readonly _tag: "Completed"; readonly result: CallResult }
  | { readonly _tag: "Failed"; readonly error: ApiError }

/** A call accepted and paid for in advance: what runs, and what it may cost at most. */
interface Prepared {
  readonly input: CallInput
  readonly key: ApiKeyPrincipal
  readonly requestId: string
  readonly startedAt: number
  readonly route: Route
  readonly plan: Option.Option<SearchPlan>
  readonly provider: ProviderShape
  readonly outputCap: number
  readonly hold: CallHold
  /** The most this call may be billed: its hold, and `max_total_cost_myr`. */
  readonly ceiling: number
}

/** What the call used: from the upstream, or counted by us when it did not say. */
interface Used {
  readonly usage: CallUsage
  readonly source: "provider" | "estimated"
  readonly sources: Sources
}

const codeOf = (cause: Cause.Cause<unknown>): string =>
  Option.match(Cause.failureOption(cause), {
    onNone: () => "internal_error",
    onSome: (error) => isApiError(error) ? errorMeta(error).code : "internal_error"
  })

const asApiError = (cause: Cause.Cause<unknown>): ApiError =>
  Option.match(Cause.failureOption(cause), {
    onNone: () => new InternalError({ message: "Internal server error." }),
    onSome: (error) => isApiError(error) ? error : new InternalError({ message: "Internal server error." })
  })

/** What the model answered: text, tool calls, and logprobs when asked for. */
interface Answer {
  readonly text: string
  readonly toolCalls: ReadonlyArray<ToolCall>
  readonly logprobs: ReadonlyArray<TokenLogprob> | undefined
  readonly finishReason: FinishReason
}

/** The input as the model reads it: the turns (images included), the tool definitions and the answer's schema. */
const countInput = (messages: ReadonlyArray<UpstreamMessage>, capabilities: Capabilities): number =>
  countUpstreamMessages(messages) + countTools(capabilities.tools) + countResponseFormat(capabilities.responseFormat)

const fromProvider = (usage: ProviderUsage): CallUsage => ({
  inputTokens: usage.inputTokens,
  outputTokens: usage.outputTokens,
  reasoningTokens: Math.min(usage.reasoningTokens, usage.outputTokens),
  cachedTokens: Math.min(usage.cachedTokens, usage.inputTokens)
})

/**
 * Runs model calls end to end (DESIGN.md, Money and Request lifecycle):
 * route, count, estimate, cap, reserve, log, search, call the provider, then
 * capture what was used (never above the reservation) or release. Settlement
 * runs exactly once, uninterruptibly, whether the call succeeds, fails, or its
 * client goes away.
 */
export class ModelCalls extends Context.Tag("nenas/ModelCalls")<ModelCalls, {
  readonly complete: (input: CallInput) => Effect.Effect<CallResult, ApiError, CurrentApiKey>
  /** Fails before the first byte as `complete` does; afterwards failures are `Failed` events. */
  readonly stream: (input: CallInput) => Effect.Effect<Stream.Stream<StreamEvent>, ApiError, CurrentApiKey>
}>() {
  static readonly layer = Layer.effect(
    ModelCalls,
    Effect.gen(function*() {
      const config = yield* AppConfig
      const router = yield* Router
      const provider = yield* Provider
      const spending = yield* Spending
      const webSearch = yield* WebSearch
      const internal = <A, E extends { readonly _tag: string }>(effect: Effect.Effect<A, E>) =>
        Effect.catchAll(effect, (error) =>
          isApiError(error) ? Effect.fail(error) : Effect.die(error)) as Effect.Effect<A, Extract<E, ApiError>>

      const openLog = (p: Omit<Prepared, "hold" | "ceiling">, inputTokens: number): OpenLog => ({
        requestId: p.requestId,
        accountId: p.key.accountId,
        apiKeyId: p.key.keyId,
        publicModel: PUBLIC_MODEL,
        upstreamModel: p.route.upstreamModel,
        routingCategory: p.route.category,
        endpoint: p.input.endpoint,
        stream: p.input.stream,
        inputTokens
      })

      const elapsed = (startedAt: number) => Effect.map(Clock.currentTimeMillis, (now) => Math.max(0, now - startedAt))

      const prepare = (input: CallInput) =>
        Effect.gen(function*() {
          const key = yield* CurrentApiKey
          const requestId = yield* currentRequestId
          const startedAt = yield* Clock.currentTimeMillis
          const route = router.route({ messages: input.messages, effort: input.effort, webSearch: input.webSearch?.mode ?? "off" })
          const plan = route.search && input.webSearch !== undefined
            ? Option.some(planSearch(input.webSearch, input.messages, route.reasoningModel))
            : Option.none()
          const inputTokens = countInput(input.upstream, input.capabilities)
          const search = searchEstimate(plan)
          const searchTokens = search.contextTokens
          const explicitCap = input.maxOutputTokens ?? 0
          if (inputTokens + searchTokens + explicitCap > CONTEXT_WINDOW) {
            return yield* new ContextLengthExceeded({
              message: `The input is ${inputTokens} tokens${searchTokens > 0 ? `, web search may add ${searchTokens}` : ""}${
                explicitCap > 0 ? ` and ${explicitCap} output tokens were asked for` : ""
              }; the model's context window is ${CONTEXT_WINDOW} tokens.`,
              param: input.inputParam
            })
          }
          const outputCap = input.maxOutputTokens ?? Math.min(MAX_OUTPUT_TOKENS, CONTEXT_WINDOW - inputTokens - searchTokens)
          const searches = { searches: search.searches, pages: search.pages }
          // Web search adds its sources to the prompt and its planning calls' tokens to the bill.
          const estimate = costOf(config.prices, route.upstreamModel, {
            inputTokens: withSafetyMargin(inputTokens + searchTokens + search.planningInputTokens),
            cachedTokens: 0,
            outputTokens: outputCap + search.planningOutputTokens,
            ...searches
          })
          const cap = input.maxTotalCostMyr === undefined ? undefined : fromMyr(input.maxTotalCostMyr)
          if (cap !== undefined && estimate > cap) {
            return yield* new InvalidRequest({
              message: `This request may cost up to RM ${toMyrString(estimate)}, above max_total_cost_myr (RM ${toMyrString(cap)}).`,
              param: "max_total_cost_myr",
              guidance: `The estimated maximum cost is RM ${toMyrString(estimate)} (${inputTokens} input tokens with a safety margin, ${outputCap} output tokens${
                searches.searches > 0 ? `, ${searches.searches} searches, ${searches.pages} pages` : ""
              }). Raise max_total_cost_myr to at least ${toMyrString(estimate)}, or lower max_output_tokens.`
            })
          }
          const live = key.environment === "live"
          const base = {
            input, key, requestId, startedAt, route, plan, outputCap,
            // Test keys always use the built-in model, cost nothing and never touch the wallet.
            provider: live ? provider : simulatedProvider
          }
          const log = openLog(base, inputTokens)
          // Test keys hold nothing; a model priced at nothing holds nothing, and settles as a call with nothing to charge.
          const money = live
            ? {
              accountId: key.accountId,
              apiKeyId: key.keyId,
              requestId,
              amountMicroMyr: estimate,
              monthlySpendLimitMicroMyr: key.monthlySpendLimitMicroMyr
            }
            : null
          const hold = yield* spending.hold(money, log).pipe(
            Effect.tapError((error) =>
              isApiError(error)
                ? Effect.flatMap(elapsed(startedAt), (ms) => spending.refused(log, errorMeta(error).code, ms))
                : Effect.void
            ),
            internal
          )
          const ceiling = Math.min(hold.amountMicroMyr, cap ?? Number.MAX_SAFE_INTEGER)
          return { ...base, hold, ceiling } satisfies Prepared
        })

      const providerRequest = (p: Prepared, sources: Sources): ProviderRequest => ({
        model: p.route.upstreamModel,
        ...p.input.capabilities,
        messages: sources.message === undefined ? p.input.upstream : [sources.message, ...p.input.upstream],
        maxOutputTokens: p.outputCap,
        reasoningEffort: p.route.reasoningModel ? p.input.effort : undefined,
        reasoningModel: p.route.reasoningModel,
        temperature: p.input.temperature ?? undefined,
        topP: p.input.topP ?? undefined,
        stop: p.input.stop,
        user: p.input.user
      })

      /** Usage counted with the tokenizer: what was sent, and what came back before the call ended. */
      const estimatedUsage = (p: Prepared, sources: Sources, produced: Answer): Used => ({
        usage: withPlanning({
          inputTokens: countInput(providerRequest(p, sources).messages, p.input.capabilities),
          outputTokens: countText(produced.text) + produced.toolCalls.reduce((sum, call) => sum + countToolCall(call), 0),
          reasoningTokens: 0,
          cachedTokens: 0
        }, sources),
        source: "estimated",
        sources
      })

      /** Bills the usage (live keys) and logs it: queued, written with the next flush. */
      const settleUsed = (p: Prepared, used: Used, answer: Answer) =>
        Effect.gen(function*() {
          const latencyMs = yield* elapsed(p.startedAt)
          const priced = p.hold.source._tag === "None" ? 0 : costOf(config.prices, p.route.upstreamModel, {
            inputTokens: used.usage.inputTokens,
            cachedTokens: used.usage.cachedTokens,
            outputTokens: used.usage.outputTokens,
            searches: used.sources.searches,
            pages: used.sources.pages
          })
          const cost = microMyr(Math.min(priced, p.ceiling))
          const logged: LoggedUsage = {
            ...used.usage,
            usageSource: used.source,
            searchCount: used.sources.searches,
            contentPages: used.sources.pages,
            costMicroMyr: cost,
            latencyMs
          }
          const charged = microMyr(yield* spending.settle(p.hold, cost, `Model call ${p.requestId} (${PUBLIC_MODEL})`, logged))
          const createdAt = Math.floor(p.startedAt / 1000)
          const { annotations, citations } = citedSources(answer.text, used.sources.found)
          return {
            requestId: p.requestId,
            createdAt,
            text: answer.text,
            toolCalls: answer.toolCalls,
            logprobs: answer.logprobs,
            finishReason: answer.finishReason,
            usage: used.usage,
            cost: charged,
            latencyMs,
            route: p.route,
            citations,
            annotations
          } satisfies CallResult
        }).pipe(Effect.orDie, Effect.uninterruptible)

      /** Returns the hold and logs the failure: queued, written together with the next flush. */
      const settleFailed = (p: Prepared, code: string) =>
        Effect.flatMap(elapsed(p.startedAt), (ms) => spending.fail(p.hold, code, ms)).pipe(Effect.uninterruptible)

      interface Progress {
        readonly upstreamStarted: boolean
        readonly sources: Sources
        readonly text: string
        /** Tool calls so far, by their index in the answer. */
        readonly toolCalls: ReadonlyArray<ToolCall>
        readonly logprobs: ReadonlyArray<TokenLogprob> | undefined
        readonly settled: boolean
      }
      const initial: Progress = {
        upstreamStarted: false,
        sources: noSources,
        text: "",
        toolCalls: [],
        logprobs: undefined,
        settled: false
      }

      const produced = (s: Progress, finishReason: FinishReason): Answer => ({
        text: s.text,
        toolCalls: s.toolCalls,
        logprobs: s.logprobs,
        finishReason
      })

      /** The end of a call that did not settle itself: a client gone after the upstream started pays for what was produced. */
      const settleAbandoned = (p: Prepared, progress: Progress, exit: Exit.Exit<unknown, unknown>) => {
        if (progress.settled) return Effect.void
        if (Exit.isFailure(exit) && Cause.isInterruptedOnly(exit.cause) && progress.upstreamStarted) {
          const answer = produced(progress, "stop")
          return Effect.asVoid(Effect.ignore(settleUsed(p, estimatedUsage(p, progress.sources, answer), answer)))
        }
        return settleFailed(p, Exit.isFailure(exit) ? codeOf(exit.cause) : "internal_error")
      }

      const searchFor = (p: Prepared) =>
        Option.match(p.plan, {
          onNone: () => Effect.succeed(initial.sources),
          onSome: (plan) =>
            webSearch.run(plan, p.input.messages, {
              simulated: p.key.environment === "test",
              provider: p.provider,
              model: p.route.upstreamModel,
              reasoningModel: p.route.reasoningModel
            })
        })

      /** Marks the call settled and settles it, as one step a disconnect cannot split. */
      const settleOnce = <A>(progress: Ref.Ref<Progress>, settle: Effect.Effect<A>) =>
        Effect.uninterruptible(Effect.zipRight(Ref.update(progress, (s) => ({ ...s, settled: true })), settle))

      const onEnd = (p: Prepared, progress: Ref.Ref<Progress>) => <A, E>(exit: Exit.Exit<A, E>) =>
        Effect.flatMap(Ref.get(progress), (s) => settleAbandoned(p, s, exit))

      const usedOf = (p: Prepared, sources: Sources, answer: Answer, usage: Option.Option<ProviderUsage>): Used =>
        Option.match(usage, {
          onNone: () => estimatedUsage(p, sources, answer),
          onSome: (reported) => ({ usage: withPlanning(fromProvider(reported), sources), source: "provider" as const, sources })
        })

      /** Search, then the upstream: from here on the call has cost something. */
      const begin = <A>(p: Prepared, progress: Ref.Ref<Progress>, call: (request: ProviderRequest) => Effect.Effect<A, ProviderError>) =>
        Effect.gen(function*() {
          const sources = yield* searchFor(p)
          yield* Ref.update(progress, (s) => ({ ...s, sources, upstreamStarted: true }))
          return { sources, answer: yield* call(providerRequest(p, sources)) }
        })

      // Between the reservation and the hook that settles it, nothing may interrupt: a reservation no hook
      // settles would be renewed by this process for as long as its lease allows.
      const complete = (input: CallInput): Effect.Effect<CallResult, ApiError, CurrentApiKey> =>
        Effect.uninterruptibleMask((restore) =>
          Effect.gen(function*() {
            const p = yield* prepare(input)
            const progress = yield* Ref.make(initial)
            return yield* restore(begin(p, progress, (request) => p.provider.complete(request))).pipe(
              Effect.flatMap(({ answer, sources }) =>
                settleOnce(progress, settleUsed(p, usedOf(p, sources, answer, answer.usage), answer))
              ),
              Effect.onExit(onEnd(p, progress))
            )
          })
        )

      /** A tool call fragment folded into the calls so far; the event names the call in full (id and name), as clients need. */
      const foldToolCall = (p: Prepared, s: Progress, part: Extract<StreamPart, { _tag: "ToolCallDelta" }>) => {
        const calls = [...s.toolCalls]
        const previous = calls[part.index]
        const id = previous?.id ?? part.id ?? `call_${p.requestId.replace(/^req_/, "")}_${part.index}`
        const name = (previous?.function.name ?? "") + (previous === undefined ? part.name ?? "" : "")
        calls[part.index] = { id, type: "function", function: { name, arguments: (previous?.function.arguments ?? "") + part.arguments } }
        // An upstream that skips an index leaves no hole: calls are kept dense, in order.
        const toolCalls = calls.filter((call): call is ToolCall => call !== undefined)
        const event: StreamEvent = { _tag: "ToolCallDelta", index: toolCalls.indexOf(calls[part.index] as ToolCall), id, name, arguments: part.arguments }
        return [event, { ...s, toolCalls }] as const
      }

      /** The upstream is answering before the first byte goes out: failures until then are HTTP errors, as OpenAI's are. */
      const stream = (input: CallInput) =>
        Effect.gen(function*() {
          const { handoff, p, parts, progress } = yield* Effect.uninterruptibleMask((restore) =>
            Effect.gen(function*() {
              const p = yield* prepare(input)
              const progress = yield* Ref.make(initial)
              const { answer } = yield* restore(begin(p, progress, p.provider.stream)).pipe(
                Effect.onError((cause) => onEnd(p, progress)(Exit.failCause(cause)))
              )
              // Until the stream runs and attaches its finalizer, a watchdog owns the settlement: a stream
              // dropped before it ran (its request interrupted in between) is settled, not left held.
              const handoff = yield* Ref.make<"waiting" | "attached" | "abandoned">("waiting")
              yield* Effect.sleep(config.streamHandoffTimeoutMs).pipe(
                Effect.zipRight(Ref.modify(handoff, (s) => s === "waiting" ? [true, "abandoned" as const] : [false, s])),
                Effect.flatMap((dropped) => dropped ? onEnd(p, progress)(Exit.interrupt(FiberId.none)) : Effect.void),
                Effect.forkDaemon
              )
              return { handoff, p, parts: answer, progress }
            })
          )
          return Stream.unwrapScoped(Effect.gen(function*(): Effect.fn.Return<Stream.Stream<StreamEvent>, never, Scope.Scope> {
            const attached = yield* Ref.modify(handoff, (s) => s === "waiting" ? [true, "attached" as const] : [false, s])
            if (!attached) {
              const failed: StreamEvent = { _tag: "Failed", error: new InternalError({ message: "The call was abandoned before its stream started." }) }
              return Stream.succeed(failed)
            }
            yield* Effect.addFinalizer(onEnd(p, progress))
            const usage = yield* Ref.make<Option.Option<ProviderUsage>>(Option.none())
            const finish = yield* Ref.make<FinishReason>("stop")
            const none: ReadonlyArray<StreamEvent> = []
            const deltas = parts.pipe(
              Stream.mapConcatEffect((part): Effect.Effect<ReadonlyArray<StreamEvent>> => {
                switch (part._tag) {
                  case "Delta":
                    return Ref.modify(progress, (s) => [
                      [{ _tag: "Delta", text: part.text, logprobs: part.logprobs }],
                      {
                        ...s,
                        text: s.text + part.text,
                        logprobs: part.logprobs === undefined ? s.logprobs : [...(s.logprobs ?? []), ...part.logprobs]
                      }
                    ])
                  case "ToolCallDelta":
                    return Ref.modify(progress, (s) => {
                      const [event, next] = foldToolCall(p, s, part)
                      return [[event], next]
                    })
                  case "Finish":
                    return Effect.as(Ref.set(finish, part.finishReason), none)
                  case "Usage":
                    return Effect.as(Ref.set(usage, Option.some(part.usage)), none)
                }
              })
            )
            const completed = Effect.gen(function*() {
              const s = yield* Ref.get(progress)
              const answer = produced(s, yield* Ref.get(finish))
              const result = yield* settleOnce(progress, settleUsed(p, usedOf(p, s.sources, answer, yield* Ref.get(usage)), answer))
              return { _tag: "Completed", result } satisfies StreamEvent
            })
            return Stream.concat(deltas, Stream.fromEffect(completed)).pipe(
              Stream.catchAllCause((cause) =>
                Stream.fromEffect(Effect.gen(function*() {
                  const error = asApiError(cause)
                  if (!isApiError(Option.getOrUndefined(Cause.failureOption(cause)))) {
                    yield* Effect.logError("model call stream failed", cause)
                  }
                  const s = yield* Ref.get(progress)
                  const reported = yield* Ref.get(usage)
                  // Output the upstream produced before it broke off was paid for upstream: it is billed, as produced.
                  if (s.text.length > 0 || s.toolCalls.length > 0 || Option.isSome(reported)) {
                    const answer = produced(s, "stop")
                    yield* settleOnce(progress, settleUsed(p, usedOf(p, s.sources, answer, reported), answer))
                  } else {
                    yield* settleOnce(progress, settleFailed(p, errorMeta(error).code))
                  }
                  return { _tag: "Failed", error } satisfies StreamEvent
                }))
              )
            )
          }))
        })

      return { complete, stream }
    })
  )
}
