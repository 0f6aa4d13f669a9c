import { expect, it } from "@effect/vitest"
import { Effect, Exit, FiberSet, Option, Ref, Scope, TestClock } from "effect"
import { watchHandoff } from "../src/Models/StreamRelay.js"

/**
 * The watchdog that settles a stream dropped before its relay attached
 * (issue 21, item 6): it runs on the service's fibers, so a service that
 * stops settles such a stream then, before the wallet's last flush — not 30 s
 * later, when nothing writes settlements any more.
 */
const watched = Effect.gen(function*() {
  const abandoned = yield* Ref.make(0)
  const scope = yield* Scope.make()
  const watchdogs = yield* Scope.extend(FiberSet.make<void>(), scope)
  const handoff = yield* watchHandoff(Ref.update(abandoned, (n) => n + 1), 30_000, (watchdog) => FiberSet.run(watchdogs, watchdog))
  yield* Effect.yieldNow()
  return { abandoned, scope, handoff }
})

it.effect("a stream still waiting for its relay when the service stops is abandoned (settled) then, once", () =>
  Effect.gen(function*() {
    const { abandoned, handoff, scope } = yield* watched
    yield* Scope.close(scope, Exit.void)
    expect(yield* Ref.get(abandoned)).toBe(1)
    expect(yield* Ref.get(handoff)).toBe("abandoned")
  }))

it.live("watched from an uninterruptible region, as the call path forks it: still abandoned at once when the service stops", () =>
  Effect.gen(function*() {
    const { abandoned, handoff, scope } = yield* Effect.uninterruptible(watched)
    // Real time: a watchdog that cannot be interrupted would hold the stop for its whole 30 s.
    const stopped = yield* Effect.timeoutOption(Scope.close(scope, Exit.void), "5 seconds")
    expect(Option.isSome(stopped), "the stop waited for the watchdog's deadline").toBe(true)
    expect(yield* Ref.get(abandoned)).toBe(1)
    expect(yield* Ref.get(handoff)).toBe("abandoned")
  }))

it.effect("a stream whose relay attached is left to the relay, at the deadline and at shutdown", () =>
  Effect.gen(function*() {
    const { abandoned, handoff, scope } = yield* watched
    yield* Ref.set(handoff, "attached")
    yield* TestClock.adjust("31 seconds")
    yield* Scope.close(scope, Exit.void)
    expect(yield* Ref.get(abandoned)).toBe(0)
  }))

it.effect("a stream never relayed is abandoned at the deadline, once", () =>
  Effect.gen(function*() {
    const { abandoned, handoff, scope } = yield* watched
    yield* TestClock.adjust("29 seconds")
    expect(yield* Ref.get(abandoned)).toBe(0)
    yield* TestClock.adjust("2 seconds")
    expect(yield* Ref.get(abandoned)).toBe(1)
    yield* Scope.close(scope, Exit.void)
    expect(yield* Ref.get(abandoned)).toBe(1)
    expect(yield* Ref.get(handoff)).toBe("abandoned")
  }))
