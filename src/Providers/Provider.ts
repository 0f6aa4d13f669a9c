import type { Effect, Option, Stream } from "effect"
import { Context } from "effect"
import type { ContextLengthExceeded, InvalidRequest, ProviderTimeout, ProviderUnavailable } from "../Domain/Errors.js"
import type { Effort } from "../Routing/Router.js"
import type { Message } from "../Models/Tokens.js"

export type FinishReason = "stop" | "length" | "tool_calls" | "content_filter"

export interface ProviderRequest {
  readonly model: string
  readonly messages: ReadonlyArray<Message>
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
  readonly finishReason: FinishReason
  readonly usage: Option.Option<ProviderUsage>
}

export type StreamPart =
  | { readonly _tag: "Delta"; readonly text: string }
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

export const finishReasonOf = (value: unknown): FinishReason =>
  value === "length" || value === "tool_calls" || value === "content_filter" ? value : "stop"
