import { SqlClient, SqlSchema } from "@effect/sql"
import { Clock, Context, Duration, Effect, FiberSet, Layer, Schedule, Schema } from "effect"
import { Webhook } from "standardwebhooks"
import { AppConfig } from "../AppConfig.js"
import { newId } from "../Domain/Ids.js"
import { now } from "../Domain/Time.js"
import { emailAccount } from "../Outbox/Events.js"
import { backoffMs, RETRY_WINDOW_MS } from "../Outbox/Retries.js"
import { HostResolver } from "../Search/Fetch.js"
import { postEvent, type PostOutcome } from "./SignedPost.js"

/** Deliveries in flight to one endpoint, across instances (docs/api/alerts.md, "Fairness of webhook deliveries"). */
export const PER_ENDPOINT = 2
/**
 * Deliveries in flight to one account's endpoints (20 endpoints would be 40),
 * so a few accounts cannot fill an instance. Counted at each claim without a
 * lock on the account: instances claiming at the same moment may pass it by a few.
 */
export const PER_ACCOUNT = 10
/** Deliveries one instance has in flight at once. */
export const PER_INSTANCE = 128

const Claimed = Schema.Struct({
  id: Schema.String,
  attempts: Schema.Int,
  createdAt: Schema.DateFromSelf,
  endpointId: Schema.String,
  accountId: Schema.String,
  url: Schema.String,
  secret: Schema.String,
  eventId: Schema.String,
  /** The event's JSON as stored, as text: the client would rename its keys if it parsed it. */
  body: Schema.String
})
type Claimed = typeof Claimed.Type

/** Standard Webhooks headers for `body`, signed with `secret` at `at`. */
export const signedHeaders = (secret: string, eventId: string, at: Date, body: string): Record<string, string> => ({
  "webhook-id": eventId,
  "webhook-timestamp": String(Math.floor(at.getTime() / 1000)),
  "webhook-signature": new Webhook(secret).sign(eventId, at, body),
  "user-agent": "nenas-webhooks/1.0"
})

/**
 * Delivers the outbox (docs/api/alerts.md, "Fairness of webhook deliveries"): every instance
 * claims due deliveries with `FOR UPDATE SKIP LOCKED` and a lease longer than
 * the delivery deadline, so each attempt is made by one instance and a claim
 * whose process died lapses to another. Deliveries run concurrently, at most
 * `PER_ENDPOINT` in flight per endpoint and `PER_ACCOUNT` per account, so a
 * silent endpoint holds up only itself. Each attempt is logged; a failure is
 * retried with exponential back-off until 3 days after the event; an endpoint
 * failing for 3 days is disabled and its developer emailed.
 */
