import { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Effect } from "effect"
import { type EventType, TEST_EVENT } from "../Domain/EventTypes.js"
import { newId } from "../Domain/Ids.js"

/** Stands for `DASHBOARD_URL` in an email's body; the sender puts the configured URL in its place. */
export const DASHBOARD_URL = "{{dashboard_url}}"

/** What the dashboard calls a personal account that has no name of its own. */
export const PERSONAL_ACCOUNT_NAME = "Personal"

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

/** The account an event or email is about, as its receivers see it: every payload and email names it. */
export interface NamedAccount {
  readonly id: string
  readonly name: string | null
}

/**
 * The Standard Webhooks payload: `{type, timestamp, account, data}`. Its id (`msg_…`)
 * is the `webhook-id` of every attempt, so a receiver can drop repeats.
 */
export const payloadOf = (event: {
  readonly type: string
  readonly at: Date
  readonly data: Record<string, unknown>
  readonly account?: NamedAccount | undefined
}) => ({
  type: event.type,
  timestamp: event.at.toISOString(),
  ...(event.account === undefined ? {} : { account: { id: event.account.id, name: event.account.name } }),
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
    // A personal account without a name is "Personal", as the dashboard labels it (web/src/accounts.tsx).
    const named = yield* sql<{ name: string | null }>`
      SELECT COALESCE(NULLIF(name, ''), CASE WHEN issuer IS NOT NULL THEN ${PERSONAL_ACCOUNT_NAME} END) AS name
      FROM accounts WHERE id = ${event.accountId}`
    const payload = payloadOf({ ...event, account: { id: event.accountId, name: named[0]?.name ?? null } })
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

/** At most this many people get one account's email. */
const MAX_RECIPIENTS = 50

/**
 * Queues an email to every owner and billing member of the account (docs/api/alerts.md, "Alerts"), optionally tied to an
 * event; its first line names the account. An account whose members have no address gets none.
 */
export const emailAccount = (accountId: string, email: EventEmail, at: Date, eventId: string | null = null) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    // Read here, in the transaction of the change that causes the email: the members table is MembersRepo's otherwise.
    yield* sql`
      INSERT INTO outbox_emails (id, account_id, event_id, to_address, subject, body, status, next_attempt_at, created_at)
      SELECT ${newId("eml")} || '_' || row_number() OVER (ORDER BY r.email), ${accountId}, ${eventId}, r.email,
        ${email.subject},
        'Account: ' || COALESCE(NULLIF(a.name, ''), NULLIF(a.email, ''), a.id) || ' (' || a.id || E')\n\n' || ${email.body},
        'pending', ${at}, ${at}
      FROM accounts a, (
        SELECT DISTINCT email FROM members
        WHERE account_id = ${accountId} AND removed_at IS NULL AND role IN ('owner', 'billing')
          AND email IS NOT NULL AND email <> ''
        ORDER BY email LIMIT ${MAX_RECIPIENTS}
      ) r
      WHERE a.id = ${accountId}
    `
  })

/** Queues an email to one address (an invitation), on the caller's connection: inside the change's transaction. */
export const emailAddress = (accountId: string, address: string, email: EventEmail, at: Date) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql`
      INSERT INTO outbox_emails (id, account_id, event_id, to_address, subject, body, status, next_attempt_at, created_at)
      VALUES (${newId("eml")}, ${accountId}, NULL, ${address}, ${email.subject}, ${email.body}, 'pending', ${at}, ${at})
    `)

export { TEST_EVENT } from "../Domain/EventTypes.js"
