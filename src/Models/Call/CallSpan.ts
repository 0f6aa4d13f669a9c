import { Cause, type Clock, Effect, Exit, Option, type Tracer } from "effect"
import { type ApiError, errorMeta, isApiError } from "../../Domain/Errors.js"
import { PUBLIC_MODEL } from "../OpenAi/Api.js"
import type { EventRenderer } from "../OpenAi/Wire.js"
import { idsOf } from "../OpenAi/Wire.js"
import type { CallInput, CallResult, StreamEvent } from "./CallTypes.js"

/**
 * A model call's span in OpenTelemetry's GenAI semantic conventions, the
 * attributes Langfuse, Phoenix and Datadog's LLM views read: what was asked
 * (`gen_ai.request.*`), what answered (`gen_ai.response.*`), the tokens
 * (`gen_ai.usage.*`), and nenas's own cost and route (`nenas.*`). Never the
 * prompt or the answer. Each upstream attempt is a child span
 * (`Providers/Fallback.ts`). Made only while traces are exported.
 */

/** The id a call's answer carries, by endpoint: what `gen_ai.response.id` names. */
const responseIdOf = (endpoint: CallInput["endpoint"], requestId: string): string => {
  const ids = idsOf(requestId)
  return endpoint === "/v1/responses" ? ids.response : endpoint === "/v1/chat/completions" ? ids.chat : ids.message
}

const requestAttributes = (input: CallInput): Record<string, unknown> => {
  const attributes: Record<string, unknown> = {
    "gen_ai.operation.name": "chat",
    "gen_ai.system": "nenas",
    "gen_ai.request.model": PUBLIC_MODEL,
    "nenas.endpoint": input.endpoint,
    "nenas.stream": input.stream
  }
  if (input.maxOutputTokens !== undefined) attributes["gen_ai.request.max_tokens"] = input.maxOutputTokens
  if (typeof input.temperature === "number") attributes["gen_ai.request.temperature"] = input.temperature
  if (typeof input.topP === "number") attributes["gen_ai.request.top_p"] = input.topP
  return attributes
}

/** What the answer says of itself; the text and tool arguments stay out. */
const recordResult = (span: Tracer.Span, endpoint: CallInput["endpoint"], result: CallResult): void => {
  span.attribute("gen_ai.response.model", result.route.upstreamModel)
  span.attribute("gen_ai.response.id", responseIdOf(endpoint, result.requestId))
  span.attribute("gen_ai.response.finish_reasons", [result.finishReason])
  span.attribute("gen_ai.usage.input_tokens", result.usage.inputTokens)
  span.attribute("gen_ai.usage.output_tokens", result.usage.outputTokens)
  span.attribute("nenas.cost_micro_myr", result.cost)
  span.attribute("nenas.routing.category", result.route.category)
  span.attribute("nenas.routing.fallback", result.route.fallback === true)
  span.attribute("nenas.request_id", result.requestId)
}

const recordError = (span: Tracer.Span, error: ApiError): void => {
  span.attribute("error.type", errorMeta(error).code)
}

/** Ends `span` once, with the call's outcome, at `clock`'s time (the span began on it); later ends are no-ops. */
const ender = (span: Tracer.Span, endpoint: CallInput["endpoint"], clock: Clock.Clock) => {
  let open = true
  return (exit: Exit.Exit<CallResult | undefined, unknown>): void => {
    if (!open) return
    open = false
    if (Exit.isSuccess(exit) && exit.value !== undefined) recordResult(span, endpoint, exit.value)
    if (Exit.isFailure(exit)) {
      const failure = Cause.failureOption(exit.cause)
      if (Option.isSome(failure) && isApiError(failure.value)) recordError(span, failure.value)
    }
    span.end(clock.unsafeCurrentTimeNanos(), exit)
  }
}

export interface CallSpans {
  /** `complete` with its span around it: the upstream's attempts are its children. */
  readonly complete: <R>(
    input: CallInput,
    run: Effect.Effect<CallResult, ApiError, R>
  ) => Effect.Effect<CallResult, ApiError, R>
  /**
   * `stream` with its span: ended by the `Completed` or `Failed` event the renderer writes, by a failure
   * before the first byte, or when the body closes without either (a client gone).
   */
  readonly stream: <A, R>(
    input: CallInput,
    renderer: EventRenderer,
    closed: Effect.Effect<void>,
    run: (renderer: EventRenderer, closed: Effect.Effect<void>) => Effect.Effect<A, ApiError, R>
  ) => Effect.Effect<A, ApiError, R>
}

/** The call's span, and its end. */
const open = (input: CallInput) =>
  Effect.zipWith(
    Effect.makeSpan(`chat ${PUBLIC_MODEL}`, { kind: "internal", attributes: requestAttributes(input) }),
    Effect.clock,
    (span, clock) => ({ span, end: ender(span, input.endpoint, clock) })
  )

/** The spans of model calls, or none at all (`traced: false`): then each call runs as it is, at no cost. */
export const makeCallSpans = (traced: boolean): CallSpans => {
  if (!traced) return { complete: (_, run) => run, stream: (_, renderer, closed, run) => run(renderer, closed) }
  return {
    complete: (input, run) =>
      Effect.flatMap(
        open(input),
        ({ end, span }) => run.pipe(Effect.withParentSpan(span), Effect.onExit((exit) => Effect.sync(() => end(exit))))
      ),
    stream: (input, renderer, closed, run) =>
      Effect.flatMap(open(input), ({ end, span }) => {
        const traced: EventRenderer = {
          start: renderer.start,
          render: (event: StreamEvent) => {
            if (event._tag === "Completed") end(Exit.succeed(event.result))
            if (event._tag === "Failed") end(Exit.fail(event.error))
            return renderer.render(event)
          }
        }
        return run(traced, Effect.zipRight(closed, Effect.sync(() => end(Exit.succeed(undefined))))).pipe(
          Effect.withParentSpan(span),
          Effect.tapErrorCause((cause) => Effect.sync(() => end(Exit.failCause(cause))))
        )
      })
  }
}
