import { SqlClient, type SqlError, SqlSchema, type Statement } from "@effect/sql"
import { Context, Effect, Layer, Option, Schema } from "effect"
import type { ParseError } from "effect/ParseResult"
import { newId } from "../Domain/Ids.js"
import { fromSen, MicroMyr } from "../Domain/Money.js"
import { storableJson } from "../Domain/Strict.js"
import { makeTestLayer } from "../Domain/TestLayer.js"
import { now } from "../Domain/Time.js"
import { type TaxedAmount, taxOn } from "../Invoices/Tax.js"

export const PaymentTransaction = Schema.Struct({
  id: Schema.String,
  accountId: Schema.String,
  /** What the wallet is credited: the top-up as chosen, tax excluded. */
  amountSen: Schema.Int,
  amountMicroMyr: MicroMyr,
  /** Service tax charged on top (docs/money.md, "Service tax"), at `taxRateBps`. */
  taxSen: Schema.Int,
  taxRateBps: Schema.Int,
  status: Schema.Literal("pending", "succeeded", "failed"),
  checkoutSessionId: Schema.NullOr(Schema.String),
  paymentIntentId: Schema.NullOr(Schema.String),
  chargeId: Schema.NullOr(Schema.String),
  /** The cumulative gross (amount and tax) Stripe refunded so far. */
  refundedMicroMyr: MicroMyr
})
export type PaymentTransaction = typeof PaymentTransaction.Type

export const DisputeRow = Schema.Struct({
  id: Schema.String,
  amountMicroMyr: MicroMyr,
  status: Schema.Literal("open", "won", "lost", "closed"),
  /** Stripe took the disputed amount (a dispute, not an inquiry). */
  fundsWithdrawn: Schema.Boolean,
  /** Stripe gave it back (funds reinstated, or the dispute won). */
  fundsReinstated: Schema.Boolean
})
export type DisputeRow = typeof DisputeRow.Type

/** What one event says about a dispute; facts only ever accumulate. */
export type DisputeFact = Omit<DisputeRow, "id"> & {
  readonly id: string
  readonly chargeId: string
  readonly paymentIntentId: string | null
}

export interface PendingPayment extends TaxedAmount {
  readonly id: string
}

type Sql = Effect.Effect.Success<typeof SqlClient.SqlClient>

type Q<A> = Effect.Effect<A, SqlError.SqlError>

const Id = Schema.Struct({ id: Schema.String })
const Total = Schema.Struct({ total: MicroMyr })
const Disputed = Schema.Struct({ disputed: Schema.Boolean })
/** What a transaction's facts are found by. */
const Transaction = Schema.Struct({
  id: Schema.String,
  accountId: Schema.String,
  paymentIntentId: Schema.NullOr(Schema.String),
  chargeId: Schema.NullOr(Schema.String)
})

const transactionColumns = (sql: Sql) =>
  sql`id, account_id, amount_sen, amount_micro_myr, tax_sen, tax_rate_bps, status, checkout_session_id, payment_intent_id,
    charge_id, refunded_micro_myr`

/**
 * Payment transactions and the Stripe facts (charges' refunded totals,
 * disputes) that move money on them. Facts are stored as they arrive, in any
 * order; the payment service turns them into ledger entries once the payment
 * they belong to is known. Rows are decoded (a row of another shape is a defect).
 * Every method but `createPending` and `attachSession` runs in the Stripe webhook's
 * transaction, whose handler counts a failed event by its `SqlError`: they keep it
 * as a failure; those two (a checkout's, and the auto top-up worker's) make it a defect.
 */
