import { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Effect } from "effect"
import { type EventType, TEST_EVENT } from "../Domain/EventTypes.js"
import { newId } from "../Domain/Ids.js"

/** Stands for `DASHBOARD_URL` in an email's body; the sender puts the configured URL in its place. */
export const DASHBOARD_URL = "{{dashboard_url}}"

/** An email written with the event, in the same transaction (sent by `Mail.ts`). */
export interface EventEmail {
  readonly subject: string
  readonly body: string
}

export interface Emitted {
  readonly accountId: string
  readonly type: EventType | typeof TEST_EVENT
  readonly data: Record<string, unknown>
  readonly at: Date
  readonly email?: EventEmail | undefined
  /** Only this endpoint (a test event); otherwise every enabled endpoint subscribed to `type`. */
  readonly endpointId?: string | undefined
}

/**
 * The Standard Webhooks payload: `{type, timestamp, data}`. Its id (`msg_…`)
 * is the `webhook-id` of every attempt, so a receiver can drop repeats.
 */
export const payloadOf = (event: { readonly type: string; readonly at: Date; readonly data: Record<string, unknown> }) => ({
  type: event.type,
  timestamp: event.at.toISOString(),
  data: event.data
})

/**
 * Writes an event to the outbox with its deliveries (and its email, to the
 * account's address when it has one). Runs on the caller's SQL connection: call
 * it inside the transaction of the change that causes the event, so both
 * commit or neither does. Answers the event's id.
 */
export const emit = (event: Emitted): Effect.Effect<string, SqlError.SqlError, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const id = newId("msg")
    const payload = payloadOf(event)
    yield* sql`
      INSERT INTO outbox_events (id, account_id, type, payload, created_at)
      VALUES (${id}, ${event.accountId}, ${event.type}, ${JSON.stringify(payload)}::jsonb, ${event.at})
    `
    const targets = event.endpointId === undefined
      ? sql`SELECT id FROM webhook_endpoints
            WHERE account_id = ${event.accountId} AND disabled_at IS NULL AND ${event.type} = ANY(events)`
      : sql`SELECT id FROM webhook_endpoints WHERE id = ${event.endpointId} AND account_id = ${event.accountId}`
    const endpoints = yield* targets
    for (const endpoint of endpoints as ReadonlyArray<{ id: string }>) {
      yield* sql`
        INSERT INTO webhook_deliveries (id, event_id, endpoint_id, status, next_attempt_at, created_at)
        VALUES (${newId("whd")}, ${id}, ${endpoint.id}, 'pending', ${event.at}, ${event.at})
      `
    }
    if (event.email !== undefined) yield* emailAccount(event.accountId, event.email, event.at, id)
    return id
  })

/** Queues an email to the account's address (none: nothing), optionally tied to an event. */
export const emailAccount = (accountId: string, email: EventEmail, at: Date, eventId: string | null = null) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    yield* sql`
      INSERT INTO outbox_emails (id, account_id, event_id, to_address, subject, body, status, next_attempt_at, created_at)
      SELECT ${newId("eml")}, id, ${eventId}, email, ${email.subject}, ${email.body}, 'pending', ${at}, ${at}
      FROM accounts WHERE id = ${accountId} AND email IS NOT NULL AND email <> ''
    `
  })

export { EVENT_TYPES, type EventType, TEST_EVENT } from "../Domain/EventTypes.js"
