import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { expectClientError } from "../../support/ErrorBody.js"
import { call, devToken, type Reply } from "../../support/Http.js"
import { TestServerLive } from "../../support/TestServer.js"

/**
 * Per-address limits on failed dashboard authentication (counted
 * with failed API keys) and on development sign-ins. Every request here
 * comes from 127.0.0.1, so each limit is reached by one test.
 */

const AUTH_FAILURES = 5
const DEV_SESSIONS = 3

const expectRateLimited = (reply: Reply, name: string) => {
  expectClientError(reply, { status: 429, code: "rate_limit_exceeded" }, name)
  expect(reply.body.error.retry_after_seconds, name).toBeGreaterThanOrEqual(1)
  expect(reply.body.error.retry_after_seconds, name).toBeLessThanOrEqual(60)
  expect(reply.headers.get("retry-after"), name).toBe(String(reply.body.error.retry_after_seconds))
}

layer(TestServerLive({ ipAuthFailuresPerMinute: AUTH_FAILURES }), { excludeTestServices: true, timeout: 60_000 })(
  "failed dashboard authentication",
  (it) => {
    it.effect(`${AUTH_FAILURES} bad session tokens answer 401, the next 429; the count is shared with API keys`, () =>
      Effect.gen(function*() {
        const valid = yield* devToken("dashboard-limits@example.com")
        const statuses: Array<number> = []
        for (let attempt = 0; attempt <= AUTH_FAILURES; attempt++) {
          const reply = yield* call("GET", "/dashboard/api-keys", { token: `not.a.token${attempt}` })
          statuses.push(reply.status)
          if (reply.status === 401) {
            expectClientError(reply, { status: 401, code: "authentication_error" }, `attempt ${attempt}`)
          } else expectRateLimited(reply, `attempt ${attempt}`)
        }
        expect(statuses).toEqual([...Array.from({ length: AUTH_FAILURES }, () => 401), 429])
        // No token at all is a failed authentication too.
        expectRateLimited(yield* call("GET", "/dashboard/billing/balance"), "no token")
        // The address is past the limit for API keys as well: refused before its key is looked up.
        expectRateLimited(yield* call("GET", "/v1/models", { token: "nns_live_guess" }), "API key")
        // A valid session token still signs in: the limit is on those not known.
        expect((yield* call("GET", "/dashboard/api-keys", { token: valid })).status).toBe(200)
      }))

    it.effect("OpenAPI shows the 429 on dashboard routes and on /dev/session", () =>
      Effect.gen(function*() {
        const document = (yield* call("GET", "/openapi.json")).body
        expect(Object.keys(document.paths["/dashboard/api-keys"].get.responses)).toContain("429")
        expect(Object.keys(document.paths["/dev/session"].post.responses)).toContain("429")
      }))
  }
)

layer(TestServerLive({ ipDevSessionsPerMinute: DEV_SESSIONS }), { excludeTestServices: true, timeout: 60_000 })(
  "development sign-ins",
  (it) => {
    it.effect(`${DEV_SESSIONS} sessions a minute from one address, then 429`, () =>
      Effect.gen(function*() {
        const statuses: Array<number> = []
        for (let attempt = 0; attempt <= DEV_SESSIONS; attempt++) {
          const reply = yield* call("POST", "/dev/session", { json: { email: `dev-limit-${attempt}@example.com` } })
          statuses.push(reply.status)
          if (reply.status === 429) expectRateLimited(reply, `session ${attempt}`)
          else expect(typeof reply.body.token).toBe("string")
        }
        expect(statuses).toEqual([...Array.from({ length: DEV_SESSIONS }, () => 200), 429])
        // A request the body check refuses creates nothing, and answers as before.
        expectClientError(yield* call("POST", "/dev/session", { json: { email: "nope" } }), {
          status: 400,
          code: "invalid_request"
        })
      }))
  }
)
