import { Effect } from "effect"

/**
 * Waits `ms` of wall-clock time, whatever clock the test runs on. `it.effect`
 * runs on a TestClock, where `Effect.sleep` waits until the test moves the
 * clock: a poll loop sleeping that way never wakes once its first probe
 * misses (the two-instance test hung for its whole 300 s timeout so).
 */
export const realSleep = (ms: number): Effect.Effect<void> =>
  Effect.async<void>((resume) => {
    const timer = setTimeout(() => resume(Effect.void), ms)
    return Effect.sync(() => clearTimeout(timer))
  })
