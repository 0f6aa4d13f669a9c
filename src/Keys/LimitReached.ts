import { SqlClient, SqlSchema } from "@effect/sql"
import { Context, Effect, Layer, Schema } from "effect"
import { AppConfig } from "../AppConfig.js"
import { MicroMyr } from "../Domain/Money.js"
import { now } from "../Domain/Time.js"
import { DASHBOARD_URL, emit } from "../Outbox/Events.js"

/** `YYYY-MM` of `at` in `timeZone`: the spend-limit month. */
export const monthOf = (at: Date, timeZone: string): string => {
  const parts = new Intl.DateTimeFormat("en-CA", { timeZone, year: "numeric", month: "2-digit" }).formatToParts(at)
  return `${parts.find((p) => p.type === "year")?.value}-${parts.find((p) => p.type === "month")?.value}`
}

/**
 * `key.limit_reached`
 * (docs/api/alerts.md, "Never run dry: alerts, auto top-up and webhooks"): the
 * first call a key's monthly spend limit refuses in a month announces it, once
 * per key and month (the row's update is the claim, on any number of
 * instances), by webhook and email. A failure here is logged and never changes
 * the refusal the caller gets.
 */
export class KeyLimitReached extends Context.Tag("nenas/KeyLimitReached")<KeyLimitReached, {
  readonly announce: (apiKeyId: string) => Effect.Effect<void>
}>() {
  static readonly layer = Layer.effect(
    KeyLimitReached,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const { businessTimezone } = yield* AppConfig
      // Keys whose announcement this month is made (here or on another instance): their later refusals cost no round trip.
      const announced = { month: "", keys: new Set<string>() }
      const announce = (apiKeyId: string) =>
        Effect.gen(function*() {
          const at = yield* now
          const month = monthOf(at, businessTimezone)
          if (announced.month !== month) announced.keys.clear()
          announced.month = month
          if (announced.keys.has(apiKeyId)) return
          yield* claim(apiKeyId, at, month)
          announced.keys.add(apiKeyId)
        })
      const markAnnounced = SqlSchema.findAll({
        Request: Schema.Struct({ apiKeyId: Schema.String, month: Schema.String }),
        Result: Schema.Struct({
          id: Schema.String,
          accountId: Schema.String,
          name: Schema.String,
          monthlySpendLimitMicroMyr: Schema.NullOr(MicroMyr)
        }),
        execute: ({ apiKeyId, month }) =>
          sql`
            UPDATE api_keys SET limit_announced_month = ${month}
            WHERE id = ${apiKeyId} AND limit_announced_month IS DISTINCT FROM ${month}
            RETURNING id, account_id, name, monthly_spend_limit_micro_myr
          `
      })
      const claim = (apiKeyId: string, at: Date, month: string) =>
        sql.withTransaction(Effect.gen(function*() {
          const keys = yield* markAnnounced({ apiKeyId, month })
          for (const key of keys) {
            const limit = key.monthlySpendLimitMicroMyr === null ? null : key.monthlySpendLimitMicroMyr / 1e6
            yield* emit({
              accountId: key.accountId,
              type: "key.limit_reached",
              at,
              data: { account_id: key.accountId, api_key_id: key.id, month, monthly_spend_limit_myr: limit },
              email: {
                subject: `Your API key "${key.name}" reached its monthly spend limit`,
                body: `The API key "${key.name}" reached its limit of RM ${limit?.toFixed(2) ?? "?"} for ${month}.\n` +
                  `Its live calls answer 402 spend_limit_exceeded until the month ends or you raise the limit: ${DASHBOARD_URL}/api-keys\n`
              }
            })
          }
        })).pipe(Effect.provideService(SqlClient.SqlClient, sql))
      return {
        announce: (apiKeyId) =>
          announce(apiKeyId).pipe(
            Effect.catchAllCause((cause) =>
              Effect.logWarning(`key.limit_reached for ${apiKeyId} was not announced`, cause)
            )
          )
      }
    })
  )
}
