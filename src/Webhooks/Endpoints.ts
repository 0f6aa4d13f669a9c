import { SqlClient, SqlSchema } from "@effect/sql"
import { Context, Effect, Layer, Option, Schema } from "effect"
import { randomBytes } from "node:crypto"
import { newId } from "../Domain/Ids.js"
import { makeTestLayer } from "../Domain/TestLayer.js"
import { now } from "../Domain/Time.js"
import { emit, TEST_EVENT } from "../Outbox/Events.js"

const NullableDate = Schema.NullOr(Schema.DateFromSelf)

export const EndpointRow = Schema.Struct({
  id: Schema.String,
  accountId: Schema.String,
  url: Schema.String,
  description: Schema.String,
  events: Schema.Array(Schema.String),
  disabledAt: NullableDate,
  disabledReason: Schema.NullOr(Schema.String),
  failingSince: NullableDate,
  createdAt: Schema.DateFromSelf,
  updatedAt: Schema.DateFromSelf,
  createdByMemberId: Schema.NullOr(Schema.String),
  creatorRemovedAt: NullableDate
})
export interface EndpointRow extends Schema.Schema.Type<typeof EndpointRow> {}

export const AttemptRow = Schema.Struct({
  deliveryId: Schema.String,
  attempt: Schema.Int,
  attemptedAt: Schema.DateFromSelf,
  statusCode: Schema.NullOr(Schema.Int),
  latencyMs: Schema.Int,
  ok: Schema.Boolean,
  error: Schema.NullOr(Schema.String),
  responseExcerpt: Schema.String
})
export interface AttemptRow extends Schema.Schema.Type<typeof AttemptRow> {}

export const DeliveryRow = Schema.Struct({
  id: Schema.String,
  eventId: Schema.String,
  eventType: Schema.String,
  status: Schema.Literal("pending", "delivered", "failed"),
  attempts: Schema.Int,
  nextAttemptAt: Schema.DateFromSelf,
  createdAt: Schema.DateFromSelf,
  deliveredAt: NullableDate
})
export interface DeliveryRow extends Schema.Schema.Type<typeof DeliveryRow> {}

const OwnEndpoint = Schema.Struct({ accountId: Schema.String, id: Schema.String })

export interface EndpointChange {
  readonly url?: string | undefined
  readonly description?: string | undefined
  readonly events?: ReadonlyArray<string> | undefined
  /** false re-enables a disabled endpoint (its failures are forgotten); true disables it. */
  readonly disabled?: boolean | undefined
}

/** Test events and resends one account may ask for in a minute, together (docs/api/alerts.md, "Fairness of webhook deliveries"). */
export const MANUAL_SENDS_PER_MINUTE = 10
const SEND_WINDOW_MS = 60_000

/** A Standard Webhooks secret: `whsec_` and 24 random bytes in base64, shown to the developer once. */
export const newSecret = (): string => `whsec_${randomBytes(24).toString("base64")}`

const COLUMNS =
  "id, account_id, url, description, events, disabled_at, disabled_reason, failing_since, created_at, updated_at, created_by_member_id, creator_removed_at"

/** Why an endpoint was disabled when the member who made it left: it may point where only that person reads. */
export const CREATOR_REMOVED_REASON =
  "the member who made it was removed from the account; check its URL before enabling it again"

/** An entry of the audit log, as the caller's recorder writes it (the handlers pass `AuditLog.record`). */
export interface EndpointDisabled {
  readonly action: "webhook.disabled"
  readonly targetType: "webhook"
  readonly targetId: string
  readonly details: Record<string, unknown>
}

