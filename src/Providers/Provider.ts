import { Context, Duration, Effect, Layer, Option, Stream } from "effect"
import type {
  ContextLengthExceeded,
  InvalidRequest,
  ProviderKeyRefused,
  ProviderTimeout,
  ProviderUnavailable
} from "../Domain/Errors.js"
import type { Message } from "../Domain/Tokens.js"
import type { UpstreamAttemptOutcome } from "../Observability/Metrics.js"
import type { Effort } from "../Routing/Router.js"
import { simulatedVectors } from "./EmbeddingVectors.js"

export type FinishReason = "stop" | "length" | "tool_calls" | "content_filter"

/** A content part as the upstream's chat API takes it. */
export type UpstreamPart =
  | { readonly type: "text"; readonly text: string }
  | {
    readonly type: "image_url"
    readonly image_url: { readonly url: string; readonly detail?: "low" | "high" | "auto" }
  }

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

export type ToolChoice = "none" | "auto" | "required" | {
  readonly type: "function"
  readonly function: { readonly name: string }
}

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
  /** The team's own provider key it went to (docs/api/provider-keys.md, "Routing"); absent: nenas's upstream. */
  readonly providerKeyId?: string | undefined
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

/** One embeddings request as the upstream takes it (OpenAI's /embeddings). */
export interface EmbeddingRequest {
  readonly model: string
  /** Each item a text or a token array. */
  readonly input: ReadonlyArray<string | ReadonlyArray<number>>
  readonly dimensions?: number | undefined
  readonly user?: string | undefined
  readonly attempted?: ProviderRequest["attempted"]
}

export interface EmbeddingAnswer {
  /** One vector per input item, in order, each of `dimensions` floats (or the model's size). */
  readonly vectors: ReadonlyArray<ReadonlyArray<number>>
  /** The upstream's `usage.prompt_tokens`, when it said. */
  readonly inputTokens: Option.Option<number>
}

/** The upstream's failures; a request it refuses is the caller's (`InvalidRequest`, `ContextLengthExceeded`). */
export type ProviderError =
  | ProviderUnavailable
  | ProviderTimeout
  | InvalidRequest
  | ContextLengthExceeded
  | ProviderKeyRefused

export interface ProviderShape {
  readonly complete: (request: ProviderRequest) => Effect.Effect<Completion, ProviderError>
  /** Succeeds once the upstream has started answering (its failures so far are HTTP errors to our client); then the parts. */
  readonly stream: (request: ProviderRequest) => Effect.Effect<Stream.Stream<StreamPart, ProviderError>, ProviderError>
  readonly embed: (request: EmbeddingRequest) => Effect.Effect<EmbeddingAnswer, ProviderError>
}

/**
 * A provider for tests (`Provider.scripted`), scripted call by call: each call
 * takes the next step of a list (or the step a function picks from the
 * request), and every request is recorded for the test to assert on. A step
 * (`Script.answer`, `Script.streamed`, `Script.refuse`) is an answer, a stream
 * of parts with real delays between them, or a typed provider error. Either
 * kind of call can take either kind of answer: `complete` joins a streamed
 * step's parts, `stream` sends a completion as one part. `embed` is not
 * scripted by default: it answers the simulated model's vectors (no usage),
 * recording each request in `embeddingRequests`; `embeddings`, when given,
 * answers each embed call instead.
 */

export type ScriptStep =
  /** The whole answer at once. */
  | { readonly _tag: "Answer"; readonly completion: Completion }
  /** Parts sent `delay` apart (a real sleep on the fiber's clock); `failure`, when given, ends the stream after them. */
  | {
    readonly _tag: "Parts"
    readonly parts: ReadonlyArray<StreamPart>
    readonly delay: Duration.Duration
    readonly failure: ProviderError | undefined
  }
  /** The upstream refuses before it answers: both `complete` and `stream` fail with it. */
  | { readonly _tag: "Refuse"; readonly error: ProviderError }

export type Script =
  | ReadonlyArray<ScriptStep>
  /** `index` counts calls from 0, over `complete` and `stream` together. */
  | ((request: ProviderRequest, index: number) => ScriptStep)