export class WebhookDelivery extends Context.Tag("nenas/WebhookDelivery")<WebhookDelivery, {
  /** Claims what is due now, as far as there is room, and starts delivering it; the number started (not awaited). */
  readonly runOnce: Effect.Effect<number>
}>() {
  static readonly layer = Layer.scoped(
    WebhookDelivery,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const config = yield* AppConfig
      const resolver = yield* HostResolver
      const timeout = Duration.millis(config.webhookTimeoutMs)
      const leaseMs = config.webhookTimeoutMs * 2 + 1_000

      const leaseEnd = (at: Date) => new Date(at.getTime() + leaseMs)

      const lockDueEndpoints = SqlSchema.findAll({
        Request: Schema.Struct({ at: Schema.DateFromSelf, room: Schema.Number }),
        Result: Schema.Struct({ id: Schema.String }),
        execute: ({ at, room }) =>
          sql`
            WITH due AS (
              SELECT d.endpoint_id, min(d.next_attempt_at) AS first_due FROM webhook_deliveries d
              WHERE d.status = 'pending' AND d.next_attempt_at <= ${at} AND (d.claimed_until IS NULL OR d.claimed_until < ${at})
              GROUP BY d.endpoint_id
            ), busy AS (
              SELECT d.endpoint_id, count(*) AS n FROM webhook_deliveries d
              WHERE d.status = 'pending' AND d.claimed_until >= ${at} GROUP BY d.endpoint_id
            ), account_busy AS (
              SELECT e.account_id, sum(b.n) AS n FROM busy b JOIN webhook_endpoints e ON e.id = b.endpoint_id GROUP BY e.account_id
            )
            SELECT e.id FROM webhook_endpoints e
            JOIN due ON due.endpoint_id = e.id
            LEFT JOIN busy ON busy.endpoint_id = e.id
            LEFT JOIN account_busy ab ON ab.account_id = e.account_id
            WHERE e.disabled_at IS NULL AND COALESCE(busy.n, 0) < ${PER_ENDPOINT} AND COALESCE(ab.n, 0) < ${PER_ACCOUNT}
            ORDER BY due.first_due LIMIT ${room}
            FOR UPDATE OF e SKIP LOCKED
          `
      })
      const claimDue = SqlSchema.findAll({
        Request: Schema.Struct({ ids: Schema.Array(Schema.String), at: Schema.DateFromSelf, room: Schema.Number }),
        Result: Claimed,
        execute: ({ at, ids, room }) =>
          sql`
            WITH busy AS (
              SELECT d.endpoint_id, count(*)::int AS n FROM webhook_deliveries d
              WHERE d.endpoint_id = ANY(${ids}::text[]) AND d.status = 'pending' AND d.claimed_until >= ${at}
              GROUP BY d.endpoint_id
            ), ranked AS (
              SELECT d.id, d.endpoint_id, e.account_id, d.next_attempt_at,
                     row_number() OVER (PARTITION BY d.endpoint_id ORDER BY d.next_attempt_at, d.id) AS place
              FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
              WHERE d.endpoint_id = ANY(${ids}::text[]) AND d.status = 'pending' AND d.next_attempt_at <= ${at}
                AND (d.claimed_until IS NULL OR d.claimed_until < ${at})
            ), per_endpoint AS (
              SELECT r.id, r.account_id, r.next_attempt_at,
                     row_number() OVER (PARTITION BY r.account_id ORDER BY r.next_attempt_at, r.id) AS place
              FROM ranked r LEFT JOIN busy b ON b.endpoint_id = r.endpoint_id
              WHERE r.place <= ${PER_ENDPOINT} - COALESCE(b.n, 0)
            ), account_busy AS (
              SELECT e.account_id, count(*)::int AS n FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
              WHERE e.account_id IN (SELECT account_id FROM per_endpoint) AND d.status = 'pending' AND d.claimed_until >= ${at}
              GROUP BY e.account_id
            ), chosen AS (
              SELECT p.id FROM per_endpoint p LEFT JOIN account_busy ab ON ab.account_id = p.account_id
              WHERE p.place <= ${PER_ACCOUNT} - COALESCE(ab.n, 0)
              ORDER BY p.next_attempt_at LIMIT ${room}
            ), locked AS (
              -- A delivery whose recording holds its row (its lease lapsed meanwhile) waits for the next claim.
              SELECT d.id FROM webhook_deliveries d WHERE d.id IN (SELECT id FROM chosen) FOR UPDATE OF d SKIP LOCKED
            )
            UPDATE webhook_deliveries d
            SET claimed_until = ${leaseEnd(at)}, attempts = d.attempts + 1
            FROM locked, webhook_endpoints e, outbox_events ev
            WHERE d.id = locked.id AND e.id = d.endpoint_id AND ev.id = d.event_id
            RETURNING d.id, d.attempts, d.created_at, e.id AS endpoint_id, e.account_id, e.url, e.secret,
                      ev.id AS event_id, ev.payload::text AS body
          `
      })
      /**
       * Up to `room` due deliveries, leaving each endpoint at most `PER_ENDPOINT`
       * in flight and each account at most `PER_ACCOUNT`. The endpoints are
       * locked first (`SKIP LOCKED`: another instance claiming for them is busy
       * with them, and skipped); the claim then counts what is in flight on a
       * fresh snapshot, which every earlier claim for them has committed to.
       */
      const claim = (at: Date, room: number) =>
        sql.withTransaction(Effect.gen(function*() {
          const endpoints = yield* lockDueEndpoints({ at, room })
          if (endpoints.length === 0) return []
          return yield* claimDue({ ids: endpoints.map((row) => row.id), at, room })
        }))

      const markFailing = SqlSchema.findAll({
        Request: Schema.Struct({
          endpointId: Schema.String,
          failingSince: Schema.DateFromSelf,
          windowStart: Schema.DateFromSelf
        }),
        Result: Schema.Struct({ id: Schema.String, url: Schema.String, disabled: Schema.Boolean }),
        execute: ({ endpointId, failingSince, windowStart }) =>
          sql`
            UPDATE webhook_endpoints
            SET failing_since = COALESCE(failing_since, ${failingSince}),
                disabled_at = CASE WHEN failing_since <= ${windowStart}::timestamptz THEN ${failingSince}::timestamptz ELSE NULL END,
                disabled_reason = CASE WHEN failing_since <= ${windowStart}::timestamptz THEN 'failing for 3 days' ELSE NULL END
            WHERE id = ${endpointId} AND disabled_at IS NULL
            RETURNING id, url, disabled_at IS NOT NULL AS disabled
          `
      })

      const record = (delivery: Claimed, at: Date, outcome: PostOutcome) =>
        sql.withTransaction(Effect.gen(function*() {
          const done = yield* Clock.currentTimeMillis
          yield* sql`
            INSERT INTO webhook_attempts
              (id, delivery_id, attempt, attempted_at, status_code, latency_ms, ok, error, response_excerpt, instance_id)
            VALUES (${
            newId("wha")
          }, ${delivery.id}, ${delivery.attempts}, ${at}, ${outcome.statusCode}, ${outcome.latencyMs},
                    ${outcome.ok}, ${outcome.error}, ${outcome.excerpt}, ${config.instanceId})
          `
          if (outcome.ok) {
            yield* sql`UPDATE webhook_deliveries SET status = 'delivered', delivered_at = ${new Date(
              done
            )}, claimed_until = NULL
                       WHERE id = ${delivery.id}`
            yield* sql`UPDATE webhook_endpoints SET failing_since = NULL WHERE id = ${delivery.endpointId}`
            return
          }
          const expired = done - delivery.createdAt.getTime() >= RETRY_WINDOW_MS
          yield* expired
            ? sql`UPDATE webhook_deliveries SET status = 'failed', claimed_until = NULL WHERE id = ${delivery.id}`
            : sql`UPDATE webhook_deliveries SET next_attempt_at = ${new Date(done + backoffMs(delivery.attempts))},
                    claimed_until = NULL WHERE id = ${delivery.id}`
          const failingSince = new Date(done)
          const windowStart = new Date(done - RETRY_WINDOW_MS)
          const [row] = yield* markFailing({ endpointId: delivery.endpointId, failingSince, windowStart })
          if (row?.disabled === true) {
            yield* emailAccount(delivery.accountId, {
              subject: "A webhook endpoint was disabled",
              body:
                `Deliveries to ${row.url} (${row.id}) have failed for 3 days, so it is disabled and no longer receives events.\n` +
                `Fix the receiver, then enable it again in the dashboard: ${config.dashboardUrl}/webhooks\n`
            }, failingSince)
          }
        })).pipe(Effect.provideService(SqlClient.SqlClient, sql))

      const deliver = (delivery: Claimed) =>
        Effect.gen(function*() {
          const at = yield* now
          const body = delivery.body
          const headers = signedHeaders(delivery.secret, delivery.eventId, at, body)
          const outcome = yield* postEvent(resolver, config.webhookAllowedHosts, timeout, delivery.url, headers, body)
          yield* record(delivery, at, outcome)
        }).pipe(
          Effect.catchAllCause((cause) => Effect.logWarning(`webhook delivery ${delivery.id} was not recorded`, cause))
        )

      // Deliveries on the wire; closing the service interrupts them and their leases lapse to another instance.
      const running = yield* FiberSet.make<void, never>()

      const runOnce = Effect.gen(function*() {
        const room = PER_INSTANCE - (yield* FiberSet.size(running))
        if (room <= 0) return 0
        const claimed = yield* claim(yield* now, room)
        for (const delivery of claimed) yield* FiberSet.run(running, deliver(delivery))
        return claimed.length
      }).pipe(Effect.catchAllCause((cause) => Effect.as(Effect.logWarning("webhook claim failed", cause), 0)))

      return { runOnce }
    })
  )

  /**
   * Delivers in the background for the life of the service: every
   * `outboxPollMs` it claims what is due while it has room, without waiting
   * for the deliveries already on the wire.
   */
  static readonly layerRunning = Layer.scopedDiscard(Effect.gen(function*() {
    const delivery = yield* WebhookDelivery
    const config = yield* AppConfig
    yield* Effect.forkScoped(Effect.repeat(delivery.runOnce, Schedule.spaced(Duration.millis(config.outboxPollMs))))
  })).pipe(Layer.provideMerge(WebhookDelivery.layer), Layer.provide(HostResolver.system))
}
