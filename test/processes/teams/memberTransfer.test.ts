import { expect, layer } from "@effect/vitest"
import { Context, Effect, Fiber, Layer, Option } from "effect"
import { newId } from "../../../src/Domain/Ids.js"
import { KeyCache } from "../../../src/Keys/KeyCache.js"
import { call, createKey, type Reply } from "../../support/Http.js"
import { modelCall, violations } from "../../support/Models.js"
import { topUp } from "../../support/Stripe.js"
import { query, TestServer } from "../../support/TestServer.js"
import {
  bothListening,
  DEADLINE_MS,
  Instances,
  on,
  outcome,
  seenWithin,
  twoInstances
} from "../../support/TwoInstances.js"
import { Upstream } from "../../support/Upstream.js"
import { developer } from "../../support/Wallet.js"

/**
 * Keys given over with a removed member (docs/api/teams.md, "Teams"): from the moment the removal answers, the recipient's
 * monthly budget counts them on every instance, their calls in flight on credit grants included.
 */

/** Two whole services in this process on one database, their live calls answered by the upstream double. */
const InstancesLive = Layer.scopedContext(Effect.gen(function*() {
  const upstream = yield* Upstream
  const { a, b, clock, database, first, second, settled } = yield* twoInstances("transfer", {
    upstreamBaseUrl: Option.some(upstream.baseUrl),
    rateLimitRpm: 100_000,
    rateLimitConcurrent: 1_000,
    ipDevSessionsPerMinute: 1_000_000
  })
  const listening = Effect.map(
    Effect.all([Context.get(first, KeyCache).listening, Context.get(second, KeyCache).listening]),
    (both) => both.every(Boolean)
  )
  return Context.make(Instances, { a, b, listening }).pipe(
    Context.add(TestServer, { baseUrl: a, databaseUrl: database.url, clock, settled })
  )
})).pipe(Layer.provideMerge(Upstream.layer))

const MAX_TOKENS = 2_000
const BODY = {
  model: "svc/nenas-flash",
  messages: [{ role: "user", content: "Count the budget." }],
  max_tokens: MAX_TOKENS
}
const NEAR_ESTIMATE = { prompt_tokens: 20, completion_tokens: MAX_TOKENS }
const chat = (apiKey: string) => modelCall(apiKey, "/v1/chat/completions", BODY)

/** A developer member of the account, made in SQL (the invitation flow is tested elsewhere). */
const memberOf = (accountId: string, budget: number | null) =>
  Effect.gen(function*() {
    const memberId = newId("mem")
    yield* query(
      `INSERT INTO members (id, account_id, issuer, subject, email, role, monthly_spend_limit_micro_myr)
       VALUES ($1, $2, 'test', $3, $4, 'developer', $5)`,
      [memberId, accountId, newId("sub"), `${memberId}@example.com`, budget]
    )
    return memberId
  })

const keyOf = (token: string, memberId: string, name: string) =>
  Effect.gen(function*() {
    const created = yield* createKey(token, { name, environment: "live" })
    yield* query("UPDATE api_keys SET member_id = $1 WHERE id = $2", [memberId, created.key.id])
    return { id: created.key.id, apiKey: created.full_key }
  })

const spentBy = (keyIds: ReadonlyArray<string>) =>
  Effect.map(
    query<{ spent: string }>(
      "SELECT COALESCE(-SUM(amount_micro_myr), 0)::text AS spent FROM ledger_entries WHERE api_key_id = ANY($1) AND type = 'usage'",
      [keyIds]
    ),
    (rows) => Number(rows[0]?.spent ?? 0)
  )

const estimateOf = (keyId: string) =>
  Effect.map(
    query<{ amount: string | null }>(
      "SELECT max(amount_micro_myr)::text AS amount FROM reservations WHERE api_key_id = $1",
      [keyId]
    ),
    (rows) => Number(rows[0]?.amount ?? 0)
  )

const grantHolders = (accountId: string, wanted: number) =>
  Effect.gen(function*() {
    let holders = 0
    for (let waited = 0; holders < wanted && waited < 100; waited++) {
      yield* Effect.sleep("100 millis")
      const rows = yield* query<{ n: number }>(
        "SELECT count(DISTINCT holder)::int AS n FROM credit_grants WHERE account_id = $1",
        [accountId]
      )
      holders = rows[0]?.n ?? 0
    }
    return holders
  })

