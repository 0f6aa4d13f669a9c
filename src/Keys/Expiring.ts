import { SqlClient, SqlSchema } from "@effect/sql"
import { Context, Duration, Effect, Layer, Schedule, Schema } from "effect"
import { now } from "../Domain/Time.js"
import { DASHBOARD_URL, emit } from "../Outbox/Events.js"

/** A key is announced as expiring this long before its `expires_at`. */
export const EXPIRING_NOTICE_MS = 7 * 24 * 60 * 60 * 1000
const EVERY = Duration.seconds(30)

/**
 * `key.expiring`
 * (docs/api/alerts.md, "Never run dry: alerts, auto top-up and webhooks"): once
 * per key and expiry, 7 days before it, a webhook event and an email, written
 * in the transaction that marks the key announced. Every instance runs it; the
 * row's update is the claim, so a key is announced once however many run at
 * once. A new `expires_at` is announced again.
 */
export class KeyExpiry extends Context.Tag("nenas/KeyExpiry")<KeyExpiry, {
  /** Announces the keys expiring within 7 days not yet announced; how many. */
  readonly runOnce: Effect.Effect<number>
}>() {
  static readonly layer = Layer.effect(
    KeyExpiry,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const markExpiring = SqlSchema.findAll({
        Request: Schema.DateFromSelf,
        Result: Schema.Struct({
          id: Schema.String,
          accountId: Schema.String,
          name: Schema.String,
          prefix: Schema.String,
          expiresAt: Schema.DateFromSelf
        }),
        execute: (at) =>
          sql`
            UPDATE api_keys SET expiring_announced_for = expires_at
            WHERE expires_at > ${at} AND expires_at <= ${new Date(at.getTime() + EXPIRING_NOTICE_MS)}
              AND expiring_announced_for IS DISTINCT FROM expires_at
            RETURNING id, account_id, name, prefix, expires_at
          `
      })
      const runOnce = sql.withTransaction(Effect.gen(function*() {
        const at = yield* now
        const keys = yield* markExpiring(at)
        for (const key of keys) {
          yield* emit({
            accountId: key.accountId,
            type: "key.expiring",
            at,
            data: { account_id: key.accountId, api_key_id: key.id, expires_at: key.expiresAt.toISOString() },
            email: {
              subject: `Your API key "${key.name}" expires on ${key.expiresAt.toISOString().slice(0, 10)}`,
              body: `The API key "${key.name}" (${key.prefix}…) expires at ${key.expiresAt.toISOString()}.\n` +
                `After that it answers 401 expired_api_key. Extend it or create a new one: ${DASHBOARD_URL}/api-keys\n`
            }
          })
        }
        return keys.length
      })).pipe(
        Effect.provideService(SqlClient.SqlClient, sql),
        Effect.catchAllCause((cause) => Effect.as(Effect.logWarning("key expiry announcements failed", cause), 0))
      )
      return { runOnce }
    })
  )

  /** Announces in the background for the life of the service. */
  static readonly layerRunning = Layer.scopedDiscard(Effect.gen(function*() {
    const expiry = yield* KeyExpiry
    yield* Effect.forkScoped(Effect.repeat(expiry.runOnce, Schedule.spaced(EVERY)))
  })).pipe(Layer.provideMerge(KeyExpiry.layer))
}
