import * as FetchHttpClient from "@effect/platform/FetchHttpClient"
import * as HttpClient from "@effect/platform/HttpClient"
import { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Clock, Context, Duration, Effect, Layer, Option, Schedule, Schema } from "effect"
import Stripe from "stripe"
import { AppConfig } from "../AppConfig.js"
import { randomBase62 } from "../Domain/Ids.js"
import { SqlString } from "../Domain/Strict.js"
import { now } from "../Domain/Time.js"
import { DASHBOARD_URL, emit } from "../Outbox/Events.js"
import { type AutoTopupRow, AutoTopups } from "../Wallet/AutoTopupAttempts.js"
import { WalletSettings } from "../Wallet/Settings.js"
import { CardProcessor, type ChargeOutcome } from "./CardProcessor.js"
import { Cards } from "./Cards.js"
import { deliver } from "./DevCheckout.js"
import { CURRENCY, PaymentProcessor } from "./PaymentProcessor.js"
import { PaymentsRepo } from "./Repo.js"

/** A PaymentIntent as its events carry it: auto top-up's carry the attempt and the transaction in `metadata`. */
export const PaymentIntent = Schema.Struct({
  id: SqlString,
  amount: Schema.Int,
  amount_received: Schema.optional(Schema.Int),
  currency: Schema.String,
  metadata: Schema.optional(Schema.NullOr(Schema.Record({ key: Schema.String, value: SqlString }))),
  last_payment_error: Schema.optional(
    Schema.NullOr(Schema.Struct({ code: Schema.optional(Schema.String), message: Schema.optional(Schema.String) }))
  )
})

const AutoTopupTag = Schema.Struct({ metadata: Schema.Struct({ auto_topup_id: Schema.String }) })

/** The auto top-up attempt a PaymentIntent event is about; none for every other payment (those are not ours to apply). */
export const autoTopupIdOf = (object: unknown): string | undefined =>
  Option.getOrUndefined(
    Option.map(Schema.decodeUnknownOption(AutoTopupTag)(object), (tagged) => tagged.metadata.auto_topup_id)
  )

/** Where the developer saves a card again after auto top-up failed: the dashboard starts a Checkout in setup mode there. */
export const REAUTHENTICATE_PATH = "/billing?card=update"

/** What a card refusal tells the developer. */
const reasonOf = (code: string) =>
  code === "authentication_required"
    ? "the bank asked for the cardholder's authentication, which an automatic payment cannot give"
    : code === "card_declined"
    ? "the card was declined"
    : `the payment failed (${code})`

/**
 * The failures and successes of auto top-up that change more than the attempt:
 * used by the charging worker and by the webhook receiver (in its transaction).
 */
