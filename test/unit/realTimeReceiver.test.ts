import { expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { eventually } from "../support/WebhookReceiver.js"

// `it.effect` runs on a TestClock, which never moves by itself: a poll helper that slept with `Effect.sleep` hung
// there for the test's whole timeout as soon as its first probe missed (the two-instance test in CI, 300 s).
it.effect("the poll helpers wake on wall-clock time under the TestClock", () =>
  Effect.gen(function*() {
    let probes = 0
    const seen = yield* eventually("the third probe", Effect.sync(() => ++probes), (n) => n >= 3, 2_000)
    expect(seen).toBe(3)
  }), { timeout: 5_000 })
