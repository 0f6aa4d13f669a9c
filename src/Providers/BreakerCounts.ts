/** When a breaker opens and for how long: `BREAKER_*` of the configuration. */
export interface BreakerSettings {
  /** Consecutive failures that open a breaker (`BREAKER_FAILURES`). */
  readonly failures: number
  /** The share of failed calls over the window that opens a breaker, 0–1 (`BREAKER_ERROR_RATE`). */
  readonly errorRate: number
  /** The sliding window the error rate is taken over (`BREAKER_WINDOW_MS`). */
  readonly windowMs: number
  /** Calls the window needs before its error rate counts (`BREAKER_MIN_CALLS`). */
  readonly minCalls: number
  /** How long an opened breaker stays open before one probe may try the target (`BREAKER_COOLDOWN_MS`). */
  readonly cooldownMs: number
  /**
   * How long a probe may take to report before another call may probe instead (its instance may have
   * died): the first-byte deadline and a second, so a probe that times out reports before it lapses.
   */
  readonly probeLeaseMs: number
}

export const DEFAULT_BREAKER_SETTINGS: BreakerSettings = {
  failures: 5,
  errorRate: 0.5,
  windowMs: 60_000,
  minCalls: 10,
  cooldownMs: 30_000,
  probeLeaseMs: 31_000
}

/** The window is kept as this many buckets: memory and work per call stay constant whatever the traffic. */
const BUCKETS = 10

/**
 * One target's recent outcomes on this instance: consecutive failures, and
 * calls and failures over a sliding window of `BUCKETS` buckets (the oldest
 * bucket drops out whole, so the window slides in steps of a tenth).
 */
export class TargetCounts {
  private consecutive = 0
  private readonly stamps = new Array<number>(BUCKETS).fill(-1)
  private readonly calls = new Array<number>(BUCKETS).fill(0)
  private readonly failed = new Array<number>(BUCKETS).fill(0)

  /** Counts one outcome at `now`; answers whether the counts now say the breaker should open. */
  add(now: number, failure: boolean, settings: BreakerSettings): boolean {
    const bucketMs = Math.max(1, settings.windowMs / BUCKETS)
    const stamp = Math.floor(now / bucketMs)
    const slot = stamp % BUCKETS
    if (this.stamps[slot] !== stamp) {
      this.stamps[slot] = stamp
      this.calls[slot] = 0
      this.failed[slot] = 0
    }
    this.calls[slot] = (this.calls[slot] ?? 0) + 1
    if (failure) this.failed[slot] = (this.failed[slot] ?? 0) + 1
    this.consecutive = failure ? this.consecutive + 1 : 0
    if (!failure) return false
    if (this.consecutive >= settings.failures) return true
    let calls = 0
    let failures = 0
    for (let i = 0; i < BUCKETS; i++) {
      if ((this.stamps[i] ?? -1) > stamp - BUCKETS) {
        calls += this.calls[i] ?? 0
        failures += this.failed[i] ?? 0
      }
    }
    return calls >= settings.minCalls && failures / calls >= settings.errorRate
  }

  /** Forgets everything: a breaker that opens or closes starts counting afresh. */
  reset(): void {
    this.consecutive = 0
    this.stamps.fill(-1)
  }
}
