import { Cause, Chunk, Effect, Option, Ref, type Scope, Stream } from "effect"
import type { ApiError } from "../Domain/Errors.js"
import { errorMeta, InternalError, isApiError } from "../Domain/Errors.js"
import type { ProviderError, StreamPart, ToolCall, ToolCallDelta } from "../Providers/Provider.js"
import type { HeldCall, Progress, StreamEvent } from "./Call.js"
import { answerSoFar, servedCall } from "./Call.js"
import type { Settlement } from "./CallSettlement.js"
import { usedOf } from "./CallSettlement.js"

/**
 * Relays a streamed call's upstream parts to its client as events, keeping
 * what was produced (text, tool calls, finish reason, reported usage) in the
 * call's progress, and settles it: on the last part, on a failure mid-way, or,
 * when the client goes away, in the finalizer.
 */

/** Who settles a started stream: a watchdog until the relay attaches, the relay after. */
export type Handoff = "waiting" | "attached" | "abandoned"

/** A streamed call whose upstream has started answering, not yet relayed. */
export interface StartedStream {
  readonly call: HeldCall
  readonly progress: Ref.Ref<Progress>
  readonly parts: Stream.Stream<StreamPart, ProviderError>
  readonly handoff: Ref.Ref<Handoff>
  /** Stops the handoff's watchdog once the relay has attached (it would otherwise sleep to its deadline). */
  readonly dismissWatchdog: Effect.Effect<void>
}

const asApiError = (cause: Cause.Cause<unknown>): ApiError =>
  Option.match(Cause.failureOption(cause), {
    onNone: () => new InternalError({ message: "Internal server error." }),
    onSome: (error) => isApiError(error) ? error : new InternalError({ message: "Internal server error." })
  })

/** A tool call fragment folded into the calls so far; the event names the call in full (id and name), as clients need. */
const foldToolCall = (requestId: string, progress: Progress, part: ToolCallDelta): readonly [StreamEvent, Progress] => {
  const calls = [...progress.toolCalls]
  const previous = calls[part.index]
  const id = previous?.id ?? part.id ?? `call_${requestId.replace(/^req_/, "")}_${part.index}`
  const name = (previous?.function.name ?? "") + (previous === undefined ? part.name ?? "" : "")
  calls[part.index] = { id, type: "function", function: { name, arguments: (previous?.function.arguments ?? "") + part.arguments } }
  // An upstream that skips an index leaves no hole: calls are kept dense, in order.
  const toolCalls = calls.filter((call): call is ToolCall => call !== undefined)
  const event: StreamEvent = { _tag: "ToolCallDelta", index: toolCalls.indexOf(calls[part.index] as ToolCall), id, name, arguments: part.arguments }
  return [event, { ...progress, toolCalls }]
}

/** One upstream part: the client events it becomes, and the progress after it. */
export const relayPart = (
  requestId: string,
  progress: Progress,
  part: StreamPart
): readonly [ReadonlyArray<StreamEvent>, Progress] => {
  switch (part._tag) {
    case "Delta": {
      const logprobs = part.logprobs === undefined ? progress.logprobs : [...(progress.logprobs ?? []), ...part.logprobs]
      return [[{ _tag: "Delta", text: part.text, logprobs: part.logprobs }], { ...progress, text: progress.text + part.text, logprobs }]
    }
    case "ToolCallDelta": {
      const [event, next] = foldToolCall(requestId, progress, part)
      return [[event], next]
    }
    case "Finish":
      return [[], { ...progress, finishReason: part.finishReason }]
    case "Usage":
      return [[], { ...progress, reportedUsage: Option.some(part.usage) }]
  }
}

/** A read's parts (one upstream network read): the client events they become, and the progress after them. */
export const relayParts = (
  requestId: string,
  progress: Progress,
  parts: Chunk.Chunk<StreamPart>
): readonly [Chunk.Chunk<StreamEvent>, Progress] => {
  const events: Array<StreamEvent> = []
  let current = progress
  for (const part of parts) {
    const [out, next] = relayPart(requestId, current, part)
    for (const event of out) events.push(event)
    current = next
  }
  return [Chunk.unsafeFromArray(events), current]
}

