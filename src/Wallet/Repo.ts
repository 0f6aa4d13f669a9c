import { SqlClient, type SqlError } from "@effect/sql"
import { Clock, Context, Effect, Layer } from "effect"
import { AppConfig } from "../AppConfig.js"
import { type LedgerEntry, type LedgerType as LedgerTypeSchema, type Wallet as WalletSchema } from "../Wallet/Api.js"
import { accountSuspended, InsufficientBalance, type PermissionDenied, SpendLimitExceeded } from "../Domain/Errors.js"
import { newId } from "../Domain/Ids.js"
import { microMyr, type MicroMyr, toMyrString } from "../Domain/Money.js"
import { RequestLogs } from "../Logs/RequestLogs.js"
import { holderDead, RESERVATION_LEASE, ReservationLeases, secondsSql } from "./Leases.js"
import { type SettleItem, settleBatch } from "./Settle.js"

/** Where instances ask each other to hand back their grants for an account (the payload). */
export const GRANT_CHANNEL = "nenas_grants"

/**
 * The prepaid wallet as a bank keeps it. Every movement is one SQL transaction
 * that locks the wallet row, so movements of one account are serialized:
 * - `reserve`/`reserveQuickly` move available → reserved before a live call runs;
 * - `growGrant` moves available → granted (a credit grant: `Spending.ts`);
 * - `capture` moves reserved → spent (a `usage` entry) and returns the rest;
 * - `release` returns a reservation whole (the last two as batches of one: `Settle.ts`);
 * - `post` credits or debits for payments, once per effect key.
 * Invariant: available + reserved + granted = the sum of the ledger (see Invariant.ts).
 */

export type Wallet = typeof WalletSchema.Type
export type LedgerType = typeof LedgerTypeSchema.Type

export interface Reservation {
  readonly id: string
  readonly accountId: string
  readonly apiKeyId: string
  readonly requestId: string
  readonly amountMicroMyr: number
}

/**
 * One info line per money movement, with its ids, wherever the movement is
 * made (here, or in the call's one-statement reserve and capture).
 */
export const logReserve = (reservation: Reservation) =>
  Effect.logInfo("wallet reserve").pipe(Effect.annotateLogs({
    reservationId: reservation.id,
    accountId: reservation.accountId,
    apiKeyId: reservation.apiKeyId,
    requestId: reservation.requestId,
    amountMicroMyr: reservation.amountMicroMyr
  }))

export const logCapture = (capture: Capture) => Effect.logInfo("wallet capture").pipe(Effect.annotateLogs({ ...capture }))

export interface ReserveInput {
  readonly accountId: string
  readonly apiKeyId: string
  /** The call's request id; one reservation per request. */
  readonly requestId: string
  readonly amountMicroMyr: MicroMyr
  /** The key's limit per `BUSINESS_TIMEZONE` month; null for none. */
  readonly monthlySpendLimitMicroMyr: number | null
}

/** A new reservation for `input`; its lease runs from the database's now() when it is written. */
export const newReservation = (input: ReserveInput): Reservation => ({
  id: newId("rsv"),
  accountId: input.accountId,
  apiKeyId: input.apiKeyId,
  requestId: input.requestId,
  amountMicroMyr: input.amountMicroMyr
})

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
export interface LedgerEntryRow extends Omit<typeof LedgerEntry.Type, "createdAt"> {
  readonly createdAt: Date
}

export interface LedgerQuery {
  readonly page: number
  readonly limit: number
  readonly type?: LedgerType | undefined
}

interface WalletLockRow extends Wallet {
  readonly grantedMicroMyr: number
  readonly suspendedAt: Date | null
}

/** The wallet row as stored: what grants hold is apart from what calls hold. */
export interface StoredWallet extends Wallet {
  readonly grantedMicroMyr: number
}

/** A grant's growth, decided under the wallet's lock from what it holds. */
export type GrantSizing = (wallet: { readonly availableMicroMyr: number; readonly heldMicroMyr: number }) => number

