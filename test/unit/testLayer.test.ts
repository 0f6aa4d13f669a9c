import { describe, expect, it } from "@effect/vitest"
import { Cause, Effect, Exit } from "effect"
import { makeTestLayer } from "../../src/Domain/TestLayer.js"
import { KeysRepo } from "../../src/Keys/Repo.js"
import { Mail } from "../../src/Outbox/Mail.js"

/** `makeTestLayer(tag)(members)`: the members given answer; any other dies when used, naming its service and itself. */

const defect = <A, E>(exit: Exit.Exit<A, E>): string =>
  Exit.isFailure(exit) && Cause.isDie(exit.cause) ? String(Cause.squash(exit.cause)) : `not a defect: ${String(exit)}`

describe("makeTestLayer", () => {
  it.effect("a method given answers; a method not given dies when called, naming itself", () =>
    Effect.gen(function*() {
      const repo = yield* KeysRepo
      expect(yield* repo.isAccountKey("acc_1", "key_1")).toBe(true)
      const removed = yield* Effect.exit(repo.remove("acc_1", "key_1"))
      expect(defect(removed)).toBe("nenas/KeysRepo: unimplemented remove (a test gave no implementation)")
    }).pipe(Effect.provide(makeTestLayer(KeysRepo)({ isAccountKey: () => Effect.succeed(true) }))))

  it.effect("an Effect-valued member given answers; one not given dies when yielded, naming itself", () =>
    Effect.gen(function*() {
      const given = yield* Effect.provide(Mail, makeTestLayer(Mail)({ runOnce: Effect.succeed(3) }))
      expect(yield* given.runOnce).toBe(3)
      const missing = yield* Effect.provide(Mail, makeTestLayer(Mail)({}))
      expect(defect(yield* Effect.exit(missing.runOnce))).toBe(
        "nenas/Mail: unimplemented runOnce (a test gave no implementation)"
      )
    }))

  it.effect("nothing dies until it is used: building the Layer and reading members is free", () =>
    Effect.gen(function*() {
      const repo = yield* Effect.provide(KeysRepo, makeTestLayer(KeysRepo)({}))
      expect(typeof repo.list).toBe("function")
      expect("rotate" in repo).toBe(true)
    }))
})
