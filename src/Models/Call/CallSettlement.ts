import { Cause, Clock, Effect, Exit, Option, Ref } from "effect"
import { AppConfig } from "../../AppConfig.js"
import { errorMeta, isApiError } from "../../Domain/Errors.js"
import type { MicroMyr } from "../../Domain/Money.js"
import { microMyr } from "../../Domain/Money.js"
import { costOfParts, FULL_SHARE_BPS, type PriceTable } from "../../Domain/Prices.js"
import { countText } from "../../Domain/Tokens.js"
import type { LoggedAttempt, LoggedOwnKey, SettledUsage } from "../../Logs/RequestLogs.js"
import { countToolCall } from "../../Providers/ContentTokens.js"
import type { ProviderUsage } from "../../Providers/Provider.js"
import type { WhenShort } from "../../Wallet/Instances/PayNow.js"
import { Spending } from "../../Wallet/Spending.js"
import { CONTEXT_WINDOW, PUBLIC_MODEL } from "../OpenAi/Api.js"
import { storedWrite } from "../OpenAi/StoredConversations.js"
import { responsesOutput } from "../OpenAi/Wire.js"
import type { Answer, CallResult, CallUsage, HeldCall, Progress, Used } from "./CallTypes.js"
import { answerSoFar, providerRequest, servedCall, shownRoute } from "./CallTypes.js"
import { billedCost, countInput } from "./Estimate.js"
import { answeringModel, estimateReasoningTokens, makeReasoningRates, thinkingMsOf } from "./ReasoningEstimate.js"
import type { Sources } from "./WebSearch.js"
import { citedSources, searchSpent, withPlanning } from "./WebSearch.js"

/** The error code a failed call is logged with. */
export const codeOf = (cause: Cause.Cause<unknown>): string =>
  Option.match(Cause.failureOption(cause), {
    onNone: () => "internal_error",
    onSome: (error) => isApiError(error) ? errorMeta(error).code : "internal_error"
  })

/** Milliseconds since `startedAt` on `clock` (the service's, read directly: no fiber steps on the call's path). */
export const elapsedSince = (clock: Clock.Clock, startedAt: number): number =>
  Math.max(0, clock.unsafeCurrentTimeMillis() - startedAt)

/** A count within `[0, bound]`, whole: one past the bound (or not a number at all) is the bound. */
const within = (count: number, bound: number): number =>
  Number.isNaN(count) ? bound : Math.min(Math.max(0, Math.round(count)), bound)

/**
 * Usage as the upstream reported it, within the call's bounds (docs/architecture.md, "Streams"): input no more than the
 * context window, output no more than the output cap the upstream was asked for, parts never above their wholes.
 */
const fromProvider = (call: HeldCall, usage: ProviderUsage): CallUsage => {
  const inputTokens = within(usage.inputTokens, CONTEXT_WINDOW)
  const outputTokens = within(usage.outputTokens, call.outputCap)
  return {
    inputTokens,
    outputTokens,
    reasoningTokens: within(usage.reasoningTokens, outputTokens),
    cachedTokens: within(usage.cachedTokens, inputTokens)
  }
}

/**
 * Usage counted with the tokenizer: what was sent, and what came back before the call ended, plus the reasoning
 * estimated for it (ReasoningEstimate.ts), within what the output cap leaves.
 */
const estimatedUsage = (call: HeldCall, sources: Sources, produced: Answer, reasoningEstimate: number): Used => {
  // The upstream stops at the output cap, whatever our tokenizer makes of what it sent.
  const visible = Math.min(
    call.outputCap,
    countText(produced.text) + produced.toolCalls.reduce((sum, toolCall) => sum + countToolCall(toolCall), 0)
  )
  const reasoningTokens = Math.max(0, Math.min(reasoningEstimate, call.outputCap - visible))
  return {
    usage: withPlanning({
      inputTokens: countInput(providerRequest(call, sources).messages, call.input.capabilities),
      outputTokens: visible + reasoningTokens,
      reasoningTokens,
      cachedTokens: 0
    }, sources),
    source: "estimated",
    sources
  }
}

