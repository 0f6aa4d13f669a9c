import { SqlClient } from "@effect/sql"
import { Clock, Context, Duration, Effect, Layer, Schedule } from "effect"
import { Webhook } from "standardwebhooks"
import { AppConfig } from "../AppConfig.js"
import { newId } from "../Domain/Ids.js"
import { HostResolver } from "../Search/Fetch.js"
import { emailAccount } from "./Events.js"
import { type PostOutcome, postEvent } from "./Post.js"

/** A delivery is retried this long after its event; an endpoint failing this long is disabled. */
export const RETRY_WINDOW_MS = 3 * 24 * 60 * 60 * 1000
const FIRST_RETRY_MS = 5_000
const LONGEST_WAIT_MS = 6 * 60 * 60 * 1000
/** Deliveries one instance claims at a time. */
const CLAIM_BATCH = 10

/** The wait after failed attempt `attempt` (1-based): 5 s doubling to 6 h, plus up to a tenth more so retries spread. */
export const backoffMs = (attempt: number, jitter: number = Math.random()): number => {
  const base = Math.min(FIRST_RETRY_MS * 2 ** Math.min(attempt - 1, 30), LONGEST_WAIT_MS)
  return Math.round(base * (1 + 0.1 * jitter))
}

interface Claimed {
  readonly id: string
  readonly attempts: number
  readonly createdAt: Date
  readonly endpointId: string
  readonly accountId: string
  readonly url: string
  readonly secret: string
  readonly eventId: string
  /** The event's JSON as stored, as text: the client would rename its keys if it parsed it. */
  readonly body: string
}

/** Standard Webhooks headers for `body`, signed with `secret` at `at`. */
export const signedHeaders = (secret: string, eventId: string, at: Date, body: string): Record<string, string> => ({
  "webhook-id": eventId,
  "webhook-timestamp": String(Math.floor(at.getTime() / 1000)),
  "webhook-signature": new Webhook(secret).sign(eventId, at, body),
  "user-agent": "nenas-webhooks/1.0"
})

/**
 * Delivers the outbox (DESIGN.md, webhooks to the developer): every instance
 * claims due deliveries with `FOR UPDATE SKIP LOCKED` and a lease longer than
 * the delivery deadline, so each attempt is made by one instance and a claim
 * whose process died lapses to another. Each attempt is logged; a failure is
 * retried with exponential back-off until 3 days after the event; an endpoint
 * failing for 3 days is disabled and its developer emailed.
 */
export class WebhookDelivery extends Context.Tag("nenas/WebhookDelivery")<WebhookDelivery, {
  /** Claims and delivers what is due now; the number of attempts made. */
  readonly runOnce: Effect.Effect<number>
}>() {
  static readonly layer = Layer.effect(
    WebhookDelivery,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const config = yield* AppConfig
      const resolver = yield* HostResolver
      const timeout = Duration.millis(config.webhookTimeoutMs)
      const leaseMs = config.webhookTimeoutMs * 2 + 1_000

      const claim = (now: Date) =>
        sql<Claimed>`
          UPDATE webhook_deliveries d
          SET claimed_until = ${new Date(now.getTime() + leaseMs)}, attempts = d.attempts + 1
          FROM webhook_endpoints e, outbox_events ev
          WHERE d.id IN (
            SELECT dd.id FROM webhook_deliveries dd JOIN webhook_endpoints ee ON ee.id = dd.endpoint_id
            WHERE dd.status = 'pending' AND dd.next_attempt_at <= ${now} AND ee.disabled_at IS NULL
              AND (dd.claimed_until IS NULL OR dd.claimed_until < ${now})
            ORDER BY dd.next_attempt_at LIMIT ${CLAIM_BATCH}
            FOR UPDATE OF dd SKIP LOCKED
          ) AND e.id = d.endpoint_id AND ev.id = d.event_id
          RETURNING d.id, d.attempts, d.created_at, e.id AS endpoint_id, e.account_id, e.url, e.secret,
                    ev.id AS event_id, ev.payload::text AS body
        `

      const record = (delivery: Claimed, at: Date, outcome: PostOutcome) =>
        sql.withTransaction(Effect.gen(function*() {
          const done = yield* Clock.currentTimeMillis
          yield* sql`
            INSERT INTO webhook_attempts
              (id, delivery_id, attempt, attempted_at, status_code, latency_ms, ok, error, response_excerpt, instance_id)
            VALUES (${newId("wha")}, ${delivery.id}, ${delivery.attempts}, ${at}, ${outcome.statusCode}, ${outcome.latencyMs},
                    ${outcome.ok}, ${outcome.error}, ${outcome.excerpt}, ${config.instanceId})
          `
          if (outcome.ok) {
            yield* sql`UPDATE webhook_deliveries SET status = 'delivered', delivered_at = ${new Date(done)}, claimed_until = NULL
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
          const disabled = yield* sql<{ id: string; url: string }>`
            UPDATE webhook_endpoints
            SET failing_since = COALESCE(failing_since, ${failingSince}),
                disabled_at = CASE WHEN failing_since <= ${windowStart}::timestamptz THEN ${failingSince}::timestamptz ELSE NULL END,
                disabled_reason = CASE WHEN failing_since <= ${windowStart}::timestamptz THEN 'failing for 3 days' ELSE NULL END
            WHERE id = ${delivery.endpointId} AND disabled_at IS NULL
            RETURNING id, url, disabled_at IS NOT NULL AS disabled
          `
          const row = disabled[0] as { id: string; url: string; disabled?: boolean } | undefined
          if (row?.disabled === true) {
            yield* emailAccount(delivery.accountId, {
              subject: "A webhook endpoint was disabled",
              body: `Deliveries to ${row.url} (${row.id}) have failed for 3 days, so it is disabled and no longer receives events.\n` +
                `Fix the receiver, then enable it again in the dashboard: ${config.dashboardUrl}/webhooks\n`
            }, failingSince)
          }
        })).pipe(Effect.provideService(SqlClient.SqlClient, sql))

      const deliver = (delivery: Claimed) =>
        Effect.gen(function*() {
          const at = new Date(yield* Clock.currentTimeMillis)
          const body = delivery.body
          const headers = signedHeaders(delivery.secret, delivery.eventId, at, body)
          const outcome = yield* postEvent(resolver, config.webhookAllowedHosts, timeout, delivery.url, headers, body)
          yield* record(delivery, at, outcome)
        }).pipe(
          Effect.catchAllCause((cause) => Effect.logWarning(`webhook delivery ${delivery.id} was not recorded`, cause))
        )

      const runOnce = Effect.gen(function*() {
        const now = new Date(yield* Clock.currentTimeMillis)
        const claimed = yield* claim(now)
        yield* Effect.forEach(claimed, deliver, { concurrency: CLAIM_BATCH, discard: true })
        return claimed.length
      }).pipe(Effect.catchAllCause((cause) => Effect.as(Effect.logWarning("webhook claim failed", cause), 0)))

      return { runOnce }
    })
  )

  /** Delivers in the background for the life of the service, every `outboxPollMs`. */
  static readonly layerRunning = Layer.scopedDiscard(Effect.gen(function*() {
    const delivery = yield* WebhookDelivery
    const config = yield* AppConfig
    yield* Effect.forkScoped(Effect.repeat(delivery.runOnce, Schedule.spaced(Duration.millis(config.outboxPollMs))))
  })).pipe(Layer.provideMerge(WebhookDelivery.layer), Layer.provide(HostResolver.system))
}
