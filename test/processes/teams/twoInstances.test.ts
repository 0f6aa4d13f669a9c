import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { call, type Reply } from "../../support/Http.js"
import { modelCall } from "../../support/Models.js"
import { TestServer } from "../../support/TestServer.js"
import {
  ASK,
  bothListening,
  DEADLINE_MS,
  Instances,
  on,
  outcome,
  seenWithin,
  TwoInstancesLive
} from "../../support/TwoInstances.js"
import { developer } from "../../support/Wallet.js"

describe("a member removed, across two instances", () => {
  const instances = TwoInstancesLive("teamremoval", { ipDevSessionsPerMinute: 1000 })
  layer(instances, { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("its keys stop working on both instances within a second, and its session no longer reaches the account", () =>
      Effect.gen(function*() {
        yield* bothListening
        const { a, b } = yield* Instances
        const owner = yield* on(a)(developer("removal-owner@example.com"))
        const member = yield* on(a)(developer("removal-dev@example.com"))
        const invitation = yield* on(a)(call("POST", "/dashboard/members/invitations", {
          token: owner.token,
          json: { email: "removal-dev@example.com", role: "developer" }
        }))
        const accepted = yield* on(b)(
          call("POST", `/dashboard/invitations/${invitation.body.id}/accept`, { token: member.token })
        )
        expect(accepted.status).toBe(200)
        const team = { token: member.token, headers: { "nenas-account": owner.accountId } }
        const key = yield* on(b)(
          call("POST", "/dashboard/api-keys", { ...team, json: { name: "member's", environment: "test" } })
        )
        expect(key.status).toBe(201)
        const respond = modelCall(key.body.full_key, "/v1/responses", ASK)
        // Both instances answer (and so remember the key) before the removal.
        for (const base of [a, b, a, b]) expect(outcome(yield* on(base)(respond))).toBe("200")
        const removedAt = Date.now()
        const removed = yield* on(a)(
          call("DELETE", `/dashboard/members/${accepted.body.account.member_id}`, { token: owner.token })
        )
        expect(removed.body.keys_disabled).toEqual([key.body.key.id])
        const seen = yield* Effect.all(
          [a, b].map((base) =>
            seenWithin(
              removedAt,
              on(base)(respond as Effect.Effect<Reply, never, TestServer>),
              (reply) => outcome(reply) === "permission_denied",
              DEADLINE_MS
            )
          ),
          { concurrency: 2 }
        )
        expect(Math.max(...seen)).toBeLessThanOrEqual(DEADLINE_MS)
        for (const base of [a, b]) {
          const members = yield* on(base)(call("GET", "/dashboard/members", team))
          expect(members.status).toBe(403)
          expect(members.body.error.code).toBe("permission_denied")
        }
      }))
  })
})