/** A call cut before its upstream call, after its search spent something: the search alone, as we counted it. */
const searchOnly = (sources: Sources): Used => ({
  usage: withPlanning({ inputTokens: 0, outputTokens: 0, reasoningTokens: 0, cachedTokens: 0 }, sources),
  source: "estimated",
  sources
})

/** What the call used: the upstream's usage when it reported one, else ours (with `reasoningEstimate` reasoning tokens). */
export const usedOf = (
  call: HeldCall,
  sources: Sources,
  answer: Answer,
  reported: Option.Option<ProviderUsage>,
  reasoningEstimate = 0
): Used =>
  Option.match(reported, {
    onNone: () => estimatedUsage(call, sources, answer, reasoningEstimate),
    onSome: (usage) => ({
      usage: withPlanning(fromProvider(call, usage), sources),
      source: "provider" as const,
      sources
    })
  })

const resultOf = (call: HeldCall, answer: Answer, used: Used, cost: MicroMyr, latencyMs: number): CallResult => {
  const { annotations, citations } = citedSources(answer.text, used.sources.found)
  return {
    requestId: call.requestId,
    createdAt: Math.floor(call.startedAt / 1000),
    text: answer.text,
    toolCalls: answer.toolCalls,
    logprobs: answer.logprobs,
    finishReason: answer.finishReason,
    usage: used.usage,
    cost,
    latencyMs,
    route: shownRoute(call.route, call.key.environment),
    citations,
    annotations,
    stored: { store: call.input.store !== undefined, previousResponseId: call.input.store?.previousResponseId ?? null }
  }
}

/**
 * What the call is billed: its usage priced, never above its ceiling; a price past what a number holds
 * saturates at the ceiling instead of throwing. Nothing when it held nothing.
 */
const pricedWithin = (prices: PriceTable, call: HeldCall, used: Used, feeBps: number): MicroMyr => {
  if (call.hold.source._tag === "None") return microMyr(0)
  try {
    return billedCost(
      prices,
      call.route.upstreamModel,
      {
        inputTokens: used.usage.inputTokens,
        cachedTokens: used.usage.cachedTokens,
        outputTokens: used.usage.outputTokens,
        searches: used.sources.searches,
        pages: used.sources.pages
      },
      call.ceiling,
      used.sources.planningCalls.map(({ model, providerKeyId, usage }) => ({
        model,
        inputTokens: usage.inputTokens,
        cachedTokens: usage.cachedTokens,
        outputTokens: usage.outputTokens,
        shareBps: providerKeyId === undefined ? FULL_SHARE_BPS : feeBps
      })),
      call.ownKey === undefined ? FULL_SHARE_BPS : feeBps
    )
  } catch (error) {
    if (error instanceof RangeError) return microMyr(call.ceiling)
    throw error
  }
}

/**
 * What a call answered on a team's own key logs: the key, and the fee, what its bill holds beside what is billed
 * in full (searches, pages, and a planning call nenas's upstream answered).
 */
const ownKeyLogged = (prices: PriceTable, providerKeyId: string, cost: number, sources: Sources): LoggedOwnKey => {
  const inFull = sources.planningCalls.filter((part) => part.providerKeyId === undefined).map(({ model, usage }) => ({
    model,
    inputTokens: usage.inputTokens,
    cachedTokens: usage.cachedTokens,
    outputTokens: usage.outputTokens
  }))
  return {
    providerKeyId,
    feeMicroMyr: Math.max(0, cost - costOfParts(prices, inFull, sources.searches, sources.pages))
  }
}

/** The call's attempts as its log row keeps them. */
const loggedAttempts = (call: HeldCall): ReadonlyArray<LoggedAttempt> =>
  (call.attempts ?? []).map(({ latencyMs, outcome, target }) => ({ target, outcome, latencyMs }))

/**
 * How a held call ends: billed for what it used (never above its ceiling) or
 * its hold returned, and logged either way. Each runs uninterruptibly; the
 * wallet writes them with its next flush.
 */
