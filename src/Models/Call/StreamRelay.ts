import { Effect, Exit, FiberId, FiberRef, Option, Ref, type Stream } from "effect"
import type { ServerResponse } from "node:http"
import type { ApiError } from "../../Domain/Errors.js"
import { errorMeta, InternalError } from "../../Domain/Errors.js"
import type { Found } from "../../Guardrails/Policy.js"
import { mergeLogged } from "../../Guardrails/Policy.js"
import { type Fork, readerOf, type Stop } from "../../Lane/Wire/PartReader.js"
import { selfWriting, type SelfWritingBody } from "../../Lane/Wire/SelfWritingBody.js"
import type { ProviderError, StreamPart, ToolCall, ToolCallDelta } from "../../Providers/Provider.js"
import { CurrentRequestId } from "../../Request/Context.js"
import type { EventRenderer } from "../OpenAi/Wire.js"
import { blockedOutput, type StreamGuard } from "./CallGuardrails.js"
import type { Settlement } from "./CallSettlement.js"
import type { Answer, CallResult, HeldCall, Progress, StreamEvent } from "./CallTypes.js"
import { answerSoFar, servedCall } from "./CallTypes.js"

/**
 * Relays a streamed call's upstream parts to its client as events, keeping
 * what was produced (text, tool calls, finish reason, reported usage) in the
 * call's progress, and settles it: on the last part, on a failure mid-way, or,
 * when the client goes away, as its response closes. The relay is plain
 * code writing to the Node response (one write per upstream read, no Effect
 * `Stream` stage per read); only the settlements run as Effects, on the service's fibers.
 */

/** A streamed call's claim on its settlement: the relay's once it attaches, else its watchdog's. */
export interface Handoff {
  /** Whether the relay attached in time; false once the call was abandoned. */
  readonly attach: () => boolean
}

/** A streamed call whose upstream has started answering, not yet relayed. */
export interface StartedStream {
  readonly call: HeldCall
  readonly progress: Ref.Ref<Progress>
  readonly parts: Stream.Stream<StreamPart, ProviderError>
  readonly handoff: Handoff
  /** The output policy's guard (docs/api/guardrails.md, "Streamed output"); absent: the output is not scanned. */
  readonly guard: StreamGuard | undefined
  /** Keeps a whole answer in the response cache when the call asked it to (docs/api/cache.md, "What is stored"). */
  readonly keep: (call: HeldCall, result: CallResult) => Effect.Effect<void>
}

