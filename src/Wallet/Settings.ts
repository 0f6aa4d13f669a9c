import { SqlClient, SqlSchema } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Context, Effect, Layer, Option, Schema } from "effect"
import { MicroMyr } from "../Domain/Money.js"
import { makeTestLayer } from "../Domain/TestLayer.js"

/** What a developer set on their wallet (docs/api/alerts.md, "Alerts"): the low-balance threshold and auto top-up. */
export const WalletSettingsRow = Schema.Struct({
  lowBalanceThresholdMicroMyr: Schema.NullOr(MicroMyr),
  autoTopupEnabled: Schema.Boolean,
  autoTopupThresholdMicroMyr: Schema.NullOr(MicroMyr),
  autoTopupAmountSen: Schema.NullOr(Schema.Int),
  autoTopupMaxPerDay: Schema.Int,
  /** Why auto top-up turned itself off (a decline, authentication required); null while on or never failed. */
  autoTopupDisabledReason: Schema.NullOr(Schema.String),
  /** Where the developer re-authenticates the card after such a failure. */
  autoTopupActionUrl: Schema.NullOr(Schema.String)
})
export type WalletSettingsRow = typeof WalletSettingsRow.Type

/** A change: absent fields stay; `null` clears a threshold. */
export interface WalletSettingsChange {
  readonly lowBalanceThresholdMicroMyr?: number | null | undefined
  readonly autoTopupEnabled?: boolean | undefined
  readonly autoTopupThresholdMicroMyr?: number | undefined
  readonly autoTopupAmountSen?: number | undefined
  readonly autoTopupMaxPerDay?: number | undefined
}

const COLUMNS =
  `low_balance_threshold_micro_myr, auto_topup_enabled, auto_topup_threshold_micro_myr, auto_topup_amount_sen,
  auto_topup_max_per_day, auto_topup_disabled_reason, auto_topup_action_url`

/**
 * The wallet's settings. `lock` and `disableAutoTopup` run in the Stripe webhook's transaction, whose
 * handler counts a failed event by its `SqlError`: they keep it; `get` and `set` make it a defect.
 */
export class WalletSettings extends Context.Tag("nenas/WalletSettings")<WalletSettings, {
  readonly get: (accountId: string) => Effect.Effect<WalletSettingsRow | undefined>
  readonly set: (accountId: string, change: WalletSettingsChange) => Effect.Effect<WalletSettingsRow | undefined>
  /**
   * Locks the wallet's row for the caller's transaction: taken before an auto top-up
   * attempt's row, in the order settlement takes them (wallet, then attempt).
   */
  readonly lock: (accountId: string) => Effect.Effect<void, SqlError.SqlError>
  /** Turns auto top-up off and says why (a failed charge); answers whether it was on. */
  readonly disableAutoTopup: (
    accountId: string,
    reason: string,
    actionUrl: string | null
  ) => Effect.Effect<boolean, SqlError.SqlError>
}>() {
  static readonly layer = Layer.effect(
    WalletSettings,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const get = SqlSchema.findOne({
        Request: Schema.String,
        Result: WalletSettingsRow,
        execute: (accountId) => sql`SELECT ${sql.unsafe(COLUMNS)} FROM wallets WHERE account_id = ${accountId}`
      })
      return WalletSettings.of({
        get: (accountId) =>
          get(accountId).pipe(Effect.map(Option.getOrUndefined), Effect.orDie, Effect.withSpan("WalletSettings.get")),
        set: (accountId, change) =>
          SqlSchema.findOne({
            Request: Schema.Void,
            Result: WalletSettingsRow,
            execute: () =>
              sql`
              UPDATE wallets SET
                low_balance_threshold_micro_myr = CASE WHEN ${change.lowBalanceThresholdMicroMyr === undefined}
                  THEN low_balance_threshold_micro_myr ELSE ${change.lowBalanceThresholdMicroMyr ?? null}::bigint END,
                auto_topup_enabled = COALESCE(${change.autoTopupEnabled ?? null}::boolean, auto_topup_enabled),
                auto_topup_threshold_micro_myr = COALESCE(${
                change.autoTopupThresholdMicroMyr ?? null
              }::bigint, auto_topup_threshold_micro_myr),
                auto_topup_amount_sen = COALESCE(${change.autoTopupAmountSen ?? null}::integer, auto_topup_amount_sen),
                auto_topup_max_per_day = COALESCE(${
                change.autoTopupMaxPerDay ?? null
              }::integer, auto_topup_max_per_day),
                auto_topup_disabled_reason = CASE WHEN ${
                change.autoTopupEnabled === true
              } THEN NULL ELSE auto_topup_disabled_reason END,
                auto_topup_action_url = CASE WHEN ${
                change.autoTopupEnabled === true
              } THEN NULL ELSE auto_topup_action_url END
              WHERE account_id = ${accountId}
              RETURNING ${sql.unsafe(COLUMNS)}
            `
          })(undefined).pipe(Effect.map(Option.getOrUndefined), Effect.orDie, Effect.withSpan("WalletSettings.set")),
        lock: (accountId) =>
          Effect.asVoid(sql`SELECT account_id FROM wallets WHERE account_id = ${accountId} FOR UPDATE`),
        disableAutoTopup: (accountId, reason, actionUrl) =>
          Effect.map(
            sql`
              UPDATE wallets SET auto_topup_enabled = false, auto_topup_disabled_reason = ${reason}, auto_topup_action_url = ${actionUrl}
              WHERE account_id = ${accountId} AND auto_topup_enabled RETURNING account_id
            `,
            (rows) => rows.length > 0
          )
      })
    })
  )

  static readonly Test = makeTestLayer(WalletSettings)
}
