import { expect, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { call, devToken } from "../../support/Http.js"
import { query, TestServer, TestServerLive } from "../../support/TestServer.js"
import {
  eventually,
  TwoInstancesWithReceiver,
  WebhookReceiver,
  WebhookReceiverLive
} from "../../support/WebhookReceiver.js"

/**
 * Fairness of webhook delivery
 * (docs/api/alerts.md, "Fairness of webhook deliveries"): a silent endpoint (a
 * receiver that never answers, cut at `WEBHOOK_TIMEOUT_MS`) never holds up
 * another account's deliveries; at most 2 deliveries are in flight per
 * endpoint; test events and resends are limited per account; an endpoint
 * failing every attempt for 3 days is disabled and its developer told.
 */

const TIMEOUT_MS = 3_000

const Server = Layer.unwrapEffect(
  Effect.map(WebhookReceiver, (receiver) =>
    TestServerLive({
      webhookAllowedHosts: new Set([`127.0.0.1:${receiver.port}`]),
      webhookTimeoutMs: TIMEOUT_MS,
      outboxPollMs: 50
    }))
)
  .pipe(Layer.provideMerge(WebhookReceiverLive))

const createEndpoint = (token: string, url: string) =>
  Effect.map(call("POST", "/dashboard/webhooks", { token, json: { url, events: ["topup.succeeded"] } }), (reply) => {
    expect(reply.status, reply.text).toBe(201)
    return reply.body.endpoint as { id: string }
  })

const arrivals = (path: string) => Effect.map(WebhookReceiver, (r) => r.received().filter((x) => x.path === path))

/** `count` events queued at once for `endpointId`, as a burst of account activity would queue them. */
const queueEvents = (endpointId: string, count: number, tag: string) =>
  query(
    `WITH ev AS (
       INSERT INTO outbox_events (id, account_id, type, payload, created_at)
       SELECT 'msg_${tag}_' || g, e.account_id, 'webhook.test',
              jsonb_build_object('type', 'webhook.test', 'timestamp', now(), 'data', jsonb_build_object('n', g)), now()
       FROM webhook_endpoints e, generate_series(1, $2::int) g WHERE e.id = $1
       RETURNING id
     )
     INSERT INTO webhook_deliveries (id, event_id, endpoint_id, status, next_attempt_at, created_at)
     SELECT 'whd_' || substr(ev.id, 5), ev.id, $1, 'pending', now() - interval '1 second', now() FROM ev`,
    [endpointId, count]
  )

layer(Server, { excludeTestServices: true, timeout: 120_000 })("webhook fairness", (it) => {
  it.effect("30 events to a silent endpoint of account A do not delay account B's delivery; at most 2 are in flight to it", () =>
    Effect.gen(function*() {
      const receiver = yield* WebhookReceiver
      const a = yield* devToken("fair-a@example.com")
      const b = yield* devToken("fair-b@example.com")
      receiver.script("/silent", Array.from({ length: 200 }, () => "hang" as const))
      const silent = yield* createEndpoint(a, receiver.url("/silent"))
      const prompt = yield* createEndpoint(b, receiver.url("/prompt"))
      yield* queueEvents(silent.id, 30, "silent")
      // A's deliveries are on the wire, hanging.
      yield* eventually("A's first attempts", arrivals("/silent"), (r) => r.length >= 1)
      yield* Effect.sleep("200 millis")
      const sent = Date.now()
      expect((yield* call("POST", `/dashboard/webhooks/${prompt.id}/test`, { token: b })).status).toBe(202)
      const [got] = yield* eventually("B's delivery", arrivals("/prompt"), (r) => r.length === 1, 20_000)
      // Claimed at the next look at the outbox, not after A's silent deliveries time out.
      expect(got!.at - sent).toBeLessThan(1_500)
      // A's endpoint keeps being tried, 2 at a time, never more.
      yield* Effect.sleep(`${TIMEOUT_MS + 1_500} millis`)
      expect((yield* arrivals("/silent")).length).toBeGreaterThanOrEqual(4)
      expect(receiver.mostAtOnce("/silent")).toBe(2)
      const claimed = yield* query<{ n: number }>(
        "SELECT count(*)::int AS n FROM webhook_deliveries WHERE endpoint_id = $1 AND attempts > 0",
        [silent.id]
      )
      expect(claimed[0]!.n).toBeLessThanOrEqual((yield* arrivals("/silent")).length)
    }))

  it.effect("the 11th test event or resend of an account in a minute answers 429 with Retry-After; another account is not held", () =>
    Effect.gen(function*() {
      const receiver = yield* WebhookReceiver
      const { clock } = yield* TestServer
      const token = yield* devToken("fair-limit@example.com")
      const endpoint = yield* createEndpoint(token, receiver.url("/limited"))
      for (let n = 1; n <= 10; n++) {
        const sent = yield* call("POST", `/dashboard/webhooks/${endpoint.id}/test`, { token })
        expect(sent.status, `test event ${n}: ${sent.text}`).toBe(202)
      }
      const eleventh = yield* call("POST", `/dashboard/webhooks/${endpoint.id}/test`, { token })
      expect(eleventh.status, eleventh.text).toBe(429)
      expect(eleventh.body.error.code).toBe("rate_limit_exceeded")
      const wait = eleventh.body.error.retry_after_seconds as number
      expect(wait).toBeGreaterThanOrEqual(1)
      expect(wait).toBeLessThanOrEqual(60)
      expect(eleventh.headers.get("retry-after")).toBe(String(wait))
      // Nothing was queued for the refused one.
      const queued = yield* query<{ n: number }>(
        "SELECT count(*)::int AS n FROM webhook_deliveries WHERE endpoint_id = $1",
        [endpoint.id]
      )
      expect(queued[0]!.n).toBe(10)
      // Resends draw on the same allowance.
      const [delivery] = yield* eventually(
        "delivered",
        Effect.map(
          call("GET", `/dashboard/webhooks/${endpoint.id}/deliveries`, { token }),
          (r) => r.body.deliveries as Array<{ id: string; status: string }>
        ),
        (d) => d.length === 10 && d.every((x) => x.status === "delivered")
      )
      const resent = yield* call("POST", `/dashboard/webhooks/${endpoint.id}/deliveries/${delivery!.id}/resend`, {
        token
      })
      expect(resent.status, resent.text).toBe(429)
      expect(resent.headers.get("retry-after")).not.toBeNull()
      // Another account has its own allowance.
      const other = yield* devToken("fair-limit-other@example.com")
      const otherEndpoint = yield* createEndpoint(other, receiver.url("/limited-other"))
      expect((yield* call("POST", `/dashboard/webhooks/${otherEndpoint.id}/test`, { token: other })).status).toBe(202)
      // A minute later the account may send again.
      clock.advance("61 seconds")
      const fresh = yield* devToken("fair-limit@example.com")
      expect(
        (yield* call("POST", `/dashboard/webhooks/${endpoint.id}/deliveries/${delivery!.id}/resend`, { token: fresh }))
          .status
      ).toBe(202)
    }))

  it.effect("an endpoint that failed every attempt for 3 days is disabled; the developer gets a banner and an email", () =>
    Effect.gen(function*() {
      const receiver = yield* WebhookReceiver
      const token = yield* devToken("fair-dead@example.com")
      const endpoint = yield* createEndpoint(token, receiver.url("/dead"))
      receiver.script("/dead", Array.from({ length: 20 }, () => "500" as const))
      // Failing since 3 days and a minute ago, by the service's clock.
      const { clock } = yield* TestServer
      const since = new Date(clock.unsafeCurrentTimeMillis() - (72 * 60 + 1) * 60_000)
      yield* query("UPDATE webhook_endpoints SET failing_since = $1 WHERE id = $2", [since, endpoint.id])
      yield* queueEvents(endpoint.id, 1, "dead")
      yield* eventually(
        "disabled",
        Effect.map(call("GET", `/dashboard/webhooks/${endpoint.id}`, { token }), (r) => r.body),
        (body) => body.status === "disabled"
      )
      const endpointNow = (yield* call("GET", `/dashboard/webhooks/${endpoint.id}`, { token })).body
      expect(endpointNow).toMatchObject({ status: "disabled", disabled_reason: "failing for 3 days" })
      const banners = (yield* call("GET", "/dashboard/alerts", { token })).body.banners as Array<
        { kind: string; message: string }
      >
      expect(banners).toEqual([
        expect.objectContaining({ kind: "webhook_endpoint_disabled", message: expect.stringContaining("/dead") })
      ])
      const mail = yield* query<{ subject: string; body: string }>(
        "SELECT m.subject, m.body FROM outbox_emails m JOIN accounts a ON a.id = m.account_id WHERE a.email = $1",
        ["fair-dead@example.com"]
      )
      expect(mail.map((m) => m.subject)).toEqual(["A webhook endpoint was disabled"])
      expect(mail[0]!.body).toContain(endpoint.id)
    }))
})

layer(TwoInstancesWithReceiver("fairness"), { excludeTestServices: true, timeout: 120_000 })(
  "webhook fairness across instances",
  (it) => {
    it.effect("two instances together keep 2 deliveries in flight to a silent endpoint, each claimed once", () =>
      Effect.gen(function*() {
        const receiver = yield* WebhookReceiver
        const token = yield* devToken("fair-two@example.com")
        receiver.script("/silent-two", Array.from({ length: 200 }, () => "hang" as const))
        const endpoint = yield* createEndpoint(token, receiver.url("/silent-two"))
        yield* queueEvents(endpoint.id, 12, "two")
        // The default deadline (10 s): both instances look every 50 ms meanwhile.
        yield* eventually("2 on the wire", arrivals("/silent-two"), (r) => r.length >= 2)
        yield* Effect.sleep("1500 millis")
        expect(receiver.mostAtOnce("/silent-two")).toBe(2)
        const got = yield* arrivals("/silent-two")
        expect(got.length).toBe(2)
        expect(new Set(got.map((r) => r.headers["webhook-id"])).size).toBe(2)
      }))
  }
)
