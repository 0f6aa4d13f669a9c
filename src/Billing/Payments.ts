import { SqlClient, type SqlError } from "@effect/sql"
import { Context, Data, Effect, FiberRef, Layer, Option, ParseResult, Schema } from "effect"
import { AccountsRepo } from "../Accounts/Repo.js"
import { AppConfig } from "../AppConfig.js"
import { type BillingError, InternalError } from "../Domain/Errors.js"
import type { EventType } from "../Domain/EventTypes.js"
import { fromSen, MICRO_PER_SEN, toMyrString } from "../Domain/Money.js"
import { SqlString } from "../Domain/Strict.js"
import { now } from "../Domain/Time.js"
import type { DocumentType } from "../Invoices/Api.js"
import { Documents } from "../Invoices/Documents.js"
import { type GrossSplit, newlyRefunded, splitGross } from "../Invoices/Tax.js"
import { KeyCache } from "../Keys/KeyCache.js"
import { emit } from "../Outbox/Events.js"
import { WalletRepo } from "../Wallet/Repo.js"
import { autoTopupIdOf, AutoTopupOutcomes, PaymentIntent } from "./AutoTopupCharges.js"
import { CardProcessor, type SavedCard } from "./CardProcessor.js"
import { Cards } from "./Cards.js"
import { CURRENCY, SAVE_CARD_METADATA } from "./PaymentProcessor.js"
import { type DisputeFact, PaymentsRepo, type PaymentTransaction } from "./Repo.js"
import { isHandled, type StripeEventType } from "./StripeEvents.js"

/** A Stripe field that is an id, or the object when expanded. */
const Expandable = Schema.Union(SqlString, Schema.Struct({ id: SqlString }))

/** Sen that convert to micro-MYR exactly: Stripe's own cap on an amount is far below. */
const Sen = Schema.Int.pipe(Schema.between(0, 100_000_000_000))
const idOf = (value: typeof Expandable.Type | null | undefined): string | null =>
  value === null || value === undefined ? null : typeof value === "string" ? value : value.id

const CheckoutSession = Schema.Struct({
  id: SqlString,
  mode: Schema.optional(Schema.String),
  setup_intent: Schema.optional(Schema.NullOr(Expandable)),
  client_reference_id: Schema.optional(Schema.NullOr(SqlString)),
  metadata: Schema.optional(Schema.NullOr(Schema.Record({ key: Schema.String, value: SqlString }))),
  payment_status: Schema.String,
  payment_intent: Schema.optional(Schema.NullOr(Expandable)),
  amount_total: Schema.optional(Schema.NullOr(Sen)),
  currency: Schema.optional(Schema.NullOr(Schema.String))
})

const Charge = Schema.Struct({
  id: SqlString,
  payment_intent: Schema.optional(Schema.NullOr(Expandable)),
  amount_refunded: Sen,
  currency: Schema.String
})

const Dispute = Schema.Struct({
  id: SqlString,
  charge: Expandable,
  payment_intent: Schema.optional(Schema.NullOr(Expandable)),
  amount: Sen.pipe(Schema.positive()),
  currency: Schema.String,
  status: Schema.String
})

/** The envelope every Stripe event shares. */
export const StripeEvent = Schema.Struct({
  id: SqlString,
  type: SqlString,
  data: Schema.Struct({ object: Schema.Unknown })
})
export type StripeEvent = typeof StripeEvent.Type

const anomaly = (message: string) => new InternalError({ message })

/**
 * A signed event we cannot read: retrying it will not help. It is kept
 * (unprocessed) for an operator and nothing of it is applied; `detail` is for
 * the log, never for the response.
 */
export class MalformedEvent extends Data.TaggedError("MalformedEvent")<{
  readonly eventId: string
  readonly eventType: string
  readonly detail: string
}> {}

/** The first problem only, and briefly: an event's object may be large or deeply nested. */
const firstIssue = (error: ParseResult.ParseError): string => {
  const [issue] = ParseResult.ArrayFormatter.formatErrorSync(error)
  return issue === undefined ? "invalid" : `${issue.path.slice(0, 8).join(".")}: ${issue.message.slice(0, 200)}`
}

const decode = <A, I>(schema: Schema.Schema<A, I>, event: StripeEvent) =>
  Schema.decodeUnknown(schema)(event.data.object).pipe(
    Effect.mapError((error) =>
      new MalformedEvent({ eventId: event.id, eventType: event.type, detail: firstIssue(error) })
    )
  )

