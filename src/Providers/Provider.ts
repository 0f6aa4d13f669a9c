import type { Effect, Option, Stream } from "effect"
import { Context } from "effect"
import type { ContextLengthExceeded, InvalidRequest, ProviderTimeout, ProviderUnavailable } from "../Domain/Errors.js"
import type { Effort } from "../Routing/Router.js"
import type { Message } from "../Domain/Tokens.js"
import type { UpstreamAttemptOutcome } from "../Observability/Metrics.js"

export type FinishReason = "stop" | "length" | "tool_calls" | "content_filter"

/** A content part as the upstream's chat API takes it. */
export type UpstreamPart =
  | { readonly type: "text"; readonly text: string }
  | { readonly type: "image_url"; readonly image_url: { readonly url: string; readonly detail?: "low" | "high" | "auto" } }

/** A function call the model made, as chat carries it in `tool_calls`. */
export interface ToolCall {
  readonly id: string
  readonly type: "function"
  readonly function: { readonly name: string; readonly arguments: string }
}

/** A message as the upstream's chat API takes it: the caller's turns, images and tool turns included, forwarded as they came. */
export type UpstreamMessage =
  | Message
  | { readonly role: "system" | "developer" | "user"; readonly content: string | ReadonlyArray<UpstreamPart> }
  | { readonly role: "assistant"; readonly content: string | null; readonly tool_calls: ReadonlyArray<ToolCall> }
  | { readonly role: "tool"; readonly tool_call_id: string; readonly content: string }

/** A function the model may call (chat's shape). */
export interface ToolDefinition {
  readonly type: "function"
  readonly function: {
    readonly name: string
    readonly description?: string | undefined
    readonly parameters?: Readonly<Record<string, unknown>> | undefined
    readonly strict?: boolean | undefined
  }
}

export type ToolChoice = "none" | "auto" | "required" | { readonly type: "function"; readonly function: { readonly name: string } }

export type ResponseFormat =
  | { readonly type: "text" }
  | { readonly type: "json_object" }
  | {
    readonly type: "json_schema"
    readonly json_schema: {
      readonly name: string
      readonly description?: string | undefined
      readonly schema?: Readonly<Record<string, unknown>> | undefined
      readonly strict?: boolean | undefined
    }
  }

/** What the caller asked beyond the text: forwarded to the upstream, and honoured by the simulated model. */
export interface Capabilities {
  readonly tools?: ReadonlyArray<ToolDefinition> | undefined
  readonly toolChoice?: ToolChoice | undefined
  readonly parallelToolCalls?: boolean | undefined
  readonly responseFormat?: ResponseFormat | undefined
  readonly presencePenalty?: number | undefined
  readonly frequencyPenalty?: number | undefined
  readonly logitBias?: Readonly<Record<string, number>> | undefined
  readonly seed?: number | undefined
  readonly logprobs?: boolean | undefined
  readonly topLogprobs?: number | undefined
}

/** One entry of chat's `logprobs.content`, as the upstream sent it. */
export type TokenLogprob = unknown

/** How one attempt at one target ended (the metrics' `outcome` label, and the log's). */
export type AttemptOutcome = UpstreamAttemptOutcome

/** One attempt of a call at one target (`upstream/model`), as its log row keeps it. */
export interface UpstreamAttempt {
  readonly target: string
  readonly model: string
  readonly outcome: AttemptOutcome
  readonly latencyMs: number
}

export interface ProviderRequest extends Capabilities {
  readonly model: string
  readonly messages: ReadonlyArray<UpstreamMessage>
  /** The output cap passed upstream. */
  readonly maxOutputTokens: number
  /** Sent only to the reasoning model. */
  readonly reasoningEffort: Effort | undefined
  /** Whether the upstream takes `max_completion_tokens` (reasoning models) rather than `max_tokens`. */
  readonly reasoningModel: boolean
  readonly temperature?: number | undefined
  readonly topP?: number | undefined
  readonly stop?: string | ReadonlyArray<string> | null | undefined
  readonly user?: string | undefined
  /**
   * Told of each attempt as it ends (fallbacks, Providers/Fallback.ts); `amend` replaces the last one told
   * (a stream that opened `ok`, then was cut short). The attempt told `ok` last is the model that answered.
   */
  readonly attempted?: ((attempt: UpstreamAttempt, amend: boolean) => Effect.Effect<void>) | undefined
}

/** Usage as the upstream reported it; `outputTokens` includes `reasoningTokens`, as in OpenAI's `completion_tokens`. */
export interface ProviderUsage {
  readonly inputTokens: number
  readonly outputTokens: number
  readonly reasoningTokens: number
  readonly cachedTokens: number
}

export interface Completion {
  readonly text: string
  readonly toolCalls: ReadonlyArray<ToolCall>
  readonly finishReason: FinishReason
  readonly usage: Option.Option<ProviderUsage>
  /** Chat's `logprobs.content` when they were asked for. */
  readonly logprobs: ReadonlyArray<TokenLogprob> | undefined
}

/** A fragment of the tool call at `index`: its id and name come first, then its arguments piece by piece. */
export interface ToolCallDelta {
  readonly _tag: "ToolCallDelta"
  readonly index: number
  readonly id?: string | undefined
  readonly name?: string | undefined
  readonly arguments: string
}

export type StreamPart =
  | { readonly _tag: "Delta"; readonly text: string; readonly logprobs?: ReadonlyArray<TokenLogprob> | undefined }
  | ToolCallDelta
  | { readonly _tag: "Finish"; readonly finishReason: FinishReason }
  | { readonly _tag: "Usage"; readonly usage: ProviderUsage }

/** The upstream's failures; a request it refuses is the caller's (`InvalidRequest`, `ContextLengthExceeded`). */
export type ProviderError = ProviderUnavailable | ProviderTimeout | InvalidRequest | ContextLengthExceeded

export interface ProviderShape {
  readonly complete: (request: ProviderRequest) => Effect.Effect<Completion, ProviderError>
  /** Succeeds once the upstream has started answering (its failures so far are HTTP errors to our client); then the parts. */
  readonly stream: (request: ProviderRequest) => Effect.Effect<Stream.Stream<StreamPart, ProviderError>, ProviderError>
}

/** The configured model provider: the upstream when `UPSTREAM_BASE_URL` is set, else the simulated model. */
export class Provider extends Context.Tag("nenas/Provider")<Provider, ProviderShape>() {}

/** The model test keys call: the simulated model, whatever the upstream; they cost nothing, so they must never reach it. */
export class TestKeyProvider extends Context.Tag("nenas/TestKeyProvider")<TestKeyProvider, ProviderShape>() {}

export const finishReasonOf = (value: unknown): FinishReason =>
  value === "length" || value === "tool_calls" || value === "content_filter" ? value : "stop"
