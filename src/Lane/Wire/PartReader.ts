import { Cause, Chunk, Effect, Exit, type Fiber, FiberId, Option, Scope, Stream } from "effect"

/**
 * A stream's parts read in plain code, one network read at a time: what the
 * relay uses to answer a streamed call without an Effect `Stream` stage per
 * read (each costs tens of microseconds a call).
 */
export interface PartReader<A> {
  /** The parts of the next reads that give any; `undefined` at the end. Rejects with a `Stop` of its stream's error type. */
  readonly next: () => Promise<ReadonlyArray<A> | undefined>
  /** Stops reading (the client went away): the rest is dropped. */
  readonly cancel: () => void
}

/**
 * Why reading stopped early: the error for the caller, and what the operator
 * is told (absent: nothing); or, from a stream that died, its defect.
 */
export type Stop<E extends object> =
  | { readonly error: E; readonly detail?: string | undefined }
  | { readonly error?: undefined; readonly defect: Cause.Cause<unknown> }

/** Runs an effect on the service's fibers, telling `onExit` its end; the result interrupts it. */
export type Fork = <A, E>(effect: Effect.Effect<A, E>, onExit: (exit: Exit.Exit<A, E>) => void) => () => void

const readers = new WeakMap<object, () => PartReader<unknown>>()

/** A stream of the parts `make`'s reader reads, which `readerOf` reads directly, with no `Stream` in between. */
export const readableParts = <A, E extends object>(make: () => PartReader<A>): Stream.Stream<A, E> => {
  const stream = Stream.suspend(() => {
    const reader = make()
    const pull: Effect.Effect<Chunk.Chunk<A>, Option.Option<E>> = Effect.async((resume) => {
      reader.next().then(
        (parts) =>
          resume(parts === undefined ? Effect.fail(Option.none()) : Effect.succeed(Chunk.unsafeFromArray(parts))),
        (stop: Stop<E>) => {
          if ("defect" in stop) return resume(Effect.die(Cause.squash(stop.defect)))
          const failed = Effect.fail(Option.some(stop.error))
          resume(
            stop.detail === undefined
              ? failed
              : Effect.zipRight(Effect.logWarning(`model provider: ${stop.detail}`), failed)
          )
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
export const tapFailure = <A, E extends object>(
  stream: Stream.Stream<A, E>,
  onFailure: (error: E) => Effect.Effect<void>
): Stream.Stream<A, E> => {
  const make = readers.get(stream) as (() => PartReader<A>) | undefined
  if (make === undefined) return Stream.tapError(stream, onFailure)
  return readableParts(() => {
    const reader = make()
    // A read cut because the client went away is no failure of the stream's.
    let cancelled = false
    const told = async (stop: Stop<E>): Promise<never> => {
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
const pulled = <A, E extends object>(stream: Stream.Stream<A, E>, fork: Fork): PartReader<A> => {
  const scope = Effect.runSync(Scope.make())
  let pull: Effect.Effect<Chunk.Chunk<A>, Option.Option<E>> | undefined
  let interrupt = () => {}
  const run = <B, F>(effect: Effect.Effect<B, F>) =>
    new Promise<Exit.Exit<B, F>>((resolve) => {
      interrupt = fork(effect, resolve)
    })
  const next = async (): Promise<ReadonlyArray<A> | undefined> => {
    if (pull === undefined) {
      const opened = await run(Scope.extend(Stream.toPull(stream), scope))
      if (Exit.isFailure(opened)) throw { defect: opened.cause } satisfies Stop<E>
      pull = opened.value
    }
    for (;;) {
      const exit = await run(pull)
      if (Exit.isSuccess(exit)) {
        if (Chunk.isEmpty(exit.value)) continue
        return Chunk.toReadonlyArray(exit.value)
      }
      const failure = Cause.failureOption(exit.cause)
      if (Option.isNone(failure)) throw { defect: exit.cause } satisfies Stop<E>
      if (Option.isNone(failure.value)) return undefined
      throw { error: failure.value.value } satisfies Stop<E>
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
export const readerOf = <A, E extends object>(stream: Stream.Stream<A, E>, fork: Fork): PartReader<A> =>
  (readers.get(stream) as (() => PartReader<A>) | undefined)?.() ?? pulled(stream, fork)

/** A `Fork` over a runtime's `runFork`. */
export const forkWith =
  (runFork: <A, E>(effect: Effect.Effect<A, E>) => Fiber.RuntimeFiber<A, E>): Fork => (effect, onExit) => {
    const fiber = runFork(effect)
    fiber.addObserver(onExit)
    return () => fiber.unsafeInterruptAsFork(FiberId.none)
  }