export const makeSettlement = Effect.gen(function*() {
  const { byokFeeBps, prices, storedResponsesMaxBytes } = yield* AppConfig
  const spending = yield* Spending
  const clock = yield* Effect.clock
  const rates = makeReasoningRates()
  const costWithin = (call: HeldCall, used: Used) => pricedWithin(prices, call, used, byokFeeBps)

  /**
   * What a call that reached the upstream used, from its progress: reported usage teaches the model's thinking
   * rate; without it, a reasoning model's thinking until its first visible output (or until now) is estimated.
   */
  const usedSoFar = (call: HeldCall, progress: Progress, answer: Answer) =>
    Effect.sync((): Used => {
      const now = clock.unsafeCurrentTimeMillis()
      const model = answeringModel(progress.attempts, call.route.upstreamModel)
      if (Option.isSome(progress.reportedUsage)) {
        const thinkingMs = progress.firstVisibleAt === undefined
          ? undefined
          : thinkingMsOf(progress, progress.firstVisibleAt)
        const used = usedOf(call, progress.sources, answer, progress.reportedUsage)
        if (call.route.reasoningModel && call.key.environment === "live" && thinkingMs !== undefined) {
          rates.observe(model, used.usage.reasoningTokens, thinkingMs)
        }
        return used
      }
      const thinkingMs = call.route.reasoningModel ? thinkingMsOf(progress, now) : undefined
      const reasoning = thinkingMs === undefined
        ? 0
        : estimateReasoningTokens(thinkingMs, rates.rateOf(model), call.outputCap)
      return usedOf(call, progress.sources, answer, Option.none(), reasoning)
    })

  /**
   * Bills the usage (live keys) and logs it, before the answer goes out. A
   * call whose hold was taken back while this instance stalled is paid from
   * the wallet first (`Spending.settle`): `refuse` fails the call when the
   * wallet cannot pay it, `bill what it can` bills what it holds. A whole
   * answer (`complete`) of a call that stores is stored with its settlement.
   */
  const bill = Effect.fnUntraced(
    function*(
      call: HeldCall,
      used: Used,
      answer: Answer,
      whenShort: WhenShort,
      complete: boolean,
      errorCode: string | null
    ) {
      const latencyMs = elapsedSince(clock, call.startedAt)
      const cost = costWithin(call, used)
      // Field by field, not a spread of `used.usage` that adds fields (slow on Node 20: `logRow`).
      const logged: SettledUsage = {
        inputTokens: used.usage.inputTokens,
        outputTokens: used.usage.outputTokens,
        reasoningTokens: used.usage.reasoningTokens,
        cachedTokens: used.usage.cachedTokens,
        answeredBy: call.ownKey?.model ?? shownRoute(call.route, call.key.environment).upstreamModel,
        attempts: loggedAttempts(call),
        errorCode,
        usageSource: used.source,
        searchCount: used.sources.searches,
        contentPages: used.sources.pages,
        costMicroMyr: cost,
        latencyMs,
        // The answer's, when the output was scanned (it holds the input's too); else the input's, as the row opened.
        guardrails: answer.guardrails ?? call.inputGuardrails,
        ownKey: call.ownKey === undefined ? undefined : ownKeyLogged(prices, call.ownKey.id, cost, used.sources)
      }
      const result = resultOf(call, answer, used, cost, latencyMs)
      const store = complete ? call.input.store : undefined
      const stored = store === undefined ? undefined : yield* storedWrite(
        store,
        {
          requestId: call.requestId,
          accountId: call.key.accountId,
          apiKeyId: call.key.keyId,
          environment: call.key.environment,
          startedAt: call.startedAt
        },
        responsesOutput(result),
        storedResponsesMaxBytes
      )
      // The wallet's step is the last: nothing after it may fail and leave the call to be settled again.
      const charged = yield* spending.settle(
        call.hold,
        cost,
        `Model call ${call.requestId} (${PUBLIC_MODEL})`,
        logged,
        whenShort,
        stored
      )
      return charged === cost ? result : Object.assign({}, result, { cost: microMyr(charged) })
    },
    Effect.uninterruptible
  )

  /**
   * A stream's end (its answer already under way; `complete` when whole), or a call whose client left: billed,
   * never refused. `errorCode`: the error that cut a stream short after it produced output (docs/money.md, "Request lifecycle and logs": billed, with the code).
   */
  const settleUsed = (call: HeldCall, used: Used, answer: Answer, complete = false, errorCode: string | null = null) =>
    bill(call, used, answer, "bill what it can", complete, errorCode).pipe(Effect.orDie)

  /** A non-streamed answer, before it goes out: `insufficient_balance` instead when it cannot be paid. */
  const settleAnswer = (call: HeldCall, used: Used, answer: Answer) => bill(call, used, answer, "refuse", true, null)

  /** Returns the hold and logs the failure. */
  const settleFailed = (call: HeldCall, code: string) =>
    Effect.suspend(() => spending.fail(call.hold, code, elapsedSince(clock, call.startedAt), loggedAttempts(call)))
      .pipe(Effect.uninterruptible)

  /**
   * Settles the call and marks it settled, as one step a disconnect cannot split; a settlement that died before
   * the wallet took it (a defect, not a refusal) is not marked, so that the call's exit settles it.
   */
  const settleOnce = <A, E>(progress: Ref.Ref<Progress>, settle: Effect.Effect<A, E>) =>
    Effect.uninterruptible(Effect.onExit(settle, (exit) =>
      Exit.isSuccess(exit) || Cause.isFailure(exit.cause)
        ? Ref.update(progress, (current) => ({ ...current, settled: true }))
        : Effect.void))

  /**
   * A call that failed with `code` and produced nothing: billed for its web search when the search spent
   * something (planning calls, searches, pages paid upstream: docs/money.md, "The money rules"), logged with the code; else
   * failed, its hold returned. A call whose idempotency key another instance took over is not billed: that
   * instance runs (and bills) it again.
   */
  const settleUnproduced = (call: HeldCall, progress: Progress, code: string) =>
    searchSpent(progress.sources) && code !== "idempotency_conflict"
      ? Effect.asVoid(
        Effect.ignore(settleUsed(call, searchOnly(progress.sources), answerSoFar(progress, "stop"), false, code))
      )
      : settleFailed(call, code)

  /**
   * The end of a call that did not settle itself: a client gone after the upstream started pays for what was
   * produced; a client gone before it, or a failure (a deadline, a failing search engine, a refusal), after web
   * search spent something, for the search.
   */
  const settleAbandoned = (held: HeldCall, progress: Progress, exit: Exit.Exit<unknown, unknown>) => {
    if (progress.settled) return Effect.void
    const call = servedCall(held, progress.attempts)
    if (Exit.isFailure(exit) && Cause.isInterruptedOnly(exit.cause)) {
      const answer = answerSoFar(progress, "stop")
      // Billed as we counted what was produced so far.
      if (progress.upstreamStarted) {
        return Effect.asVoid(
          Effect.ignore(Effect.flatMap(usedSoFar(call, progress, answer), (used) => settleUsed(call, used, answer)))
        )
      }
      if (searchSpent(progress.sources)) {
        return Effect.asVoid(Effect.ignore(settleUsed(call, searchOnly(progress.sources), answer)))
      }
      return settleFailed(call, "internal_error")
    }
    return settleUnproduced(call, progress, Exit.isFailure(exit) ? codeOf(exit.cause) : "internal_error")
  }

  /** A call's last word, whatever its exit: it settles unless it settled itself. */
  const settleOnExit = (call: HeldCall, progress: Ref.Ref<Progress>) => <A, E>(exit: Exit.Exit<A, E>) =>
    Effect.flatMap(Ref.get(progress), (current) => settleAbandoned(call, current, exit))

  return { usedSoFar, settleUsed, settleAnswer, settleFailed, settleUnproduced, settleOnce, settleOnExit }
})

export type Settlement = Effect.Effect.Success<typeof makeSettlement>
