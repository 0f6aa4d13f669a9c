import { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Clock, Context, Effect, Layer, Schedule } from "effect"
import { InsufficientBalance } from "../Domain/Errors.js"
import type { PermissionDenied, SpendLimitExceeded } from "../Domain/Errors.js"
import { newId } from "../Domain/Ids.js"
import type { MicroMyr } from "../Domain/Money.js"
import { microMyr, toMyrString } from "../Domain/Money.js"
import { RESERVATION_LEASE, ReservationLeases, secondsSql } from "../Wallet/Leases.js"
import type { Reservation, ReserveInput } from "../Wallet/Repo.js"
import { logCapture, logReserve, newReservation, WalletRepo } from "../Wallet/Repo.js"
import type { LoggedUsage, OpenLog } from "./RequestLogs.js"
import { RequestLogs } from "./RequestLogs.js"

/**
 * A model call's two money movements, each one SQL statement on the common
 * path: reserve (debit available, hold, log `pending`) and capture (bill,
 * return the rest, post the `usage` entry, log `billed`). A statement is its
 * own transaction, so the wallet row is locked for one round trip instead of
 * six. Every other case — a refusal to explain, a key with a monthly spend
 * limit (whose month-to-date sum must be read after the wallet's lock), a
 * reservation the sweeper already settled — goes through `WalletRepo`'s
 * transactions, which decide it exactly.
 */
/** How settlements ride out a database outage: about 25 s of retries, then the sweeper's turn. */
export const SETTLE_RETRY = Schedule.exponential("100 millis", 2).pipe(
  Schedule.either(Schedule.spaced("5 seconds")),
  Schedule.intersect(Schedule.recurs(10))
)

