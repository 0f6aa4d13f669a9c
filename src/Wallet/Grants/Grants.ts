/**
 * Credit grants as one instance keeps them in memory (docs/money.md, "Credit grants"), and
 * the pure decisions about them. A grant's row holds, at every commit,
 * `remaining + inFlight + pending` of it: what no call holds yet, what calls in
 * flight hold, and what settled calls were charged but not yet written.
 */
export interface Grant {
  readonly id: string
  readonly accountId: string
  /** Not lent to any call: what the next calls reserve from. */
  remaining: number
  /** Held by calls in flight. */
  inFlight: number
  /** Charged to settled calls, waiting for the next flush. */
  pending: number
  /** Being handed back: no call reserves from it until it is gone. */
  closing: boolean
  /** Another instance waits for this one to answer its request (a flush that touches the row). */
  asked: boolean
  growing: boolean
  /** The row exists in the database (its first growth committed). */
  stored: boolean
  /** When a call last reserved from it (ms). */
  lastHoldAt: number
}

export const newGrant = (id: string, accountId: string, now: number): Grant => ({
  id,
  accountId,
  remaining: 0,
  inFlight: 0,
  pending: 0,
  closing: false,
  asked: false,
  growing: false,
  stored: false,
  lastHoldAt: now
})

/** An account's recent spending on this instance, over whole seconds. */
export interface Pace {
  windowStart: number
  /** Reserved so far in the current second. */
  windowSpend: number
  windowCalls: number
  /** Reserved and calls made in the last whole second. */
  spendPerSecond: number
  callsPerSecond: number
  lastEstimate: number
  /** No grant for this account before this time (ms): the wallet was low, or another instance asked for it. */
  noGrantUntil: number
}

export const newPace = (now: number): Pace => ({
  windowStart: now,
  windowSpend: 0,
  windowCalls: 0,
  spendPerSecond: 0,
  callsPerSecond: 0,
  lastEstimate: 0,
  noGrantUntil: 0
})

/** Counts a call's estimate into its account's pace. */
export const notePace = (pace: Pace, estimate: number, now: number): void => {
  if (now - pace.windowStart >= 1000) {
    const lastWholeSecond = now - pace.windowStart < 2000
    pace.spendPerSecond = lastWholeSecond ? pace.windowSpend : 0
    pace.callsPerSecond = lastWholeSecond ? pace.windowCalls : 0
    pace.windowStart = now
    pace.windowSpend = 0
    pace.windowCalls = 0
  }
  pace.windowSpend += estimate
  pace.windowCalls += 1
  pace.lastEstimate = estimate
}

/** Below this many calls a second an account's calls reserve one by one: a grant would cost more than it saves. */
export const GRANT_MIN_CALLS_PER_SECOND = 8
/** A grant covers about this many seconds of the account's recent spend. */
export const GRANT_SECONDS = 2
/** ... and at least this many calls like the last one. */
export const GRANT_MIN_CALLS = 16
/** Not worth holding below this many calls: the wallet is low, calls go back to one reservation each. */
export const GRANT_FLOOR_CALLS = 4

/** Whether the account's pace asks for (more) grant now: it runs often, and what is left covers under a second. */
export const wantsGrant = (pace: Pace, grant: Grant | undefined, now: number): boolean =>
  now >= pace.noGrantUntil &&
  Math.max(pace.callsPerSecond, pace.windowCalls) >= GRANT_MIN_CALLS_PER_SECOND &&
  (grant === undefined ||
    (!grant.closing && !grant.growing &&
      grant.remaining < Math.max(pace.spendPerSecond, pace.lastEstimate * GRANT_MIN_CALLS) / 2))

/**
 * How much to add to a grant, decided under the wallet's lock: about
 * `GRANT_SECONDS` of recent spend (at least `GRANT_MIN_CALLS` calls), never
 * taking this instance above a third of what it and the wallet hold together
 * (so it never holds most of a small wallet), and nothing when that would
 * cover fewer than `GRANT_FLOOR_CALLS` calls.
 */
export const grantGrowth = (input: {
  readonly spendPerSecond: number
  readonly estimate: number
  /** What the grant has not lent out. */
  readonly remaining: number
  /** What the grant's row holds (remaining, in flight, pending). */
  readonly heldMicroMyr: number
  readonly availableMicroMyr: number
}): number => {
  const target = Math.max(input.spendPerSecond * GRANT_SECONDS, input.estimate * GRANT_MIN_CALLS)
  const cap = Math.floor((input.availableMicroMyr + input.heldMicroMyr) / 3) - input.heldMicroMyr
  const growth = Math.floor(Math.min(target - input.remaining, cap, input.availableMicroMyr))
  return growth >= input.estimate * GRANT_FLOOR_CALLS && growth > 0 ? growth : 0
}
