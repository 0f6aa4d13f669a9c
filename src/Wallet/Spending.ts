import { SqlClient, type SqlError } from "@effect/sql"
import { Context, Duration, Effect, Either, Layer, Schedule } from "effect"
import type { PermissionDenied, SpendLimitExceeded } from "../Domain/Errors.js"
import { InsufficientBalance, NEGATIVE_BALANCE_GUIDANCE } from "../Domain/Errors.js"
import type { MicroMyr } from "../Domain/Money.js"
import { microMyr, toMyrString } from "../Domain/Money.js"
import type { LoggedAttempt, LogWrite, OpenLog, SettledUsage } from "../Logs/RequestLogs.js"
import { failedRow, logRow, RequestLogs } from "../Logs/RequestLogs.js"
import { Metrics } from "../Observability/Metrics.js"
import type { StoredWrite } from "../Responses/Store.js"
import { type CallHold, reservationIdOf } from "./CallHold.js"
import { type GrantPool, makeGrantPool } from "./Grants/GrantPool.js"
import { ReservationLeases } from "./Instances/Leases.js"
import { payNow, type WhenShort } from "./Instances/PayNow.js"
import type { GrantsAsked, Wallet } from "./Repo.js"
import { WalletRepo } from "./Repo.js"
import type { ReserveInput } from "./Reserve.js"
import { makeSettlementQueue, type SettlementQueue } from "./Settlement/SettlementQueue.js"
import { isLimited } from "./SpendLimits.js"

export type { CallHold } from "./CallHold.js"

/** How long a refused call waits for other instances to hand their grants back. */
const RECLAIM_WAIT_MS = 1000

/**
 * The wallet's side of a model call (docs/money.md, "A call's money"): hold the call's
 * maximum before it runs — in memory from a credit grant when the account
 * spends often and the wallet is large, otherwise in one SQL reservation —
 * then settle it: the charge, its ledger entry and the call's log row are
 * queued and written in batches, one transaction at most `FLUSH_INTERVAL`
 * apart, never on the call's path. Reads of the wallet, ledger and logs go
 * through `settled` first, so they include every call this instance answered.
 * The grants live in `Grants/GrantPool.ts`, the batches in `Settlement/SettlementQueue.ts`; this
 * is the façade the call path uses.
 */
