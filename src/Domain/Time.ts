import { Clock, Effect } from "effect"

/** The current instant of the fiber's `Clock` (a test's shifted clock included), as a `Date`. */
export const now: Effect.Effect<Date> = Effect.map(Clock.currentTimeMillis, (ms) => new Date(ms))
