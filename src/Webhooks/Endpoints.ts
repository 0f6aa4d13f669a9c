import { randomBytes } from "node:crypto"
import { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Clock, Context, Effect, Layer } from "effect"
import { newId } from "../Domain/Ids.js"
import { emit, TEST_EVENT } from "../Outbox/Events.js"

export interface EndpointRow {
  readonly id: string
  readonly accountId: string
  readonly url: string
  readonly description: string
  readonly events: ReadonlyArray<string>
  readonly disabledAt: Date | null
  readonly disabledReason: string | null
  readonly failingSince: Date | null
  readonly createdAt: Date
  readonly updatedAt: Date
}

export interface AttemptRow {
  readonly deliveryId: string
  readonly attempt: number
  readonly attemptedAt: Date
  readonly statusCode: number | null
  readonly latencyMs: number
  readonly ok: boolean
  readonly error: string | null
  readonly responseExcerpt: string
}

export interface DeliveryRow {
  readonly id: string
  readonly eventId: string
  readonly eventType: string
  readonly status: "pending" | "delivered" | "failed"
  readonly attempts: number
  readonly nextAttemptAt: Date
  readonly createdAt: Date
  readonly deliveredAt: Date | null
}

export interface EndpointChange {
  readonly url?: string | undefined
  readonly description?: string | undefined
  readonly events?: ReadonlyArray<string> | undefined
  /** false re-enables a disabled endpoint (its failures are forgotten); true disables it. */
  readonly disabled?: boolean | undefined
}

/** Test events and resends one account may ask for in a minute, together (DESIGN.md, Fairness). */
export const MANUAL_SENDS_PER_MINUTE = 10
const SEND_WINDOW_MS = 60_000

/** A Standard Webhooks secret: `whsec_` and 24 random bytes in base64, shown to the developer once. */
export const newSecret = (): string => `whsec_${randomBytes(24).toString("base64")}`

const COLUMNS = "id, account_id, url, description, events, disabled_at, disabled_reason, failing_since, created_at, updated_at"