export class WalletRepo extends Context.Tag("nenas/WalletRepo")<WalletRepo, {
  /** The row as stored (grants apart); `Spending.balance` is what developers see. */
  readonly wallet: (accountId: string) => Effect.Effect<StoredWallet, SqlError.SqlError>
  /** Reserves in one transaction that explains a refusal: balance, suspension, the key's monthly limit. */
  readonly reserve: (
    input: ReserveInput
  ) => Effect.Effect<Reservation, InsufficientBalance | SpendLimitExceeded | PermissionDenied | SqlError.SqlError>
  /**
   * Reserves in one statement (a transaction of its own, the wallet row locked
   * for one round trip): undefined when refused, for `reserve` to explain.
   * Only for keys without a monthly limit.
   */
  readonly reserveQuickly: (input: ReserveInput) => Effect.Effect<Reservation | undefined, SqlError.SqlError>
  /** Bills `amount` (capped at the reservation) and returns the rest; repeating it bills nothing more. */
  readonly capture: (reservationId: string, amountMicroMyr: MicroMyr, description: string) => Effect.Effect<Capture, SqlError.SqlError>
  /** Returns an open reservation whole; true when it was open. */
  readonly release: (reservationId: string) => Effect.Effect<boolean, SqlError.SqlError>
  /**
   * Grows this process's grant for the account by what `size` decides under
   * the wallet's lock (available → granted); returns the growth (0: none).
   * The grant row is created when `create`, and must exist otherwise.
   */
  readonly growGrant: (
    grant: { readonly id: string; readonly accountId: string; readonly create: boolean },
    size: GrantSizing
  ) => Effect.Effect<number | "missing", SqlError.SqlError>
  /** Returns the grants of dead processes to their wallets; how many. */
  readonly returnDeadGrants: Effect.Effect<number, SqlError.SqlError>
  /** A payment's credit or debit; false when its effect was already posted. */
  readonly post: (input: PostInput) => Effect.Effect<boolean, SqlError.SqlError>
  readonly ledger: (accountId: string, query: LedgerQuery) => Effect.Effect<ReadonlyArray<LedgerEntryRow>, SqlError.SqlError>
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

      const now = Effect.map(Clock.currentTimeMillis, (ms) => new Date(ms))

      /** Locks the wallet row: every movement of one account queues here. */
      const lockWallet = (accountId: string) =>
        sql<WalletLockRow>`
          SELECT w.available_micro_myr, w.reserved_micro_myr, w.granted_micro_myr, w.lifetime_topup_micro_myr,
                 w.lifetime_spend_micro_myr, a.suspended_at
          FROM wallets w JOIN accounts a ON a.id = w.account_id
          WHERE w.account_id = ${accountId}
          FOR UPDATE OF w
        `.pipe(Effect.flatMap((rows) =>
          rows[0] === undefined ? Effect.dieMessage(`no wallet for account ${accountId}`) : Effect.succeed(rows[0])
        ))

      const monthToDate = (apiKeyId: string, at: Date) =>
        sql<{ spent: number; held: number }>`
          SELECT
            COALESCE((
              SELECT -SUM(amount_micro_myr) FROM ledger_entries
              WHERE api_key_id = ${apiKeyId} AND type = 'usage'
                AND created_at >= date_trunc('month', ${at}::timestamptz AT TIME ZONE ${businessTimezone}::text)
                                  AT TIME ZONE ${businessTimezone}::text
            ), 0)::bigint AS spent,
            COALESCE((
              SELECT SUM(amount_micro_myr) FROM reservations WHERE api_key_id = ${apiKeyId} AND status = 'open'
            ), 0)::bigint AS held
        `.pipe(Effect.map((rows) => rows[0] ?? { spent: 0, held: 0 }))