export class Spending extends Context.Tag("nenas/Spending")<Spending, {
  /** Holds the call's maximum (`input`; null for a test key, which holds nothing). */
  readonly hold: (
    input: ReserveInput | null,
    log: OpenLog
  ) => Effect.Effect<CallHold, InsufficientBalance | SpendLimitExceeded | PermissionDenied | SqlError.SqlError>
  /**
   * Bills `amount` (at most the hold) and logs the usage; returns the cost
   * billed. Written with the next flush — unless this instance's beat lapsed
   * since the hold was taken (its hold may have been taken back): then it is
   * paid now, from the wallet if need be, before the caller answers; when the
   * wallet cannot pay it, `refuse` fails (the hold returned, the call logged
   * failed) and `bill what it can` bills what it holds and records the shortfall.
   * `stored`, the call's stored response, is written with the settlement.
   */
  readonly settle: (
    hold: CallHold,
    amount: MicroMyr,
    description: string,
    usage: SettledUsage,
    whenShort: WhenShort,
    stored?: StoredWrite
  ) => Effect.Effect<number, InsufficientBalance>
  /** Returns the hold whole and logs the failure (cost 0), with the call's upstream attempts. */
  readonly fail: (
    hold: CallHold,
    errorCode: string,
    latencyMs: number,
    attempts?: ReadonlyArray<LoggedAttempt>
  ) => Effect.Effect<void>
  /** A call refused before it held anything: one `failed` row. */
  readonly refused: (log: OpenLog, errorCode: string, latencyMs: number) => Effect.Effect<void>
  /**
   * Writes everything queued so far; reads that must include this instance's
   * calls run after it. A flush the database refuses is left to the retries:
   * the read goes on with what is written.
   */
  readonly settled: Effect.Effect<void>
  /** The balance as developers see it: grants are available money, calls in flight are reserved (a failed read is a defect). */
  readonly balance: (accountId: string) => Effect.Effect<Wallet>
  /** What each of the account's keys was billed this month, this instance's calls included (a failed read is a defect). */
  readonly spentThisMonth: (accountId: string) => Effect.Effect<ReadonlyMap<string, number>>
  /**
   * What each of the account's members' keys were billed this month together, deleted keys included (what its
   * budget's check counts), this instance's calls included; members that spent nothing are absent (a failed read is a defect).
   */
  readonly spentThisMonthByMember: (accountId: string) => Effect.Effect<ReadonlyMap<string, number>>
  /**
   * A monthly limit was set on the key (or lowered): every instance hands back
   * the account's grants and writes what the key's calls in flight on them
   * hold, and what they were charged but not yet written, for the limit's
   * check to count. Returns once they answered (or after a second); a failed write is a defect.
   */
  readonly limitSet: (accountId: string, apiKeyId: string) => Effect.Effect<void>
  /**
   * A member's monthly budget was set (or lowered), committed: `limitSet` for each of the member's keys (and
   * those deleted lately, whose calls may still run), in one request to every instance.
   */
  readonly memberLimitSet: (accountId: string, memberId: string) => Effect.Effect<void>
}>() {
  static readonly layer = Layer.scoped(
    Spending,
    Effect.gen(function*() {
      const wallets = yield* WalletRepo
      const pool = yield* makeGrantPool
      // Made after the pool: its finalizer (the last flush, every grant handed back) runs before the pool stops listening.
      const queue = yield* makeSettlementQueue(pool)
      const sql = yield* SqlClient.SqlClient
      const calls: Calls = {
        wallets,
        pool,
        queue,
        nowMs: (yield* Effect.clock).currentTimeMillis,
        sql,
        context: Context.make(SqlClient.SqlClient, sql).pipe(Context.add(RequestLogs, yield* RequestLogs)),
        leases: yield* ReservationLeases,
        metrics: yield* Metrics
      }
      const settled = queue.flush.pipe(
        Effect.catchAllCause((cause) => Effect.logWarning("settlements could not be written before a read", cause))
      )
      return Spending.of({
        hold: (input, log) => hold(calls, input, log),
        settle: (held, amount, description, usage, whenShort, stored) =>
          settle(calls, held, amount, description, usage, whenShort, stored),
        fail: (held, errorCode, latencyMs, attempts) => fail(calls, held, errorCode, latencyMs, attempts),
        refused: (log, errorCode, latencyMs) => refused(calls, log, errorCode, latencyMs),
        settled,
        balance: (accountId) =>
          Effect.zipRight(settled, balance(calls, accountId)).pipe(Effect.orDie, Effect.withSpan("Spending.balance")),
        spentThisMonth: (accountId) =>
          Effect.zipRight(settled, wallets.spentThisMonth(accountId)).pipe(
            Effect.orDie,
            Effect.withSpan("Spending.spentThisMonth")
          ),
        spentThisMonthByMember: (accountId) =>
          Effect.zipRight(settled, wallets.spentThisMonthByMember(accountId)).pipe(
            Effect.orDie,
            Effect.withSpan("Spending.spentThisMonthByMember")
          ),
        limitSet: (accountId, apiKeyId) =>
          limitSet(calls, accountId, [apiKeyId]).pipe(Effect.orDie, Effect.withSpan("Spending.limitSet")),
        memberLimitSet: (accountId, memberId) =>
          Effect.flatMap(wallets.memberKeys(accountId, memberId), (apiKeyIds) => limitSet(calls, accountId, apiKeyIds))
            .pipe(
              Effect.orDie,
              Effect.withSpan("Spending.memberLimitSet")
            )
      })
    })
  )
}

/** What the façade's calls use: the wallet's statements, this instance's grants, the settlement queue. */
interface Calls {
  readonly wallets: WalletRepo["Type"]
  readonly pool: GrantPool
  readonly queue: SettlementQueue
  /** This service's clock, whoever calls it. */
  readonly nowMs: Effect.Effect<number>
  readonly sql: SqlClient.SqlClient
  /** What a payment before answering runs on. */
  readonly context: Context.Context<SqlClient.SqlClient | RequestLogs>
  /** This process's heartbeat (`fence`) and the reservations it renews. */
  readonly leases: ReservationLeases["Type"]
  readonly metrics: Metrics
}

