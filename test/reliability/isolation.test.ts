import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { expectClientError } from "../support/ErrorBody.js"
import { call, createKey } from "../support/Http.js"
import { SMOKE } from "../support/Smoke.js"
import { topUp, webhookOverrides } from "../support/Stripe.js"
import { TestServerLive } from "../support/TestServer.js"
import { developer } from "../support/Wallet.js"

/**
 * Isolation: two developers, each with keys, money and logs.
 * Every dashboard endpoint and key operation tried with one's session on the
 * other's resources: nothing of one is visible to, or changeable by, the other.
 */

const CALLS = SMOKE ? 2 : 5

const owner = (email: string) =>
  Effect.gen(function*() {
    const dev = yield* developer(email)
    const testKey = yield* createKey(dev.token, { name: `${email} test`, environment: "test" })
    const liveKey = yield* createKey(dev.token, { name: `${email} live`, monthly_spend_limit_myr: 5 })
    yield* topUp(dev.token, 2500)
    for (let i = 0; i < CALLS; i++) {
      const reply = yield* call("POST", "/v1/responses", {
        token: testKey.full_key,
        json: { input: `hello from ${email} ${i}` }
      })
      expect(reply.status, reply.text).toBe(200)
    }
    return { ...dev, email, testKey, liveKey }
  })

/** Everything a developer's dashboard shows. */
const view = (token: string) =>
  Effect.gen(function*() {
    const paths = [
      "/dashboard/api-keys",
      "/dashboard/billing/balance",
      "/dashboard/billing/transactions?limit=200",
      "/dashboard/logs?limit=200",
      "/dashboard/usage?granularity=hour&from=2020-01-01T00:00:00Z&to=2020-01-31T00:00:00Z",
      "/dashboard/overview"
    ]
    const replies = yield* Effect.forEach(paths, (path) => call("GET", path, { token }))
    for (const reply of replies) expect(reply.status, reply.text).toBe(200)
    return replies.map((reply) => reply.body)
  })

layer(TestServerLive(webhookOverrides), { timeout: 300_000 })("isolation", (it) => {
  it.effect("one developer sees and changes nothing of another's", () =>
    Effect.gen(function*() {
      const a = yield* owner("isolation-a@example.com")
      const b = yield* owner("isolation-b@example.com")
      const aBefore = yield* view(a.token)
      const aText = JSON.stringify(aBefore)
      const bView = JSON.stringify(yield* view(b.token))

      // Nothing of A in anything B sees.
      for (
        const secret of [a.testKey.key.id, a.liveKey.key.id, a.testKey.key.prefix, a.email, "hello from isolation-a"]
      ) {
        expect(bView).not.toContain(secret)
      }
      expect(aText).toContain(a.testKey.key.id)

      // A's key ids through B's session: 404, as for a key that does not exist.
      for (const id of [a.testKey.key.id, a.liveKey.key.id]) {
        expectClientError(yield* call("DELETE", `/dashboard/api-keys/${id}`, { token: b.token }), {
          status: 404,
          code: "not_found"
        }, "delete")
        for (const path of [`/dashboard/logs?api_key_id=${id}`, `/dashboard/usage?api_key_id=${id}`]) {
          const reply = yield* call("GET", path, { token: b.token })
          expectClientError(reply, { status: 404, code: "not_found" }, path)
        }
      }

      // Credentials used in the wrong place: a key as a session, a session as a key.
      expectClientError(yield* call("GET", "/dashboard/api-keys", { token: a.testKey.full_key }), {
        status: 401,
        code: "authentication_error"
      })
      const asKey = yield* call("POST", "/v1/responses", { token: a.token, json: { input: "hi" } })
      expect(asKey.status).toBe(401)

      // B's own operations leave A untouched.
      const created = yield* createKey(b.token, { name: "b extra" })
      expect((yield* call("DELETE", `/dashboard/api-keys/${created.key.id}`, { token: b.token })).status).toBe(200)
      const checkout = yield* call("POST", "/dashboard/billing/checkout", {
        token: b.token,
        json: { amount_sen: 1000 }
      })
      expect(checkout.status).toBe(200)

      // A's dashboard is exactly as it was (the usage window is in the past, so "now" does not move it).
      const aAfter = yield* view(a.token)
      expect(aAfter).toEqual(aBefore)
      // And A's keys still work.
      expect(
        (yield* call("POST", "/v1/responses", { token: a.testKey.full_key, json: { input: "still mine" } })).status
      ).toBe(200)
    }))
})