/**
 * Until the stream runs and attaches its finalizer, a watchdog owns the
 * settlement: a stream dropped before it ran (its request interrupted in
 * between) is `abandon`ed, not left held. The watchdog runs on `watch` (the
 * service's fibers): interrupted at shutdown, it abandons a stream still
 * waiting then, before the wallet's last flush.
 */
export const watchHandoff = <X>(abandon: Effect.Effect<void>, timeoutMs: number, watch: (watchdog: Effect.Effect<void>) => Effect.Effect<X>) =>
  Effect.gen(function*() {
    const handoff = yield* Ref.make<Handoff>("waiting")
    const abandonIfWaiting = Ref.modify(handoff, (state) => state === "waiting" ? [true, "abandoned" as const] : [false, state]).pipe(
      Effect.flatMap((dropped) => dropped ? abandon : Effect.void)
    )
    // The call path forks it uninterruptible: only the wait may be interrupted; the check and the settlement run whole.
    yield* watch(Effect.uninterruptible(Effect.zipRight(Effect.exit(Effect.interruptible(Effect.sleep(timeoutMs))), abandonIfWaiting)))
    return handoff
  })

/** The last event: the call settled for what it used, and its result. */
const completed = (settlement: Settlement, { call: held, progress }: StartedStream) =>
  Effect.gen(function*() {
    const current = yield* Ref.get(progress)
    const call = servedCall(held, current.attempts)
    const answer = answerSoFar(current, current.finishReason)
    const used = usedOf(call, current.sources, answer, current.reportedUsage)
    const result = yield* settlement.settleOnce(progress, settlement.settleUsed(call, used, answer, true))
    return { _tag: "Completed", result } satisfies StreamEvent
  })

/** A stream that broke off after the first byte: settled, and told to the client as a `Failed` event. */
const failed = (settlement: Settlement, { call: held, progress }: StartedStream, cause: Cause.Cause<unknown>) =>
  Effect.gen(function*() {
    const error = asApiError(cause)
    if (!isApiError(Option.getOrUndefined(Cause.failureOption(cause)))) {
      yield* Effect.logError("model call stream failed", cause)
    }
    const current = yield* Ref.get(progress)
    const call = servedCall(held, current.attempts)
    // Output the upstream produced before it broke off was paid for upstream: it is billed, as produced, and its
    // log keeps the error's code, so it is told apart from a complete answer (DESIGN.md, Fallbacks).
    if (current.text.length > 0 || current.toolCalls.length > 0 || Option.isSome(current.reportedUsage)) {
      const answer = answerSoFar(current, "stop")
      const used = usedOf(call, current.sources, answer, current.reportedUsage)
      yield* settlement.settleOnce(progress, settlement.settleUsed(call, used, answer, false, errorMeta(error).code))
    } else {
      yield* settlement.settleOnce(progress, settlement.settleFailed(call, errorMeta(error).code))
    }
    return { _tag: "Failed", error } satisfies StreamEvent
  })

/** The client's events: one per upstream text or tool-call part, then `Completed` or `Failed`. */
export const relay = (settlement: Settlement, started: StartedStream): Stream.Stream<StreamEvent> =>
  Stream.unwrapScoped(Effect.gen(function*(): Effect.fn.Return<Stream.Stream<StreamEvent>, never, Scope.Scope> {
    const { call, handoff, parts, progress } = started
    const attached = yield* Ref.modify(handoff, (state) => state === "waiting" ? [true, "attached" as const] : [false, state])
    if (!attached) {
      const abandoned: StreamEvent = { _tag: "Failed", error: new InternalError({ message: "The call was abandoned before its stream started." }) }
      return Stream.succeed(abandoned)
    }
    yield* started.dismissWatchdog
    yield* Effect.addFinalizer(settlement.settleOnExit(call, progress))
    // One step per upstream read, not per part: the progress is written once for all of a read's parts.
    const events = parts.pipe(
      Stream.mapChunksEffect((chunk) => Ref.modify(progress, (current) => relayParts(call.requestId, current, chunk)))
    )
    return Stream.concat(events, Stream.fromEffect(completed(settlement, started))).pipe(
      Stream.catchAllCause((cause) => Stream.fromEffect(failed(settlement, started, cause)))
    )
  }))