const refusedForHolds = (reply: Reply) => outcome(reply) === "spend_limit_exceeded"

layer(InstancesLive, { excludeTestServices: true, timeout: 180_000 })("keys given over with a removed member", (it) => {
  it.effect("the recipient's budget counts what the given keys' calls on grants hold, on both instances, once the removal answers", () =>
    Effect.gen(function*() {
      yield* bothListening
      const upstream = yield* Upstream
      const { a, b } = yield* Instances
      const { accountId, token } = yield* on(a)(developer("transfer-owner@example.com"))
      yield* on(a)(topUp(token, 50_000))
      const leaver = yield* on(a)(memberOf(accountId, null))
      const heir = yield* on(a)(memberOf(accountId, null))
      const busyKey = yield* on(a)(keyOf(token, leaver, "leaver's busy"))
      const heirKey = yield* on(a)(keyOf(token, heir, "heir's own"))

      // No budget anywhere: the leaver's key runs on grants each instance holds.
      upstream.setBehaviour({ kind: "ok", delayMs: 20, usage: NEAR_ESTIMATE })
      for (const base of [a, b]) expect(outcome(yield* on(base)(chat(heirKey.apiKey)))).toBe("200")
      let busy = true
      const load = yield* Effect.all(
        [a, b].flatMap((base) =>
          Array.from({ length: 8 }, () =>
            Effect.gen(function*() {
              while (busy) expect(outcome(yield* on(base)(chat(busyKey.apiKey)))).toBe("200")
            }))
        ),
        { concurrency: "unbounded" }
      ).pipe(Effect.fork)
      const holders = yield* grantHolders(accountId, 2)
      busy = false
      yield* Fiber.join(load)
      expect(holders, "both instances hold a grant for the account").toBe(2)

      // Slow calls of the leaver's key, on the grants of both instances.
      upstream.setBehaviour({ kind: "ok", delayMs: 4_000, usage: NEAR_ESTIMATE })
      const slow = yield* Effect.all(
        [a, b].flatMap((base) => Array.from({ length: 5 }, () => on(base)(chat(busyKey.apiKey)))),
        { concurrency: "unbounded" }
      ).pipe(Effect.fork)
      yield* Effect.sleep("500 millis")

      // The heir's budget has room for one call over what both keys wrote, not for what the slow calls hold.
      const estimate = yield* estimateOf(heirKey.id)
      const written = yield* spentBy([busyKey.id, heirKey.id])
      yield* query("UPDATE members SET monthly_spend_limit_micro_myr = $1 WHERE id = $2", [
        written + estimate + 1_000,
        heir
      ])
      yield* Effect.sleep("200 millis")
      const removed = yield* on(b)(call("DELETE", `/dashboard/members/${leaver}?transfer_keys_to=${heir}`, { token }))
      expect(removed.body, removed.text).toEqual({ ok: true, keys_disabled: [], keys_transferred: [busyKey.id] })
      const movedAt = Date.now()
      const holds = yield* query<{ amount: string }>(
        "SELECT amount_micro_myr::text AS amount FROM key_grant_holds WHERE api_key_id = $1",
        [busyKey.id]
      )
      expect(holds.reduce((sum, hold) => sum + Number(hold.amount), 0), "both instances wrote what the calls hold")
        .toBe(10 * estimate)
      for (const base of [a, b]) {
        const ms = yield* seenWithin(movedAt, on(base)(chat(heirKey.apiKey)), refusedForHolds)
        expect(ms).toBeLessThanOrEqual(DEADLINE_MS)
        const refused = yield* on(base)(chat(heirKey.apiKey))
        expect(refused.body.error.message).toContain("held for calls in flight")
      }
      expect(Date.now() - movedAt, "the refusals came while the slow calls still ran").toBeLessThan(3_000)
      const finished = yield* Fiber.join(slow)
      expect(finished.map(outcome)).toEqual(Array(10).fill("200"))
      expect(yield* violations(accountId)).toEqual([])
    }))
})
