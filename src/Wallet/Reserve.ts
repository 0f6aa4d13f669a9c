import type { SqlClient, SqlError } from "@effect/sql"
import { Effect } from "effect"
import {
  accountSuspended,
  InsufficientBalance,
  NEGATIVE_BALANCE_GUIDANCE,
  type PermissionDenied,
  type SpendLimitExceeded
} from "../Domain/Errors.js"
import { newId } from "../Domain/Ids.js"
import { type MicroMyr, microMyr, toMyrString } from "../Domain/Money.js"
import { now } from "../Domain/Time.js"
import { secondsSql } from "./Instances/Instances.js"
import { RESERVATION_LEASE, type ReservationLeases } from "./Instances/Leases.js"
import { type LockedWallet, lockWallet } from "./Lock.js"
import { keyLimitRefusal, memberBudgetRefusal, type MonthToDate } from "./SpendLimits.js"

// Hand-cast SQL (docs/performance.md, "Hand-cast SQL on the call path"): every SQL reservation, on the call's path.

/**
 * Reservations taken (docs/money.md, "Reservations"): a live call's maximum moved from
 * available to reserved before it runs. Both ways of taking one — the exact
 * one that explains a refusal, and the quick one of one round trip — write it
 * with the same statement, `debitAndHold`.
 */

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

export interface ReserveInput {
  readonly accountId: string
  readonly apiKeyId: string
  /** The call's request id; one reservation per request. */
  readonly requestId: string
  readonly amountMicroMyr: MicroMyr
  /** The key's limit per `BUSINESS_TIMEZONE` month; null for none. */
  readonly monthlySpendLimitMicroMyr: number | null
  /** The member who made the key (null: none recorded); its budget caps all its keys' spend together. */
  readonly memberId: string | null
  /** The member's budget per `BUSINESS_TIMEZONE` month; null for none (or no member, or a removed one). */
  readonly memberMonthlySpendLimitMicroMyr: number | null
}

/** A new reservation for `input`; its lease runs from the database's now() when it is written. */
export const newReservation = (input: ReserveInput): Reservation => ({
  id: newId("rsv"),
  accountId: input.accountId,
  apiKeyId: input.apiKeyId,
  requestId: input.requestId,
  amountMicroMyr: input.amountMicroMyr
})

export interface ReserveStatements {
  readonly reserve: (
    input: ReserveInput
  ) => Effect.Effect<Reservation, InsufficientBalance | SpendLimitExceeded | PermissionDenied | SqlError.SqlError>
  readonly reserveQuickly: (input: ReserveInput) => Effect.Effect<Reservation | undefined, SqlError.SqlError>
  readonly spentThisMonth: (accountId: string) => Effect.Effect<ReadonlyMap<string, number>, SqlError.SqlError>
  readonly spentThisMonthByMember: (accountId: string) => Effect.Effect<ReadonlyMap<string, number>, SqlError.SqlError>
  readonly memberKeys: (accountId: string, memberId: string) => Effect.Effect<ReadonlyArray<string>, SqlError.SqlError>
}

/** The start of `at`'s month in `timezone`, as SQL. */
export const monthStart = (sql: SqlClient.SqlClient, at: Date, timezone: string) =>
  sql`date_trunc('month', ${at}::timestamptz AT TIME ZONE ${timezone}::text) AT TIME ZONE ${timezone}::text`