const hold = Effect.fnUntraced(function*(calls: Calls, input: ReserveInput | null, log: OpenLog) {
  const now = yield* calls.nowMs
  const startedAt = new Date(now)
  // Read before the hold is taken: a lapse while it is taken counts against it.
  const epoch = calls.leases.fence.epoch()
  const admitted = (amountMicroMyr: number, source: CallHold["source"]) =>
    calls.queue.track({ log, startedAt, amountMicroMyr, source, epoch })
  if (input === null) return admitted(0, { _tag: "None" })
  if (input.amountMicroMyr === 0) {
    yield* refuseNegativeBalance(calls, input.accountId)
    return admitted(0, { _tag: "None" })
  }
  const grant = calls.pool.lend(input, now)
  if (grant !== undefined) return admitted(input.amountMicroMyr, { _tag: "Grant", grant })
  // The grant ran short while it grows: its growth (one transaction on the wallet's row) is awaited, instead of
  // a reservation of the call's own queued behind it on that row (under load, the calls held longest).
  // (A call under a monthly limit, its key's or its member's, never lends: it does not wait.)
  const growth = isLimited(input) ? undefined : calls.pool.growth(input.accountId)
  if (growth !== undefined) {
    yield* growth
    const grown = calls.pool.lendAgain(input, yield* calls.nowMs)
    if (grown !== undefined) return admitted(input.amountMicroMyr, { _tag: "Grant", grant: grown })
  }
  return admitted(input.amountMicroMyr, {
    _tag: "Reservation",
    reservation: yield* holdInReservation(calls, input, now)
  })
})

/** A call priced at nothing (a free local model) holds nothing, but a negative balance still blocks it. */
const refuseNegativeBalance = Effect.fnUntraced(function*(calls: Calls, accountId: string) {
  const stored = yield* calls.wallets.wallet(accountId)
  const balance = stored.availableMicroMyr + stored.grantedMicroMyr
  if (balance < 0) {
    return yield* new InsufficientBalance({
      message: `The wallet's balance is negative (RM ${
        toMyrString(microMyr(balance))
      }); live calls resume after a top-up.`,
      guidance: NEGATIVE_BALANCE_GUIDANCE
    })
  }
})

/** A reservation of the call's own: in one round trip when it may, else one that explains a refusal. */
const holdInReservation = Effect.fnUntraced(function*(calls: Calls, input: ReserveInput, now: number) {
  if (!isLimited(input)) {
    const quick = yield* calls.wallets.reserveQuickly(input)
    if (quick !== undefined) return quick
  }
  const exact = yield* Effect.either(calls.wallets.reserve(input))
  return Either.isRight(exact) || exact.left._tag !== "InsufficientBalance"
    ? yield* exact
    : yield* reclaimAndRetry(calls, input, now)
})

/** Another instance's grants (or this one's) may hold what this call needs: ask for them back, then decide again. */
const reclaimAndRetry = Effect.fnUntraced(function*(calls: Calls, input: ReserveInput, now: number) {
  calls.pool.handBack(input.accountId, now)
  if (calls.pool.holds(input.accountId)) yield* calls.queue.flush
  const asked = yield* calls.wallets.askForGrants(input.accountId)
  let attempt = yield* Effect.either(calls.wallets.reserve(input))
  if (asked.others === 0) return attempt
  const deadline = now + RECLAIM_WAIT_MS
  while (Either.isLeft(attempt) && attempt.left._tag === "InsufficientBalance" && (yield* calls.nowMs) < deadline) {
    const answered = yield* allAnswered(calls, input.accountId, asked)
    yield* Effect.sleep(Duration.millis(answered ? 0 : 20))
    attempt = yield* Effect.either(calls.wallets.reserve(input))
    if (answered) break
  }
  return attempt
}, Effect.flatMap(Either.match({ onLeft: Effect.fail, onRight: Effect.succeed })))

