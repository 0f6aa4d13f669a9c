import type { Stream } from "effect"
import type { Readable } from "node:stream"
import { doneWith } from "../Lane/Wire/DoneWith.js"
import { type PartReader, readableParts, type Stop } from "../Lane/Wire/PartReader.js"
import { chunkParts, makeEventSplitter } from "./ChatDecode.js"
import type { ProviderError, StreamPart } from "./Provider.js"

export interface EventStreamErrors {
  readonly malformed: () => ProviderError
  readonly errorChunk: () => ProviderError
  readonly brokeOff: () => ProviderError
  readonly cutShort: () => ProviderError
  readonly timedOut: () => ProviderError
}

/**
 * A body's reads one at a time (`undefined` at its end), and `drop` to read and
 * discard the rest (the connection is then reused, and nothing is aborted).
 */
const flowingReads = (body: Readable) => {
  const queue: Array<Uint8Array> = []
  let ended = false
  let failure: unknown = undefined
  let waiting: { resolve: (read: Uint8Array | undefined) => void; reject: (cause: unknown) => void } | undefined
  let dropping = false
  const wake = () => {
    const waiter = waiting
    if (waiter === undefined) return
    if (queue.length > 0) {
      waiting = undefined
      waiter.resolve(queue.shift())
    } else if (failure !== undefined) {
      waiting = undefined
      waiter.reject(failure)
    } else if (ended) {
      waiting = undefined
      waiter.resolve(undefined)
    }
  }
  const onData = (bytes: Uint8Array) => {
    if (dropping) return
    queue.push(bytes)
    if (waiting === undefined) body.pause()
    wake()
  }
  const onEnd = () => {
    ended = true
    wake()
  }
  const onError = (cause: unknown) => {
    failure = cause
    wake()
  }
  // A connection lost midway may close the body without an error. Closed, the body keeps none of this call's
  // listeners (`doneWith`).
  const onClose = () => {
    doneWith(body, { data: onData, end: onEnd, error: onError, close: onClose })
    if (ended || failure !== undefined) return
    failure = new Error("The stream's connection closed before its end.")
    wake()
  }
  body.on("data", onData)
  body.on("end", onEnd)
  body.on("error", onError)
  body.on("close", onClose)
  return {
    next: (): Promise<Uint8Array | undefined> =>
      new Promise((resolve, reject) => {
        waiting = { resolve, reject }
        wake()
        if (waiting !== undefined) body.resume()
      }),
    drop: () => {
      dropping = true
      queue.length = 0
      body.resume()
    }
  }
}

/**
 * The parts of an upstream's event stream, read to `[DONE]` or the body's end
 * in one plain loop per network read: OpenAI sends usage in a chunk after the
 * finish reason (`choices: []`), often in a later read. A stream that stops
 * before any finish reason was cut off; after it, a lost connection costs
 * only the usage chunk. One timer bounds the whole stream (`totalMs`, from
 * its first read). Nothing is aborted once the body has ended, so the
 * success path builds no error object.
 */
export const eventStreamParts = (
  body: Readable,
  totalMs: number,
  errors: EventStreamErrors
): Stream.Stream<StreamPart, ProviderError> =>
  readableParts<StreamPart, ProviderError>((): PartReader<StreamPart> => {
    const split = makeEventSplitter()
    const reads = flowingReads(body)
    let finished = false
    let done = false
    let timedOut = false
    const timer = setTimeout(() => {
      timedOut = true
      body.destroy()
    }, totalMs)
    // The timer goes once the body is closed, whoever closes it.
    body.once("close", () => clearTimeout(timer))

    /** After `[DONE]` the rest of the body is read and dropped, so the connection is reused. */
    const stopReading = () => {
      done = true
      reads.drop()
    }

    /** The parts of the next reads that give any; undefined at the end. */
    const next = async (): Promise<ReadonlyArray<StreamPart> | undefined> => {
      const parts: Array<StreamPart> = []
      while (!done && parts.length === 0) {
        let read: Uint8Array | undefined
        try {
          read = await reads.next()
        } catch (cause) {
          done = true
          if (timedOut) throw { error: errors.timedOut() } satisfies Stop<ProviderError>
          if (finished) return undefined
          throw {
            error: errors.brokeOff(),
            detail: cause instanceof Error ? cause.message : String(cause)
          } satisfies Stop<ProviderError>
        }
        if (timedOut) throw { error: errors.timedOut() } satisfies Stop<ProviderError>
        for (const data of split(read)) {
          if (data === "[DONE]") {
            stopReading()
            break
          }
          const outcome = chunkParts(data, parts)
          if (outcome._tag !== "Parts") {
            stopReading()
            if (finished) break
            throw outcome._tag === "Malformed"
              ? { error: errors.malformed() } satisfies Stop<ProviderError>
              : {
                error: errors.errorChunk(),
                detail: `error chunk: ${JSON.stringify(outcome.error).slice(0, 2000)}`
              } satisfies Stop<ProviderError>
          }
          if (!finished && parts.some((part) => part._tag === "Finish")) finished = true
        }
        if (read === undefined) {
          done = true
          if (!finished) throw { error: errors.cutShort() } satisfies Stop<ProviderError>
        }
      }
      return parts.length > 0 ? parts : undefined
    }

    // Stopped before its end (the client went away): the body is dropped.
    const cancel = () => {
      if (!body.readableEnded && !done) body.destroy()
    }
    return { next, cancel }
  })
