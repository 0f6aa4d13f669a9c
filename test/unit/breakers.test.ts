import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, TestClock } from "effect"
import { TargetCounts } from "../../src/Providers/BreakerCounts.js"
import { Breakers } from "../../src/Providers/Breakers.js"
import type { AttemptOutcome } from "../../src/Providers/BreakerTypes.js"
import { configFrom } from "../support/Config.js"

/**
 * The breakers' decisions on the memory layer, on Effect's TestClock: time
 * moves only when a test moves it.
 */
const SETTINGS = { failures: 3, errorRate: 0.5, windowMs: 10_000, minCalls: 6, cooldownMs: 5_000, probeLeaseMs: 2_000 }
const A = "primary/gpt-4.1-mini"
const B = "secondary/gpt-4.1-mini"
const ok: AttemptOutcome = { _tag: "Success" }
const fail: AttemptOutcome = { _tag: "Failure" }

const withBreakers = <A, E>(use: (breakers: typeof Breakers.Service) => Effect.Effect<A, E>) =>
  Effect.flatMap(Breakers, use).pipe(Effect.provide(Breakers.memory(SETTINGS)))

const recordAll = (breakers: typeof Breakers.Service, target: string, outcomes: ReadonlyArray<AttemptOutcome>) =>
  Effect.forEach(outcomes, (outcome) => breakers.record(target, outcome), { discard: true })

const now = TestClock.currentTimeMillis

describe("circuit breakers (memory)", () => {
  it.effect("open after the consecutive-failure threshold, not before, and only for that target", () =>
    withBreakers((breakers) =>
      Effect.gen(function*() {
        yield* TestClock.setTime(1_000_000)
        yield* recordAll(breakers, A, [fail, fail])
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Closed" })
        // A success between failures starts the count again.
        yield* recordAll(breakers, A, [ok, fail, fail])
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Closed" })
        yield* breakers.record(A, fail)
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Open", halfOpenAt: 1_000_000 + SETTINGS.cooldownMs })
        expect(yield* breakers.admit(B)).toEqual({ _tag: "Closed" })
        expect(yield* breakers.notClosed).toEqual([{ target: A, state: "open", halfOpenAt: 1_005_000 }])
      })
    ))

  it.effect("open when the error rate over the window reaches the threshold, once the window has its minimum of calls", () =>
    withBreakers((breakers) =>
      Effect.gen(function*() {
        yield* TestClock.setTime(2_000_000)
        // Alternating: never 3 in a row; 2 failures of 5 calls, then 3 of 6 — the minimum reached at 50%.
        yield* recordAll(breakers, A, [fail, ok, fail, ok, ok])
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Closed" })
        yield* breakers.record(A, fail)
        expect((yield* breakers.admit(A))._tag).toBe("Open")
      })
    ))

  it.effect("the error rate forgets calls older than the window", () =>
    withBreakers((breakers) =>
      Effect.gen(function*() {
        yield* TestClock.setTime(3_000_000)
        // 4 failures of 6 calls, never 3 in a row, the last a success: under the minimum at every failure.
        yield* recordAll(breakers, A, [fail, fail, ok, fail, fail, ok])
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Closed" })
        yield* TestClock.adjust(SETTINGS.windowMs + 1_000)
        yield* recordAll(breakers, A, [ok, ok, ok, fail, ok, fail])
        // 2 of 6 in the window: 33%. Had the old calls stayed, 6 of 12 would have opened it.
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Closed" })
        yield* recordAll(breakers, A, [fail, ok, fail])
        // 4 of 9: still under; one more failure makes 5 of 10.
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Closed" })
        yield* breakers.record(A, fail)
        expect((yield* breakers.admit(A))._tag).toBe("Open")
      })
    ))

  it.effect("half-open after the cool-down: exactly one probe; the others see Open until the probe's lease ends", () =>
    withBreakers((breakers) =>
      Effect.gen(function*() {
        yield* TestClock.setTime(4_000_000)
        yield* recordAll(breakers, A, [fail, fail, fail])
        yield* TestClock.adjust(SETTINGS.cooldownMs - 1)
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Open", halfOpenAt: 4_005_000 })
        yield* TestClock.adjust(1)
        expect(yield* breakers.notClosed).toEqual([{ target: A, state: "half_open", halfOpenAt: 4_005_000 }])
        const admissions = yield* Effect.all(Array.from({ length: 20 }, () => breakers.admit(A)), {
          concurrency: "unbounded"
        })
        expect(admissions.filter((admission) => admission._tag === "Probe")).toHaveLength(1)
        expect(admissions.filter((admission) => admission._tag === "Open")).toHaveLength(19)
        for (const admission of admissions) {
          if (admission._tag === "Open") expect(admission.halfOpenAt).toBe(4_005_000 + SETTINGS.probeLeaseMs)
        }
        // A probe that never reports (its instance died) lets another probe go after its lease.
        yield* TestClock.adjust(SETTINGS.probeLeaseMs)
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Probe" })
      })
    ))

  it.effect("the probe's success closes the breaker and the counts start afresh", () =>
    withBreakers((breakers) =>
      Effect.gen(function*() {
        yield* TestClock.setTime(5_000_000)
        yield* recordAll(breakers, A, [fail, fail, fail])
        yield* TestClock.adjust(SETTINGS.cooldownMs)
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Probe" })
        yield* breakers.record(A, ok)
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Closed" })
        expect(yield* breakers.notClosed).toEqual([])
        yield* recordAll(breakers, A, [fail, fail])
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Closed" })
      })
    ))

  it.effect("the probe's failure opens it for another cool-down", () =>
    withBreakers((breakers) =>
      Effect.gen(function*() {
        yield* TestClock.setTime(6_000_000)
        yield* recordAll(breakers, A, [fail, fail, fail])
        yield* TestClock.adjust(SETTINGS.cooldownMs)
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Probe" })
        yield* TestClock.adjust(300)
        yield* breakers.record(A, fail)
        const reopened = 6_000_000 + SETTINGS.cooldownMs + 300 + SETTINGS.cooldownMs
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Open", halfOpenAt: reopened })
        expect(yield* breakers.notClosed).toEqual([{ target: A, state: "open", halfOpenAt: reopened }])
        yield* TestClock.setTime(reopened)
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Probe" })
      })
    ))

  it.effect("outcomes of calls admitted before it opened change nothing while it is open", () =>
    withBreakers((breakers) =>
      Effect.gen(function*() {
        yield* TestClock.setTime(7_000_000)
        yield* recordAll(breakers, A, [fail, fail, fail])
        yield* TestClock.adjust(1_000)
        yield* recordAll(breakers, A, [ok, fail, fail, fail])
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Open", halfOpenAt: 7_005_000 })
      })
    ))

  it.effect("a Retry-After opens the target until then whatever the counts, and never shortens an open breaker", () =>
    withBreakers((breakers) =>
      Effect.gen(function*() {
        yield* TestClock.setTime(8_000_000)
        yield* breakers.record(A, { _tag: "Failure", retryAfterMs: 12_000 })
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Open", halfOpenAt: 8_012_000 })
        // A shorter one later keeps the longer.
        yield* breakers.record(A, { _tag: "Failure", retryAfterMs: 1_000 })
        expect(yield* breakers.admit(A)).toEqual({ _tag: "Open", halfOpenAt: 8_012_000 })
        // Shorter than the cool-down: the upstream's own word is kept.
        yield* breakers.record(B, { _tag: "Failure", retryAfterMs: 800 })
        expect(yield* breakers.admit(B)).toEqual({ _tag: "Open", halfOpenAt: 8_000_800 })
        yield* TestClock.adjust(800)
        expect(yield* breakers.admit(B)).toEqual({ _tag: "Probe" })
        // A probe answered with Retry-After longer than the cool-down opens it until then.
        yield* breakers.record(B, { _tag: "Failure", retryAfterMs: 60_000 })
        expect(yield* breakers.admit(B)).toEqual({ _tag: "Open", halfOpenAt: 8_060_800 })
        const listed = yield* breakers.notClosed
        expect([...listed].sort((x, y) => x.target.localeCompare(y.target))).toEqual([
          { target: A, state: "open", halfOpenAt: 8_012_000 },
          { target: B, state: "open", halfOpenAt: 8_060_800 }
        ])
        expect(yield* now).toBe(8_000_800)
      })
    ))

  it.effect("the gauge hook hears each change: 2 on opening, 1 on the probe, 0 on closing", () =>
    Effect.gen(function*() {
      const seen: Array<[string, number]> = []
      yield* TestClock.setTime(9_000_000)
      const breakers = yield* Effect.provide(
        Breakers,
        Breakers.memory(SETTINGS, (target, value) => seen.push([target, value]))
      )
      yield* recordAll(breakers, A, [fail, fail, fail])
      yield* TestClock.adjust(SETTINGS.cooldownMs)
      yield* breakers.admit(A)
      yield* breakers.record(A, ok)
      expect(seen).toEqual([[A, 2], [A, 1], [A, 0]])
    }))
})

