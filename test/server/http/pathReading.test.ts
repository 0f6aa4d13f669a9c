import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { isErrorBody } from "../../support/ErrorBody.js"
import { call, devToken } from "../../support/Http.js"
import { caller, TestServerWithUpstream } from "../../support/Models.js"
import { rawCall, type RawReply } from "../../support/RawHttp.js"
import { TestServer } from "../../support/TestServer.js"

/**
 * One path, one reading (docs/security.md, "Security"): a request target the router would read differently from the checks
 * in front of it (letter case, duplicate slashes, percent-escaped letters, an absolute-form target, HEAD) is either
 * answered 404 in the error shape or read by every check as the router reads it; never a different set of checks.
 */

const PROXIED = { "x-forwarded-for": "203.0.113.9", "content-type": "application/json" }
/** The per-address limit of failed authentications, low enough to reach in a test. */
const AUTH_FAILURES = 3

/** An answer in the error shape whose `X-Request-Id` is the body's `request_id`, never a 5xx. */
const expectErrorShape = (reply: RawReply, name: string) => {
  expect(reply.status, `${name}: status (${reply.text.slice(0, 300)})`).toBeLessThan(500)
  expect(reply.status, `${name}: status`).toBeGreaterThanOrEqual(400)
  expect(isErrorBody(reply.body), `${name}: error shape (${reply.text.slice(0, 300)})`).toBe(true)
  expect(reply.headers["x-request-id"], `${name}: X-Request-Id`).toBe(reply.body.error.request_id)
}

/** JSON nested `depth` levels deep, built without recursion. */
const deepJson = (depth: number) => `${"[".repeat(depth)}${"]".repeat(depth)}`

layer(TestServerWithUpstream({ ipAuthFailuresPerMinute: AUTH_FAILURES }), { excludeTestServices: true })(
  "one reading of a path",
  (it) => {
    it.effect("no spelling of a development route signs anyone in through a proxy", () =>
      Effect.gen(function*() {
        const { baseUrl } = yield* TestServer
        const session = JSON.stringify({ email: "path-reading-victim@example.com" })
        const targets = [
          "/dev/session",
          "/DEV/session",
          "/Dev/Session",
          "/dev/SESSION",
          "//dev/session",
          "/dev//session",
          "/dev/%73ession",
          "/%64ev/session",
          "/dev/./session",
          "/dev/session;x",
          "/dev/session/",
          `${baseUrl}/dev/session`,
          `${baseUrl.toUpperCase()}/DEV/session`
        ]
        for (const target of targets) {
          const reply = yield* rawCall("POST", target, { headers: PROXIED, body: session })
          expect(reply.body?.token, `${target}: no session token`).toBeUndefined()
          expectErrorShape(reply, target)
          expect(reply.status, target).toBe(404)
          expect(reply.body.error.code, target).toBe("not_found")
        }
        // Nor is anyone's mail read, nor a checkout paid, through another spelling.
        for (
          const [method, target] of [["GET", "/DEV/mailbox/messages"], ["GET", "//dev/mailbox/messages"], [
            "POST",
            "/DEV/checkout/cs_x/pay"
          ]] as const
        ) {
          const reply = yield* rawCall(method, target, { headers: PROXIED })
          expectErrorShape(reply, target)
          expect(reply.status, target).toBe(404)
        }
      }))

    it.effect("a bad key on another spelling of /v1 never escapes the failed-authentication limit", () =>
      Effect.gen(function*() {
        const bad = {
          authorization: "Bearer nns_live_wrongwrongwrongwrongwrongwrongwrong",
          "content-type": "application/json"
        }
        const body = JSON.stringify({ model: "svc/nenas-flash", messages: [{ role: "user", content: "hi" }] })
        for (
          const target of ["/V1/chat/completions", "/v1//chat/completions", "/v1/chat/%63ompletions", "/V1/models"]
        ) {
          for (let i = 0; i < AUTH_FAILURES + 1; i++) {
            const reply = yield* rawCall(
              target.endsWith("models") ? "GET" : "POST",
              target,
              target.endsWith("models") ? { headers: bad } : { headers: bad, body }
            )
            expectErrorShape(reply, `${target} #${i + 1}`)
            // Not found, or counted: an answer that is neither would be a key guessed past the limit.
            expect(["not_found", "rate_limit_exceeded"], `${target} #${i + 1}: ${reply.body.error.code}`).toContain(
              reply.body.error.code
            )
          }
        }
      }))

    it.effect("deep JSON to another spelling of /v1 is a 4xx, with no-store wherever /v1/responses has it", () =>
      Effect.gen(function*() {
        const { apiKey } = yield* caller("path-reading-deep@example.com", { environment: "test" })
        const headers = { authorization: `Bearer ${apiKey}`, "content-type": "application/json" }
        for (const target of ["/V1/chat/completions", "/V1/responses", "/v1//responses", "/V1/messages"]) {
          const reply = yield* rawCall("POST", target, { headers, body: deepJson(100_000) })
          expectErrorShape(reply, target)
          expect(reply.headers["cache-control"], `${target}: never cached`).toBe("no-store")
        }
        const canonical = yield* rawCall("POST", "/v1/responses", { headers, body: deepJson(100_000) })
        expectErrorShape(canonical, "/v1/responses")
        expect(canonical.body.error.code).toBe("invalid_request")
        expect(canonical.headers["cache-control"]).toBe("no-store")
      }))

    it.effect("HEAD and percent-escaped dashboard paths are answered through the same checks, never a 500", () =>
      Effect.gen(function*() {
        const token = yield* devToken("path-reading-head@example.com")
        for (const auth of [{}, { authorization: `Bearer ${token}` }]) {
          const name = "authorization" in auth ? "signed in" : "signed out"
          const get = yield* rawCall("GET", "/dashboard/members", { headers: auth })
          const head = yield* rawCall("HEAD", "/dashboard/members", { headers: auth })
          expect(head.status, `HEAD ${name} (GET: ${get.status})`).toBe(get.status)
          expect(head.text, `HEAD ${name}: no body`).toBe("")
          expect(head.headers["x-request-id"], `HEAD ${name}: X-Request-Id`).toMatch(/^req_/)
          expect(head.headers["cache-control"], `HEAD ${name}: no-store`).toBe("no-store")
          for (
            const target of [
              "/dashboard/%6dembers",
              "/Dashboard/members",
              "/dashboard/MEMBERS",
              "/dashboard//members",
              "/dashboard/members%2f"
            ]
          ) {
            const reply = yield* rawCall("GET", target, { headers: auth })
            expectErrorShape(reply, `${target} ${name}`)
            expect(reply.status, `${target} ${name}`).toBe(404)
            expect(reply.headers["cache-control"], `${target} ${name}: no-store`).toBe("no-store")
          }
        }
        const headUnknown = yield* rawCall("HEAD", "/no-such-route")
        expect(headUnknown.status).toBe(404)
        expect(headUnknown.headers["x-request-id"]).toMatch(/^req_/)
      }))

    it.effect("a CORS preflight on /v1 carries an X-Request-Id like every other answer", () =>
      Effect.gen(function*() {
        for (const path of ["/v1/chat/completions", "/v1/responses", "/dashboard/api-keys"]) {
          const { baseUrl } = yield* TestServer
          const reply = yield* call("OPTIONS", path, {
            headers: {
              origin: path.startsWith("/v1") ? "https://elsewhere.example" : baseUrl,
              "access-control-request-method": "POST"
            }
          })
          expect(reply.status, path).toBe(204)
          expect(reply.headers.get("x-request-id"), path).toMatch(/^req_/)
        }
      }))
  }
)
