import type { Effect } from "effect"

/** What the circuit breakers answer and count (`Breakers.ts` tells how they decide). */

/** Whether a call may try a target now. `Probe`: the one call let through a half-open breaker. */
export type Admission =
  | { readonly _tag: "Closed" }
  | { readonly _tag: "Probe" }
  | { readonly _tag: "Open"; /** Epoch milliseconds at which the breaker half-opens. */ readonly halfOpenAt: number }

/** An attempt's outcome, as the breaker counts it. A refusal of the request itself (4xx but 429) is `success`: the upstream is up. */
export type AttemptOutcome =
  | { readonly _tag: "Success" }
  | {
    readonly _tag: "Failure"
    /** An upstream's `Retry-After`: the target is not tried again before then, whatever the counts say. */
    readonly retryAfterMs?: number | undefined
  }

export interface BreakerState {
  readonly target: string
  readonly state: "open" | "half_open"
  /** Epoch milliseconds at which an open breaker half-opens. */
  readonly halfOpenAt: number
}

/**
 * Where the breakers of a team's own provider keys are named: never shown on `/readyz` or in `/metrics`, which
 * speak of nenas's upstreams only (an upstream's name has no colon).
 */
export const OWN_KEY_BREAKER_PREFIX = "provider_key:"

/** The breakers of nenas's own upstreams among `states`. */
export const upstreamBreakers = <S extends { readonly target: string }>(states: ReadonlyArray<S>): ReadonlyArray<S> =>
  states.filter((state) => !state.target.startsWith(OWN_KEY_BREAKER_PREFIX))

export interface BreakersShape {
  readonly admit: (target: string) => Effect.Effect<Admission>
  readonly record: (target: string, outcome: AttemptOutcome) => Effect.Effect<void>
  /** Every breaker not closed now: `/readyz` lists them, the metrics gauge reads them. */
  readonly notClosed: Effect.Effect<ReadonlyArray<BreakerState>>
}
