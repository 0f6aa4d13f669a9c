import { Cause, Chunk, Effect, Exit, type Fiber, FiberId, Option, Scope, Stream } from "effect"
import type { ProviderError, StreamPart } from "./Provider.js"

/**
 * A stream's parts read in plain code, one network read at a time: what the
 * relay uses to answer a streamed call without an Effect `Stream` stage per
 * read (each costs tens of microseconds a call).
 */
export interface PartReader {
  /** The parts of the next reads that give any; `undefined` at the end. Rejects with a `Stop`. */
  readonly next: () => Promise<ReadonlyArray<StreamPart> | undefined>
  /** Stops reading (the client went away): the rest is dropped. */
  readonly cancel: () => void
}

/**
 * Why reading stopped early: the error for the caller, and what the operator
 * is told (absent: nothing); or, from a stream that died, its defect.
 */
export type Stop =
  | { readonly error: ProviderError; readonly detail?: string | undefined }
  | { readonly error?: undefined; readonly defect: Cause.Cause<unknown> }

/** Runs an effect on the service's fibers, telling `onExit` its end; the result interrupts it. */
export type Fork = <A, E>(effect: Effect.Effect<A, E>, onExit: (exit: Exit.Exit<A, E>) => void) => () => void

const readers = new WeakMap<object, () => PartReader>()

/** A stream of the parts `make`'s reader reads, which `readerOf` reads directly, with no `Stream` in between. */
export const readableParts = (make: () => PartReader): Stream.Stream<StreamPart, ProviderError> => {
  const stream = Stream.suspend(() => {
    const reader = make()
    const pull: Effect.Effect<Chunk.Chunk<StreamPart>, Option.Option<ProviderError>> = Effect.async((resume) => {
      reader.next().then(
        (parts) => resume(parts === undefined ? Effect.fail(Option.none()) : Effect.succeed(Chunk.unsafeFromArray(parts))),
        (stop: Stop) => {
          if (stop.error === undefined) return resume(Effect.die(Cause.squash(stop.defect)))
          const failed = Effect.fail(Option.some(stop.error))
          resume(stop.detail === undefined ? failed : Effect.zipRight(Effect.logWarning(`model provider: ${stop.detail}`), failed))
        }
      )
      return Effect.sync(reader.cancel)
    })
    return Stream.repeatEffectChunkOption(pull).pipe(Stream.ensuring(Effect.sync(reader.cancel)))
  })
  readers.set(stream, make)
  return stream
}

/**
 * `stream` that runs `onFailure` when it fails (not when it is cancelled: a
 * client gone away is no failure of the upstream's),
 * keeping its plain reader when it has one: on the default runtime, so
 * `onFailure` must need no service (its own closures).
 */
export const tapFailure = (
  stream: Stream.Stream<StreamPart, ProviderError>,
  onFailure: (error: ProviderError) => Effect.Effect<void>
): Stream.Stream<StreamPart, ProviderError> => {
  const make = readers.get(stream)
  if (make === undefined) return Stream.tapError(stream, onFailure)
  return readableParts(() => {
    const reader = make()
    // A read cut because the client went away is no failure of the stream's.
    let cancelled = false
    const told = async (stop: Stop): Promise<never> => {
      if (!cancelled && stop.error !== undefined) await Effect.runPromise(onFailure(stop.error))
      throw stop
    }
    return {
      next: () => reader.next().catch(told),
      cancel: () => {
        cancelled = true
        reader.cancel()
      }
    }
  })
}

/** Any other stream (the simulated model's, a test's) read through its pull, on `fork`'s fibers. */
const pulled = (stream: Stream.Stream<StreamPart, ProviderError>, fork: Fork): PartReader => {
  const scope = Effect.runSync(Scope.make())
  let pull: Effect.Effect<Chunk.Chunk<StreamPart>, Option.Option<ProviderError>> | undefined
  let interrupt = () => {}
  const run = <A, E>(effect: Effect.Effect<A, E>) =>
    new Promise<Exit.Exit<A, E>>((resolve) => {
      interrupt = fork(effect, resolve)
    })
  const next = async (): Promise<ReadonlyArray<StreamPart> | undefined> => {
    if (pull === undefined) {
      const opened = await run(Scope.extend(Stream.toPull(stream), scope))
      if (Exit.isFailure(opened)) throw { defect: opened.cause } satisfies Stop
      pull = opened.value
    }
    for (;;) {
      const exit = await run(pull)
      if (Exit.isSuccess(exit)) {
        if (Chunk.isEmpty(exit.value)) continue
        return Chunk.toReadonlyArray(exit.value)
      }
      const failure = Cause.failureOption(exit.cause)
      if (Option.isNone(failure)) throw { defect: exit.cause } satisfies Stop
      if (Option.isNone(failure.value)) return undefined
      throw { error: failure.value.value } satisfies Stop
    }
  }
  return {
    next,
    cancel: () => {
      interrupt()
      fork(Scope.close(scope, Exit.void), () => {})
    }
  }
}

/**
 * The plain reader of a provider's stream: its own when it has one
 * (`readableParts`), else one over the stream's pull.
 */
export const readerOf = (stream: Stream.Stream<StreamPart, ProviderError>, fork: Fork): PartReader =>
  readers.get(stream)?.() ?? pulled(stream, fork)

/** A `Fork` over a runtime's `runFork`. */
export const forkWith = (runFork: <A, E>(effect: Effect.Effect<A, E>) => Fiber.RuntimeFiber<A, E>): Fork => (effect, onExit) => {
  const fiber = runFork(effect)
  fiber.addObserver(onExit)
  return () => fiber.unsafeInterruptAsFork(FiberId.none)
}
