import { SqlClient, SqlSchema } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Context, Effect, Layer, Option, Schema } from "effect"
import { newId } from "../Domain/Ids.js"
import { makeTestLayer } from "../Domain/TestLayer.js"
import { totalOf } from "./LowBalance.js"
import type { WalletRow } from "./Settlement/SettleRows.js"

/**
 * Auto top-up attempts (docs/api/alerts.md, "Alerts"). A settlement that leaves a wallet below its
 * auto top-up threshold queues one, in its own transaction under the wallet's
 * lock, unless one is unfinished (a unique index: one in flight per account,
 * across instances) or the day's cap is reached. Billing's worker charges it
 * and finishes it. Refunds and chargebacks are not settlements: they never queue one.
 */
export const queueAutoTopups = (
  before: ReadonlyMap<string, number>,
  wallets: ReadonlyMap<string, WalletRow>,
  at: Date
): Effect.Effect<void, SqlError.SqlError, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    for (const wallet of wallets.values()) {
      const threshold = wallet.autoTopupThresholdMicroMyr
      const was = before.get(wallet.accountId)
      const now = totalOf(wallet)
      if (
        threshold === null || wallet.autoTopupAmountSen === null || was === undefined || now >= threshold || now >= was
      ) continue
      yield* sql`
        INSERT INTO auto_topups (id, account_id, amount_sen, status, created_at)
        SELECT ${newId("atu")}, ${wallet.accountId}, ${wallet.autoTopupAmountSen}, 'queued', ${at}
        WHERE (SELECT count(*) FROM auto_topups WHERE account_id = ${wallet.accountId}
               AND created_at > ${new Date(at.getTime() - 24 * 60 * 60 * 1000)}) < ${wallet.autoTopupMaxPerDay}
        ON CONFLICT (account_id) WHERE status IN ('queued', 'charging') DO NOTHING
      `
    }
  })

export const AutoTopupRow = Schema.Struct({
  id: Schema.String,
  accountId: Schema.String,
  amountSen: Schema.Int,
  status: Schema.Literal("queued", "charging", "succeeded", "failed"),
  transactionId: Schema.NullOr(Schema.String),
  paymentIntentId: Schema.NullOr(Schema.String),
  createdAt: Schema.DateFromSelf,
  /** The claim's lease as its claimer set it: a claimer charges only while the row still carries its own. */
  claimedUntil: Schema.NullOr(Schema.DateFromSelf),
  /** Claimed before (its claimer's lease lapsed): that claimer may have made a payment this one must find. */
  reclaimed: Schema.Boolean
})
export type AutoTopupRow = typeof AutoTopupRow.Type

const BlockerRow = Schema.Struct({ suspended: Schema.Boolean, enabled: Schema.Boolean, ours: Schema.Boolean })

/** Why a claimed attempt must not be charged now: its account's state changed after it was queued. */
export type AutoTopupBlocker = "account_suspended" | "auto_topup_disabled"

/** What the check before the charge found: the charge is this claimer's to make, blocked, or another's (or done). */
export type ChargeStart =
  | { readonly _tag: "Charge" }
  | { readonly _tag: "Blocked"; readonly blocker: AutoTopupBlocker }
  | { readonly _tag: "NotOurs" }

const COLUMNS = "id, account_id, amount_sen, status, transaction_id, payment_intent_id, created_at, claimed_until"

/**
 * The attempts' rows, decoded (a row of another shape is a defect). Their `SqlError` stays a failure: the
 * Stripe webhook's transaction uses them through `AutoTopupOutcomes` and counts a failed event by it.
 */
