import { type Context, Duration, Effect, Layer, Option, Stream } from "effect"
import type { Completion, ProviderError, ProviderRequest, ProviderShape, ProviderUsage, StreamPart, ToolCall } from "./Provider.js"
import { Provider } from "./Provider.js"

/**
 * A provider for tests, scripted call by call: each call takes the next step
 * of a list (or the step a function picks from the request), and every
 * request is recorded for the test to assert on. A step is an answer, a
 * stream of parts with real delays between them, or a typed provider error.
 * Either kind of call can take either kind of answer: `complete` joins a
 * streamed step's parts, `stream` sends a completion as one part.
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

export interface ScriptedProvider extends ProviderShape {
  /** Every request received, in order (a live array). */
  readonly requests: ReadonlyArray<ProviderRequest>
}

export const usage = (inputTokens: number, outputTokens: number, extra: Partial<ProviderUsage> = {}): ProviderUsage => ({
  inputTokens,
  outputTokens,
  reasoningTokens: 0,
  cachedTokens: 0,
  ...extra
})

/** A step: `text` as the answer, with the usage the upstream reports (none: we count it ourselves). */
export const answer = (
  text: string,
  options: { readonly usage?: ProviderUsage; readonly toolCalls?: ReadonlyArray<ToolCall>; readonly finishReason?: Completion["finishReason"] } = {}
): ScriptStep => ({
  _tag: "Answer",
  completion: {
    text,
    toolCalls: options.toolCalls ?? [],
    finishReason: options.finishReason ?? (options.toolCalls !== undefined && options.toolCalls.length > 0 ? "tool_calls" : "stop"),
    usage: Option.fromNullable(options.usage),
    logprobs: undefined
  }
})

/** A step: `chunks` as text deltas `delay` apart, then the finish and (when given) the usage; or `failure` after the chunks. */
export const streamed = (
  chunks: ReadonlyArray<string>,
  options: { readonly delay?: Duration.DurationInput; readonly usage?: ProviderUsage; readonly failure?: ProviderError } = {}
): ScriptStep => ({
  _tag: "Parts",
  parts: [
    ...chunks.map((text): StreamPart => ({ _tag: "Delta", text })),
    ...(options.failure === undefined ? [{ _tag: "Finish", finishReason: "stop" } as const] : []),
    ...(options.usage === undefined || options.failure !== undefined ? [] : [{ _tag: "Usage", usage: options.usage } as const])
  ],
  delay: Duration.decode(options.delay ?? 0),
  failure: options.failure
})

export const refuse = (error: ProviderError): ScriptStep => ({ _tag: "Refuse", error })

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
  ...Option.match(completion.usage, { onNone: () => [], onSome: (reported) => [{ _tag: "Usage", usage: reported } as const] })
]

export const make = (script: Script): ScriptedProvider => {
  const requests: Array<ProviderRequest> = []
  const next = (request: ProviderRequest) =>
    Effect.suspend(() => {
      const index = requests.length
      requests.push(request)
      if (typeof script === "function") return Effect.succeed(script(request, index))
      const step = script[index]
      return step === undefined
        ? Effect.dieMessage(`ProviderTest: the script has ${script.length} step(s), and call ${index + 1} came (model ${request.model})`)
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
  return { complete, stream, requests }
}

/** The scripted provider as the configured `Provider`. */
export const layer = (provider: ScriptedProvider): Layer.Layer<Provider> => Layer.succeed(Provider, provider)

/** The scripted provider under another tag of the same shape (the provider test keys use). */
export const layerAs = <I>(tag: Context.Tag<I, ProviderShape>, provider: ScriptedProvider): Layer.Layer<I> =>
  Layer.succeed(tag, provider)