export class PaymentsRepo extends Context.Tag("nenas/PaymentsRepo")<PaymentsRepo, {
  /** A pending top-up of `amountSen` with service tax at `taxRateBps` on top: what the buyer is charged. */
  readonly createPending: (accountId: string, amountSen: number, taxRateBps: number) => Effect.Effect<PendingPayment>
  /** A transaction as it is (no lock). */
  readonly find: (transactionId: string) => Q<PaymentTransaction | undefined>
  /** The account's transactions among `ids` (a ledger page's), as they are. */
  readonly findMany: (accountId: string, ids: ReadonlyArray<string>) => Q<ReadonlyArray<PaymentTransaction>>
  readonly attachSession: (transactionId: string, sessionId: string) => Effect.Effect<void>
  readonly findBySession: (sessionId: string) => Q<PaymentTransaction | undefined>
  /** Locks a transaction row for the rest of the SQL transaction. */
  readonly lock: (transactionId: string) => Q<PaymentTransaction | undefined>
  readonly findIdByIntentOrCharge: (paymentIntentId: string | null, chargeId: string | null) => Q<string | undefined>
  readonly succeed: (transactionId: string, paymentIntentId: string | null) => Q<void>
  /** A pending transaction fails; a settled one is left as it is. True when it changed. */
  readonly fail: (transactionId: string) => Q<boolean>
  readonly setCharge: (transactionId: string, chargeId: string) => Q<void>
  readonly setRefunded: (transactionId: string, refundedMicroMyr: number) => Q<void>
  /** Keeps the highest cumulative refunded amount seen; true when it grew or is new. */
  readonly recordCharge: (chargeId: string, paymentIntentId: string | null, refundedMicroMyr: number) => Q<boolean>
  /** The refunded total Stripe reported across the charges of a payment. */
  readonly refundedTotal: (transaction: PaymentTransaction) => Q<number>
  /** Stores a dispute, merging what is known: a closed dispute stays closed, withdrawn and reinstated stay set. True when it is new or changed. */
  readonly recordDispute: (fact: DisputeFact) => Q<boolean>
  /** The disputes of a payment, now linked to its account. */
  readonly claimDisputes: (transaction: PaymentTransaction) => Q<ReadonlyArray<DisputeRow>>
  /** An open dispute of the account whose funds Stripe withdrew (an inquiry withdraws nothing). */
  readonly hasWithdrawnDispute: (accountId: string) => Q<boolean>
  /** Records a webhook event; false when its id was seen before. */
  readonly recordEvent: (id: string, type: string, payload: unknown) => Q<boolean>
  /** Keeps an event that could not be applied (`processed_at` null), for an operator to look at. */
  readonly keepUnprocessed: (id: string, type: string, payload: unknown) => Q<void>
  /** Serializes the events of one payment across instances until the SQL transaction ends. */
  readonly lockPayment: (key: string) => Q<void>
}>() {
  static readonly layer = Layer.effect(
    PaymentsRepo,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      /** A row of another shape is a defect; the `SqlError` stays a failure (see above). */
      const decoded = (name: string) => <A>(self: Effect.Effect<A, ParseError | SqlError.SqlError>): Q<A> =>
        self.pipe(Effect.catchTag("ParseError", Effect.die), Effect.withSpan(`PaymentsRepo.${name}`))
      const transactionBy = (where: (key: string) => Statement.Fragment) =>
        SqlSchema.findOne({
          Request: Schema.String,
          Result: PaymentTransaction,
          execute: (key) => sql`SELECT ${transactionColumns(sql)} FROM payment_transactions WHERE ${where(key)}`
        })
      const bySession = transactionBy((sessionId) => sql`checkout_session_id = ${sessionId}`)
      const locked = transactionBy((id) => sql`id = ${id} FOR UPDATE`)
      const found = transactionBy((id) => sql`id = ${id}`)
      const idByIntentOrCharge = SqlSchema.findOne({
        Request: Schema.Struct({
          paymentIntentId: Schema.NullOr(Schema.String),
          chargeId: Schema.NullOr(Schema.String)
        }),
        Result: Id,
        execute: ({ chargeId, paymentIntentId }) =>
          sql`
            SELECT id FROM payment_transactions
            WHERE (${paymentIntentId}::text IS NOT NULL AND payment_intent_id = ${paymentIntentId})
               OR (${chargeId}::text IS NOT NULL AND charge_id = ${chargeId})
            LIMIT 1
          `
      })
      const refundedTotal = SqlSchema.single({
        Request: Transaction,
        Result: Total,
        execute: (transaction) =>
          sql`
            SELECT COALESCE(SUM(amount_refunded_micro_myr), 0)::bigint AS total FROM stripe_charges
            WHERE (${transaction.paymentIntentId}::text IS NOT NULL AND payment_intent_id = ${transaction.paymentIntentId})
               OR (${transaction.chargeId}::text IS NOT NULL AND id = ${transaction.chargeId})
          `
      })
      const claimDisputes = SqlSchema.findAll({
        Request: Transaction,
        Result: DisputeRow,
        execute: (transaction) =>
          sql`
            UPDATE disputes SET account_id = ${transaction.accountId}, payment_transaction_id = ${transaction.id}
            WHERE (${transaction.paymentIntentId}::text IS NOT NULL AND payment_intent_id = ${transaction.paymentIntentId})
               OR (${transaction.chargeId}::text IS NOT NULL AND charge_id = ${transaction.chargeId})
            RETURNING id, amount_micro_myr, status, funds_withdrawn, funds_reinstated
          `
      })
      const hasWithdrawnDispute = SqlSchema.single({
        Request: Schema.String,
        Result: Disputed,
        execute: (accountId) =>
          sql`
            SELECT EXISTS (
              SELECT 1 FROM disputes WHERE account_id = ${accountId} AND status = 'open' AND funds_withdrawn
            ) AS disputed
          `
      })

      return PaymentsRepo.of({
        createPending: (accountId, amountSen, taxRateBps) =>
          Effect.gen(function*() {
            const id = newId("txn")
            const at = yield* now
            const taxed = taxOn(amountSen, taxRateBps)
            yield* sql`
              INSERT INTO payment_transactions (id, account_id, amount_sen, amount_micro_myr, tax_sen, tax_rate_bps,
                                                created_at, updated_at)
              VALUES (${id}, ${accountId}, ${amountSen}, ${fromSen(amountSen)}, ${taxed.taxSen}, ${taxRateBps},
                      ${at}, ${at})
            `
            return { id, ...taxed }
          }).pipe(Effect.orDie, Effect.withSpan("PaymentsRepo.createPending")),
        findMany: (accountId, ids) =>
          ids.length === 0 ? Effect.succeed([]) : SqlSchema.findAll({
            Request: Schema.Void,
            Result: PaymentTransaction,
            execute: () =>
              sql`SELECT ${transactionColumns(sql)} FROM payment_transactions
                  WHERE account_id = ${accountId} AND id IN ${sql.in(ids)}`
          })(undefined).pipe(decoded("findMany")),
        find: (transactionId) => found(transactionId).pipe(Effect.map(Option.getOrUndefined), decoded("find")),
        attachSession: (transactionId, sessionId) =>
          sql`
            UPDATE payment_transactions SET checkout_session_id = ${sessionId} WHERE id = ${transactionId}
          `.pipe(Effect.asVoid, Effect.orDie, Effect.withSpan("PaymentsRepo.attachSession")),
        findBySession: (sessionId) =>
          bySession(sessionId).pipe(Effect.map(Option.getOrUndefined), decoded("findBySession")),
        lock: (transactionId) => locked(transactionId).pipe(Effect.map(Option.getOrUndefined), decoded("lock")),
        findIdByIntentOrCharge: (paymentIntentId, chargeId) =>
          idByIntentOrCharge({ paymentIntentId, chargeId }).pipe(
            Effect.map((row) => Option.getOrUndefined(row)?.id),
            decoded("findIdByIntentOrCharge")
          ),
        succeed: (transactionId, paymentIntentId) =>
          Effect.flatMap(now, (at) =>
            sql`
              UPDATE payment_transactions
              SET status = 'succeeded', payment_intent_id = COALESCE(${paymentIntentId}, payment_intent_id),
                  completed_at = COALESCE(completed_at, ${at}), updated_at = ${at}
              WHERE id = ${transactionId}
            `),
        fail: (transactionId) =>
          Effect.flatMap(now, (at) =>
            sql`
              UPDATE payment_transactions SET status = 'failed', updated_at = ${at}
              WHERE id = ${transactionId} AND status = 'pending'
              RETURNING id
            `).pipe(Effect.map((rows) => rows.length > 0)),
        setCharge: (transactionId, chargeId) =>
          Effect.asVoid(sql`
            UPDATE payment_transactions SET charge_id = ${chargeId} WHERE id = ${transactionId} AND charge_id IS NULL
          `),
        setRefunded: (transactionId, refundedMicroMyr) =>
          Effect.flatMap(now, (at) =>
            sql`
              UPDATE payment_transactions SET refunded_micro_myr = ${refundedMicroMyr}, updated_at = ${at}
              WHERE id = ${transactionId}
            `),
        recordCharge: (chargeId, paymentIntentId, refundedMicroMyr) =>
          Effect.flatMap(now, (at) =>
            sql`
              INSERT INTO stripe_charges (id, payment_intent_id, amount_refunded_micro_myr, updated_at)
              VALUES (${chargeId}, ${paymentIntentId}, ${refundedMicroMyr}, ${at})
              ON CONFLICT (id) DO UPDATE
                SET amount_refunded_micro_myr = EXCLUDED.amount_refunded_micro_myr,
                    payment_intent_id = COALESCE(stripe_charges.payment_intent_id, EXCLUDED.payment_intent_id),
                    updated_at = EXCLUDED.updated_at
                WHERE stripe_charges.amount_refunded_micro_myr < EXCLUDED.amount_refunded_micro_myr
              RETURNING id
            `).pipe(Effect.map((rows) => rows.length > 0)),
        refundedTotal: (transaction) =>
          refundedTotal(transaction).pipe(
            Effect.map((row) => row.total),
            Effect.catchTag("NoSuchElementException", Effect.die),
            decoded("refundedTotal")
          ),
        recordDispute: (fact) =>
          Effect.flatMap(now, (at) => {
            // A close tells about money only while the dispute is open: a close after a close changes nothing.
            const applies = sql`(EXCLUDED.status = 'open' OR disputes.status = 'open')`
            return sql`
              INSERT INTO disputes (id, charge_id, payment_intent_id, amount_micro_myr, status, funds_withdrawn,
                                    funds_reinstated, created_at, closed_at)
              VALUES (${fact.id}, ${fact.chargeId}, ${fact.paymentIntentId}, ${fact.amountMicroMyr}, ${fact.status},
                      ${fact.fundsWithdrawn}, ${fact.fundsReinstated}, ${at}, ${fact.status === "open" ? null : at})
              ON CONFLICT (id) DO UPDATE
                SET status = CASE WHEN disputes.status = 'open' THEN EXCLUDED.status ELSE disputes.status END,
                    closed_at = COALESCE(disputes.closed_at, EXCLUDED.closed_at),
                    funds_withdrawn = disputes.funds_withdrawn OR (EXCLUDED.funds_withdrawn AND ${applies}),
                    funds_reinstated = disputes.funds_reinstated OR (EXCLUDED.funds_reinstated AND ${applies}),
                    payment_intent_id = COALESCE(disputes.payment_intent_id, EXCLUDED.payment_intent_id)
                WHERE (disputes.status = 'open' AND EXCLUDED.status <> 'open')
                   OR (EXCLUDED.funds_withdrawn AND NOT disputes.funds_withdrawn AND ${applies})
                   OR (EXCLUDED.funds_reinstated AND NOT disputes.funds_reinstated AND ${applies})
              RETURNING id
            `.pipe(Effect.map((rows) => rows.length > 0))
          }),
        claimDisputes: (transaction) => claimDisputes(transaction).pipe(decoded("claimDisputes")),
        hasWithdrawnDispute: (accountId) =>
          hasWithdrawnDispute(accountId).pipe(
            Effect.map((row) => row.disputed),
            Effect.catchTag("NoSuchElementException", Effect.die),
            decoded("hasWithdrawnDispute")
          ),
        recordEvent: (id, type, payload) =>
          Effect.flatMap(now, (at) =>
            sql`
              INSERT INTO webhook_events (id, type, payload, received_at, processed_at)
              VALUES (${id}, ${type}, ${storableJson(payload)}::jsonb, ${at}, ${at})
              ON CONFLICT (id) DO UPDATE SET processed_at = EXCLUDED.processed_at WHERE webhook_events.processed_at IS NULL
              RETURNING id
            `).pipe(Effect.map((rows) => rows.length > 0)),
        keepUnprocessed: (id, type, payload) =>
          Effect.flatMap(now, (at) =>
            sql`
              INSERT INTO webhook_events (id, type, payload, received_at, processed_at)
              VALUES (${id}, ${type}, ${storableJson(payload)}::jsonb, ${at}, NULL)
              ON CONFLICT (id) DO NOTHING
            `).pipe(Effect.asVoid),
        lockPayment: (key) => Effect.asVoid(sql`SELECT pg_advisory_xact_lock(hashtextextended(${key}, 0))`)
      })
    })
  )

  static readonly Test = makeTestLayer(PaymentsRepo)
}
