import { describe, expect, it, layer } from "@effect/vitest"
import { Context, Effect, Option } from "effect"
import { Breakers } from "../../../src/Providers/Breakers.js"
import { call } from "../../support/Http.js"
import { TestServer, TestServerLive } from "../../support/TestServer.js"
import { on, twoInstances } from "../../support/TwoInstances.js"

/**
 * What operators see of the breakers, through the real server: `/readyz`
 * lists those not closed and stays ready; `/metrics` has their state on the
 * gauge. In memory and through Redis (`Breakers.layer` chooses by REDIS_URL).
 */
const TARGET = "flaky/gpt-4.1-mini"
const OTHER = "steady/gpt-4.1-mini"
const COOLDOWN_MS = 60_000

/** The gauge's value for `target` in a Prometheus text. */
const gauge = (text: string, target: string): number | undefined => {
  const line = text.split("\n").find((row) => row.startsWith(`nenas_upstream_breaker_state{target="${target}"}`))
  return line === undefined ? undefined : Number(line.split(" ").at(-1))
}

const cases = [
  { name: "in memory", config: {} },
  { name: "through Redis", config: { redisUrl: Option.some("redis://127.0.0.1:6379") } }
] as const

for (const { config, name } of cases) {
  describe(`breakers on /readyz and /metrics (${name})`, () => {
    layer(TestServerLive({ ...config, breakerFailures: 2, breakerCooldownMs: COOLDOWN_MS }), {
      excludeTestServices: true
    })((it) => {
      it.effect("an opened breaker is listed with its half-open time, the service stays ready, the gauge says 2, then 1, then 0", () =>
        Effect.gen(function*() {
          const { clock } = yield* TestServer
          const breakers = yield* Breakers
          const closed = yield* call("GET", "/readyz")
          expect(closed.status).toBe(200)
          expect(closed.body).toEqual({ status: "ok", upstreams: { open: [] } })

          // As the provider records attempts: the other target answers, this one fails twice.
          yield* Effect.withClock(
            Effect.all([
              breakers.record(OTHER, { _tag: "Success" }),
              breakers.record(TARGET, { _tag: "Failure" }),
              breakers.record(TARGET, { _tag: "Failure" })
            ]),
            clock
          )
          const openedAt = clock.unsafeCurrentTimeMillis()
          const ready = yield* call("GET", "/readyz")
          expect(ready.status).toBe(200)
          expect(ready.body.status).toBe("ok")
          expect(ready.body.upstreams.open).toHaveLength(1)
          const [listed] = ready.body.upstreams.open
          expect(listed.target).toBe(TARGET)
          expect(listed.state).toBe("open")
          const halfOpenAt = Date.parse(listed.half_open_at)
          expect(halfOpenAt - openedAt).toBeGreaterThan(COOLDOWN_MS - 1_000)
          expect(halfOpenAt - openedAt).toBeLessThanOrEqual(COOLDOWN_MS)
          expect(listed.half_open_at).toBe(new Date(halfOpenAt).toISOString())

          const metrics = yield* call("GET", "/metrics")
          expect(gauge(metrics.text, TARGET)).toBe(2)
          // The per-target attempt metrics the provider records into are declared.
          expect(metrics.text).toContain("# TYPE nenas_upstream_attempts_total counter")
          expect(metrics.text).toContain("# TYPE nenas_upstream_attempt_duration_seconds histogram")

          // Past the cool-down the breaker is half-open; its probe's success closes it.
          clock.advance(COOLDOWN_MS)
          const halfOpen = yield* call("GET", "/readyz")
          expect(halfOpen.body.upstreams.open).toEqual([{
            target: TARGET,
            state: "half_open",
            half_open_at: listed.half_open_at
          }])
          expect(gauge((yield* call("GET", "/metrics")).text, TARGET)).toBe(1)
          expect(yield* Effect.withClock(breakers.admit(TARGET), clock)).toEqual({ _tag: "Probe" })
          yield* Effect.withClock(breakers.record(TARGET, { _tag: "Success" }), clock)
          expect((yield* call("GET", "/readyz")).body).toEqual({ status: "ok", upstreams: { open: [] } })
          expect(gauge((yield* call("GET", "/metrics")).text, TARGET)).toBe(0)
        }))
    })
  })
}

describe("breakers across two instances on one Redis", () => {
  it.scopedLive(
    "a breaker opened on one instance is on the other's /readyz and gauge, with the same half-open time",
    () =>
      Effect.gen(function*() {
        const { a, b, clock, database, first, second, settled } = yield* twoInstances("breakers", {
          redisUrl: Option.some("redis://127.0.0.1:6379"),
          breakerFailures: 2,
          breakerCooldownMs: COOLDOWN_MS
        })
        yield* Effect.provideService(seenOnBoth(a, b, first, second), TestServer, {
          baseUrl: a,
          databaseUrl: database.url,
          clock,
          settled
        })
      }),
    60_000
  )
})

/** Instance one opens the breaker; both `/readyz` list it, the second's gauge and calls see it. */
const seenOnBoth = (a: string, b: string, first: Context.Context<Breakers>, second: Context.Context<Breakers>) =>
  Effect.gen(function*() {
    const one = Context.get(first, Breakers)
    expect((yield* on(b)(call("GET", "/readyz"))).body.upstreams.open).toEqual([])
    yield* one.record(TARGET, { _tag: "Failure" })
    yield* one.record(TARGET, { _tag: "Failure" })
    const onA = (yield* on(a)(call("GET", "/readyz"))).body.upstreams.open
    const onB = (yield* on(b)(call("GET", "/readyz"))).body.upstreams.open
    expect(onA).toHaveLength(1)
    expect(onB).toEqual(onA)
    // The second instance never tried the target; its gauge shows it open all the same.
    expect(gauge((yield* on(b)(call("GET", "/metrics"))).text, TARGET)).toBe(2)
    // And its calls skip it without a request (its copy heard the change).
    const two = Context.get(second, Breakers)
    let admission = yield* two.admit(TARGET)
    for (let i = 0; i < 300 && admission._tag !== "Open"; i++) {
      yield* Effect.sleep("10 millis")
      admission = yield* two.admit(TARGET)
    }
    expect(admission).toEqual({ _tag: "Open", halfOpenAt: Date.parse(onA[0].half_open_at) })
  })
