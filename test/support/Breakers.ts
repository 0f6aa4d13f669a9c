import { Effect, Layer } from "effect"
import { Breakers } from "../../src/Providers/Breakers.js"
import type { AttemptOutcome, BreakersShape, BreakerState } from "../../src/Providers/BreakerTypes.js"

/**
 * Circuit breakers in memory that a test drives by hand: `open` a target
 * until a time, read what was recorded. Like the real ones, an open target
 * is refused (`Open` with its half-open time) until then, and a failure with
 * an upstream's `Retry-After` opens its target for that long; failure counts
 * and probes are the real breakers', not this stand-in's.
 */
export interface TestBreakers {
  readonly layer: Layer.Layer<Breakers>
  /** The breakers themselves, for what is built without layers. */
  readonly service: BreakersShape
  /** Opens `target` until `halfOpenAt` (epoch ms). */
  readonly open: (target: string, halfOpenAt: number) => void
  /** Every breaker closed, the records cleared. */
  readonly reset: () => void
  /** Each `record` call, in order. */
  readonly recorded: ReadonlyArray<{ readonly target: string; readonly outcome: AttemptOutcome }>
  /** Each `admit` call's target, in order. */
  readonly admitted: ReadonlyArray<string>
}

export const makeTestBreakers = (): TestBreakers => {
  const openUntil = new Map<string, number>()
  const recorded: Array<{ target: string; outcome: AttemptOutcome }> = []
  const admitted: Array<string> = []
  const service: BreakersShape = {
    admit: (target) =>
      Effect.sync(() => {
        admitted.push(target)
        const until = openUntil.get(target)
        if (until === undefined || until <= Date.now()) return { _tag: "Closed" as const }
        return { _tag: "Open" as const, halfOpenAt: until }
      }),
    record: (target, outcome) =>
      Effect.sync(() => {
        recorded.push({ target, outcome })
        if (outcome._tag === "Failure" && outcome.retryAfterMs !== undefined) {
          openUntil.set(target, Date.now() + outcome.retryAfterMs)
        }
        if (outcome._tag === "Success") {
          openUntil.delete(target)
        }
      }),
    notClosed: Effect.sync(() =>
      [...openUntil.entries()]
        .filter(([, until]) => until > Date.now())
        .map(([target, halfOpenAt]): BreakerState => ({ target, state: "open", halfOpenAt }))
    )
  }
  return {
    layer: Layer.succeed(Breakers, service),
    service,
    open: (target, halfOpenAt) => void openUntil.set(target, halfOpenAt),
    reset: () => {
      openUntil.clear()
      recorded.length = 0
      admitted.length = 0
    },
    recorded,
    admitted
  }
}

/** Breakers that never open, whatever is recorded: for tests of one upstream's failures, one after another. */
export const alwaysClosed: Layer.Layer<Breakers> = Layer.succeed(Breakers, {
  admit: () => Effect.succeed({ _tag: "Closed" as const }),
  record: () => Effect.void,
  notClosed: Effect.succeed([])
})