const requireMyr = (currency: string | null | undefined, event: StripeEvent) =>
  currency === CURRENCY || currency === null || currency === undefined
    ? Effect.void
    : Effect.fail(
      new MalformedEvent({
        eventId: event.id,
        eventType: event.type,
        detail: `in ${currency.slice(0, 10)}; wallets are in MYR`
      })
    )

/**
 * Applies Stripe events to wallets, each at most once: by event id (recorded
 * in the same SQL transaction as its effects) and by effect (ledger effect
 * keys). Events about one payment are serialized by an advisory lock on its
 * payment intent; facts that arrive before their payment is known (a refund or
 * dispute before the completed checkout) are stored and applied when it is, so
 * every delivery order ends in the same state.
 */
/** The accounts whose suspension the event being applied decided (`apply` gives each event its own set). */
const SuspensionsDecided = FiberRef.unsafeMake<Set<string> | undefined>(undefined)

export class Payments extends Context.Tag("nenas/Payments")<Payments, {
  /** True when the event changed anything; false for duplicates and types we do not handle. */
  readonly apply: (event: StripeEvent) => Effect.Effect<boolean, InternalError | MalformedEvent | SqlError.SqlError>
}>() {
  static readonly layer = Layer.effect(
    Payments,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const repo = yield* PaymentsRepo
      const wallet = yield* WalletRepo
      const accounts = yield* AccountsRepo
      const keyCache = yield* KeyCache
      const { dashboardUrl } = yield* AppConfig
      const cards = yield* Cards
      const cardProcessor = yield* CardProcessor
      const autoTopups = yield* AutoTopupOutcomes
      const documents = yield* Documents

      /**
       * Suspended exactly while a dispute whose funds were withdrawn is open (a change is announced to the
       * developer). The account is locked before its disputes are read: events of two payments decide in turn.
       */
      const updateSuspension = (accountId: string) =>
        Effect.gen(function*() {
          const { suspended } = yield* accounts.lock(accountId)
          const disputed = yield* repo.hasWithdrawnDispute(accountId)
          yield* disputed ? accounts.suspend(accountId) : accounts.reinstate(accountId)
          const reason = disputed ? "a payment dispute withdrew funds" : "no payment dispute withdraws funds any more"
          if (disputed !== suspended) {
            yield* announce(accountId, disputed ? "account.suspended" : "account.reinstated", { reason })
          }
          yield* Effect.map(FiberRef.get(SuspensionsDecided), (decided) => decided?.add(accountId))
        })

      /** An event to the developer's webhooks, in the transaction applying the Stripe event. */
      const announce = (accountId: string, type: EventType, data: Record<string, unknown>) =>
        Effect.flatMap(now, (at) => emit({ accountId, type, at, data: { account_id: accountId, ...data } })).pipe(
          Effect.provideService(SqlClient.SqlClient, sql)
        )

      /** The tax document of a money movement this transaction just made, numbered with it. */
      const issue = (
        transaction: PaymentTransaction,
        type: DocumentType,
        effectKey: string,
        description: string,
        split: GrossSplit
      ) =>
        documents.issue({
          accountId: transaction.accountId,
          type,
          effectKey,
          paymentTransactionId: transaction.id,
          paymentReference: transaction.paymentIntentId ?? transaction.checkoutSessionId,
          description,
          netSen: split.netSen,
          taxSen: split.taxSen,
          taxRateBps: transaction.taxRateBps
        })

      /**
       * Brings a paid transaction's ledger in line with every fact known about it. Stripe reports refunds and
       * disputes gross; the wallet moves by their net part only (docs/money.md, "Service tax"), and each
       * movement issues its document in the same SQL transaction.
       */
      const reconcile = (transaction: PaymentTransaction) =>
        Effect.gen(function*() {
          const topupKey = `topup:${transaction.id}`
          let changed = yield* wallet.post({
            accountId: transaction.accountId,
            type: "topup",
            amountMicroMyr: transaction.amountMicroMyr,
            effectKey: topupKey,
            description: `Top-up of RM ${(transaction.amountSen / 100).toFixed(2)} (Stripe Checkout)`,
            paymentTransactionId: transaction.id
          })
          if (changed) {
            yield* issue(transaction, "invoice", topupKey, "nenas prepaid API credits (wallet top-up)", {
              netSen: transaction.amountSen,
              taxSen: transaction.taxSen
            })
          }
          const grossMicroMyr = fromSen(transaction.amountSen + transaction.taxSen)
          const refunded = Math.min(yield* repo.refundedTotal(transaction), grossMicroMyr)
          if (refunded > transaction.refundedMicroMyr) {
            const moved = newlyRefunded(
              transaction.refundedMicroMyr / MICRO_PER_SEN,
              refunded / MICRO_PER_SEN,
              transaction
            )
            const refundKey = `refund:${transaction.id}:${refunded}`
            if (moved.netSen > 0) {
              yield* wallet.post({
                accountId: transaction.accountId,
                type: "refund",
                amountMicroMyr: -fromSen(moved.netSen),
                effectKey: refundKey,
                description: `Refund of RM ${toMyrString(fromSen(moved.netSen))} on a top-up`,
                paymentTransactionId: transaction.id
              })
            }
            yield* issue(transaction, "refund_note", refundKey, "Refund of prepaid API credits", moved)
            yield* repo.setRefunded(transaction.id, refunded)
            changed = true
          }
          for (const dispute of yield* repo.claimDisputes(transaction)) {
            // An inquiry moves no money: only funds Stripe withdrew are debited, and only reinstated ones credited.
            const disputed = splitGross(dispute.amountMicroMyr / MICRO_PER_SEN, transaction)
            const chargebackKey = `chargeback:${dispute.id}`
            const debited = dispute.fundsWithdrawn && (yield* wallet.post({
              accountId: transaction.accountId,
              type: "chargeback",
              amountMicroMyr: -fromSen(disputed.netSen),
              effectKey: chargebackKey,
              description: `Chargeback: payment dispute ${dispute.id} opened`,
              paymentTransactionId: transaction.id
            }))
            if (debited) {
              yield* issue(transaction, "refund_note", chargebackKey, "Payment disputed: credits withdrawn", disputed)
            }
            const reversalKey = `chargeback_reversal:${dispute.id}`
            const reversed = dispute.fundsReinstated && (yield* wallet.post({
              accountId: transaction.accountId,
              type: "chargeback_reversal",
              amountMicroMyr: fromSen(disputed.netSen),
              effectKey: reversalKey,
              description: `Chargeback reversed: funds of payment dispute ${dispute.id} reinstated`,
              paymentTransactionId: transaction.id
            }))
            if (reversed) {
              yield* issue(transaction, "debit_note", reversalKey, "Payment dispute won: credits restored", disputed)
            }
            changed = changed || debited || reversed
          }
          yield* updateSuspension(transaction.accountId)
          return changed
        })

      /** Reconciles the payment a fact belongs to, if it is known and paid. */
      const reconcileFor = (paymentIntentId: string | null, chargeId: string | null) =>
        Effect.gen(function*() {
          const id = yield* repo.findIdByIntentOrCharge(paymentIntentId, chargeId)
          if (id === undefined) return false
          const transaction = yield* repo.lock(id)
          if (transaction === undefined || transaction.status !== "succeeded") return false
          if (chargeId !== null) yield* repo.setCharge(transaction.id, chargeId)
          return yield* reconcile(transaction)
        })

      const sessionTransaction = (session: typeof CheckoutSession.Type) =>
        Option.fromNullable(session.client_reference_id ?? session.metadata?.["transaction_id"])

      /**
       * The transaction a session pays: the one that stored its id, else the one its metadata names.
       * Any disagreement between the two is an anomaly, never a credit to a guess.
       */
      const checkoutTransaction = (session: typeof CheckoutSession.Type, event: StripeEvent) =>
        Effect.gen(function*() {
          const named = Option.getOrUndefined(sessionTransaction(session))
          const stored = yield* repo.findBySession(session.id)
          if (stored !== undefined && named !== undefined && named !== stored.id) {
            return yield* anomaly(
              `Event ${event.id}: checkout session ${session.id} belongs to transaction ${stored.id}, but names ${named}.`
            )
          }
          const id = stored?.id ?? named
          if (id === undefined) return undefined
          const transaction = yield* repo.lock(id)
          if (
            transaction !== undefined && transaction.checkoutSessionId !== null &&
            transaction.checkoutSessionId !== session.id
          ) {
            return yield* anomaly(
              `Event ${event.id}: checkout session ${session.id} names transaction ${transaction.id}, whose session is ${transaction.checkoutSessionId}.`
            )
          }
          return transaction
        })

      /** Keeps a card for auto top-up; one that cannot be read fails the event, which Stripe delivers again. */
      const keepCard = (accountId: string, read: Effect.Effect<SavedCard, BillingError>, what: string) =>
        Effect.flatMap(
          Effect.mapError(read, () => anomaly(`The ${what} could not be read.`)),
          (card) => cards.saveCard(accountId, card)
        )

      /** A Checkout in setup mode saved a card: kept for auto top-up, once. */
      const saveCard = (session: typeof CheckoutSession.Type) =>
        Effect.gen(function*() {
          const setupIntent = idOf(session.setup_intent)
          const setup = yield* cards.findSetup(session.id)
          if (setup === undefined || setupIntent === null || !(yield* cards.completeSetup(setup.id))) return false
          yield* keepCard(
            setup.accountId,
            cardProcessor.savedCard(setupIntent),
            `saved card of setup session ${session.id}`
          )
          return true
        })

      /** An off-session auto top-up paid: credited once (as a top-up), the attempt finished, the developer told. */
      const intentSucceeded = (event: StripeEvent) =>
        Effect.gen(function*() {
          if (autoTopupIdOf(event.data.object) === undefined) return false
          const intent = yield* decode(PaymentIntent, event)
          const autoTopupId = intent.metadata?.["auto_topup_id"]
          const transactionId = intent.metadata?.["transaction_id"]
          if (autoTopupId === undefined || transactionId === undefined) return false
          yield* requireMyr(intent.currency, event)
          yield* repo.lockPayment(intent.id)
          const transaction = yield* repo.lock(transactionId)
          if (
            transaction === undefined ||
            (intent.amount_received ?? intent.amount) !== transaction.amountSen + transaction.taxSen
          ) {
            return yield* anomaly(`Payment ${intent.id} does not match transaction ${transactionId}.`)
          }
          const newlyPaid = transaction.status !== "succeeded"
          yield* repo.succeed(transaction.id, intent.id)
          const credited = yield* reconcile({ ...transaction, status: "succeeded", paymentIntentId: intent.id })
          yield* autoTopups.paid(autoTopupId)
          const facts = { transaction_id: transaction.id, amount_myr: transaction.amountSen / 100, automatic: true }
          if (newlyPaid) yield* announce(transaction.accountId, "topup.succeeded", facts)
          return credited || newlyPaid
        })

      const intentFailed = (event: StripeEvent) => {
        const id = autoTopupIdOf(event.data.object)
        return id === undefined ?
          Effect.succeed(false) :
          Effect.flatMap(
            decode(PaymentIntent, event),
            (intent) => autoTopups.refused(id, intent.last_payment_error?.code ?? "payment_failed")
          )
      }

      const completeCheckout = (event: StripeEvent) =>
        Effect.gen(function*() {
          const session = yield* decode(CheckoutSession, event)
          if (session.mode === "setup") return yield* saveCard(session)
          if (session.payment_status !== "paid") return false
          const paymentIntentId = idOf(session.payment_intent)
          if (paymentIntentId !== null) yield* repo.lockPayment(paymentIntentId)
          const transaction = yield* checkoutTransaction(session, event)
          if (transaction === undefined) return false
          yield* requireMyr(session.currency, event)
          if (
            session.amount_total !== undefined && session.amount_total !== null &&
            session.amount_total !== transaction.amountSen + transaction.taxSen
          ) {
            return yield* anomaly(
              `Checkout session ${session.id} was paid ${session.amount_total} sen; transaction ${transaction.id} is for ${
                transaction.amountSen + transaction.taxSen
              }.`
            )
          }
          const newlyPaid = transaction.status !== "succeeded"
          yield* repo.succeed(transaction.id, paymentIntentId)
          // A top-up asked to save its card (`setup_future_usage: off_session`): the card that paid, once.
          if (newlyPaid && paymentIntentId !== null && session.metadata?.[SAVE_CARD_METADATA] === "true") {
            yield* keepCard(
              transaction.accountId,
              cardProcessor.paymentCard(paymentIntentId),
              `paying card of checkout session ${session.id}`
            )
          }
          const facts = { transaction_id: transaction.id, amount_myr: transaction.amountSen / 100, automatic: false }
          if (newlyPaid) yield* announce(transaction.accountId, "topup.succeeded", facts)
          const settled = {
            ...transaction,
            status: "succeeded" as const,
            paymentIntentId: paymentIntentId ?? transaction.paymentIntentId
          }
          return (yield* reconcile(settled)) || newlyPaid
        })

      const failCheckout = (event: StripeEvent) =>
        Effect.gen(function*() {
          const session = yield* decode(CheckoutSession, event)
          const transaction = yield* checkoutTransaction(session, event)
          if (transaction === undefined) return false
          const failed = yield* repo.fail(transaction.id)
          if (failed) {
            yield* announce(transaction.accountId, "topup.failed", {
              transaction_id: transaction.id,
              amount_myr: transaction.amountSen / 100,
              reason: event.type === "checkout.session.expired"
                ? "the checkout session expired or was cancelled"
                : "the payment failed",
              action_url: `${dashboardUrl}/billing`
            })
          }
          return failed
        })

      const refund = (event: StripeEvent) =>
        Effect.gen(function*() {
          const charge = yield* decode(Charge, event)
          yield* requireMyr(charge.currency, event)
          const paymentIntentId = idOf(charge.payment_intent)
          yield* repo.lockPayment(paymentIntentId ?? charge.id)
          const recorded = yield* repo.recordCharge(charge.id, paymentIntentId, fromSen(charge.amount_refunded))
          const applied = yield* reconcileFor(paymentIntentId, charge.id)
          return recorded || applied
        })

      const dispute = (event: StripeEvent) =>
        Effect.gen(function*() {
          const object = yield* decode(Dispute, event)
          yield* requireMyr(object.currency, event)
          const fact: DisputeFact = {
            id: object.id,
            chargeId: idOf(object.charge) ?? object.id,
            paymentIntentId: idOf(object.payment_intent),
            amountMicroMyr: fromSen(object.amount),
            ...disputeFacts(event.type, object.status)
          }
          yield* repo.lockPayment(fact.paymentIntentId ?? fact.chargeId)
          const recorded = yield* repo.recordDispute(fact)
          const applied = yield* reconcileFor(fact.paymentIntentId, fact.chargeId)
          return recorded || applied
        })

      /** The events we act on, and how; every other type is acknowledged and ignored. */
      const handlers: Record<
        StripeEventType,
        (event: StripeEvent) => Effect.Effect<boolean, InternalError | MalformedEvent | SqlError.SqlError>
      > = {
        "checkout.session.completed": completeCheckout,
        "checkout.session.async_payment_succeeded": completeCheckout,
        "checkout.session.expired": failCheckout,
        "checkout.session.async_payment_failed": failCheckout,
        "charge.refunded": refund,
        "charge.dispute.created": dispute,
        "charge.dispute.funds_withdrawn": dispute,
        "charge.dispute.funds_reinstated": dispute,
        "charge.dispute.closed": dispute,
        "payment_intent.succeeded": intentSucceeded,
        "payment_intent.payment_failed": intentFailed
      }

      return Payments.of({
        apply: (event) => {
          const handle = isHandled(event.type) ? handlers[event.type] : undefined
          if (handle === undefined) return Effect.succeed(false)
          const decided = new Set<string>()
          return sql.withTransaction(Effect.gen(function*() {
            // The event's row is written first: a concurrent twin waits on it, then sees a duplicate.
            if (!(yield* repo.recordEvent(event.id, event.type, event))) return false
            return yield* handle(event)
          })).pipe(
            Effect.locally(SuspensionsDecided, decided),
            // Committed: this instance's cached keys follow at once (others on the database's announcement),
            // so a call right after the webhook's answer sees the account as it now is.
            Effect.tap(() => Effect.forEach(decided, keyCache.forgetAccount, { discard: true })),
            // Its effects rolled back; the event is kept, unprocessed, for an operator (a redelivery tries again).
            Effect.tapErrorTag("MalformedEvent", () => repo.keepUnprocessed(event.id, event.type, event))
          )
        }
      })
    })
  )
}

const closedStatus = (status: string): "won" | "lost" | "closed" =>
  status === "won" || status === "lost" ? status : "closed"

/**
 * What a dispute event says about Stripe's money (docs/money.md, "Payments (Stripe)"): an
 * inquiry (`warning_…`) moves none; a dispute's funds are withdrawn when it is
 * created or by `funds_withdrawn`, and reinstated by `funds_reinstated` or a
 * win. Reinstated funds were withdrawn first, whatever order events arrive in.
 */
export const disputeFacts = (
  type: string,
  status: string
): Pick<DisputeFact, "status" | "fundsWithdrawn" | "fundsReinstated"> => {
  const inquiry = status.startsWith("warning_")
  const reinstated = type === "charge.dispute.funds_reinstated" ||
    (type === "charge.dispute.closed" && status === "won")
  return {
    status: type === "charge.dispute.closed" ? closedStatus(status) : "open",
    fundsWithdrawn: reinstated || type === "charge.dispute.funds_withdrawn" || !inquiry,
    fundsReinstated: reinstated
  }
}
