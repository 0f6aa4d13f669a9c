import { type Effect, Option } from "effect"
import type { ApiKeyPrincipal } from "../../Auth/Api.js"
import type { ApiError, IdempotencyConflict } from "../../Domain/Errors.js"
import type { MicroMyr } from "../../Domain/Money.js"
import type { Message } from "../../Domain/Tokens.js"
import type { LoggedGuardrails } from "../../Guardrails/Api.js"
import type { ActivePolicy } from "../../Guardrails/Policy.js"
import { servedBy } from "../../Providers/Fallback.js"
import type {
  Capabilities,
  FinishReason,
  ProviderRequest,
  ProviderShape,
  ProviderUsage,
  TokenLogprob,
  ToolCall,
  UpstreamAttempt,
  UpstreamMessage
} from "../../Providers/Provider.js"
import { SIMULATED_MODEL } from "../../Providers/Simulated.js"
import type { Effort, Route } from "../../Routing/Router.js"
import type { CallHold } from "../../Wallet/Spending.js"
import type { WebSearchConfig } from "../OpenAi/Api.js"
import type { StoreRequest } from "../OpenAi/StoredConversations.js"
import type { Annotation, Citation, SearchPlan, Sources } from "./WebSearch.js"
import { noSources } from "./WebSearch.js"

/** A model call's vocabulary: what comes in, what goes out, and what it carries while it runs. */

export type Endpoint = "/v1/responses" | "/v1/chat/completions" | "/v1/messages"

/** Every endpoint that bills a call: the model calls and embeddings. */
export type BilledEndpoint = Endpoint | "/v1/embeddings"

/** What a call asks of the response cache (docs/api/cache.md): a bypass, or a key to read (unless refreshing) and store under. */
export type CacheAsk =
  | { readonly _tag: "Bypass" }
  | { readonly _tag: "Use"; readonly key: string; readonly read: boolean; readonly ttlSeconds: number }

/** A model call, whichever endpoint it came through. */
export interface CallInput {
  readonly endpoint: Endpoint
  /** The text of the conversation, for routing and search. */
  readonly messages: ReadonlyArray<Message>
  /** The conversation as the upstream takes it: images and tool turns included. */
  readonly upstream: ReadonlyArray<UpstreamMessage>
  /** The field each message of `upstream` came from, for a guardrail's refusal; absent: `inputParam`. */
  readonly paths?: ReadonlyArray<string> | undefined
  /** Remote image URLs in `upstream`, each with the param of its first use; absent, none. */
  readonly remoteImages?: ReadonlyMap<string, string> | undefined
  readonly capabilities: Capabilities
  readonly effort: Effort
  readonly maxOutputTokens: number | undefined
  readonly maxTotalCostMyr: number | undefined
  readonly webSearch: typeof WebSearchConfig.Type | undefined
  readonly temperature?: number | null | undefined
  readonly topP?: number | null | undefined
  readonly stop?: string | ReadonlyArray<string> | null | undefined
  readonly user?: string | undefined
  /** The caller's tags, kept on the call's log. */
  readonly metadata?: Readonly<Record<string, string>> | null | undefined
  readonly stream: boolean
  /** The field that names the prompt in errors: `input` or `messages`. */
  readonly inputParam: string
  /**
   * An idempotent call confirms it still holds its key just before it is billed:
   * one whose key another instance took over while this one stalled is not billed twice.
   */
  readonly confirmBeforeBilling?: Effect.Effect<void, IdempotencyConflict> | undefined
  /** A Responses call that stores its response (`store`, the default): what it keeps besides its answer. */
  readonly store?: StoreRequest | undefined
  /** What the call asks of the response cache (docs/api/cache.md); absent: nothing. */
  readonly cache?: CacheAsk | undefined
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
  /** Whether the response is stored (`store`), and the one it continues: what `/v1/responses` answers. */
  readonly stored: { readonly store: boolean; readonly previousResponseId: string | null }
}

export type StreamEvent =
  | { readonly _tag: "Delta"; readonly text: string; readonly logprobs?: ReadonlyArray<TokenLogprob> | undefined }
  | {
    readonly _tag: "ToolCallDelta"
    readonly index: number
    readonly id: string
    readonly name: string
    readonly arguments: string
  }
  | { readonly _tag: "Completed"; readonly result: CallResult }
  | { readonly _tag: "Failed"; readonly error: ApiError }

/** A call accepted and paid for in advance: what runs, and what it may cost at most. */
export interface HeldCall {
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
  /** Its upstream attempts so far, once it is settled (`servedCall`). */
  readonly attempts?: ReadonlyArray<UpstreamAttempt> | undefined
  /** The guardrail policy its key runs under (none: no guardrail work), and what it did to the input. */
  readonly guardrails: ActivePolicy | undefined
  readonly inputGuardrails: LoggedGuardrails | undefined
  /** Where its whole answer is kept in the response cache (a miss that asked it); absent: nowhere. */
  readonly keepAs?: { readonly key: string; readonly ttlSeconds: number } | undefined
  /**
   * The team's own provider key that answered, and the model asked there, once it is settled (`servedCall`):
   * billed its fee at nenas's prices for `route.upstreamModel` (docs/api/provider-keys.md, "Billing").
   */
  readonly ownKey?: { readonly id: string; readonly model: string } | undefined
}