const allAnswered = (calls: Calls, accountId: string, asked: GrantsAsked) =>
  Effect.map(calls.wallets.unansweredGrants(accountId, asked.askedAt), (unanswered) => unanswered === 0)

/** A limit was set on the keys: every instance reports their holds of its grants (`GrantPool.report`), this one first. */
const limitSet = Effect.fnUntraced(function*(calls: Calls, accountId: string, apiKeyIds: ReadonlyArray<string>) {
  const now = yield* calls.nowMs
  calls.pool.report(accountId, apiKeyIds, now)
  yield* calls.queue.flush
  const asked = yield* calls.wallets.askForKeyHolds(accountId, apiKeyIds)
  if (asked.others === 0) return
  // Each answers with a flush that writes its grant row and the key's holds in one transaction.
  while (!(yield* allAnswered(calls, accountId, asked)) && (yield* calls.nowMs) < now + RECLAIM_WAIT_MS) {
    yield* Effect.sleep(Duration.millis(20))
  }
})

const settle = Effect.fnUntraced(function*(
  calls: Calls,
  held: CallHold,
  amount: MicroMyr,
  description: string,
  usage: SettledUsage,
  whenShort: WhenShort,
  stored: StoredWrite | undefined
) {
  const now = yield* calls.nowMs
  const charged = Math.min(Math.max(amount, 0), held.amountMicroMyr)
  const log = logRow(held.log, Object.assign({}, usage, { costMicroMyr: charged }), {
    reservationId: reservationIdOf(held),
    status: held.source._tag === "None" && held.log.cache?.status !== "hit" ? "succeeded" : "billed",
    // A stream cut short after producing output is billed, and keeps its error's code.
    errorCode: usage.errorCode ?? null,
    createdAt: held.startedAt,
    completedAt: new Date(now)
  }, usage.answeredBy ?? held.log.upstreamModel) // a fallback's model, when one answered
  if (held.source._tag !== "None" && !calls.leases.fence.intact(held.epoch)) {
    const paid = yield* payBeforeAnswering(calls, held, { amount: charged, description, log, whenShort, now, stored })
    if (paid !== undefined) return paid
  }
  calls.queue.finish(held)
  const { source } = held
  switch (source._tag) {
    case "None":
      calls.queue.enqueue({ log, stored })
      break
    case "Reservation":
      calls.queue.enqueue({
        item: { _tag: "Capture", reservationId: source.reservation.id, amountMicroMyr: charged, description, log },
        stored
      })
      break
    case "Grant": {
      const { grant } = source
      const { accountId, id: grantId } = grant
      const { apiKeyId, requestId } = held.log
      calls.pool.charge(grant, held.amountMicroMyr, charged, apiKeyId)
      calls.queue.enqueue({
        item: {
          _tag: "GrantCharge",
          grantId,
          accountId,
          apiKeyId,
          requestId,
          amountMicroMyr: charged,
          description,
          log
        },
        grant: { grant, amount: charged, apiKeyId },
        stored
      })
      break
    }
  }
  return charged
})

/** A payment before answering that could not be written is retried briefly, then left to the flush. */
const PAY_NOW_RETRIES = Schedule.exponential("50 millis").pipe(Schedule.intersect(Schedule.recurs(4)))

/**
 * The call's hold may have been taken back (this instance's beat lapsed since
 * it was taken): the call is paid now, before its answer goes out. The charge;
 * undefined when the database could not be reached (the flush bills it, late).
 */