export class AutoTopups extends Context.Tag("nenas/AutoTopups")<AutoTopups, {
  /** Claims unfinished attempts (new ones, and ones whose claimer's lease lapsed) for `leaseMs`. */
  readonly claim: (now: Date, leaseMs: number) => Effect.Effect<ReadonlyArray<AutoTopupRow>, SqlError.SqlError>
  readonly attachTransaction: (id: string, transactionId: string) => Effect.Effect<void, SqlError.SqlError>
  /** Stripe accepted the charge: its intent, and the claim held until `holdUntil` while its event comes. */
  readonly attachIntent: (
    id: string,
    paymentIntentId: string,
    holdUntil: Date
  ) => Effect.Effect<void, SqlError.SqlError>
  /** Finishes an unfinished attempt; false when it was finished already. */
  readonly finish: (
    id: string,
    status: "succeeded" | "failed",
    at: Date,
    failureCode: string | null
  ) => Effect.Effect<boolean, SqlError.SqlError>
  readonly find: (id: string) => Effect.Effect<AutoTopupRow | undefined, SqlError.SqlError>
  /**
   * The last step before the charge, in one statement: the attempt is still unfinished and still carries this
   * claim's lease (`claimedUntil`), its account is not suspended and auto top-up is on; then its lease runs to
   * `holdUntil`, so no other claimer takes it while the charge is made. Read at charge time, not only at queue time.
   */
  readonly startCharge: (
    id: string,
    claimedUntil: Date | null,
    holdUntil: Date
  ) => Effect.Effect<ChargeStart, SqlError.SqlError>
}>() {
  static readonly layer = Layer.effect(
    AutoTopups,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const claim = SqlSchema.findAll({
        Request: Schema.Struct({ now: Schema.DateFromSelf, leaseMs: Schema.Number }),
        Result: AutoTopupRow,
        execute: ({ leaseMs, now }) =>
          sql`
            WITH due AS (
              SELECT id, status AS was FROM auto_topups
              WHERE status IN ('queued', 'charging') AND (claimed_until IS NULL OR claimed_until < ${now})
              ORDER BY created_at LIMIT 10 FOR UPDATE SKIP LOCKED
            )
            UPDATE auto_topups t SET status = 'charging', claimed_until = ${new Date(now.getTime() + leaseMs)}
            FROM due WHERE t.id = due.id
            RETURNING ${
            sql.unsafe(COLUMNS.split(", ").map((c) => `t.${c}`).join(", "))
          }, due.was = 'charging' AS reclaimed
          `
      })
      const find = SqlSchema.findOne({
        Request: Schema.String,
        Result: AutoTopupRow,
        execute: (id) => sql`SELECT ${sql.unsafe(COLUMNS)}, false AS reclaimed FROM auto_topups WHERE id = ${id}`
      })
      const blocker = SqlSchema.findOne({
        Request: Schema.Struct({ id: Schema.String, claimedUntil: Schema.NullOr(Schema.DateFromSelf) }),
        Result: BlockerRow,
        execute: ({ claimedUntil, id }) =>
          sql`
            SELECT a.suspended_at IS NOT NULL AS suspended, w.auto_topup_enabled AS enabled,
                   t.status = 'charging' AND t.claimed_until IS NOT DISTINCT FROM ${claimedUntil} AS ours
            FROM auto_topups t JOIN accounts a ON a.id = t.account_id JOIN wallets w ON w.account_id = t.account_id
            WHERE t.id = ${id}
          `
      })
      // The state check and the claim to charge are one statement: no other claimer or change slips between them.
      const start = (id: string, claimedUntil: Date | null, holdUntil: Date) =>
        sql`
          UPDATE auto_topups t SET claimed_until = ${holdUntil}
          FROM accounts a, wallets w
          WHERE t.id = ${id} AND t.status = 'charging' AND t.claimed_until IS NOT DISTINCT FROM ${claimedUntil}
            AND a.id = t.account_id AND a.suspended_at IS NULL
            AND w.account_id = t.account_id AND w.auto_topup_enabled
          RETURNING t.id
        `
      const whyNot = (id: string, claimedUntil: Date | null) =>
        blocker({ id, claimedUntil }).pipe(
          Effect.map((found): ChargeStart => {
            const row = Option.getOrUndefined(found)
            if (row?.ours !== true) return { _tag: "NotOurs" }
            if (row.suspended) return { _tag: "Blocked", blocker: "account_suspended" }
            return { _tag: "Blocked", blocker: "auto_topup_disabled" }
          }),
          Effect.catchTag("ParseError", Effect.die)
        )
      return AutoTopups.of({
        claim: (now, leaseMs) =>
          claim({ now, leaseMs }).pipe(Effect.catchTag("ParseError", Effect.die), Effect.withSpan("AutoTopups.claim")),
        attachTransaction: (id, transactionId) =>
          Effect.asVoid(sql`UPDATE auto_topups SET transaction_id = ${transactionId} WHERE id = ${id}`),
        attachIntent: (id, paymentIntentId, holdUntil) =>
          Effect.asVoid(
            sql`UPDATE auto_topups SET payment_intent_id = ${paymentIntentId}, claimed_until = ${holdUntil} WHERE id = ${id}`
          ),
        finish: (id, status, at, failureCode) =>
          Effect.map(
            sql`
              UPDATE auto_topups SET status = ${status}, failure_code = ${failureCode}, finished_at = ${at}, claimed_until = NULL
              WHERE id = ${id} AND status IN ('queued', 'charging') RETURNING id
            `,
            (rows) => rows.length > 0
          ),
        find: (id) =>
          find(id).pipe(
            Effect.map(Option.getOrUndefined),
            Effect.catchTag("ParseError", Effect.die),
            Effect.withSpan("AutoTopups.find")
          ),
        startCharge: (id, claimedUntil, holdUntil) =>
          Effect.flatMap(
            start(id, claimedUntil, holdUntil),
            (rows): Effect.Effect<ChargeStart, SqlError.SqlError> =>
              rows.length > 0 ? Effect.succeed({ _tag: "Charge" }) : whyNot(id, claimedUntil)
          ).pipe(Effect.withSpan("AutoTopups.startCharge"))
      })
    })
  )

  static readonly Test = makeTestLayer(AutoTopups)
}