/** What the model answered: text, tool calls, and logprobs when asked for. */
export interface Answer {
  readonly text: string
  readonly toolCalls: ReadonlyArray<ToolCall>
  readonly logprobs: ReadonlyArray<TokenLogprob> | undefined
  readonly finishReason: FinishReason
  /** What the guardrails did to the input and to this answer, as the log keeps it. */
  readonly guardrails?: LoggedGuardrails | undefined
}

/** What the call used: from the upstream, or counted by us when it did not say. */
export interface Used {
  readonly usage: CallUsage
  readonly source: "provider" | "estimated"
  readonly sources: Sources
}

/** How far a call got: read by whoever settles it, including the finalizer of a client gone away. */
export interface Progress {
  readonly upstreamStarted: boolean
  readonly sources: Sources
  readonly text: string
  /** Tool calls so far, by their index in the answer. */
  readonly toolCalls: ReadonlyArray<ToolCall>
  readonly logprobs: ReadonlyArray<TokenLogprob> | undefined
  /** What a stream's `Finish` part said, and the usage its `Usage` part reported. */
  readonly finishReason: FinishReason
  readonly reportedUsage: Option.Option<ProviderUsage>
  /** Each upstream attempt as it ended (Providers/Fallback.ts): the last `ok` one answered. */
  readonly attempts: ReadonlyArray<UpstreamAttempt>
  /** Epoch ms: when the upstream was first asked, and when the first visible output arrived (ReasoningEstimate.ts). */
  readonly upstreamSentAt: number | undefined
  readonly firstVisibleAt: number | undefined
  readonly settled: boolean
}

export const notStarted: Progress = {
  upstreamStarted: false,
  sources: noSources,
  text: "",
  toolCalls: [],
  logprobs: undefined,
  finishReason: "stop",
  reportedUsage: Option.none(),
  attempts: [],
  upstreamSentAt: undefined,
  firstVisibleAt: undefined,
  settled: false
}

/** `progress` with `attempt` told: after the others, or in place of the last (`amend`: a stream that opened, then was cut). */
export const withAttempt = (progress: Progress, attempt: UpstreamAttempt, amend: boolean): Progress => ({
  ...progress,
  attempts: amend && progress.attempts.length > 0
    ? [...progress.attempts.slice(0, -1), attempt]
    : [...progress.attempts, attempt]
})

/**
 * The call as it is settled: with its attempts, and routed to the model that answered. A fallback (any
 * attempt before the one that answered) is billed at its own prices, and `routing` says so.
 */
export const servedCall = (call: HeldCall, attempts: ReadonlyArray<UpstreamAttempt>): HeldCall =>
  Option.match(servedBy(attempts), {
    // `Object.assign`, not a spread: the call has no `attempts` before, and Node 20 builds a spread that adds a
    // field on a slow path whose objects outlive the call (docs/performance.md, "What kept a request's objects through young collections").
    onNone: () => Object.assign({}, call, { attempts }),
    onSome: (served) => {
      const before = attempts.indexOf(served)
      // On a team's own key the call stays priced at nenas's model for its category.
      const own = served.providerKeyId === undefined
        ? undefined
        : { ownKey: { id: served.providerKeyId, model: served.model } }
      if (before === 0) {
        if (own === undefined) return Object.assign({}, call, { attempts })
        const reasoning =
          `${call.route.reasoning} ${served.model} answered on your provider key ${served.providerKeyId}.`
        return Object.assign({}, call, { attempts, route: { ...call.route, reasoning } }, own)
      }
      const skipped = attempts.slice(0, before).map((a) => `${a.target} (${a.outcome.replaceAll("_", " ")})`).join(", ")
      return Object.assign({}, call, {
        attempts,
        route: {
          ...call.route,
          upstreamModel: own === undefined ? served.model : call.route.upstreamModel,
          fallback: true,
          reasoning: `${call.route.reasoning} ${served.target} answered as a fallback after ${skipped}.`
        }
      }, own)
    }
  })

/** The answer produced so far, ending for `finishReason`. */
export const answerSoFar = (progress: Progress, finishReason: FinishReason): Answer => ({
  text: progress.text,
  toolCalls: progress.toolCalls,
  logprobs: progress.logprobs,
  finishReason
})

/** The request the upstream gets: the caller's conversation after the sources, at the held output cap. */
export const providerRequest = (
  call: HeldCall,
  sources: Sources,
  attempted?: ProviderRequest["attempted"]
  // eslint-disable-next-line nenas/no-spread-adding-field -- once per call, not per chunk
): ProviderRequest => ({
  model: call.route.upstreamModel,
  ...call.input.capabilities,
  messages: sources.message === undefined ? call.input.upstream : [sources.message, ...call.input.upstream],
  maxOutputTokens: call.outputCap,
  reasoningEffort: call.route.reasoningModel ? call.input.effort : undefined,
  reasoningModel: call.route.reasoningModel,
  temperature: call.input.temperature ?? undefined,
  topP: call.input.topP ?? undefined,
  stop: call.input.stop,
  user: call.input.user,
  attempted
})

/** The route as the caller is told it: a test key's call ran on the built-in model, whatever upstream the router picked. */
export const shownRoute = (route: Route, environment: "live" | "test"): Route =>
  environment === "test" ? { ...route, upstreamModel: SIMULATED_MODEL } : route
