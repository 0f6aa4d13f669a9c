import { describe, expect, layer } from "@effect/vitest"
import { Effect, Option } from "effect"
import { Breakers } from "../src/Providers/Breakers.js"
import { call } from "./support/Http.js"
import { TestServer, TestServerLive } from "./support/TestServer.js"

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
    layer(TestServerLive({ ...config, breakerFailures: 2, breakerCooldownMs: COOLDOWN_MS }), { excludeTestServices: true })((it) => {
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

          // Past the cool-down the breaker is half-open; its probe's success closes it.
          clock.advance(COOLDOWN_MS)
          const halfOpen = yield* call("GET", "/readyz")
          expect(halfOpen.body.upstreams.open).toEqual([{ target: TARGET, state: "half_open", half_open_at: listed.half_open_at }])
          expect(gauge((yield* call("GET", "/metrics")).text, TARGET)).toBe(1)
          expect(yield* Effect.withClock(breakers.admit(TARGET), clock)).toEqual({ _tag: "Probe" })
          yield* Effect.withClock(breakers.record(TARGET, { _tag: "Success" }), clock)
          expect((yield* call("GET", "/readyz")).body).toEqual({ status: "ok", upstreams: { open: [] } })
          expect(gauge((yield* call("GET", "/metrics")).text, TARGET)).toBe(0)
        }))
    })
  })
}