/** How a scripted provider answers its `embed` calls; `index` counts them from 0. */
export type EmbeddingScript = (
  request: EmbeddingRequest,
  index: number
) => Effect.Effect<EmbeddingAnswer, ProviderError>

export interface ScriptedProvider extends ProviderShape {
  /** Every `complete` and `stream` request received, in order (a live array). */
  readonly requests: ReadonlyArray<ProviderRequest>
  /** Every `embed` request received, in order (a live array). */
  readonly embeddingRequests: ReadonlyArray<EmbeddingRequest>
}

/** The simulated model's answer to an embeddings request: its vectors, no usage (the caller counts). */
const simulatedEmbeddings: EmbeddingScript = (request) =>
  Effect.sync(() => ({
    vectors: simulatedVectors(request.input, request.dimensions),
    inputTokens: Option.none()
  }))

// eslint-disable-next-line nenas/no-spread-adding-field -- the simulated model's usage, once per call
const usage = (inputTokens: number, outputTokens: number, extra: Partial<ProviderUsage> = {}): ProviderUsage => ({
  inputTokens,
  outputTokens,
  reasoningTokens: 0,
  cachedTokens: 0,
  ...extra
})

/** A step: `text` as the answer, with the usage the upstream reports (none: we count it ourselves). */
const answer = (
  text: string,
  options: {
    readonly usage?: ProviderUsage
    readonly toolCalls?: ReadonlyArray<ToolCall>
    readonly finishReason?: Completion["finishReason"]
  } = {}
): ScriptStep => ({
  _tag: "Answer",
  completion: {
    text,
    toolCalls: options.toolCalls ?? [],
    finishReason: options.finishReason ??
      (options.toolCalls !== undefined && options.toolCalls.length > 0 ? "tool_calls" : "stop"),
    usage: Option.fromNullable(options.usage),
    logprobs: undefined
  }
})

/** A step: `chunks` as text deltas `delay` apart, then the finish and (when given) the usage; or `failure` after the chunks. */
const streamed = (
  chunks: ReadonlyArray<string>,
  options: {
    readonly delay?: Duration.DurationInput
    readonly usage?: ProviderUsage
    readonly failure?: ProviderError
  } = {}
): ScriptStep => ({
  _tag: "Parts",
  parts: [
    ...chunks.map((text): StreamPart => ({ _tag: "Delta", text })),
    ...(options.failure === undefined ? [{ _tag: "Finish", finishReason: "stop" } as const] : []),
    ...(options.usage === undefined || options.failure !== undefined
      ? []
      : [{ _tag: "Usage", usage: options.usage } as const])
  ],
  delay: Duration.decode(options.delay ?? 0),
  failure: options.failure
})

const refuse = (error: ProviderError): ScriptStep => ({ _tag: "Refuse", error })

/** The completion a streamed step adds up to, as the upstream would have answered it whole. */
const joined = (parts: ReadonlyArray<StreamPart>): Completion => {
  let text = ""
  let finishReason: Completion["finishReason"] = "stop"
  let reported: Option.Option<ProviderUsage> = Option.none()
  const calls = new Map<number, { id: string; name: string; arguments: string }>()
  for (const part of parts) {
    switch (part._tag) {
      case "Delta":
        text += part.text
        break
      case "ToolCallDelta": {
        const call = calls.get(part.index) ?? { id: "", name: "", arguments: "" }
        calls.set(part.index, {
          id: part.id ?? call.id,
          name: part.name ?? call.name,
          arguments: call.arguments + part.arguments
        })
        break
      }
      case "Finish":
        finishReason = part.finishReason
        break
      case "Usage":
        reported = Option.some(part.usage)
        break
    }
  }
  const toolCalls = [...calls.entries()].sort(([a], [b]) => a - b).map(([, call]): ToolCall => ({
    id: call.id,
    type: "function",
    function: { name: call.name, arguments: call.arguments }
  }))
  return { text, toolCalls, finishReason, usage: reported, logprobs: undefined }
}

