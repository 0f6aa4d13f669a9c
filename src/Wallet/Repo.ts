import { SqlClient, type SqlError, SqlSchema } from "@effect/sql"
import { Context, Effect, Layer, Option, Schema } from "effect"
import { AppConfig } from "../AppConfig.js"
import type { InsufficientBalance, PermissionDenied, SpendLimitExceeded } from "../Domain/Errors.js"
import { newId } from "../Domain/Ids.js"
import type { MicroMyr } from "../Domain/Money.js"
import { now } from "../Domain/Time.js"
import { RequestLogs } from "../Logs/RequestLogs.js"
import { LedgerEntry, type LedgerType as LedgerTypeSchema, Wallet as WalletSchema } from "../Wallet/Api.js"
import {
  GRANT_CHANNEL,
  type GrantsAsked,
  type GrantSizing,
  grantStatements,
  type GrantToGrow
} from "./Grants/GrantRows.js"
import { ReservationLeases } from "./Instances/Leases.js"
import { lockWallet } from "./Lock.js"
import { type Reservation, type ReserveInput, reserveStatements } from "./Reserve.js"
import { settleBatch } from "./Settlement/Settle.js"
import type { SettleItem } from "./Settlement/SettleBatch.js"

/**
 * The prepaid wallet as a bank keeps it. `open` makes the row at an account's
 * first sign-in. Every movement is one SQL transaction that locks the wallet
 * row (`Lock.ts`), so movements of one account are serialized:
 * - `reserve`/`reserveQuickly` move available → reserved before a live call runs (`Reserve.ts`);
 * - `growGrant` moves available → granted (a credit grant: `Grants/GrantRows.ts`, `Grants/GrantPool.ts`);
 * - `capture` moves reserved → spent (a `usage` entry) and returns the rest;
 * - `release` returns a reservation whole (the last two as batches of one: `Settlement/Settle.ts`);
 * - `post` credits or debits for payments, once per effect key.
 * Invariant: available + reserved + granted = the sum of the ledger (see Invariant.ts).
 */

export type Wallet = typeof WalletSchema.Type
export type LedgerType = typeof LedgerTypeSchema.Type

export type { Reservation, ReserveInput } from "./Reserve.js"

export const logCapture = (capture: Capture) =>
  Effect.logInfo("wallet capture").pipe(Effect.annotateLogs({ ...capture }))

export interface Capture {
  readonly reservationId: string
  /** What was billed: never more than the reservation, nor (late) than the wallet held. */
  readonly chargedMicroMyr: number
  readonly ledgerEntryId: string | null
}

export interface PostInput {
  readonly accountId: string
  readonly type: Exclude<LedgerType, "usage">
  /** Signed: credits positive. */
  readonly amountMicroMyr: number
  /** The effect this entry applies; an entry with the same key is never posted twice. */
  readonly effectKey: string
  readonly description: string
  readonly paymentTransactionId?: string | null
}

/** A ledger entry as the contract has it, with its time as a `Date`. */
export const LedgerEntryRow = Schema.Struct({
  ...LedgerEntry.fields,
  createdAt: Schema.DateFromSelf,
  /** The payment a top-up, refund or chargeback entry moved money for. */
  paymentTransactionId: Schema.NullOr(Schema.String)
})
export type LedgerEntryRow = typeof LedgerEntryRow.Type

export interface LedgerQuery {
  readonly page: number
  readonly limit: number
  readonly type?: LedgerType | undefined
}

/** The wallet row as stored: what grants hold is apart from what calls hold. */
export const StoredWallet = Schema.Struct({ ...WalletSchema.fields, grantedMicroMyr: Schema.Int })
export type StoredWallet = typeof StoredWallet.Type

const OpenHolds = Schema.Struct({ open: Schema.Int })

export type { GrantsAsked, GrantSizing } from "./Grants/GrantRows.js"