const payBeforeAnswering = Effect.fnUntraced(function*(calls: Calls, held: CallHold, bill: {
  amount: number
  description: string
  log: LogWrite
  whenShort: WhenShort
  now: number
  stored: StoredWrite | undefined
}) {
  const { requestId } = held.log
  const refusedLog = failedRow(
    held.log,
    reservationIdOf(held),
    held.startedAt,
    "insufficient_balance",
    bill.log.latencyMs,
    new Date(bill.now)
  )
  const outcome = yield* payNow(calls.sql, {
    hold: held,
    amountMicroMyr: bill.amount,
    description: bill.description,
    log: bill.log,
    refusedLog,
    stored: bill.stored,
    whenShort: bill.whenShort,
    at: new Date(bill.now),
    holder: calls.leases.holder
  }).pipe(Effect.provide(calls.context), Effect.retry(PAY_NOW_RETRIES), Effect.either)
  if (Either.isLeft(outcome)) {
    yield* Effect.logWarning("a call could not be paid before answering; the next flush bills it", outcome.left).pipe(
      Effect.annotateLogs({ requestId })
    )
    return undefined
  }
  const paid = outcome.right
  calls.queue.finish(held)
  const { source } = held
  if (source._tag === "Reservation") yield* calls.leases.drop(source.reservation.id)
  if (paid._tag === "Refused") {
    if (source._tag === "Grant") calls.pool.giveBack(source.grant, held.amountMicroMyr, held.log.apiKeyId)
    yield* Effect.logWarning(
      "a call whose hold was taken back while this instance stalled was refused: the wallet cannot pay it"
    )
      .pipe(Effect.annotateLogs({ requestId, costMicroMyr: bill.amount, availableMicroMyr: paid.availableMicroMyr }))
    return yield* new InsufficientBalance({
      message: `This request cost RM ${toMyrString(microMyr(bill.amount))}, and the wallet holds RM ${
        toMyrString(microMyr(paid.availableMicroMyr))
      } available.`
    })
  }
  if (source._tag === "Grant") {
    calls.pool.charge(source.grant, held.amountMicroMyr, paid.chargedMicroMyr, held.log.apiKeyId)
    calls.pool.chargeWritten(source.grant, paid.chargedMicroMyr, held.log.apiKeyId)
  }
  const noted = {
    requestId,
    costMicroMyr: bill.amount,
    chargedMicroMyr: paid.chargedMicroMyr,
    shortfallMicroMyr: paid.shortfallMicroMyr
  }
  if (paid.shortfallMicroMyr > 0) {
    calls.metrics.billingShortfall.inc(paid.shortfallMicroMyr)
    yield* Effect.logError("billing shortfall: an answer given that the wallet could not pay in full").pipe(
      Effect.annotateLogs(noted)
    )
  } else {
    yield* Effect.logInfo("a call paid before answering: this instance's beat lapsed while it ran").pipe(
      Effect.annotateLogs(noted)
    )
  }
  return paid.chargedMicroMyr
})

const fail = (
  calls: Calls,
  held: CallHold,
  errorCode: string,
  latencyMs: number,
  attempts?: ReadonlyArray<LoggedAttempt>
) =>
  Effect.map(calls.nowMs, (now) => {
    calls.queue.finish(held)
    const log = failedRow(
      held.log,
      reservationIdOf(held),
      held.startedAt,
      errorCode,
      latencyMs,
      new Date(now),
      attempts
    )
    const { source } = held
    if (source._tag === "Reservation") {
      calls.queue.enqueue({ item: { _tag: "Release", reservationId: source.reservation.id, log } })
    } else {
      if (source._tag === "Grant") calls.pool.giveBack(source.grant, held.amountMicroMyr, held.log.apiKeyId)
      calls.queue.enqueue({ log })
    }
  })

const refused = (calls: Calls, log: OpenLog, errorCode: string, latencyMs: number) =>
  Effect.map(calls.nowMs, (now) => {
    calls.queue.enqueue({ log: failedRow(log, null, new Date(now - latencyMs), errorCode, latencyMs, new Date(now)) })
  })

/** The balance as developers see it, from the stored row (read after the flush). */
const balance = Effect.fnUntraced(function*(calls: Calls, accountId: string) {
  const stored = yield* calls.wallets.wallet(accountId)
  const inFlight = calls.pool.inFlight(accountId)
  return {
    availableMicroMyr: stored.availableMicroMyr + stored.grantedMicroMyr - inFlight,
    reservedMicroMyr: stored.reservedMicroMyr + inFlight,
    lifetimeTopupMicroMyr: stored.lifetimeTopupMicroMyr,
    lifetimeSpendMicroMyr: stored.lifetimeSpendMicroMyr
  } satisfies Wallet
})