/** The parts a whole completion streams as: its text in one delta, its tool calls, the finish, the usage. */
const split = (completion: Completion): ReadonlyArray<StreamPart> => [
  ...(completion.text === "" ? [] : [{ _tag: "Delta", text: completion.text } as const]),
  ...completion.toolCalls.map((call, index): StreamPart => ({
    _tag: "ToolCallDelta",
    index,
    id: call.id,
    name: call.function.name,
    arguments: call.function.arguments
  })),
  { _tag: "Finish", finishReason: completion.finishReason },
  ...Option.match(completion.usage, {
    onNone: () => [],
    onSome: (reported) => [{ _tag: "Usage", usage: reported } as const]
  })
]

const scripted = (script: Script, embeddings: EmbeddingScript = simulatedEmbeddings): ScriptedProvider => {
  const requests: Array<ProviderRequest> = []
  const embeddingRequests: Array<EmbeddingRequest> = []
  const next = (request: ProviderRequest) =>
    Effect.suspend(() => {
      const index = requests.length
      requests.push(request)
      if (typeof script === "function") return Effect.succeed(script(request, index))
      const step = script[index]
      return step === undefined
        ? Effect.dieMessage(
          `Provider.scripted: the script has ${script.length} step(s), and call ${
            index + 1
          } came (model ${request.model})`
        )
        : Effect.succeed(step)
    })
  const complete = (request: ProviderRequest) =>
    Effect.flatMap(next(request), (step): Effect.Effect<Completion, ProviderError> => {
      switch (step._tag) {
        case "Answer":
          return Effect.succeed(step.completion)
        case "Refuse":
          return Effect.fail(step.error)
        case "Parts":
          // A whole answer waits for every part, as a complete call to a slow upstream would.
          return Effect.sleep(Duration.times(step.delay, step.parts.length)).pipe(
            Effect.zipRight(step.failure === undefined ? Effect.succeed(joined(step.parts)) : Effect.fail(step.failure))
          )
      }
    })
  const stream = (request: ProviderRequest) =>
    Effect.flatMap(next(request), (step): Effect.Effect<Stream.Stream<StreamPart, ProviderError>, ProviderError> => {
      switch (step._tag) {
        case "Answer":
          return Effect.succeed(Stream.fromIterable(split(step.completion)))
        case "Refuse":
          return Effect.fail(step.error)
        case "Parts": {
          const [first, ...rest] = step.parts
          // The first part comes at once (the upstream has started answering); each later one `delay` after the last.
          const parts: Stream.Stream<StreamPart, ProviderError> = first === undefined ? Stream.empty : Stream.concat(
            Stream.succeed(first),
            Stream.fromIterable(rest).pipe(Stream.mapEffect((part) => Effect.as(Effect.sleep(step.delay), part)))
          )
          return Effect.succeed(step.failure === undefined ? parts : Stream.concat(parts, Stream.fail(step.failure)))
        }
      }
    })
  const embed = (request: EmbeddingRequest) =>
    Effect.suspend(() => {
      const index = embeddingRequests.length
      embeddingRequests.push(request)
      return embeddings(request, index)
    })
  return { complete, stream, embed, requests, embeddingRequests }
}

/** The steps of a script, and the usage an upstream reports. */
export const Script = { answer, streamed, refuse, usage }

/** The configured model provider: the upstream when `UPSTREAM_BASE_URL` is set, else the simulated model. */
export class Provider extends Context.Tag("nenas/Provider")<Provider, ProviderShape>() {
  /** A provider for tests, scripted call by call (above), recording every request. */
  static readonly scripted = scripted
  /** The test Layer: a scripted provider as the configured `Provider`. */
  static readonly Test = (provider: ScriptedProvider): Layer.Layer<Provider> => Layer.succeed(Provider, provider)
}

/** The model test keys call: the simulated model, whatever the upstream; they cost nothing, so they must never reach it. */
export class TestKeyProvider extends Context.Tag("nenas/TestKeyProvider")<TestKeyProvider, ProviderShape>() {
  /** The test Layer: a scripted provider as the model test keys call. */
  static readonly Test = (provider: ScriptedProvider): Layer.Layer<TestKeyProvider> =>
    Layer.succeed(TestKeyProvider, provider)
}

export const finishReasonOf = (value: unknown): FinishReason =>
  value === "length" || value === "tool_calls" || value === "content_filter" ? value : "stop"