      const reserve = (input: ReserveInput) =>
        sql.withTransaction(Effect.gen(function*() {
          if (input.amountMicroMyr <= 0) return yield* Effect.dieMessage("a reservation must be positive")
          const wallet = yield* lockWallet(input.accountId)
          if (wallet.suspendedAt !== null) {
            return yield* accountSuspended()
          }
          if (wallet.availableMicroMyr < input.amountMicroMyr) {
            return yield* new InsufficientBalance({
              message: `This request may cost up to RM ${toMyrString(input.amountMicroMyr)}, and the wallet holds RM ${
                toMyrString(microMyr(Math.max(wallet.availableMicroMyr, 0)))
              } available.`
            })
          }
          const at = yield* now
          if (input.monthlySpendLimitMicroMyr !== null) {
            const { held, spent } = yield* monthToDate(input.apiKeyId, at)
            if (spent + held + input.amountMicroMyr > input.monthlySpendLimitMicroMyr) {
              return yield* new SpendLimitExceeded({
                message: `This key's monthly spend limit is RM ${
                  toMyrString(microMyr(input.monthlySpendLimitMicroMyr))
                }; it has spent RM ${toMyrString(microMyr(spent))} this month, RM ${
                  toMyrString(microMyr(held))
                } is held for calls in flight, and this request may cost up to RM ${
                  toMyrString(input.amountMicroMyr)
                }.`
              })
            }
          }
          const reservation = newReservation(input)
          yield* sql`
            INSERT INTO reservations (id, account_id, api_key_id, request_id, amount_micro_myr, expires_at, created_at, holder)
            VALUES (${reservation.id}, ${input.accountId}, ${input.apiKeyId}, ${input.requestId},
                    ${input.amountMicroMyr}, now() + ${secondsSql(RESERVATION_LEASE)} * interval '1 second', ${at},
                    ${leases.holder})
          `
          yield* sql`
            UPDATE wallets
            SET available_micro_myr = available_micro_myr - ${input.amountMicroMyr},
                reserved_micro_myr = reserved_micro_myr + ${input.amountMicroMyr},
                updated_at = ${at}
            WHERE account_id = ${input.accountId}
          `
          return reservation
        })).pipe(
          Effect.tap((reservation) => leases.hold(reservation.id)),
          Effect.tap(logReserve)
        )

      const reserveQuickly = (input: ReserveInput) =>
        Effect.gen(function*() {
          if (input.amountMicroMyr <= 0) return yield* Effect.dieMessage("a reservation must be positive")
          const at = yield* now
          const reservation = newReservation(input)
          // The UPDATE waits for the wallet row and re-checks the balance on its newest version: no overdraft.
          const rows = yield* sql<{ held: number }>`
            WITH debit AS (
              UPDATE wallets w
              SET available_micro_myr = w.available_micro_myr - ${input.amountMicroMyr},
                  reserved_micro_myr = w.reserved_micro_myr + ${input.amountMicroMyr},
                  updated_at = ${at}
              FROM accounts a
              WHERE w.account_id = ${input.accountId} AND a.id = w.account_id
                AND a.suspended_at IS NULL AND w.available_micro_myr >= ${input.amountMicroMyr}
              RETURNING w.account_id
            ), held AS (
              INSERT INTO reservations (id, account_id, api_key_id, request_id, amount_micro_myr, expires_at, created_at, holder)
              SELECT ${reservation.id}, account_id, ${input.apiKeyId}, ${input.requestId}, ${input.amountMicroMyr},
                     now() + ${secondsSql(RESERVATION_LEASE)} * interval '1 second', ${at}, ${leases.holder}
              FROM debit
              RETURNING id
            )
            SELECT count(*)::int AS held FROM held
          `
          if (rows[0]?.held !== 1) return undefined
          yield* leases.hold(reservation.id)
          yield* logReserve(reservation)
          return reservation
        })

      const growGrant = (
        grant: { readonly id: string; readonly accountId: string; readonly create: boolean },
        size: GrantSizing
      ) =>
        sql.withTransaction(Effect.gen(function*() {
          const wallet = yield* lockWallet(grant.accountId)
          if (wallet.suspendedAt !== null) return 0
          const rows = yield* sql<{ amountMicroMyr: number }>`
            SELECT amount_micro_myr FROM credit_grants WHERE id = ${grant.id} FOR UPDATE
          `
          const held = rows[0]?.amountMicroMyr
          if (held === undefined && !grant.create) return "missing" as const
          const growth = Math.floor(size({ availableMicroMyr: wallet.availableMicroMyr, heldMicroMyr: held ?? 0 }))
          if (growth <= 0 || growth > wallet.availableMicroMyr) return 0
          const at = yield* now
          yield* sql`
            UPDATE wallets
            SET available_micro_myr = available_micro_myr - ${growth}, granted_micro_myr = granted_micro_myr + ${growth},
                updated_at = ${at}
            WHERE account_id = ${grant.accountId}
          `
          yield* held === undefined
            ? sql`
              INSERT INTO credit_grants (id, account_id, holder, amount_micro_myr, created_at, updated_at)
              VALUES (${grant.id}, ${grant.accountId}, ${leases.holder}, ${growth}, ${at}, ${at})
            `
            : sql`UPDATE credit_grants SET amount_micro_myr = amount_micro_myr + ${growth}, updated_at = ${at} WHERE id = ${grant.id}`
          return growth
        }))