export class CallBilling extends Context.Tag("nenas/CallBilling")<CallBilling, {
  /** Holds the call's maximum (positive) and logs it `pending`. */
  readonly reserve: (
    input: ReserveInput,
    log: OpenLog
  ) => Effect.Effect<Reservation, InsufficientBalance | SpendLimitExceeded | PermissionDenied | SqlError.SqlError>
  /** A call whose maximum is 0 (a model priced at nothing) holds nothing: logs it `pending` unless the balance is negative. */
  readonly admitFree: (input: ReserveInput, log: OpenLog) => Effect.Effect<void, InsufficientBalance | SqlError.SqlError>
  /** Bills `amount` (at most the reservation) and logs `usage` with the cost billed; returns the cost billed. */
  readonly capture: (
    reservation: Reservation,
    amount: MicroMyr,
    description: string,
    usage: LoggedUsage
  ) => Effect.Effect<number, SqlError.SqlError>
}>() {
  static readonly layer = Layer.effect(
    CallBilling,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const wallet = yield* WalletRepo
      const logs = yield* RequestLogs
      const leases = yield* ReservationLeases

      const reserveInOneStatement = (input: ReserveInput, log: OpenLog) =>
        Effect.gen(function*() {
          const at = new Date(yield* Clock.currentTimeMillis)
          const reservation = newReservation(input)
          // The UPDATE waits for the wallet row and re-checks the balance on its newest version: no overdraft.
          const rows = yield* sql<{ reserved: number }>`
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
            ), logged AS (
              INSERT INTO request_logs (request_id, account_id, api_key_id, reservation_id, public_model, upstream_model,
                routing_category, endpoint, status, input_tokens, stream, created_at, holder)
              SELECT ${log.requestId}, ${log.accountId}, ${log.apiKeyId}, id, ${log.publicModel}, ${log.upstreamModel},
                     ${log.routingCategory}, ${log.endpoint}, 'pending', ${log.inputTokens}, ${log.stream}, ${at}, ${leases.holder}
              FROM held
              RETURNING request_id
            )
            SELECT count(*)::int AS reserved FROM logged
          `
          return rows[0]?.reserved === 1 ? reservation : undefined
        })

      /** A call priced at nothing (a free local model): no hold, but a negative balance still blocks it. */
      const admitFree = (input: ReserveInput, log: OpenLog) =>
        Effect.gen(function*() {
          const { availableMicroMyr } = yield* wallet.wallet(input.accountId)
          if (availableMicroMyr < 0) {
            return yield* new InsufficientBalance({
              message: `The wallet's balance is negative (RM ${toMyrString(microMyr(availableMicroMyr))}); live calls resume after a top-up.`
            })
          }
          yield* logs.open(log)
        })

      const reserve = (input: ReserveInput, log: OpenLog) =>
        Effect.gen(function*() {
          const fast = input.monthlySpendLimitMicroMyr === null ? yield* reserveInOneStatement(input, log) : undefined
          if (fast === undefined) {
            // Refused, or a spend limit to check: the transaction decides and explains.
            return yield* wallet.reserve(input, (reservation) => logs.open({ ...log, reservationId: reservation.id }))
          }
          yield* leases.hold(fast.id)
          yield* logReserve(fast)
          return fast
        })

      const captureInOneStatement = (reservation: Reservation, amount: MicroMyr, description: string, usage: LoggedUsage) =>
        Effect.gen(function*() {
          const at = new Date(yield* Clock.currentTimeMillis)
          const ledgerEntryId = newId("le")
          // Locks the reservation, then the wallet: the order every movement of a reservation takes.
          const rows = yield* sql<{ charged: number }>`
            WITH settled AS (
              UPDATE reservations
              SET status = 'captured', captured_micro_myr = LEAST(GREATEST(${amount}::bigint, 0), amount_micro_myr), settled_at = ${at}
              WHERE id = ${reservation.id} AND status = 'open'
              RETURNING account_id, api_key_id, request_id, amount_micro_myr, captured_micro_myr
            ), billed AS (
              UPDATE wallets w
              SET available_micro_myr = w.available_micro_myr + s.amount_micro_myr - s.captured_micro_myr,
                  reserved_micro_myr = w.reserved_micro_myr - s.amount_micro_myr,
                  lifetime_spend_micro_myr = w.lifetime_spend_micro_myr + s.captured_micro_myr,
                  updated_at = ${at}
              FROM settled s
              WHERE w.account_id = s.account_id
              RETURNING w.available_micro_myr + w.reserved_micro_myr AS balance_after, s.captured_micro_myr AS charged,
                        s.account_id, s.api_key_id, s.request_id
            ), entry AS (
              INSERT INTO ledger_entries
                (id, account_id, type, amount_micro_myr, balance_after_micro_myr, description, api_key_id, request_id, created_at)
              SELECT ${ledgerEntryId}, account_id, 'usage', -charged, balance_after, ${description}, api_key_id, request_id, ${at}
              FROM billed WHERE charged > 0
            ), logged AS (
              UPDATE request_logs
              SET status = 'billed', input_tokens = ${usage.inputTokens}, output_tokens = ${usage.outputTokens},
                  reasoning_tokens = ${usage.reasoningTokens}, cached_tokens = ${usage.cachedTokens},
                  usage_source = ${usage.usageSource}, search_count = ${usage.searchCount},
                  content_pages = ${usage.contentPages}, cost_micro_myr = (SELECT charged FROM billed),
                  latency_ms = ${usage.latencyMs}, completed_at = ${at}
              WHERE request_id = ${reservation.requestId} AND status = 'pending' AND EXISTS (SELECT 1 FROM billed)
            )
            SELECT charged FROM billed
          `
          const charged = rows[0]?.charged
          if (charged === undefined) return undefined
          yield* logCapture({
            reservationId: reservation.id,
            chargedMicroMyr: Number(charged),
            ledgerEntryId: Number(charged) > 0 ? ledgerEntryId : null
          })
          return charged
        })

      const capture = (reservation: Reservation, amount: MicroMyr, description: string, usage: LoggedUsage) =>
        captureOnce(reservation, amount, description, usage).pipe(
          // A database blip must not strand the hold: retrying is safe (a capture that did commit is found and not repeated).
          Effect.retry(SETTLE_RETRY),
          // Given up: stop renewing the lease, so that the sweeper settles the reservation once it lapses.
          Effect.tapErrorCause(() => leases.drop(reservation.id))
        )

      const captureOnce = (reservation: Reservation, amount: MicroMyr, description: string, usage: LoggedUsage) =>
        Effect.gen(function*() {
          const charged = yield* captureInOneStatement(reservation, amount, description, usage)
          if (charged !== undefined) {
            yield* leases.drop(reservation.id)
            return Number(charged)
          }
          // No longer open (the sweeper released it, or it was captured): the transaction settles it exactly.
          const done = yield* wallet.capture(reservation.id, amount, description, (c) =>
            logs.complete(reservation.requestId, { ...usage, costMicroMyr: c.chargedMicroMyr }, "billed"))
          return done.chargedMicroMyr
        })

      return { reserve, admitFree, capture }
    })
  )
}
