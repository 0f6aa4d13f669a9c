import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { call, createKey } from "../../support/Http.js"
import { modelCall } from "../../support/Models.js"
import {
  bothListening,
  DEADLINE_MS,
  Instances,
  on,
  outcome,
  seenWithin,
  TwoInstancesLive
} from "../../support/TwoInstances.js"
import { developer } from "../../support/Wallet.js"

/**
 * A guardrail policy changed through one instance applies to the next call on it, and on the other within a
 * second (docs/api/guardrails.md, "Policies"): the policy is read with the key, and its change is announced
 * as the account's.
 */

const ASK_MYKAD = { model: "svc/nenas-flash", input: "My IC is 880101-14-5678.", max_output_tokens: 16 }

layer(TwoInstancesLive("guardrails"), { excludeTestServices: true, timeout: 120_000 })((it) => {
  it.effect("an account's policy and a key's override, set through one instance, hold on both within a second", () =>
    Effect.gen(function*() {
      yield* bothListening
      const { a, b } = yield* Instances
      const { token } = yield* on(a)(developer("guardrails-two@example.com"))
      const created = yield* on(a)(createKey(token, { name: "two", environment: "test" }))
      const ask = modelCall(created.full_key, "/v1/responses", ASK_MYKAD)
      // Both instances remember the key (and its policy: none) before the change.
      for (const base of [a, b, a, b]) expect(outcome(yield* on(base)(ask))).toBe("200")

      const setAt = Date.now()
      const set = yield* on(a)(call("PUT", "/dashboard/guardrails", {
        token,
        json: { pii: { action: "block", types: ["mykad"] } }
      }))
      expect(set.status, set.text).toBe(200)
      // The instance that took it knows at once; the other within the deadline.
      expect(outcome(yield* on(a)(ask))).toBe("content_blocked")
      const blockedAfter = yield* seenWithin(setAt, on(b)(ask), (reply) => outcome(reply) === "content_blocked")
      expect(blockedAfter).toBeLessThanOrEqual(DEADLINE_MS)

      const overrideAt = Date.now()
      const patched = yield* on(b)(call("PATCH", `/dashboard/api-keys/${created.key.id}`, {
        token,
        json: { guardrails: { pii: { action: "redact" } } }
      }))
      expect(patched.status, patched.text).toBe(200)
      expect(outcome(yield* on(b)(ask))).toBe("200")
      const passedAfter = yield* seenWithin(overrideAt, on(a)(ask), (reply) => outcome(reply) === "200")
      expect(passedAfter).toBeLessThanOrEqual(DEADLINE_MS)
    }))
})