/** The developer's webhook endpoints and their deliveries; every read and write is scoped to one account. */
export class WebhookEndpoints extends Context.Tag("nenas/WebhookEndpoints")<WebhookEndpoints, {
  readonly create: (
    accountId: string,
    input: { url: string; description: string; events: ReadonlyArray<string>; createdBy: string | null }
  ) => Effect.Effect<{ endpoint: EndpointRow; secret: string }>
  readonly list: (accountId: string) => Effect.Effect<ReadonlyArray<EndpointRow>>
  readonly find: (accountId: string, id: string) => Effect.Effect<EndpointRow | undefined>
  readonly update: (accountId: string, id: string, change: EndpointChange) => Effect.Effect<EndpointRow | undefined>
  readonly remove: (accountId: string, id: string) => Effect.Effect<boolean>
  readonly rotateSecret: (accountId: string, id: string) => Effect.Effect<string | undefined>
  /** Queues a `webhook.test` event to this endpoint only; its event id. */
  readonly sendTest: (accountId: string, id: string) => Effect.Effect<string | undefined>
  readonly deliveries: (
    accountId: string,
    id: string,
    limit: number
  ) => Effect.Effect<ReadonlyArray<DeliveryRow & { readonly attemptLog: ReadonlyArray<AttemptRow> }>>
  /**
   * Counts one test event or resend against the account's minute (a fixed
   * window, shared by every instance through the database): its count so far,
   * this one included, and the milliseconds until the window ends.
   */
  readonly countManualSend: (
    accountId: string
  ) => Effect.Effect<{ readonly sends: number; readonly resetsInMs: number }>
  /** Makes a delivery due now again (any status; one on the wire now is left to finish its attempt). */
  readonly resend: (accountId: string, endpointId: string, deliveryId: string) => Effect.Effect<boolean>
  /**
   * Disables and flags the enabled endpoints `memberId` made, in the caller's transaction (its removal's), each
   * told to `record` for the audit log; their ids.
   */
  readonly creatorRemoved: <R>(
    accountId: string,
    memberId: string,
    record: (entry: EndpointDisabled) => Effect.Effect<void, never, R>
  ) => Effect.Effect<ReadonlyArray<string>, never, R>
}>() {
  static readonly layer = Layer.effect(
    WebhookEndpoints,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const columns = sql.unsafe(COLUMNS)
      const insert = SqlSchema.single({
        Request: Schema.Struct({
          id: Schema.String,
          accountId: Schema.String,
          url: Schema.String,
          description: Schema.String,
          events: Schema.Array(Schema.String),
          secret: Schema.String,
          at: Schema.DateFromSelf,
          createdBy: Schema.NullOr(Schema.String)
        }),
        Result: EndpointRow,
        execute: (row) =>
          sql`
            INSERT INTO webhook_endpoints (id, account_id, url, description, events, secret, created_at, updated_at, created_by_member_id)
            VALUES (${row.id}, ${row.accountId}, ${row.url}, ${row.description}, ${row.events}::text[],
                    ${row.secret}, ${row.at}, ${row.at}, ${row.createdBy})
            RETURNING ${columns}
          `
      })
      const listEndpoints = SqlSchema.findAll({
        Request: Schema.String,
        Result: EndpointRow,
        execute: (accountId) =>
          sql`SELECT ${columns} FROM webhook_endpoints WHERE account_id = ${accountId} ORDER BY created_at, id`
      })
      const findEndpoint = SqlSchema.findOne({
        Request: OwnEndpoint,
        Result: EndpointRow,
        execute: ({ accountId, id }) =>
          sql`SELECT ${columns} FROM webhook_endpoints WHERE id = ${id} AND account_id = ${accountId}`
      })
      const find = (accountId: string, id: string) => Effect.map(findEndpoint({ accountId, id }), Option.getOrUndefined)
      const updateEndpoint = SqlSchema.findOne({
        Request: Schema.Struct({
          ...OwnEndpoint.fields,
          at: Schema.DateFromSelf,
          url: Schema.NullOr(Schema.String),
          description: Schema.NullOr(Schema.String),
          events: Schema.NullOr(Schema.Array(Schema.String)),
          disabled: Schema.NullOr(Schema.Boolean)
        }),
        Result: EndpointRow,
        execute: (change) =>
          sql`
            UPDATE webhook_endpoints SET
              url = COALESCE(${change.url}, url),
              description = COALESCE(${change.description}, description),
              events = COALESCE(${change.events}::text[], events),
              disabled_at = CASE WHEN ${change.disabled}::boolean IS NULL THEN disabled_at
                                 WHEN ${change.disabled}::boolean THEN COALESCE(disabled_at, ${change.at}) ELSE NULL END,
              disabled_reason = CASE WHEN ${change.disabled}::boolean IS NULL THEN disabled_reason
                                     WHEN ${change.disabled}::boolean THEN COALESCE(disabled_reason, 'disabled by the developer')
                                     ELSE NULL END,
              failing_since = CASE WHEN ${change.disabled}::boolean = false THEN NULL ELSE failing_since END,
              updated_at = ${change.at}
            WHERE id = ${change.id} AND account_id = ${change.accountId}
            RETURNING ${columns}
          `
      })
      const recentDeliveries = SqlSchema.findAll({
        Request: Schema.Struct({ ...OwnEndpoint.fields, limit: Schema.Number }),
        Result: DeliveryRow,
        execute: ({ accountId, id, limit }) =>
          sql`
            SELECT d.id, d.event_id, ev.type AS event_type, d.status, d.attempts, d.next_attempt_at, d.created_at, d.delivered_at
            FROM webhook_deliveries d
            JOIN webhook_endpoints e ON e.id = d.endpoint_id
            JOIN outbox_events ev ON ev.id = d.event_id
            WHERE d.endpoint_id = ${id} AND e.account_id = ${accountId}
            ORDER BY d.created_at DESC, d.id DESC LIMIT ${limit}
          `
      })
      const attemptsOf = SqlSchema.findAll({
        Request: Schema.Array(Schema.String),
        Result: AttemptRow,
        execute: (ids) =>
          sql`
            SELECT delivery_id, attempt, attempted_at, status_code, latency_ms, ok, error, response_excerpt
            FROM webhook_attempts WHERE delivery_id = ANY(${ids}::text[]) ORDER BY attempt
          `
      })
      const countSend = SqlSchema.findOne({
        Request: Schema.Struct({ accountId: Schema.String, at: Schema.DateFromSelf, windowFrom: Schema.DateFromSelf }),
        Result: Schema.Struct({ sends: Schema.Int, windowStart: Schema.DateFromSelf }),
        execute: ({ accountId, at, windowFrom }) =>
          sql`
            INSERT INTO webhook_send_windows AS w (account_id, window_start, sends) VALUES (${accountId}, ${at}, 1)
            ON CONFLICT (account_id) DO UPDATE SET
              sends = CASE WHEN w.window_start <= ${windowFrom} THEN 1 ELSE w.sends + 1 END,
              window_start = CASE WHEN w.window_start <= ${windowFrom} THEN ${at} ELSE w.window_start END
            RETURNING sends, window_start
          `
      })
      return WebhookEndpoints.of({
        create: (accountId, input) =>
          Effect.gen(function*() {
            const at = yield* now
            const secret = newSecret()
            const endpoint = yield* insert({
              id: newId("we"),
              accountId,
              url: input.url,
              description: input.description,
              events: input.events,
              createdBy: input.createdBy,
              secret,
              at
            })
            return { endpoint, secret }
          }).pipe(Effect.orDie, Effect.withSpan("WebhookEndpoints.create")),
        list: (accountId) => listEndpoints(accountId).pipe(Effect.orDie, Effect.withSpan("WebhookEndpoints.list")),
        find: (accountId, id) => find(accountId, id).pipe(Effect.orDie, Effect.withSpan("WebhookEndpoints.find")),
        update: (accountId, id, change) =>
          Effect.gen(function*() {
            const row = yield* updateEndpoint({
              accountId,
              id,
              at: yield* now,
              url: change.url ?? null,
              description: change.description ?? null,
              events: change.events ?? null,
              disabled: change.disabled ?? null
            })
            return Option.getOrUndefined(row)
          }).pipe(Effect.orDie, Effect.withSpan("WebhookEndpoints.update")),
        remove: (accountId, id) =>
          Effect.map(
            sql`DELETE FROM webhook_endpoints WHERE id = ${id} AND account_id = ${accountId} RETURNING id`,
            (rows) => rows.length > 0
          ).pipe(Effect.orDie, Effect.withSpan("WebhookEndpoints.remove")),
        rotateSecret: (accountId, id) =>
          Effect.gen(function*() {
            const secret = newSecret()
            const rows = yield* sql`
              UPDATE webhook_endpoints SET secret = ${secret}, updated_at = ${yield* now}
              WHERE id = ${id} AND account_id = ${accountId} RETURNING id
            `
            return rows.length > 0 ? secret : undefined
          }).pipe(Effect.orDie, Effect.withSpan("WebhookEndpoints.rotateSecret")),
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
              data: {
                endpoint_id: id,
                message: "A test event from nenas: your endpoint receives and verifies webhooks."
              }
            }))
          }).pipe(
            Effect.provideService(SqlClient.SqlClient, sql),
            Effect.orDie,
            Effect.withSpan("WebhookEndpoints.sendTest")
          ),
        deliveries: (accountId, id, limit) =>
          Effect.gen(function*() {
            const rows = yield* recentDeliveries({ accountId, id, limit })
            const ids = rows.map((row) => row.id)
            const attempts = ids.length === 0 ? [] : yield* attemptsOf(ids)
            return rows.map((row) => ({ ...row, attemptLog: attempts.filter((a) => a.deliveryId === row.id) }))
          }).pipe(Effect.orDie, Effect.withSpan("WebhookEndpoints.deliveries")),
        countManualSend: (accountId) =>
          Effect.gen(function*() {
            const at = yield* now
            const row = yield* countSend({ accountId, at, windowFrom: new Date(at.getTime() - SEND_WINDOW_MS) })
            return Option.match(row, {
              onNone: () => ({ sends: 1, resetsInMs: SEND_WINDOW_MS }),
              onSome: ({ sends, windowStart }) => ({
                sends,
                resetsInMs: windowStart.getTime() + SEND_WINDOW_MS - at.getTime()
              })
            })
          }).pipe(Effect.orDie, Effect.withSpan("WebhookEndpoints.countManualSend")),
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
          }).pipe(Effect.orDie, Effect.withSpan("WebhookEndpoints.resend")),
        creatorRemoved: (accountId, memberId, record) =>
          Effect.gen(function*() {
            const at = yield* now
            const rows = yield* sql<{ id: string; wasEnabled: boolean }>`
              UPDATE webhook_endpoints e SET creator_removed_at = ${at},
                disabled_at = COALESCE(e.disabled_at, ${at}),
                disabled_reason = CASE WHEN e.disabled_at IS NULL THEN ${CREATOR_REMOVED_REASON} ELSE e.disabled_reason END,
                updated_at = ${at}
              FROM webhook_endpoints prior
              WHERE e.account_id = ${accountId} AND e.created_by_member_id = ${memberId} AND e.creator_removed_at IS NULL
                AND prior.id = e.id
              RETURNING e.id, prior.disabled_at IS NULL AS was_enabled
            `.pipe(Effect.orDie)
            for (const row of rows) {
              yield* record({
                action: "webhook.disabled",
                targetType: "webhook",
                targetId: row.id,
                details: { reason: "creator_removed", member_id: memberId, was_enabled: row.wasEnabled }
              })
            }
            return rows.map((row) => row.id)
          }).pipe(Effect.withSpan("WebhookEndpoints.creatorRemoved"))
      })
    })
  )
  /** Only the members a test gives; any other dies when used. */
  static readonly Test = makeTestLayer(WebhookEndpoints)
}
