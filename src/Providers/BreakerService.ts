import { Effect } from "effect"
import { type BreakerSettings, TargetCounts } from "./BreakerCounts.js"
import type { Admission, AttemptOutcome, BreakersShape, BreakerState } from "./BreakerTypes.js"

/**
 * Where breakers' open state lives: this process's memory, or Redis shared by
 * every instance (`BreakersRedis.ts`). Counting outcomes is each instance's own
 * (`TargetCounts`); opening, the probe's claim and closing go through here.
 */
export interface OpenStore {
  /** When the target half-opens, if its breaker is not closed, as this instance knows it now. Synchronous: every call asks. */
  readonly openUntil: (target: string) => number | undefined
  /** The half-open breaker's one probe, if nobody holds it: `Probe`, else `Open` until the probe's lease ends. */
  readonly claimProbe: (target: string, now: number, leaseMs: number) => Effect.Effect<Admission>
  /** Opens the breaker until `until` (or later, if it is already open longer); answers when it half-opens. */
  readonly open: (target: string, until: number) => Effect.Effect<number>
  /** Closes a half-open breaker, answering whether it did: one opened again meanwhile (`now` before its half-open time) stays open. */
  readonly close: (target: string, now: number) => Effect.Effect<boolean>
  readonly list: (now: number) => Effect.Effect<ReadonlyArray<BreakerState>>
}

/** 0 closed, 1 half-open, 2 open: the `nenas_upstream_breaker_state` gauge. */
export type BreakerGaugeValue = 0 | 1 | 2

const CLOSED: Admission = { _tag: "Closed" }
const ADMIT_CLOSED = Effect.succeed(CLOSED)

export const stateAt = (target: string, halfOpenAt: number, now: number): BreakerState => ({
  target,
  state: now < halfOpenAt ? "open" : "half_open",
  halfOpenAt
})

/** Open state in this process only (no `REDIS_URL`). */
export const memoryOpenStore = (): OpenStore => {
  const open = new Map<string, { halfOpenAt: number; probeUntil: number }>()
  return {
    openUntil: (target) => open.get(target)?.halfOpenAt,
    claimProbe: (target, now, leaseMs) =>
      Effect.sync((): Admission => {
        const entry = open.get(target)
        if (entry === undefined) return CLOSED
        if (now < entry.halfOpenAt) return { _tag: "Open", halfOpenAt: entry.halfOpenAt }
        if (now < entry.probeUntil) return { _tag: "Open", halfOpenAt: entry.probeUntil }
        entry.probeUntil = now + leaseMs
        return { _tag: "Probe" }
      }),
    open: (target, until) =>
      Effect.sync(() => {
        const halfOpenAt = Math.max(until, open.get(target)?.halfOpenAt ?? 0)
        open.set(target, { halfOpenAt, probeUntil: 0 })
        return halfOpenAt
      }),
    close: (target, now) =>
      Effect.sync(() => {
        const entry = open.get(target)
        if (entry === undefined || entry.halfOpenAt > now) return false
        open.delete(target)
        return true
      }),
    list: (now) => Effect.sync(() => [...open].map(([target, entry]) => stateAt(target, entry.halfOpenAt, now)))
  }
}

/**
 * The breakers' decisions over an open-state store. A closed target costs
 * `admit` one map lookup. Outcomes recorded while a breaker is open (calls
 * admitted before it opened) change nothing but a `Retry-After`; once it is
 * half-open, the first outcome recorded decides: a success closes it, a
 * failure opens it for another cool-down (the contract carries no probe
 * token, so a late outcome of an earlier call may decide instead of the probe).
 */
export const makeBreakers = (
  settings: BreakerSettings,
  store: OpenStore,
  onState: (target: string, value: BreakerGaugeValue) => void = () => {}
): BreakersShape => {
  const counts = new Map<string, TargetCounts>()
  const countsOf = (target: string): TargetCounts => {
    let found = counts.get(target)
    if (found === undefined) {
      found = new TargetCounts()
      counts.set(target, found)
    }
    return found
  }

  const admit = (target: string): Effect.Effect<Admission> =>
    Effect.suspend(() => {
      const halfOpenAt = store.openUntil(target)
      if (halfOpenAt === undefined) return ADMIT_CLOSED
      return Effect.clockWith((clock) => {
        const now = clock.unsafeCurrentTimeMillis()
        if (now < halfOpenAt) return Effect.succeed<Admission>({ _tag: "Open", halfOpenAt })
        return Effect.tap(store.claimProbe(target, now, settings.probeLeaseMs), (admission) => {
          if (admission._tag === "Probe") onState(target, 1)
        })
      })
    })

  const record = (target: string, outcome: AttemptOutcome): Effect.Effect<void> =>
    Effect.clockWith((clock) => {
      const now = clock.unsafeCurrentTimeMillis()
      const targetCounts = countsOf(target)
      const tripped = targetCounts.add(now, outcome._tag === "Failure", settings)
      const halfOpenAt = store.openUntil(target)
      const open = halfOpenAt !== undefined && now < halfOpenAt
      const halfOpen = halfOpenAt !== undefined && now >= halfOpenAt
      if (outcome._tag === "Success") {
        if (!halfOpen) return Effect.void
        targetCounts.reset()
        return Effect.asVoid(Effect.tap(store.close(target, now), (closed) => {
          if (closed) onState(target, 0)
        }))
      }
      const retryAfterMs = outcome.retryAfterMs ?? 0
      const retryAt = retryAfterMs > 0 ? now + retryAfterMs : 0
      const coolAt = (tripped && !open) || halfOpen ? now + settings.cooldownMs : 0
      const until = Math.max(retryAt, coolAt)
      if (until === 0) return Effect.void
      targetCounts.reset()
      return Effect.asVoid(Effect.tap(store.open(target, until), () => onState(target, 2)))
    })

  return {
    admit,
    record,
    notClosed: Effect.clockWith((clock) => store.list(clock.unsafeCurrentTimeMillis()))
  }
}
