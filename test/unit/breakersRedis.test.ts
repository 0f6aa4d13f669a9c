import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import { Redis } from "ioredis"
import { randomUUID } from "node:crypto"
import { Breakers } from "../../src/Providers/Breakers.js"
import type { Admission } from "../../src/Providers/BreakerTypes.js"

/**
 * Two instances' breakers on one Redis (each test its own key prefix): the
 * open state and the half-open probe are shared; a Redis that is away fails
 * no call.
 */
const REDIS_URL = process.env["REDIS_URL"] ?? "redis://127.0.0.1:6379"
const SETTINGS = { failures: 3, cooldownMs: 60_000, probeLeaseMs: 5_000 }
const TARGET = "primary/gpt-4.1-mini"

/** Two `Breakers` as two instances build them: separate connections, one Redis, one prefix. */
const twoInstances = (prefix: string) =>
  Effect.all([
    Layer.build(Breakers.redis({ url: REDIS_URL, prefix, settings: SETTINGS })),
    Layer.build(Breakers.redis({ url: REDIS_URL, prefix, settings: SETTINGS }))
  ]).pipe(Effect.map((contexts) => contexts.map((context) => Context.get(context, Breakers))))

/** The prefix's keys removed after the test, so nothing is left in the shared Redis. */
const cleanPrefix = Effect.acquireRelease(
  Effect.sync(() => `nenas:test:breaker:${randomUUID()}:`),
  (prefix) =>
    Effect.promise(async () => {
      const redis = new Redis(REDIS_URL)
      const keys = await redis.keys(`${prefix}*`)
      if (keys.length > 0) await redis.del(...keys)
      await redis.quit()
    })
)

/** Asks until `done` holds (a message between instances takes a moment), for at most 3 s. */
const until = <A>(probe: Effect.Effect<A>, done: (a: A) => boolean) =>
  Effect.gen(function*() {
    const deadline = Date.now() + 3_000
    for (;;) {
      const value = yield* probe
      if (done(value) || Date.now() > deadline) return value
      yield* Effect.sleep("10 millis")
    }
  })

describe("circuit breakers shared through Redis", () => {
  it.scopedLive("opened on one instance, the other sees it open with the same half-open time", () =>
    Effect.gen(function*() {
      const prefix = yield* cleanPrefix
      const [one, two] = yield* twoInstances(prefix)
      if (one === undefined || two === undefined) throw new Error("two instances")
      expect(yield* two.admit(TARGET)).toEqual({ _tag: "Closed" })
      const before = Date.now()
      for (let i = 0; i < SETTINGS.failures; i++) yield* one.record(TARGET, { _tag: "Failure" })
      const onOne = yield* one.admit(TARGET)
      expect(onOne._tag).toBe("Open")
      const halfOpenAt = onOne._tag === "Open" ? onOne.halfOpenAt : 0
      expect(halfOpenAt).toBeGreaterThanOrEqual(before + SETTINGS.cooldownMs)
      expect(halfOpenAt).toBeLessThanOrEqual(Date.now() + SETTINGS.cooldownMs)
      const onTwo = yield* until(two.admit(TARGET), (admission) => admission._tag === "Open")
      expect(onTwo).toEqual({ _tag: "Open", halfOpenAt })
      expect(yield* two.notClosed).toEqual([{ target: TARGET, state: "open", halfOpenAt }])
      // Counting is per instance: two failures on the second instance open nothing elsewhere.
      yield* two.record("other/model", { _tag: "Failure" })
      yield* one.record("other/model", { _tag: "Failure" })
      expect(yield* one.admit("other/model")).toEqual({ _tag: "Closed" })
    }))

  it.scopedLive("half-open: of many concurrent admits across both instances, exactly one is the probe; its success closes it everywhere", () =>
    Effect.gen(function*() {
      const prefix = yield* cleanPrefix
      const [one, two] = yield* twoInstances(prefix)
      if (one === undefined || two === undefined) throw new Error("two instances")
      // A Retry-After of 150 ms opens it on both until then.
      yield* one.record(TARGET, { _tag: "Failure", retryAfterMs: 150 })
      yield* until(two.admit(TARGET), (admission) => admission._tag === "Open")
      yield* Effect.sleep("200 millis")
      const admissions: ReadonlyArray<Admission> = yield* Effect.all(
        Array.from({ length: 100 }, (_, i) => (i % 2 === 0 ? one : two).admit(TARGET)),
        { concurrency: "unbounded" }
      )
      const probes = admissions.filter((admission) => admission._tag === "Probe")
      expect(probes).toHaveLength(1)
      expect(admissions.filter((admission) => admission._tag === "Open")).toHaveLength(99)
      const states = yield* one.notClosed
      expect(states.map((state) => state.state)).toEqual(["half_open"])
      // Whoever holds the probe, its success recorded on the second instance closes the breaker on both.
      yield* two.record(TARGET, { _tag: "Success" })
      expect(yield* two.admit(TARGET)).toEqual({ _tag: "Closed" })
      expect(yield* until(one.admit(TARGET), (admission) => admission._tag === "Closed")).toEqual({ _tag: "Closed" })
      expect(yield* one.notClosed).toEqual([])
    }))

  it.scopedLive("the probe's failure on one instance opens it again for a cool-down on both", () =>
    Effect.gen(function*() {
      const prefix = yield* cleanPrefix
      const [one, two] = yield* twoInstances(prefix)
      if (one === undefined || two === undefined) throw new Error("two instances")
      yield* two.record(TARGET, { _tag: "Failure", retryAfterMs: 100 })
      yield* until(one.admit(TARGET), (admission) => admission._tag === "Open")
      yield* Effect.sleep("150 millis")
      expect(yield* one.admit(TARGET)).toEqual({ _tag: "Probe" })
      const failedAt = Date.now()
      yield* one.record(TARGET, { _tag: "Failure" })
      const seen = yield* until(
        two.admit(TARGET),
        (admission) => admission._tag === "Open" && admission.halfOpenAt > failedAt + 1_000
      )
      expect(seen._tag).toBe("Open")
      if (seen._tag === "Open") expect(seen.halfOpenAt).toBeGreaterThanOrEqual(failedAt + SETTINGS.cooldownMs)
    }))

  it.scopedLive(
    "a Redis that cannot be reached fails no call: admits answer Closed, opening holds on this instance",
    () =>
      Effect.gen(function*() {
        // Nothing listens on port 1.
        const breakers = yield* Effect.map(
          Layer.build(
            Breakers.redis({ url: "redis://127.0.0.1:1", prefix: "nenas:test:unreachable:", settings: SETTINGS })
          ),
          (context) => Context.get(context, Breakers)
        )
        expect(yield* breakers.admit(TARGET)).toEqual({ _tag: "Closed" })
        yield* breakers.record(TARGET, { _tag: "Failure", retryAfterMs: 100 })
        expect((yield* breakers.admit(TARGET))._tag).toBe("Open")
        yield* Effect.sleep("150 millis")
        // Half-open, the probe's claim fails on Redis: the call is admitted rather than refused.
        expect(yield* breakers.admit(TARGET)).toEqual({ _tag: "Closed" })
        expect((yield* breakers.notClosed).map((state) => state.target)).toEqual([TARGET])
      }),
    20_000
  )
})