describe("TargetCounts", () => {
  it("needs the minimum of calls before the rate counts", () => {
    const counts = new TargetCounts()
    const settings = { ...SETTINGS, failures: 100 }
    const results = [true, true, false, false, false].map((failure, i) => counts.add(i, failure, settings))
    // 2 failures of 5 calls: under the minimum of 6 whatever the rate.
    expect(results).toEqual([false, false, false, false, false])
    expect(counts.add(5, true, settings)).toBe(true)
  })
})

describe("BREAKER_* configuration", () => {
  it.effect("defaults, and a bad value refuses to start with one line naming it", () =>
    Effect.gen(function*() {
      const defaults = yield* configFrom({})
      expect(
        Either.isRight(defaults) && {
          failures: defaults.right.breakerFailures,
          rate: defaults.right.breakerErrorRate,
          window: defaults.right.breakerWindowMs,
          min: defaults.right.breakerMinCalls,
          cooldown: defaults.right.breakerCooldownMs
        }
      ).toEqual({ failures: 5, rate: 0.5, window: 60_000, min: 10, cooldown: 30_000 })
      const cases: ReadonlyArray<readonly [string, string]> = [
        ["BREAKER_FAILURES", "0"],
        ["BREAKER_FAILURES", "three"],
        ["BREAKER_ERROR_RATE", "1.5"],
        ["BREAKER_ERROR_RATE", "0"],
        ["BREAKER_WINDOW_MS", "10"],
        ["BREAKER_MIN_CALLS", "-1"],
        ["BREAKER_COOLDOWN_MS", "2.5"]
      ]
      for (const [name, value] of cases) {
        const result = yield* configFrom({ [name]: value })
        expect(Either.isLeft(result), `${name}=${value}`).toBe(true)
        const message = Either.isLeft(result) ? String(result.left) : ""
        expect(message).toContain(name)
        expect(message.split("\n")).toHaveLength(1)
      }
      const tuned = yield* configFrom({
        BREAKER_FAILURES: "2",
        BREAKER_ERROR_RATE: "0.25",
        BREAKER_COOLDOWN_MS: "1000"
      })
      expect(
        Either.isRight(tuned) &&
          [tuned.right.breakerFailures, tuned.right.breakerErrorRate, tuned.right.breakerCooldownMs]
      )
        .toEqual([2, 0.25, 1_000])
    }))
})