export class WalletRepo extends Context.Tag("nenas/WalletRepo")<WalletRepo, {
  /** Makes the account's empty wallet, unless it has one; inside the caller's transaction when there is one. */
  readonly open: (accountId: string) => Effect.Effect<void, SqlError.SqlError>
  /** The row as stored (grants apart); `Spending.balance` is what developers see. */
  readonly wallet: (accountId: string) => Effect.Effect<StoredWallet, SqlError.SqlError>
  /** Reserves in one transaction that explains a refusal: balance, suspension, the key's monthly limit, its member's budget. */
  readonly reserve: (
    input: ReserveInput
  ) => Effect.Effect<Reservation, InsufficientBalance | SpendLimitExceeded | PermissionDenied | SqlError.SqlError>
  /**
   * Reserves in one statement (a transaction of its own, the wallet row locked
   * for one round trip): undefined when refused, for `reserve` to explain.
   * Only for calls under no monthly limit (`isLimited`).
   */
  readonly reserveQuickly: (input: ReserveInput) => Effect.Effect<Reservation | undefined, SqlError.SqlError>
  /** What each of the account's keys was billed this month (in `BUSINESS_TIMEZONE`), as written: keys that spent nothing are absent. */
  readonly spentThisMonth: (accountId: string) => Effect.Effect<ReadonlyMap<string, number>, SqlError.SqlError>
  /** The same by member: all its keys together, deleted ones included (what its budget's check counts); members that spent nothing are absent. */
  readonly spentThisMonthByMember: (accountId: string) => Effect.Effect<ReadonlyMap<string, number>, SqlError.SqlError>
  /** The account's member's keys whose calls may be in flight: its keys, and those deleted lately. */
  readonly memberKeys: (accountId: string, memberId: string) => Effect.Effect<ReadonlyArray<string>, SqlError.SqlError>
  /** Bills `amount` (capped at the reservation) and returns the rest; repeating it bills nothing more. */
  readonly capture: (
    reservationId: string,
    amountMicroMyr: MicroMyr,
    description: string
  ) => Effect.Effect<Capture, SqlError.SqlError>
  /** Returns an open reservation whole; true when it was open. */
  readonly release: (reservationId: string) => Effect.Effect<boolean, SqlError.SqlError>
  /**
   * Grows this process's grant for the account by what `size` decides under
   * the wallet's lock (available → granted); returns the growth (0: none).
   * The grant row is created when `create`, and must exist otherwise.
   */
  readonly growGrant: (grant: GrantToGrow, size: GrantSizing) => Effect.Effect<number | "missing", SqlError.SqlError>
  /** Returns the grants of dead processes to their wallets; how many. */
  readonly returnDeadGrants: Effect.Effect<number, SqlError.SqlError>
  /** Asks every other instance (NOTIFY) to hand back its grants for the account: how many they hold, and when asked. */
  readonly askForGrants: (accountId: string) => Effect.Effect<GrantsAsked, SqlError.SqlError>
  /** How many of other instances' grants for the account have not been written since `askedAt`: not answered yet. */
  readonly unansweredGrants: (accountId: string, askedAt: Date) => Effect.Effect<number, SqlError.SqlError>
  /**
   * Tells every instance a monthly limit (a key's, or its member's) was set on the keys: each hands back the
   * account's grants, writing what the keys' calls hold of them.
   */
  readonly askForKeyHolds: (
    accountId: string,
    apiKeyIds: ReadonlyArray<string>
  ) => Effect.Effect<GrantsAsked, SqlError.SqlError>
  /** A payment's credit or debit; false when its effect was already posted. */
  readonly post: (input: PostInput) => Effect.Effect<boolean, SqlError.SqlError>
  /** The dashboard's page of the ledger, newest first (a failed read is a defect). */
  readonly ledger: (accountId: string, query: LedgerQuery) => Effect.Effect<ReadonlyArray<LedgerEntryRow>>
  /** Reservations still open, across every instance (for the operator's metrics). */
  readonly openHolds: Effect.Effect<number, SqlError.SqlError>
}>() {
  static readonly layer = Layer.effect(
    WalletRepo,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const { businessTimezone } = yield* AppConfig
      const leases = yield* ReservationLeases
      const logs = yield* RequestLogs

      /** One capture or release, as a batch of one (one copy of the settlement rules: `Settlement/Settle.ts`). */
      const settleOne = (item: SettleItem & { readonly _tag: "Capture" | "Release" }) =>
        Effect.flatMap(
          now,
          (at) => settleBatch({ items: [item], returns: [], logs: [], close: [], at, holder: leases.holder })
        ).pipe(
          Effect.map(({ items: [done] }) => done ?? { chargedMicroMyr: 0, ledgerEntryId: null, released: false }),
          Effect.provideService(SqlClient.SqlClient, sql),
          Effect.provideService(RequestLogs, logs),
          Effect.ensuring(leases.drop(item.reservationId))
        )

      const capture = (reservationId: string, amountMicroMyr: MicroMyr, description: string) =>
        settleOne({ _tag: "Capture", reservationId, amountMicroMyr, description }).pipe(
          Effect.map((done): Capture => ({
            reservationId,
            chargedMicroMyr: done.chargedMicroMyr,
            ledgerEntryId: done.ledgerEntryId
          })),
          Effect.tap(logCapture)
        )

      const release = (reservationId: string) =>
        settleOne({ _tag: "Release", reservationId }).pipe(
          Effect.map((done) => done.released),
          Effect.tap((released) =>
            released ? Effect.logInfo("wallet release").pipe(Effect.annotateLogs({ reservationId })) : Effect.void
          )
        )

      const post = (input: PostInput) =>
        sql.withTransaction(Effect.gen(function*() {
          const wallet = yield* lockWallet(sql, input.accountId)
          // Under the wallet lock, an entry committed by a concurrent twin is visible here.
          const seen = yield* sql`SELECT 1 FROM ledger_entries WHERE effect_key = ${input.effectKey}`
          if (seen.length > 0 || input.amountMicroMyr === 0) return false
          const at = yield* now
          const available = wallet.availableMicroMyr + input.amountMicroMyr
          const topup = input.type === "topup" ? input.amountMicroMyr : 0
          yield* sql`
            UPDATE wallets
            SET available_micro_myr = ${available},
                lifetime_topup_micro_myr = lifetime_topup_micro_myr + ${topup},
                updated_at = ${at}
            WHERE account_id = ${input.accountId}
          `
          yield* sql`
            INSERT INTO ledger_entries
              (id, account_id, type, amount_micro_myr, balance_after_micro_myr, description,
               payment_transaction_id, effect_key, created_at)
            VALUES (${newId("le")}, ${input.accountId}, ${input.type}, ${input.amountMicroMyr},
                    ${available + wallet.reservedMicroMyr + wallet.grantedMicroMyr}, ${input.description},
                    ${input.paymentTransactionId ?? null}, ${input.effectKey}, ${at})
          `
          // A debit may leave less than instances hold in grants: they hand them back (and run on exact holds).
          if (input.amountMicroMyr < 0) yield* sql`SELECT pg_notify(${GRANT_CHANNEL}, ${input.accountId})`
          return true
        })).pipe(Effect.tap((posted) =>
          posted
            ? Effect.logInfo("wallet post").pipe(Effect.annotateLogs({
              accountId: input.accountId,
              type: input.type,
              amountMicroMyr: input.amountMicroMyr,
              effectKey: input.effectKey,
              paymentTransactionId: input.paymentTransactionId ?? null
            }))
            : Effect.void
        ))

      // `wallet` is read on a call's hold (a free call's balance check) and `openHolds` by the metrics, which
      // report a failed read: both keep their `SqlError`; a row of another shape is a defect.
      const openHolds = SqlSchema.findAll({
        Request: Schema.Void,
        Result: OpenHolds,
        execute: () => sql`SELECT count(*)::int AS open FROM reservations WHERE status = 'open'`
      })(undefined).pipe(Effect.map((rows) => rows[0]?.open ?? 0), Effect.catchTag("ParseError", Effect.die))
      const storedWallet = SqlSchema.findOne({
        Request: Schema.String,
        Result: StoredWallet,
        execute: (accountId) =>
          sql`
            SELECT available_micro_myr, reserved_micro_myr, granted_micro_myr, lifetime_topup_micro_myr, lifetime_spend_micro_myr
            FROM wallets WHERE account_id = ${accountId}
          `
      })

      return WalletRepo.of({
        ...reserveStatements(sql, leases, businessTimezone),
        ...grantStatements(sql, leases.holder),
        open: (accountId) =>
          Effect.asVoid(
            sql`INSERT INTO wallets (account_id) VALUES (${accountId}) ON CONFLICT (account_id) DO NOTHING`
          ),
        openHolds,
        wallet: (accountId) =>
          storedWallet(accountId).pipe(
            Effect.map(
              Option.getOrElse((): StoredWallet => ({
                availableMicroMyr: 0,
                reservedMicroMyr: 0,
                grantedMicroMyr: 0,
                lifetimeTopupMicroMyr: 0,
                lifetimeSpendMicroMyr: 0
              }))
            ),
            Effect.catchTag("ParseError", Effect.die)
          ),
        capture,
        release,
        post,
        ledger: (accountId, query) =>
          SqlSchema.findAll({
            Request: Schema.Void,
            Result: LedgerEntryRow,
            execute: () =>
              sql`
                SELECT id, type, amount_micro_myr, balance_after_micro_myr, description, created_at,
                       payment_transaction_id
                FROM ledger_entries
                WHERE account_id = ${accountId}
                  ${query.type === undefined ? sql`` : sql`AND type = ${query.type}`}
                ORDER BY seq DESC
                LIMIT ${query.limit} OFFSET ${(query.page - 1) * query.limit}
              `
          })(undefined).pipe(Effect.orDie, Effect.withSpan("WalletRepo.ledger"))
      })
    })
  )
}
