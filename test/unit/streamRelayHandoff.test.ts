import { expect, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { makeHandoffs } from "../../src/Models/Call/StreamRelay.js"

/**
 * The watchdog that settles a stream dropped before its relay attached: a
 * service that stops settles such a stream then, before the wallet's last
 * flush, not at its deadline, when nothing writes settlements any more. Real
 * time: the watchdog is a timer.
 */
const watched = (timeoutMs: number) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    const handoffs = yield* Scope.extend(makeHandoffs(timeoutMs), scope)
    let abandoned = 0
    const handoff = handoffs.watch(() => {
      abandoned += 1
    })
    return { abandoned: () => abandoned, scope, handoff }
  })

it.live("a stream still waiting for its relay when the service stops is abandoned (settled) then, once", () =>
  Effect.gen(function*() {
    const { abandoned, handoff, scope } = yield* watched(30_000)
    yield* Scope.close(scope, Exit.void)
    expect(abandoned()).toBe(1)
    expect(handoff.attach(), "a relay attaching after the stop").toBe(false)
    expect(abandoned()).toBe(1)
  }))

it.live("a stream whose relay attached is left to the relay, at the deadline and at shutdown", () =>
  Effect.gen(function*() {
    const { abandoned, handoff, scope } = yield* watched(50)
    expect(handoff.attach()).toBe(true)
    yield* Effect.sleep("120 millis")
    yield* Scope.close(scope, Exit.void)
    expect(abandoned()).toBe(0)
    expect(handoff.attach(), "attached once only").toBe(false)
  }))

it.live("a stream never relayed is abandoned at the deadline, once", () =>
  Effect.gen(function*() {
    const { abandoned, handoff, scope } = yield* watched(100)
    yield* Effect.sleep("20 millis")
    expect(abandoned()).toBe(0)
    yield* Effect.sleep("200 millis")
    expect(abandoned()).toBe(1)
    expect(handoff.attach()).toBe(false)
    yield* Scope.close(scope, Exit.void)
    expect(abandoned()).toBe(1)
  }))