export class AutoTopupOutcomes extends Context.Tag("nenas/AutoTopupOutcomes")<AutoTopupOutcomes, {
  /** A refused charge: the attempt and its transaction fail, auto top-up turns off, and the developer is told. */
  readonly refused: (autoTopupId: string, code: string) => Effect.Effect<boolean, SqlError.SqlError>
  /** Not charged: the account was suspended or auto top-up turned off after queuing (nothing to tell: the developer knows). */
  readonly dropped: (autoTopupId: string, code: string) => Effect.Effect<boolean, SqlError.SqlError>
  /** The attempt is finished as paid (its money is credited by the receiver, once). */
  readonly paid: (autoTopupId: string) => Effect.Effect<boolean, SqlError.SqlError>
}>() {
  static readonly layer = Layer.effect(
    AutoTopupOutcomes,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const attempts = yield* AutoTopups
      const settings = yield* WalletSettings
      const payments = yield* PaymentsRepo
      const config = yield* AppConfig
      return AutoTopupOutcomes.of({
        refused: (autoTopupId, code) =>
          sql.withTransaction(Effect.gen(function*() {
            const at = yield* now
            const attempt = yield* attempts.find(autoTopupId)
            if (attempt === undefined) return false
            yield* settings.lock(attempt.accountId)
            if (!(yield* attempts.finish(autoTopupId, "failed", at, code))) return false
            if (attempt.transactionId !== null) yield* payments.fail(attempt.transactionId)
            const reason = reasonOf(code)
            const actionUrl = `${config.dashboardUrl}${REAUTHENTICATE_PATH}`
            yield* settings.disableAutoTopup(
              attempt.accountId,
              `${reason}. Save the card again to turn auto top-up back on.`,
              actionUrl
            )
            yield* emit({
              accountId: attempt.accountId,
              type: "auto_topup.failed",
              at,
              data: {
                account_id: attempt.accountId,
                transaction_id: attempt.transactionId,
                amount_myr: attempt.amountSen / 100,
                reason: code,
                action_url: actionUrl
              },
              email: {
                subject: "Auto top-up failed and is now off",
                body: `An automatic top-up of RM ${(attempt.amountSen / 100).toFixed(2)} failed: ${reason}.\n` +
                  `Auto top-up is off, so your balance can run out.\n\nSave your card again: ${DASHBOARD_URL}${REAUTHENTICATE_PATH}\n`
              }
            })
            return true
          })).pipe(Effect.provideService(SqlClient.SqlClient, sql)),
        dropped: (autoTopupId, code) =>
          sql.withTransaction(Effect.gen(function*() {
            const attempt = yield* attempts.find(autoTopupId)
            if (attempt === undefined || !(yield* attempts.finish(autoTopupId, "failed", yield* now, code))) {
              return false
            }
            if (attempt.transactionId !== null) yield* payments.fail(attempt.transactionId)
            return true
          })).pipe(Effect.provideService(SqlClient.SqlClient, sql)),
        paid: (autoTopupId) => Effect.flatMap(now, (at) => attempts.finish(autoTopupId, "succeeded", at, null))
      })
    })
  )
}

/** Stripe's `payment_intent.succeeded` for a simulated off-session payment. */
const succeededEvent = (attempt: AutoTopupRow, transactionId: string, paymentIntentId: string, created: number) => ({
  id: `evt_sim_${randomBase62(24)}`,
  object: "event",
  api_version: Stripe.API_VERSION,
  created,
  livemode: false,
  type: "payment_intent.succeeded",
  data: {
    object: {
      id: paymentIntentId,
      object: "payment_intent",
      amount: attempt.amountSen,
      amount_received: attempt.amountSen,
      currency: CURRENCY,
      status: "succeeded",
      metadata: { transaction_id: transactionId, account_id: attempt.accountId, auto_topup_id: attempt.id }
    }
  }
})

/** How long a claimed attempt is this instance's; a charge Stripe accepted waits this long for its event. */
const LEASE_MS = 60_000
const ACCEPTED_WAIT_MS = 60 * 60 * 1000

/**
 * Charges queued auto top-ups: each claimed by one instance (`FOR UPDATE SKIP
 * LOCKED`), checked at charge time with its claim in one statement (still
 * this claimer's lease, not suspended, auto top-up still on),
 * charged off-session with an idempotency key per attempt (a retry after a
 * lost answer is the same payment; an attempt claimed again looks for its
 * PaymentIntent first, as Stripe forgets keys after 24 hours), and credited
 * only when `payment_intent.succeeded` reaches the webhook receiver.
 */