      const returnDeadGrants = Effect.gen(function*() {
        const dead = yield* sql<{ id: string; accountId: string }>`
          SELECT id, account_id FROM credit_grants WHERE ${holderDead(sql, "holder", leases.holder)} LIMIT 500
        `
        let returned = 0
        for (const grant of dead) {
          const done = yield* sql.withTransaction(Effect.gen(function*() {
            yield* lockWallet(grant.accountId)
            const rows = yield* sql<{ amountMicroMyr: number }>`
              DELETE FROM credit_grants WHERE id = ${grant.id} RETURNING amount_micro_myr
            `
            const amount = rows[0]?.amountMicroMyr
            if (amount === undefined) return false
            yield* sql`
              UPDATE wallets
              SET available_micro_myr = available_micro_myr + ${amount}, granted_micro_myr = granted_micro_myr - ${amount}
              WHERE account_id = ${grant.accountId}
            `
            return true
          }))
          if (done) returned++
        }
        return returned
      })

      /** One capture or release, as a batch of one (one copy of the settlement rules: `Settle.ts`). */
      const settleOne = (item: SettleItem & { readonly _tag: "Capture" | "Release" }) =>
        Effect.flatMap(now, (at) =>
          settleBatch({ items: [item], returns: [], logs: [], close: [], at, holder: leases.holder })).pipe(
            Effect.map(({ items: [done] }) => done ?? { chargedMicroMyr: 0, ledgerEntryId: null, released: false }),
            Effect.provideService(SqlClient.SqlClient, sql),
            Effect.provideService(RequestLogs, logs),
            Effect.ensuring(leases.drop(item.reservationId))
          )

      const capture = (reservationId: string, amountMicroMyr: MicroMyr, description: string) =>
        settleOne({ _tag: "Capture", reservationId, amountMicroMyr, description }).pipe(
          Effect.map((done): Capture => ({ reservationId, chargedMicroMyr: done.chargedMicroMyr, ledgerEntryId: done.ledgerEntryId })),
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
          const wallet = yield* lockWallet(input.accountId)
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

      const openHolds = Effect.map(
        sql<{ readonly open: number }>`SELECT count(*)::int AS open FROM reservations WHERE status = 'open'`,
        (rows) => rows[0]?.open ?? 0
      )

      return WalletRepo.of({
        openHolds,
        wallet: (accountId) =>
          sql<StoredWallet>`
            SELECT available_micro_myr, reserved_micro_myr, granted_micro_myr, lifetime_topup_micro_myr, lifetime_spend_micro_myr
            FROM wallets WHERE account_id = ${accountId}
          `.pipe(Effect.map((rows) =>
            rows[0] ??
              { availableMicroMyr: 0, reservedMicroMyr: 0, grantedMicroMyr: 0, lifetimeTopupMicroMyr: 0, lifetimeSpendMicroMyr: 0 }
          )),
        reserve,
        reserveQuickly,
        growGrant,
        returnDeadGrants,
        capture,
        release,
        post,
        ledger: (accountId, query) =>
          sql<LedgerEntryRow>`
            SELECT id, type, amount_micro_myr, balance_after_micro_myr, description, created_at
            FROM ledger_entries
            WHERE account_id = ${accountId}
              ${query.type === undefined ? sql`` : sql`AND type = ${query.type}`}
            ORDER BY seq DESC
            LIMIT ${query.limit} OFFSET ${(query.page - 1) * query.limit}
          `
      })
    })
  )
}