/** A tool call fragment folded into the calls so far; the event names the call in full (id and name), as clients need. */
const foldToolCall = (requestId: string, progress: Progress, part: ToolCallDelta): readonly [StreamEvent, Progress] => {
  const calls = [...progress.toolCalls]
  const previous = calls[part.index]
  const id = previous?.id ?? part.id ?? `call_${requestId.replace(/^req_/, "")}_${part.index}`
  const name = (previous?.function.name ?? "") + (previous === undefined ? part.name ?? "" : "")
  calls[part.index] = {
    id,
    type: "function",
    function: { name, arguments: (previous?.function.arguments ?? "") + part.arguments }
  }
  // An upstream that skips an index leaves no hole: calls are kept dense, in order.
  const toolCalls = calls.filter((call): call is ToolCall => call !== undefined)
  const event: StreamEvent = {
    _tag: "ToolCallDelta",
    index: toolCalls.indexOf(calls[part.index] as ToolCall),
    id,
    name,
    arguments: part.arguments
  }
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
      const logprobs = part.logprobs === undefined
        ? progress.logprobs
        : [...(progress.logprobs ?? []), ...part.logprobs]
      return [[{ _tag: "Delta", text: part.text, logprobs: part.logprobs }], {
        ...progress,
        text: progress.text + part.text,
        logprobs
      }]
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

/**
 * Until its relay attaches, a watchdog owns a stream's settlement: a stream
 * dropped before it ran (its request interrupted in between) is abandoned at
 * its deadline, not left held; and every stream still waiting when the
 * service stops is abandoned then, before the wallet's last flush. A timer and
 * a set, not a fiber per call.
 */
export const makeHandoffs = Effect.fnUntraced(function*(timeoutMs: number) {
  const waiting = new Set<() => void>()
  yield* Effect.addFinalizer(() =>
    Effect.sync(() => {
      for (const abandon of [...waiting]) abandon()
    })
  )
  /** `abandon` runs once, at the deadline or the stop, unless the relay attached before. */
  const watch = (abandon: () => void): Handoff => {
    let state: "waiting" | "attached" | "abandoned" = "waiting"
    const expire = () => {
      if (state !== "waiting") return
      state = "abandoned"
      clearTimeout(timer)
      waiting.delete(expire)
      abandon()
    }
    const timer = setTimeout(expire, timeoutMs)
    waiting.add(expire)
    return {
      attach: () => {
        if (state !== "waiting") return false
        state = "attached"
        clearTimeout(timer)
        waiting.delete(expire)
        return true
      }
    }
  }
  return { watch }
})

/** The answer as its caller was shown it (redacted), with what the guardrails did, input and output. */
const shownAnswer = (started: StartedStream, answer: Answer): Answer =>
  started.guard === undefined ? answer : Object.assign({}, started.guard.shown(answer), {
    guardrails: mergeLogged(started.call.inputGuardrails, started.guard.tally.logged()) ?? undefined
  })

/** The last event: the call settled for what it used (what the upstream produced), and its result as shown. */
const completed = Effect.fnUntraced(function*(settlement: Settlement, started: StartedStream) {
  const { call: held, progress } = started
  const current = yield* Ref.get(progress)
  const call = servedCall(held, current.attempts)
  const answer = answerSoFar(current, current.finishReason)
  const used = yield* settlement.usedSoFar(call, current, answer)
  const result = yield* settlement.settleOnce(
    progress,
    settlement.settleUsed(call, used, shownAnswer(started, answer), true)
  )
  yield* started.keep(call, result)
  return { _tag: "Completed", result } satisfies StreamEvent
})

/** A stream the output policy blocked: billed for what the upstream produced so far, told as `content_blocked`. */
const blocked = Effect.fnUntraced(function*(settlement: Settlement, started: StartedStream, finding: Found) {
  const { call: held, progress } = started
  const current = yield* Ref.get(progress)
  const call = servedCall(held, current.attempts)
  const answer = answerSoFar(current, "stop")
  const used = yield* settlement.usedSoFar(call, current, answer)
  yield* settlement.settleOnce(
    progress,
    settlement.settleUsed(call, used, shownAnswer(started, answer), false, "content_blocked")
  )
  return { _tag: "Failed", error: blockedOutput(finding) } satisfies StreamEvent
})

/** A stream that broke off after the first byte: settled, and told to the client as a `Failed` event. */
const failed = Effect.fnUntraced(
  function*(settlement: Settlement, { call: held, progress }: StartedStream, stop: Stop<ProviderError>) {
    const error: ApiError = stop.error ?? new InternalError({ message: "Internal server error." })
    if (stop.error === undefined) yield* Effect.logError("model call stream failed", stop.defect)
    else if (stop.detail !== undefined) yield* Effect.logWarning(`model provider: ${stop.detail}`)
    const current = yield* Ref.get(progress)
    const call = servedCall(held, current.attempts)
    // What the upstream used before it broke off (its input, what it thought, what it sent) was paid for upstream:
    // billed as a client's cut is, and its log keeps the error's code, so it is told apart from a whole answer.
    const answer = answerSoFar(current, "stop")
    const used = yield* settlement.usedSoFar(call, current, answer)
    yield* settlement.settleOnce(progress, settlement.settleUsed(call, used, answer, false, errorMeta(error).code))
    return { _tag: "Failed", error } satisfies StreamEvent
  }
)

const internal = () => new InternalError({ message: "Internal server error." })

/** A client this far behind (bytes its answer holds unsent) is cut, however it reads: the upstream is not held back for it. */
const MAX_BEHIND_BYTES = 8 * 1024 * 1024

/**
 * A client's write-stall deadline: armed when a write backs up (one timer a stall, none per chunk), cleared by
 * `drain`; at the deadline a client that took nothing since is cut (its response destroyed), one that reads,
 * however slowly, gets another period.
 */
const stallWatch = (response: ServerResponse, stallMs: number) => {
  let timer: ReturnType<typeof setTimeout> | undefined
  /** What the response held when the period began, and what was written to it since. */
  let heldAtStart = 0
  let writtenSince = 0
  const clear = () => {
    if (timer === undefined) return
    clearTimeout(timer)
    timer = undefined
  }
  const expire = () => {
    // Characters written, at most the bytes they became: what left the response's buffers, or less.
    const taken = writtenSince - (response.writableLength - heldAtStart)
    if (taken > 0 && !response.destroyed) {
      heldAtStart = response.writableLength
      writtenSince = 0
      timer?.refresh()
      return
    }
    timer = undefined
    response.destroy()
  }
  const backedUp = () => {
    if (timer !== undefined) return
    heldAtStart = response.writableLength
    writtenSince = 0
    timer = setTimeout(expire, stallMs)
    response.once("drain", clear)
  }
  return {
    backedUp,
    /** Whether `length` more may be written: false once the client is too far behind, and cut. */
    writing: (length: number): boolean => {
      if (timer === undefined) return true
      writtenSince += length
      if (response.writableLength <= MAX_BEHIND_BYTES) return true
      clear()
      response.destroy()
      return false
    },
    /** The response ended with its last events: watched until they are out unless they fit what the socket takes. */
    ended: () => {
      if (response.writableLength >= response.writableHighWaterMark) backedUp()
    },
    closed: clear
  }
}

/** The call's progress with what the relay produced; the rest (sources, attempts, settled) stays as others wrote it. */
const withRelayed = (stored: Progress, relayed: Progress): Progress => ({
  ...stored,
  text: relayed.text,
  toolCalls: relayed.toolCalls,
  logprobs: relayed.logprobs,
  finishReason: relayed.finishReason,
  reportedUsage: relayed.reportedUsage,
  firstVisibleAt: relayed.firstVisibleAt
})

/**
 * The client's body: the renderer's opening, one write per upstream read that
 * gives any events, then `Completed` or `Failed` with the response's end;
 * `closed` runs once the response closes, however it ends. It writes itself to
 * the Node response (`Lane/Wire/NodeBody.ts`), with no `Readable` and pipe in
 * between: the last events go out with the response's end, in one write
 * (docs/performance.md, "Going around the platform"). A response that closes
 * first (the client went away) is billed for what was produced so far, once.
 */
export const relayBody = (
  settlement: Settlement,
  started: StartedStream,
  renderer: EventRenderer,
  fork: Fork,
  closed: Effect.Effect<void>,
  stallMs: number
): SelfWritingBody =>
  selfWriting((response) => {
    const { call, guard, progress } = started
    const reader = readerOf(started.parts, fork)
    /** Tool calls whose first event went out: the one that names them is sent even with no arguments shown yet. */
    const opened = new Set<number>()
    /** An event as the output policy lets it out: text held back and redacted; empty when nothing may go yet. */
    const guarded = (event: StreamEvent, policy: StreamGuard): string => {
      if (event._tag === "Delta") {
        const shown = policy.delta(event.text)
        if (shown === "") return ""
        return renderer.render({ _tag: "Delta", text: shown, logprobs: policy.changes ? undefined : event.logprobs })
      }
      if (event._tag !== "ToolCallDelta") return renderer.render(event)
      const { ended, shown } = policy.toolArguments(event.index, event.arguments)
      const before = ended === undefined ? "" : argumentsEvent(ended[0], ended[1])
      if (shown === "" && opened.has(event.index)) return before
      opened.add(event.index)
      return before +
        renderer.render({ _tag: "ToolCallDelta", index: event.index, id: event.id, name: event.name, arguments: shown })
    }
    /** More of a tool call's arguments, named as its first event named it. */
    const argumentsEvent = (index: number, args: string): string => {
      const toolCall = current.toolCalls[index]
      if (args === "" || toolCall === undefined) return ""
      return renderer.render({
        _tag: "ToolCallDelta",
        index,
        id: toolCall.id,
        name: toolCall.function.name,
        arguments: args
      })
    }
    /** The stream's end under the policy: what was held back, judged to its end; true when that blocked it. */
    const released = (policy: StreamGuard): boolean => {
      const rest = policy.end()
      let text = rest.text === "" ? "" : renderer.render({ _tag: "Delta", text: rest.text })
      if (rest.call !== undefined) text += argumentsEvent(rest.call[0], rest.call[1])
      if (text.length > 0 && stall.writing(text.length) && !response.write(text)) stall.backedUp()
      return policy.blocked !== undefined
    }
    let current = Effect.runSync(Ref.get(progress))
    let state: "open" | "settling" | "done" = "open"
    const stall = stallWatch(response, stallMs)
    /** The socket corked for the opening: uncorked once, by the end of the turn or by the response's end (which uncorks it whole). */
    let holding = false
    const release = () => {
      if (!holding) return
      holding = false
      response.socket?.uncork()
    }
    /**
     * An effect of this call on a fiber of its own, named with its request id in logs (set, not `Effect.locally`:
     * the fiber ends with the effect, so nothing needs the reference back).
     */
    const run = <A>(effect: Effect.Effect<A>, onExit: (exit: Exit.Exit<A>) => void = () => {}) =>
      fork(Effect.zipRight(FiberRef.set(CurrentRequestId, call.requestId), effect), onExit)
    /** The call's end, settled with what was relayed: `progress` gets what the relay produced, once, just before. */
    const finish = (last: Effect.Effect<StreamEvent>) => {
      state = "settling"
      run(Effect.zipRight(Ref.update(progress, (stored) => withRelayed(stored, current)), last), (exit) => {
        if (Exit.isFailure(exit)) {
          // Settlement itself broke: the call is settled as failed unless it already was, and the client is told.
          run(
            Effect.zipRight(
              Effect.logError("model call stream failed", exit.cause),
              settlement.settleOnExit(call, progress)(exit)
            )
          )
        }
        if (state !== "settling") return
        state = "done"
        holding = false
        response.end(renderer.render(Exit.isSuccess(exit) ? exit.value : { _tag: "Failed", error: internal() }))
        // Settled already: a client that leaves the rest unread is still cut at its deadline, not kept open.
        stall.ended()
      })
    }
    const pump = (): void => {
      reader.next().then((parts) => {
        if (state !== "open") return
        if (parts === undefined) {
          if (guard !== undefined && released(guard)) return finish(blocked(settlement, started, guard.blocked!))
          return finish(completed(settlement, started))
        }
        let text = ""
        // A reasoning model's thinking ends with its first visible output: the time to it estimates reasoning on a cut.
        if (
          current.firstVisibleAt === undefined &&
          parts.some((part) => part._tag === "Delta" || part._tag === "ToolCallDelta")
        ) {
          current = { ...current, firstVisibleAt: Date.now() }
        }
        for (const part of parts) {
          const [events, next] = relayPart(call.requestId, current, part)
          current = next
          for (const event of events) text += guard === undefined ? renderer.render(event) : guarded(event, guard)
        }
        // The upstream is read on whatever the client does, so its end is billed when it comes; a client that
        // leaves its writes backed up past its deadline is cut (`stallWatch`).
        if (text.length > 0 && stall.writing(text.length) && !response.write(text)) stall.backedUp()
        const stop = guard?.blocked
        if (stop !== undefined) {
          // Nothing more is read: the call is billed for what the upstream sent until now.
          reader.cancel()
          return finish(blocked(settlement, started, stop))
        }
        pump()
      }, (stop: Stop<ProviderError>) => {
        if (state === "open") finish(failed(settlement, started, stop))
      })
    }
    /** The response closed (the client went away, or the stream ended): what was produced so far is billed, once. */
    const onClose = (attached: boolean) => {
      holding = false
      stall.closed()
      const wasOpen = attached && state === "open"
      if (state === "open") state = "done"
      reader.cancel()
      if (wasOpen) {
        const stored = Ref.update(progress, (stored) => withRelayed(stored, current))
        run(Effect.zipRight(stored, settlement.settleOnExit(call, progress)(Exit.interrupt(FiberId.none))))
      }
      // It logs nothing: no request id to set.
      fork(closed, () => {})
    }
    const attached = started.handoff.attach()
    if (response.closed) return onClose(attached)
    response.once("close", () => onClose(attached))
    if (!attached) {
      state = "done"
      reader.cancel()
      response.end(
        renderer.start +
          renderer.render({
            _tag: "Failed",
            error: new InternalError({ message: "The call was abandoned before its stream started." })
          })
      )
      return
    }
    // The opening goes out with the first read's events, in one write: the upstream has begun answering, so that read
    // is usually in already; held no longer than this turn of the event loop, whatever it is. The socket is corked,
    // not the response: Node 22 writes an `end()` of a corked response's chunked body before the chunks it holds.
    const socket = response.socket
    holding = socket !== null
    socket?.cork()
    response.write(renderer.start)
    setImmediate(() => release())
    pump()
  })