/** The reserve statements of this process (`leases.holder`), months counted in `businessTimezone`. */
export const reserveStatements = (
  sql: SqlClient.SqlClient,
  leases: ReservationLeases["Type"],
  businessTimezone: string
): ReserveStatements => {
  /** What the key spent this month, and what its calls in flight hold: reservations, and grants (`key_grant_holds`). */
  const monthToDate = (apiKeyId: string, at: Date) =>
    sql<MonthToDate>`
      SELECT
        COALESCE((
          SELECT -SUM(amount_micro_myr) FROM ledger_entries
          WHERE api_key_id = ${apiKeyId} AND type = 'usage' AND created_at >= ${monthStart(sql, at, businessTimezone)}
        ), 0)::bigint AS spent,
        COALESCE((
          SELECT SUM(amount_micro_myr) FROM reservations WHERE api_key_id = ${apiKeyId} AND status = 'open'
        ), 0)::bigint + COALESCE((
          SELECT SUM(amount_micro_myr) FROM key_grant_holds WHERE api_key_id = ${apiKeyId}
        ), 0)::bigint AS held
    `.pipe(Effect.map((rows) => rows[0] ?? { spent: 0, held: 0 }))

  /**
   * The member's keys whose spend counts toward its budget: those it has, and its deleted ones (a tombstone
   * whose key is gone; a rotated key's tombstones are the key itself, counted for its member now).
   */
  const memberKeyIds = (memberId: string) =>
    sql`
      SELECT id FROM api_keys WHERE member_id = ${memberId}
      UNION
      SELECT t.key_id FROM api_key_tombstones t
      WHERE t.member_id = ${memberId} AND NOT EXISTS (SELECT 1 FROM api_keys k WHERE k.id = t.key_id)
    `

  /** `monthToDate` of all the member's keys together. */
  const memberMonthToDate = (memberId: string, at: Date) =>
    sql<MonthToDate>`
      WITH member_keys AS (${memberKeyIds(memberId)})
      SELECT
        COALESCE((
          SELECT -SUM(amount_micro_myr) FROM ledger_entries
          WHERE api_key_id IN (SELECT id FROM member_keys) AND type = 'usage'
            AND created_at >= ${monthStart(sql, at, businessTimezone)}
        ), 0)::bigint AS spent,
        COALESCE((
          SELECT SUM(amount_micro_myr) FROM reservations WHERE api_key_id IN (SELECT id FROM member_keys) AND status = 'open'
        ), 0)::bigint + COALESCE((
          SELECT SUM(amount_micro_myr) FROM key_grant_holds WHERE api_key_id IN (SELECT id FROM member_keys)
        ), 0)::bigint AS held
    `.pipe(Effect.map((rows) => rows[0] ?? { spent: 0, held: 0 }))

  /**
   * The one reserve statement: moves `amount` available → reserved and writes
   * the reservation, unless the account is suspended or the wallet holds less.
   * Its UPDATE waits for the wallet row and checks on its newest version: no
   * overdraft. False when refused (nothing written).
   */
  const debitAndHold = (reservation: Reservation, at: Date) =>
    sql<{ held: number }>`
      WITH debit AS (
        UPDATE wallets w
        SET available_micro_myr = w.available_micro_myr - ${reservation.amountMicroMyr},
            reserved_micro_myr = w.reserved_micro_myr + ${reservation.amountMicroMyr},
            updated_at = ${at}
        FROM accounts a
        WHERE w.account_id = ${reservation.accountId} AND a.id = w.account_id
          AND a.suspended_at IS NULL AND w.available_micro_myr >= ${reservation.amountMicroMyr}
        RETURNING w.account_id
      ), held AS (
        INSERT INTO reservations (id, account_id, api_key_id, request_id, amount_micro_myr, expires_at, created_at, holder)
        SELECT ${reservation.id}, account_id, ${reservation.apiKeyId}, ${reservation.requestId}, ${reservation.amountMicroMyr},
               now() + ${secondsSql(RESERVATION_LEASE)} * interval '1 second', ${at}, ${leases.holder}
        FROM debit
        RETURNING id
      )
      SELECT count(*)::int AS held FROM held
    `.pipe(Effect.map((rows) => rows[0]?.held === 1))

  /** A reservation written: this process renews its lease until the call settles. */
  const held = (reservation: Reservation) =>
    leases.hold(reservation.id).pipe(Effect.zipRight(logReserve(reservation)), Effect.as(reservation))

  /** Why `input` may not reserve now, read under the wallet's lock; nothing when it may. */
  const refusal = (input: ReserveInput, wallet: LockedWallet, at: Date) =>
    Effect.gen(function*() {
      if (wallet.suspendedAt !== null) return yield* accountSuspended()
      if (wallet.availableMicroMyr < 0) {
        return yield* new InsufficientBalance({
          message: `The wallet's balance is negative (RM ${
            toMyrString(microMyr(wallet.availableMicroMyr))
          } available); calls resume after a top-up.`,
          guidance: NEGATIVE_BALANCE_GUIDANCE
        })
      }
      if (wallet.availableMicroMyr < input.amountMicroMyr) {
        return yield* new InsufficientBalance({
          message: `This request may cost up to RM ${toMyrString(input.amountMicroMyr)}, and the wallet holds RM ${
            toMyrString(microMyr(Math.max(wallet.availableMicroMyr, 0)))
          } available.`
        })
      }
      if (input.monthlySpendLimitMicroMyr !== null) {
        const refused = keyLimitRefusal(
          input.monthlySpendLimitMicroMyr,
          yield* monthToDate(input.apiKeyId, at),
          input.amountMicroMyr
        )
        if (refused !== undefined) return yield* refused
      }
      if (input.memberId !== null && input.memberMonthlySpendLimitMicroMyr !== null) {
        const month = yield* memberMonthToDate(input.memberId, at)
        const refused = memberBudgetRefusal(input.memberMonthlySpendLimitMicroMyr, month, input.amountMicroMyr)
        if (refused !== undefined) return yield* refused
      }
    })

  const reserve = (input: ReserveInput) =>
    sql.withTransaction(Effect.gen(function*() {
      if (input.amountMicroMyr <= 0) return yield* Effect.dieMessage("a reservation must be positive")
      const wallet = yield* lockWallet(sql, input.accountId)
      const at = yield* now
      yield* refusal(input, wallet, at)
      const reservation = newReservation(input)
      // Under the lock only a suspension committed since the check can refuse it.
      if (!(yield* debitAndHold(reservation, at))) return yield* accountSuspended()
      return reservation
    })).pipe(Effect.flatMap(held))

  const reserveQuickly = (input: ReserveInput) =>
    Effect.gen(function*() {
      if (input.amountMicroMyr <= 0) return yield* Effect.dieMessage("a reservation must be positive")
      const reservation = newReservation(input)
      return (yield* debitAndHold(reservation, yield* now)) ? yield* held(reservation) : undefined
    })

  const spentThisMonth = (accountId: string) =>
    Effect.gen(function*() {
      const rows = yield* sql<{ apiKeyId: string; spent: number }>`
        SELECT api_key_id, -SUM(amount_micro_myr)::bigint AS spent FROM ledger_entries
        WHERE account_id = ${accountId} AND type = 'usage' AND created_at >= ${
        monthStart(sql, yield* now, businessTimezone)
      }
        GROUP BY api_key_id
      `
      return new Map(rows.map((row) => [row.apiKeyId, Number(row.spent)]))
    })

  // Each key's spend goes to its member now, a deleted key's to the member its tombstone names (as the budget's check counts it).
  const spentThisMonthByMember = (accountId: string) =>
    Effect.gen(function*() {
      const rows = yield* sql<{ memberId: string; spent: number }>`
        WITH spent AS (
          SELECT api_key_id, -SUM(amount_micro_myr)::bigint AS spent FROM ledger_entries
          WHERE account_id = ${accountId} AND type = 'usage' AND created_at >= ${
        monthStart(sql, yield* now, businessTimezone)
      }
          GROUP BY api_key_id
        ), key_members AS (
          SELECT k.id AS api_key_id, k.member_id FROM api_keys k WHERE k.id IN (SELECT api_key_id FROM spent)
          UNION
          SELECT t.key_id, t.member_id FROM api_key_tombstones t
          WHERE t.key_id IN (SELECT api_key_id FROM spent) AND NOT EXISTS (SELECT 1 FROM api_keys k WHERE k.id = t.key_id)
        )
        SELECT m.member_id, SUM(s.spent)::bigint AS spent
        FROM spent s JOIN key_members m ON m.api_key_id = s.api_key_id
        WHERE m.member_id IS NOT NULL
        GROUP BY m.member_id
      `
      return new Map(rows.map((row) => [row.memberId, Number(row.spent)]))
    })

  /**
   * The member's keys whose calls may be in flight: its keys, and those deleted in the last day (a call
   * outlives its key's deletion by at most its upstream deadline), the newest 150 of them: every id fits
   * one NOTIFY payload (under 8000 bytes) with the 50 keys an account may have.
   */
  const memberKeys = (accountId: string, memberId: string) =>
    sql<{ id: string }>`
      SELECT id FROM api_keys WHERE member_id = ${memberId} AND account_id = ${accountId}
      UNION
      SELECT key_id FROM (
        SELECT t.key_id FROM api_key_tombstones t
        WHERE t.member_id = ${memberId} AND t.account_id = ${accountId} AND t.deleted_at > now() - interval '1 day'
          AND NOT EXISTS (SELECT 1 FROM api_keys k WHERE k.id = t.key_id)
        ORDER BY t.deleted_at DESC LIMIT 150
      ) deleted
    `.pipe(Effect.map((rows) => rows.map((row) => row.id)))

  return { reserve, reserveQuickly, spentThisMonth, spentThisMonthByMember, memberKeys }
}
