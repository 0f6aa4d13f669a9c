import { describe, expect, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { Webhook, WebhookVerificationError } from "standardwebhooks"
import { KeyExpiry } from "../../../src/Keys/Expiring.js"
import { call, createKey, devToken } from "../../support/Http.js"
import { simulatedTopUp } from "../../support/Stripe.js"
import { query, TestServer, TestServerLive } from "../../support/TestServer.js"
import { eventually, type Received, WebhookReceiver, WebhookReceiverLive } from "../../support/WebhookReceiver.js"

/**
 * Signed webhooks to the developer
 * (docs/api/alerts.md, "Never run dry: alerts, auto top-up and webhooks"):
 * endpoints through `/dashboard/webhooks`, the outbox written with the money
 * movement, delivery with back-off, the attempt log, the address guard,
 * Standard Webhooks signatures checked with the package's own verifier. The
 * receiver is a real HTTP server on 127.0.0.1, which the operator allows
 * (`WEBHOOK_ALLOWED_HOSTS`) on its port only; `localhost` on that port is
 * allowed for page fetching only (`FETCH_ALLOWED_HOSTS`).
 */

const TIMEOUT_MS = 700

/** An IPv4 address, or IPv6 (two colons in a row, or a loopback/mapped form). */
const AN_ADDRESS = /\b\d{1,3}(\.\d{1,3}){3}\b|::/

const Server = Layer.unwrapEffect(Effect.map(WebhookReceiver, (receiver) =>
  TestServerLive({
    webhookAllowedHosts: new Set([`127.0.0.1:${receiver.port}`]),
    fetchAllowedHosts: new Set([`localhost:${receiver.port}`]),
    webhookTimeoutMs: TIMEOUT_MS,
    outboxPollMs: 50
  })))
  .pipe(Layer.provideMerge(WebhookReceiverLive))

const arrivals = (path: string) => Effect.map(WebhookReceiver, (r) => r.received().filter((x) => x.path === path))

const createEndpoint = (token: string, json: Record<string, unknown>) =>
  Effect.map(call("POST", "/dashboard/webhooks", { token, json }), (reply) => {
    expect(reply.status, reply.text).toBe(201)
    return reply.body as { endpoint: { id: string; status: string; events: Array<string> }; secret: string }
  })

/** A top-up through the simulated checkout: the money movement that writes `topup.succeeded`. */

const deliveries = (token: string, endpointId: string) =>
  Effect.map(call("GET", `/dashboard/webhooks/${endpointId}/deliveries`, { token }), (reply) => {
    expect(reply.status, reply.text).toBe(200)
    return reply.body.deliveries as Array<{
      id: string
      event_id: string
      event_type: string
      status: string
      attempts: number
      attempt_log: Array<
        {
          attempt: number
          status_code: number | null
          ok: boolean
          error: string | null
          response_excerpt: string
          latency_ms: number
        }
      >
    }>
  })

/** Verifies with `standardwebhooks`' own verifier, as a receiver would. */
const verify = (secret: string, received: Received) =>
  new Webhook(secret).verify(received.body, received.headers as Record<string, string>) as {
    type: string
    timestamp: string
    account: { id: string; name: string | null }
    data: Record<string, unknown>
  }

layer(Server, { excludeTestServices: true, timeout: 120_000 })("webhooks to the developer", (it) => {
  describe("endpoints", () => {
    it.effect("create answers a whsec_ secret once; list, get, update, rotate and delete manage it", () =>
      Effect.gen(function*() {
        const receiver = yield* WebhookReceiver
        const token = yield* devToken("hooks-crud@example.com")
        const created = yield* createEndpoint(token, {
          url: receiver.url("/crud"),
          events: ["balance.low", "topup.succeeded"],
          description: "mine"
        })
        expect(created.secret).toMatch(/^whsec_[A-Za-z0-9+/]{32}$/)
        expect(created.endpoint).toMatchObject({ status: "enabled", events: ["balance.low", "topup.succeeded"] })
        const list = yield* call("GET", "/dashboard/webhooks", { token })
        expect(list.status).toBe(200)
        expect(list.body.endpoints.map((e: { id: string }) => e.id)).toEqual([created.endpoint.id])
        expect(list.text).not.toContain(created.secret)
        const updated = yield* call("PATCH", `/dashboard/webhooks/${created.endpoint.id}`, {
          token,
          json: { events: ["key.expiring"], disabled: true }
        })
        expect(updated.status, updated.text).toBe(200)
        expect(updated.body).toMatchObject({ events: ["key.expiring"], status: "disabled", description: "mine" })
        const rotated = yield* call("POST", `/dashboard/webhooks/${created.endpoint.id}/rotate-secret`, { token })
        expect(rotated.status, rotated.text).toBe(200)
        expect(rotated.body.secret).toMatch(/^whsec_/)
        expect(rotated.body.secret).not.toBe(created.secret)
        const other = yield* devToken("hooks-someone-else@example.com")
        expect((yield* call("GET", `/dashboard/webhooks/${created.endpoint.id}`, { token: other })).status).toBe(404)
        expect((yield* call("DELETE", `/dashboard/webhooks/${created.endpoint.id}`, { token: other })).status).toBe(404)
        expect((yield* call("DELETE", `/dashboard/webhooks/${created.endpoint.id}`, { token })).status).toBe(200)
        expect((yield* call("GET", `/dashboard/webhooks/${created.endpoint.id}`, { token })).body.error.code).toBe(
          "not_found"
        )
      }))

    it.effect("refuses loopback, private and metadata URLs and plain http unless the host is allowed", () =>
      Effect.gen(function*() {
        const receiver = yield* WebhookReceiver
        const token = yield* devToken("hooks-guard@example.com")
        const refused = [
          `http://127.0.0.1:${receiver.port + 1}/other-port`,
          "https://127.0.0.1/",
          "https://localhost:8443/hook",
          "https://[::1]/hook",
          "https://[::ffff:127.0.0.1]/hook",
          "https://10.1.2.3/hook",
          "https://169.254.169.254/latest/meta-data",
          "http://example.com/plain-http",
          "ftp://example.com/",
          "not a url"
        ]
        for (const url of refused) {
          const reply = yield* call("POST", "/dashboard/webhooks", { token, json: { url, events: ["balance.low"] } })
          expect(reply.status, `${url}: ${reply.text}`).toBe(400)
          expect(reply.body.error).toMatchObject({ code: "invalid_request", param: "url" })
          // Never what a host resolves to (an internal DNS oracle), nor any address: only that it is not allowed.
          expect(reply.text, url).not.toMatch(AN_ADDRESS)
        }
        // FETCH_ALLOWED_HOSTS is for page fetching only: a webhook to a host listed there alone is refused.
        const fetchOnly = yield* call("POST", "/dashboard/webhooks", {
          token,
          json: { url: `http://localhost:${receiver.port}/fetch-only`, events: ["balance.low"] }
        })
        expect(fetchOnly.status, fetchOnly.text).toBe(400)
        expect(fetchOnly.body.error).toMatchObject({ code: "invalid_request", param: "url" })
        const badEvents = yield* call("POST", "/dashboard/webhooks", {
          token,
          json: { url: receiver.url("/x"), events: ["balance.high"] }
        })
        expect(badEvents.status).toBe(400)
        const noEvents = yield* call("POST", "/dashboard/webhooks", {
          token,
          json: { url: receiver.url("/x"), events: [] }
        })
        expect(noEvents.status).toBe(400)
        // The allowed host:port is reachable over plain http, as a local receiver is.
        yield* createEndpoint(token, { url: receiver.url("/allowed"), events: ["balance.low"] })
        // Changing the URL goes through the same guard.
        const created = yield* createEndpoint(token, { url: receiver.url("/allowed2"), events: ["balance.low"] })
        const moved = yield* call("PATCH", `/dashboard/webhooks/${created.endpoint.id}`, {
          token,
          json: { url: "https://192.168.1.1/" }
        })
        expect(moved.status).toBe(400)
        expect(moved.body.error.param).toBe("url")
      }))
  })

  it.effect("a delivery the guard refuses logs no address: the attempt says only that the address is not allowed", () =>
    Effect.gen(function*() {
      const receiver = yield* WebhookReceiver
      const token = yield* devToken("hooks-oracle@example.com")
      const { endpoint } = yield* createEndpoint(token, { url: receiver.url("/oracle"), events: ["balance.low"] })
      // A name that resolved publicly at registration and points inside now (DNS changed since).
      yield* query("UPDATE webhook_endpoints SET url = $1 WHERE id = $2", [
        `https://localhost:${receiver.port}/oracle`,
        endpoint.id
      ])
      expect((yield* call("POST", `/dashboard/webhooks/${endpoint.id}/test`, { token })).status).toBe(202)
      const [delivery] = yield* eventually(
        "refused attempt",
        deliveries(token, endpoint.id),
        (d) => d[0]?.attempt_log.length === 1
      )
      const attempt = delivery!.attempt_log[0]!
      expect(attempt).toMatchObject({ ok: false, status_code: null })
      expect(attempt.error).toMatch(/not allowed/)
      expect(attempt.error).not.toMatch(AN_ADDRESS)
      expect((yield* arrivals("/oracle")).length).toBe(0)
    }))

  it.effect("OpenAPI lists every new endpoint and the webhook event payloads", () =>
    Effect.gen(function*() {
      const spec = (yield* call("GET", "/openapi.json")).body as {
        paths: Record<string, Record<string, unknown>>
        components: { schemas: Record<string, unknown> }
      }
      const expected: ReadonlyArray<readonly [string, string]> = [
        ["/dashboard/webhooks", "post"],
        ["/dashboard/webhooks", "get"],
        ["/dashboard/webhooks/event-types", "get"],
        ["/dashboard/webhooks/{id}", "get"],
        ["/dashboard/webhooks/{id}", "patch"],
        ["/dashboard/webhooks/{id}", "delete"],
        ["/dashboard/webhooks/{id}/rotate-secret", "post"],
        ["/dashboard/webhooks/{id}/test", "post"],
        ["/dashboard/webhooks/{id}/deliveries", "get"],
        ["/dashboard/webhooks/{id}/deliveries/{delivery_id}/resend", "post"],
        ["/dashboard/billing/settings", "get"],
        ["/dashboard/billing/settings", "put"],
        ["/dashboard/billing/card", "post"],
        ["/dashboard/billing/card", "delete"],
        ["/dashboard/alerts", "get"],
        ["/dev/mailbox", "get"],
        ["/dev/checkout/setup/{session_id}", "get"]
      ]
      for (const [path, method] of expected) expect(spec.paths[path]?.[method], `${method} ${path}`).toBeDefined()
      for (const schema of ["WebhookEventPayload", "WebhookEndpoint", "WebhookDelivery", "BillingSettings", "Banner"]) {
        expect(spec.components.schemas[schema], schema).toBeDefined()
      }
      expect(JSON.stringify(spec.components.schemas["WebhookEventPayload"])).toContain("balance.low")
    }))

  describe("key.expiring", () => {
    it.effect("a key expiring within 7 days is announced once, by webhook and email; one expiring later is not", () =>
      Effect.gen(function*() {
        const receiver = yield* WebhookReceiver
        const expiry = yield* KeyExpiry
        const token = yield* devToken("hooks-expiring@example.com")
        const { secret } = yield* createEndpoint(token, { url: receiver.url("/expiring"), events: ["key.expiring"] })
        const soon = yield* createKey(token, {
          name: "soon",
          expires_at: new Date(Date.now() + 6 * 86_400_000).toISOString()
        })
        yield* createKey(token, { name: "later", expires_at: new Date(Date.now() + 30 * 86_400_000).toISOString() })
        // The service runs it every 30 s as well: between them, the key is announced once.
        const first = yield* expiry.runOnce
        expect(first).toBeLessThanOrEqual(1)
        expect(yield* expiry.runOnce).toBe(0)
        const [got] = yield* eventually("key.expiring", arrivals("/expiring"), (r) => r.length === 1)
        expect(verify(secret, got!)).toMatchObject({ type: "key.expiring", data: { api_key_id: soon.key.id } })
        const mail = yield* query<{ subject: string }>(
          "SELECT m.subject FROM outbox_emails m JOIN accounts a ON a.id = m.account_id WHERE a.email = $1",
          ["hooks-expiring@example.com"]
        )
        expect(mail.map((m) => m.subject)).toEqual([expect.stringMatching(/^Your API key "soon" expires on /)])
      }))
  })

  describe("delivery", () => {
    it.effect("a test event is signed as Standard Webhooks; it verifies with the secret, and not after rotation", () =>
      Effect.gen(function*() {
        const receiver = yield* WebhookReceiver
        const token = yield* devToken("hooks-sign@example.com")
        const { endpoint, secret } = yield* createEndpoint(token, {
          url: receiver.url("/sign"),
          events: ["topup.succeeded"]
        })
        const sent = yield* call("POST", `/dashboard/webhooks/${endpoint.id}/test`, { token })
        expect(sent.status, sent.text).toBe(202)
        const [first] = yield* eventually("test event", arrivals("/sign"), (r) => r.length === 1)
        expect(first!.headers["webhook-id"]).toBe(sent.body.event_id)
        const payload = verify(secret, first!)
        expect(payload.type).toBe("webhook.test")
        expect(payload.data.endpoint_id).toBe(endpoint.id)
        // A body changed on the way, or another secret, does not verify.
        expect(() => verify(secret, { ...first!, body: first!.body.replace("test", "tost") })).toThrow(
          WebhookVerificationError
        )
        const rotated = (yield* call("POST", `/dashboard/webhooks/${endpoint.id}/rotate-secret`, { token })).body
          .secret as string
        yield* call("POST", `/dashboard/webhooks/${endpoint.id}/test`, { token })
        const [, second] = yield* eventually("second test event", arrivals("/sign"), (r) => r.length === 2)
        expect(verify(rotated, second!).type).toBe("webhook.test")
        expect(() => verify(secret, second!)).toThrow(WebhookVerificationError)
      }))

    it.effect("a top-up writes topup.succeeded; answered 500, 500, then 200 it is delivered once with three attempts logged", () =>
      Effect.gen(function*() {
        const receiver = yield* WebhookReceiver
        const { clock } = yield* TestServer
        const token = yield* devToken("hooks-retry@example.com")
        const { endpoint, secret } = yield* createEndpoint(token, {
          url: receiver.url("/retry"),
          events: ["topup.succeeded"]
        })
        receiver.script("/retry", ["500", "500", "200"])
        const { transactionId } = yield* simulatedTopUp(token)
        yield* eventually("first attempt", deliveries(token, endpoint.id), (d) => d[0]?.attempt_log.length === 1)
        // Back-off: the next attempt is not due for 5 s; move the server's clock past it, twice.
        clock.advance("6 seconds")
        yield* eventually("second attempt", deliveries(token, endpoint.id), (d) => d[0]?.attempt_log.length === 2)
        clock.advance("12 seconds")
        const [delivery] = yield* eventually(
          "delivered",
          deliveries(token, endpoint.id),
          (d) => d[0]?.status === "delivered"
        )
        expect(delivery!.event_type).toBe("topup.succeeded")
        expect(delivery!.attempt_log.map((a) => a.status_code)).toEqual([500, 500, 200])
        expect(delivery!.attempt_log.map((a) => a.ok)).toEqual([false, false, true])
        expect(delivery!.attempt_log[0]!.response_excerpt).toBe("receiver is down")
        expect(delivery!.attempt_log[2]!.response_excerpt).toBe("thanks")
        const got = yield* arrivals("/retry")
        expect(got.map((r) => r.headers["webhook-id"])).toEqual([
          delivery!.event_id,
          delivery!.event_id,
          delivery!.event_id
        ])
        const payload = verify(secret, got[2]!)
        expect(payload).toMatchObject({
          type: "topup.succeeded",
          data: { transaction_id: transactionId, amount_myr: 10, automatic: false }
        })
        // Every payload names its account (a person may belong to several accounts).
        expect(Object.keys(payload.account)).toEqual(["id", "name"])
        expect(payload.account.id).toMatch(/^acct_/)
        // Delivered once: nothing more arrives however far time moves.
        clock.advance("1 hour")
        yield* Effect.sleep("400 millis")
        expect((yield* arrivals("/retry")).length).toBe(3)
        // The event is in the outbox with the ledger's top-up.
        const rows = yield* query<{ n: string }>(
          "SELECT count(*) AS n FROM outbox_events e JOIN ledger_entries l ON l.account_id = e.account_id AND l.type = 'topup' WHERE e.id = $1",
          [delivery!.event_id]
        )
        expect(rows[0]?.n).toBe("1")
        // Resend delivers the same event (same webhook-id) again.
        const resent = yield* call("POST", `/dashboard/webhooks/${endpoint.id}/deliveries/${delivery!.id}/resend`, {
          token
        })
        expect(resent.status, resent.text).toBe(202)
        const again = yield* eventually("resent", arrivals("/retry"), (r) => r.length === 4)
        expect(again[3]!.headers["webhook-id"]).toBe(delivery!.event_id)
      }))

    it.effect("a receiver that hangs is cut at the deadline; a redirect is not followed; a huge answer is capped", () =>
      Effect.gen(function*() {
        const receiver = yield* WebhookReceiver
        const token = yield* devToken("hooks-hang@example.com")
        const cases = [["/hang", "hang"], ["/redirect", "redirect"], ["/huge", "huge"]] as const
        const ids: Record<string, string> = {}
        for (const [path, answer] of cases) {
          receiver.script(path, [answer])
          const { endpoint } = yield* createEndpoint(token, { url: receiver.url(path), events: ["topup.succeeded"] })
          ids[path] = endpoint.id
        }
        yield* simulatedTopUp(token)
        const hang = (yield* eventually("hang cut", deliveries(token, ids["/hang"]!), (d) =>
          d[0]?.attempt_log.length === 1))[0]!
        expect(hang.attempt_log[0]).toMatchObject({ ok: false, status_code: null })
        expect(hang.attempt_log[0]!.error).toContain("no answer within")
        expect(hang.attempt_log[0]!.latency_ms).toBeGreaterThanOrEqual(TIMEOUT_MS - 50)
        expect(hang.status).toBe("pending")
        const redirect = (yield* eventually("redirect", deliveries(token, ids["/redirect"]!), (d) =>
          d[0]?.attempt_log.length === 1))[0]!
        expect(redirect.attempt_log[0]).toMatchObject({
          ok: false,
          status_code: 302,
          error: "redirects are not followed"
        })
        expect((yield* arrivals("/elsewhere")).length).toBe(0)
        const huge = (yield* eventually("huge", deliveries(token, ids["/huge"]!), (d) =>
          d[0]?.status === "delivered"))[0]!
        expect(huge.attempt_log[0]!.response_excerpt.length).toBe(500)
      }))

    it.effect("an endpoint failing for 3 days is disabled, its delivery given up, and the developer emailed", () =>
      Effect.gen(function*() {
        const receiver = yield* WebhookReceiver
        const { clock } = yield* TestServer
        let token = yield* devToken("hooks-dead@example.com")
        const { endpoint } = yield* createEndpoint(token, { url: receiver.url("/dead"), events: ["topup.succeeded"] })
        receiver.script("/dead", Array.from({ length: 50 }, () => "500" as const))
        yield* simulatedTopUp(token)
        yield* eventually("first failure", deliveries(token, endpoint.id), (d) => d[0]?.attempt_log.length === 1)
        const failing = yield* call("GET", `/dashboard/webhooks/${endpoint.id}`, { token })
        expect(failing.body.status).toBe("enabled")
        expect(failing.body.failing_since).not.toBeNull()
        clock.advance("73 hours")
        // Session tokens have expired meanwhile: sign in again.
        token = yield* devToken("hooks-dead@example.com")
        const [delivery] = yield* eventually(
          "given up",
          deliveries(token, endpoint.id),
          (d) => d[0]?.status === "failed"
        )
        expect(delivery!.attempt_log.length).toBe(2)
        const disabled = yield* call("GET", `/dashboard/webhooks/${endpoint.id}`, { token })
        expect(disabled.body).toMatchObject({ status: "disabled", disabled_reason: "failing for 3 days" })
        const mail = yield* query<{ subject: string; body: string }>(
          "SELECT m.subject, m.body FROM outbox_emails m JOIN accounts a ON a.id = m.account_id WHERE a.email = $1",
          ["hooks-dead@example.com"]
        )
        expect(mail.map((m) => m.subject)).toEqual(["A webhook endpoint was disabled"])
        expect(mail[0]!.body).toContain(endpoint.id)
        // A disabled endpoint gets nothing more; enabled again, it receives new events.
        const before = (yield* arrivals("/dead")).length
        yield* simulatedTopUp(token)
        yield* Effect.sleep("400 millis")
        expect((yield* arrivals("/dead")).length).toBe(before)
        const enabled = yield* call("PATCH", `/dashboard/webhooks/${endpoint.id}`, { token, json: { disabled: false } })
        expect(enabled.body).toMatchObject({ status: "enabled", failing_since: null })
      }))
  })
})