/** The developer's webhook endpoints and their deliveries; every read and write is scoped to one account. */
export class WebhookEndpoints extends Context.Tag("nenas/WebhookEndpoints")<WebhookEndpoints, {
  readonly create: (accountId: string, input: { url: string; description: string; events: ReadonlyArray<string> }) =>
    Effect.Effect<{ endpoint: EndpointRow; secret: string }, SqlError.SqlError>
  readonly list: (accountId: string) => Effect.Effect<ReadonlyArray<EndpointRow>, SqlError.SqlError>
  readonly find: (accountId: string, id: string) => Effect.Effect<EndpointRow | undefined, SqlError.SqlError>
  readonly update: (accountId: string, id: string, change: EndpointChange) => Effect.Effect<EndpointRow | undefined, SqlError.SqlError>
  readonly remove: (accountId: string, id: string) => Effect.Effect<boolean, SqlError.SqlError>
  readonly rotateSecret: (accountId: string, id: string) => Effect.Effect<string | undefined, SqlError.SqlError>
  /** Queues a `webhook.test` event to this endpoint only; its event id. */
  readonly sendTest: (accountId: string, id: string) => Effect.Effect<string | undefined, SqlError.SqlError>
  readonly deliveries: (accountId: string, id: string, limit: number) =>
    Effect.Effect<ReadonlyArray<DeliveryRow & { readonly attemptLog: ReadonlyArray<AttemptRow> }>, SqlError.SqlError>
  /**
   * Counts one test event or resend against the account's minute (a fixed
   * window, shared by every instance through the database): its count so far,
   * this one included, and the milliseconds until the window ends.
   */
  readonly countManualSend: (accountId: string) => Effect.Effect<{ readonly sends: number; readonly resetsInMs: number }, SqlError.SqlError>
  /** Makes a delivery due now again (any status; one on the wire now is left to finish its attempt). */
  readonly resend: (accountId: string, endpointId: string, deliveryId: string) => Effect.Effect<boolean, SqlError.SqlError>
}>() {
  static readonly layer = Layer.effect(
    WebhookEndpoints,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const now = Effect.map(Clock.currentTimeMillis, (ms) => new Date(ms))
      const find = (accountId: string, id: string) =>
        Effect.map(
          sql<EndpointRow>`SELECT ${sql.unsafe(COLUMNS)} FROM webhook_endpoints WHERE id = ${id} AND account_id = ${accountId}`,
          (rows) => rows[0]
        )
      return WebhookEndpoints.of({
        create: (accountId, input) =>
          Effect.gen(function*() {
            const at = yield* now
            const secret = newSecret()
            const rows = yield* sql<EndpointRow>`
              INSERT INTO webhook_endpoints (id, account_id, url, description, events, secret, created_at, updated_at)
              VALUES (${newId("we")}, ${accountId}, ${input.url}, ${input.description}, ${input.events as Array<string>}::text[],
                      ${secret}, ${at}, ${at})
              RETURNING ${sql.unsafe(COLUMNS)}
            `
            return { endpoint: rows[0]!, secret } // INSERT … RETURNING answers its one row.
          }),
        list: (accountId) =>
          sql<EndpointRow>`SELECT ${sql.unsafe(COLUMNS)} FROM webhook_endpoints WHERE account_id = ${accountId} ORDER BY created_at, id`,
        find,
        update: (accountId, id, change) =>
          Effect.gen(function*() {
            const at = yield* now
            const rows = yield* sql<EndpointRow>`
              UPDATE webhook_endpoints SET
                url = COALESCE(${change.url ?? null}, url),
                description = COALESCE(${change.description ?? null}, description),
                events = COALESCE(${(change.events ?? null) as Array<string> | null}::text[], events),
                disabled_at = CASE WHEN ${change.disabled ?? null}::boolean IS NULL THEN disabled_at
                                   WHEN ${change.disabled ?? null}::boolean THEN COALESCE(disabled_at, ${at}) ELSE NULL END,
                disabled_reason = CASE WHEN ${change.disabled ?? null}::boolean IS NULL THEN disabled_reason
                                       WHEN ${change.disabled ?? null}::boolean THEN COALESCE(disabled_reason, 'disabled by the developer')
                                       ELSE NULL END,
                failing_since = CASE WHEN ${change.disabled ?? null}::boolean = false THEN NULL ELSE failing_since END,
                updated_at = ${at}
              WHERE id = ${id} AND account_id = ${accountId}
              RETURNING ${sql.unsafe(COLUMNS)}
            `
            return rows[0]
          }),
        remove: (accountId, id) =>
          Effect.map(
            sql`DELETE FROM webhook_endpoints WHERE id = ${id} AND account_id = ${accountId} RETURNING id`,
            (rows) => rows.length > 0
          ),
        rotateSecret: (accountId, id) =>
          Effect.gen(function*() {
            const secret = newSecret()
            const rows = yield* sql`
              UPDATE webhook_endpoints SET secret = ${secret}, updated_at = ${yield* now}
              WHERE id = ${id} AND account_id = ${accountId} RETURNING id
            `
            return rows.length > 0 ? secret : undefined
          }),
        sendTest: (accountId, id) =>
          Effect.gen(function*() {
            const endpoint = yield* find(accountId, id)
            if (endpoint === undefined) return undefined
            const at = yield* now
            return yield* sql.withTransaction(emit({
              accountId,
              type: TEST_EVENT,
              at,
              endpointId: id,
              data: { endpoint_id: id, message: "A test event from nenas: your endpoint receives and verifies webhooks." }
            }))
          }).pipe(Effect.provideService(SqlClient.SqlClient, sql)),
        deliveries: (accountId, id, limit) =>
          Effect.gen(function*() {
            const rows = yield* sql<DeliveryRow>`
              SELECT d.id, d.event_id, ev.type AS event_type, d.status, d.attempts, d.next_attempt_at, d.created_at, d.delivered_at
              FROM webhook_deliveries d
              JOIN webhook_endpoints e ON e.id = d.endpoint_id
              JOIN outbox_events ev ON ev.id = d.event_id
              WHERE d.endpoint_id = ${id} AND e.account_id = ${accountId}
              ORDER BY d.created_at DESC, d.id DESC LIMIT ${limit}
            `
            const ids = rows.map((row) => row.id)
            const attempts = ids.length === 0 ? [] : yield* sql<AttemptRow>`
              SELECT delivery_id, attempt, attempted_at, status_code, latency_ms, ok, error, response_excerpt
              FROM webhook_attempts WHERE delivery_id = ANY(${ids}::text[]) ORDER BY attempt
            `
            return rows.map((row) => ({ ...row, attemptLog: attempts.filter((a) => a.deliveryId === row.id) }))
          }),
        countManualSend: (accountId) =>
          Effect.gen(function*() {
            const at = yield* now
            const windowFrom = new Date(at.getTime() - SEND_WINDOW_MS)
            const rows = yield* sql<{ sends: number; windowStart: Date }>`
              INSERT INTO webhook_send_windows AS w (account_id, window_start, sends) VALUES (${accountId}, ${at}, 1)
              ON CONFLICT (account_id) DO UPDATE SET
                sends = CASE WHEN w.window_start <= ${windowFrom} THEN 1 ELSE w.sends + 1 END,
                window_start = CASE WHEN w.window_start <= ${windowFrom} THEN ${at} ELSE w.window_start END
              RETURNING sends, window_start
            `
            const row = rows[0]
            return row === undefined
              ? { sends: 1, resetsInMs: SEND_WINDOW_MS }
              : { sends: row.sends, resetsInMs: row.windowStart.getTime() + SEND_WINDOW_MS - at.getTime() }
          }),
        resend: (accountId, endpointId, deliveryId) =>
          Effect.gen(function*() {
            const at = yield* now
            // A delivery on the wire keeps its lease: cleared, it would be claimed twice and counted out of flight.
            const rows = yield* sql`
              UPDATE webhook_deliveries d SET status = 'pending', next_attempt_at = ${at},
                claimed_until = CASE WHEN d.claimed_until >= ${at} THEN d.claimed_until ELSE NULL END
              FROM webhook_endpoints e
              WHERE d.id = ${deliveryId} AND d.endpoint_id = ${endpointId} AND e.id = d.endpoint_id AND e.account_id = ${accountId}
              RETURNING d.id
            `
            return rows.length > 0
          })
      })
    })
  )
}
