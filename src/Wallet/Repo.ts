import { SqlClient, type SqlError } from "@effect/sql"
import { Clock, Context, Effect, Layer } from "effect"
import { AppConfig } from "../AppConfig.js"
import { type LedgerEntry, type LedgerType as LedgerTypeSchema, type Wallet as WalletSchema } from "../Billing/Api.js"
import { accountSuspended, InsufficientBalance, type PermissionDenied, SpendLimitExceeded } from "../Domain/Errors.js"
import { newId } from "../Domain/Ids.js"
import { microMyr, type MicroMyr, toMyrString } from "../Domain/Money.js"
import { RESERVATION_LEASE, ReservationLeases, secondsSql } from "./Leases.js"

/**
 * The prepaid wallet as a bank keeps it. Every movement is one SQL transaction
 * that locks the wallet row first, so movements of one account are serialized:
 * - `reserve` moves available → reserved before a live call runs;
 * - `capture` moves reserved → spent (a `usage` entry) and returns the rest;
 * - `release` returns a reservation whole;
 * - `post` credits or debits for payments, once per effect key.
 * Invariant: available + reserved = the sum of the ledger (see Invariant.ts).
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
  readonly suspendedAt: Date | null
}

interface ReservationRow {
  readonly id: string
  readonly accountId: string
  readonly apiKeyId: string
  readonly requestId: string
  readonly amountMicroMyr: number
  readonly status: "open" | "captured" | "released"
  readonly capturedMicroMyr: number | null
}

export class WalletRepo extends Context.Tag("nenas/WalletRepo")<WalletRepo, {
  readonly wallet: (accountId: string) => Effect.Effect<Wallet, SqlError.SqlError>
  /** `withIt` runs in the reservation's transaction (the call's log row is written with it). */
  readonly reserve: (
    input: ReserveInput,
    withIt?: (reservation: Reservation) => Effect.Effect<void, SqlError.SqlError>
  ) => Effect.Effect<Reservation, InsufficientBalance | SpendLimitExceeded | PermissionDenied | SqlError.SqlError>
  /**
   * Bills `amount` (capped at the reservation) and returns the rest; repeating it bills nothing more.
   * `withIt` runs in the capture's transaction.
   */
  readonly capture: (
    reservationId: string,
    amountMicroMyr: MicroMyr,
    description: string,
    withIt?: (capture: Capture) => Effect.Effect<void, SqlError.SqlError>
  ) => Effect.Effect<Capture, SqlError.SqlError>
  /** Returns an open reservation whole; true when it was open. `withIt` runs in the release's transaction. */
  readonly release: (
    reservationId: string,
    withIt?: Effect.Effect<void, SqlError.SqlError>
  ) => Effect.Effect<boolean, SqlError.SqlError>
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

      const now = Effect.map(Clock.currentTimeMillis, (ms) => new Date(ms))

      /** Locks the wallet row: every movement of one account queues here. */
      const lockWallet = (accountId: string) =>
        sql<WalletLockRow>`
          SELECT w.available_micro_myr, w.reserved_micro_myr, w.lifetime_topup_micro_myr,
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

      const reserve = (input: ReserveInput, withIt?: (reservation: Reservation) => Effect.Effect<void, SqlError.SqlError>) =>
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
          if (withIt !== undefined) yield* withIt(reservation)
          return reservation
        })).pipe(
          Effect.tap((reservation) => leases.hold(reservation.id)),
          Effect.tap(logReserve)
        )

      const lockReservation = (reservationId: string) =>
        sql<ReservationRow>`
          SELECT id, account_id, api_key_id, request_id, amount_micro_myr, status, captured_micro_myr
          FROM reservations WHERE id = ${reservationId} FOR UPDATE
        `.pipe(Effect.flatMap((rows) =>
          rows[0] === undefined ? Effect.dieMessage(`no reservation ${reservationId}`) : Effect.succeed(rows[0])
        ))

      const existingCapture = (reservation: ReservationRow) =>
        sql<{ id: string }>`
          SELECT id FROM ledger_entries WHERE type = 'usage' AND request_id = ${reservation.requestId}
        `.pipe(Effect.map((rows): Capture => ({
          reservationId: reservation.id,
          chargedMicroMyr: reservation.capturedMicroMyr ?? 0,
          ledgerEntryId: rows[0]?.id ?? null
        })))

      const capture = (
        reservationId: string,
        amountMicroMyr: MicroMyr,
        description: string,
        withIt?: (capture: Capture) => Effect.Effect<void, SqlError.SqlError>
      ) =>
        sql.withTransaction(Effect.tap(settle(reservationId, amountMicroMyr, description), (done) => withIt === undefined ? Effect.void : withIt(done)))
          .pipe(
            Effect.ensuring(leases.drop(reservationId)),
            Effect.tap(logCapture)
          )

      const settle = (reservationId: string, amountMicroMyr: MicroMyr, description: string) =>
        Effect.gen(function*() {
          const reservation = yield* lockReservation(reservationId)
          if (reservation.status === "captured") return yield* existingCapture(reservation)
          const wallet = yield* lockWallet(reservation.accountId)
          const open = reservation.status === "open"
          const held = open ? reservation.amountMicroMyr : 0
          // A reservation the sweeper released (its owner looked dead) is billed late, from what the wallet holds.
          const ceiling = open ? reservation.amountMicroMyr : Math.min(reservation.amountMicroMyr, Math.max(wallet.availableMicroMyr, 0))
          const charged = Math.min(Math.max(amountMicroMyr, 0), ceiling)
          const at = yield* now
          const available = wallet.availableMicroMyr + held - charged
          const reserved = wallet.reservedMicroMyr - held
          yield* sql`
            UPDATE wallets
            SET available_micro_myr = ${available}, reserved_micro_myr = ${reserved},
                lifetime_spend_micro_myr = lifetime_spend_micro_myr + ${charged}, updated_at = ${at}
            WHERE account_id = ${reservation.accountId}
          `
          yield* sql`
            UPDATE reservations
            SET status = 'captured', captured_micro_myr = ${charged}, settled_at = COALESCE(settled_at, ${at})
            WHERE id = ${reservation.id}
          `
          if (charged === 0) return { reservationId, chargedMicroMyr: 0, ledgerEntryId: null }
          const ledgerEntryId = newId("le")
          yield* sql`
            INSERT INTO ledger_entries
              (id, account_id, type, amount_micro_myr, balance_after_micro_myr, description, api_key_id, request_id, created_at)
            VALUES (${ledgerEntryId}, ${reservation.accountId}, 'usage', ${-charged}, ${available + reserved},
                    ${description}, ${reservation.apiKeyId}, ${reservation.requestId}, ${at})
          `
          return { reservationId, chargedMicroMyr: charged, ledgerEntryId }
        })

      const release = (reservationId: string, withIt?: Effect.Effect<void, SqlError.SqlError>) =>
        sql.withTransaction(Effect.gen(function*() {
          const reservation = yield* lockReservation(reservationId)
          // The log is closed whatever the reservation's state: a failure settles in one step.
          if (withIt !== undefined) yield* withIt
          if (reservation.status !== "open") return false
          yield* lockWallet(reservation.accountId)
          const at = yield* now
          yield* sql`
            UPDATE wallets
            SET available_micro_myr = available_micro_myr + ${reservation.amountMicroMyr},
                reserved_micro_myr = reserved_micro_myr - ${reservation.amountMicroMyr},
                updated_at = ${at}
            WHERE account_id = ${reservation.accountId}
          `
          yield* sql`UPDATE reservations SET status = 'released', settled_at = ${at} WHERE id = ${reservation.id}`
          return true
        })).pipe(
          Effect.ensuring(leases.drop(reservationId)),
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
                    ${available + wallet.reservedMicroMyr}, ${input.description},
                    ${input.paymentTransactionId ?? null}, ${input.effectKey}, ${at})
          `
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
          sql<Wallet>`
            SELECT available_micro_myr, reserved_micro_myr, lifetime_topup_micro_myr, lifetime_spend_micro_myr
            FROM wallets WHERE account_id = ${accountId}
          `.pipe(Effect.map((rows) =>
            rows[0] ?? { availableMicroMyr: 0, reservedMicroMyr: 0, lifetimeTopupMicroMyr: 0, lifetimeSpendMicroMyr: 0 }
          )),
        reserve,
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