export const AutoTopupWorker = Layer.scopedDiscard(Effect.gen(function*() {
  const attempts = yield* AutoTopups
  const outcomes = yield* AutoTopupOutcomes
  const cards = yield* Cards
  const processor = yield* CardProcessor
  const payments = yield* PaymentProcessor
  const repo = yield* PaymentsRepo
  const config = yield* AppConfig
  const client = yield* HttpClient.HttpClient

  /** Stripe took (or refused) the charge: the claim waits for its event, or the refusal turns auto top-up off. */
  const settle = (attempt: AutoTopupRow, transactionId: string, outcome: ChargeOutcome) =>
    Effect.gen(function*() {
      if (outcome._tag === "Refused") return yield* outcomes.refused(attempt.id, outcome.code)
      yield* attempts.attachIntent(
        attempt.id,
        outcome.paymentIntentId,
        new Date((yield* Clock.currentTimeMillis) + ACCEPTED_WAIT_MS)
      )
      if (payments.simulated) {
        const created = Math.floor((yield* Clock.currentTimeMillis) / 1000)
        yield* deliver(
          client,
          config,
          payments.webhookSecret,
          succeededEvent(attempt, transactionId, outcome.paymentIntentId, created)
        )
      }
      return true
    })

  const charge = (attempt: AutoTopupRow) =>
    Effect.gen(function*() {
      const card = yield* cards.find(attempt.accountId)
      // Claimed again: the first claimer may have made the payment and died before recording it. Stripe forgets
      // an idempotency key after 24 hours, so the payment is looked for, never made a second time.
      if (attempt.reclaimed && card !== undefined && attempt.transactionId !== null) {
        const found = yield* processor.findCharge({
          customerId: card.customerId,
          paymentIntentId: attempt.paymentIntentId,
          metadata: { auto_topup_id: attempt.id },
          since: attempt.createdAt
        })
        if (found !== undefined) {
          if (found._tag === "Accepted" && attempt.paymentIntentId !== null) {
            yield* Effect.logWarning(
              `auto top-up ${attempt.id}: payment_intent.succeeded has not arrived for ${found.paymentIntentId}; ` +
                "is the Stripe webhook endpoint subscribed to it?"
            )
          }
          return yield* settle(attempt, attempt.transactionId, found)
        }
      }
      // Checked at charge time, with the claim, in one statement: what changed since queuing (a suspension, auto
      // top-up off) counts, and a claimer whose lease another instance took since (this one stalled) charges nothing.
      const started = yield* attempts.startCharge(
        attempt.id,
        attempt.claimedUntil,
        new Date((yield* Clock.currentTimeMillis) + LEASE_MS)
      )
      if (started._tag === "NotOurs") return false
      if (started._tag === "Blocked") return yield* outcomes.dropped(attempt.id, started.blocker)
      // Charged with service tax on top, as a checkout is; the total is fixed when the transaction is made.
      const transaction = attempt.transactionId === null
        ? yield* repo.createPending(attempt.accountId, attempt.amountSen, config.sstRateBps)
        : yield* repo.find(attempt.transactionId)
      if (transaction === undefined) return yield* Effect.dieMessage(`auto top-up ${attempt.id} lost its transaction`)
      const transactionId = transaction.id
      if (attempt.transactionId === null) yield* attempts.attachTransaction(attempt.id, transactionId)
      if (card?.paymentMethodId == null) return yield* outcomes.refused(attempt.id, "no_saved_card")
      const outcome = yield* processor.charge({
        customerId: card.customerId,
        paymentMethodId: card.paymentMethodId,
        amountSen: transaction.amountSen + transaction.taxSen,
        idempotencyKey: `auto_topup_${attempt.id}`,
        metadata: { transaction_id: transactionId, account_id: attempt.accountId, auto_topup_id: attempt.id }
      })
      return yield* settle(attempt, transactionId, outcome)
    }).pipe(Effect.catchAllCause((cause) =>
      Effect.as(Effect.logWarning(`auto top-up ${attempt.id} was not charged yet`, cause), false)
    ))

  const runOnce = Effect.gen(function*() {
    const claimed = yield* attempts.claim(yield* now, LEASE_MS)
    yield* Effect.forEach(claimed, charge, { concurrency: 4, discard: true })
  }).pipe(Effect.catchAllCause((cause) => Effect.logWarning("auto top-up claim failed", cause)))

  yield* Effect.forkScoped(Effect.repeat(runOnce, Schedule.spaced(Duration.millis(config.outboxPollMs))))
})).pipe(Layer.provide(FetchHttpClient.layer))
