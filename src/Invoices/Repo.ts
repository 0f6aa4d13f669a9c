import { SqlClient, type SqlError, SqlSchema } from "@effect/sql"
import { Context, Effect, Layer, Option, Schema } from "effect"
import type { NoSuchElementException } from "effect/Cause"
import type { ParseError } from "effect/ParseResult"
import { newId } from "../Domain/Ids.js"
import { now } from "../Domain/Time.js"
import { type DocumentType, EInvoiceStatus, Party } from "./Api.js"

/**
 * The billing profiles, the document numbers and the documents themselves: this module is their tables'
 * only reader and writer. Their jsonb columns are read as text and decoded here: the client's name
 * transform would otherwise rename the keys inside them. The e-invoice state columns (`e_invoice_*` but the
 * route) are `EInvoiceRepo`'s, which writes them with each change of the e-invoice they copy. Every write of a document runs inside the caller's SQL transaction (the one that
 * moves its money), so a number exists exactly when its money moved.
 */

/** Each document type's number prefix (`INV-2026-000001`). */
export const PREFIXES: Record<DocumentType, string> = {
  invoice: "INV",
  credit_note: "CN",
  debit_note: "DN",
  refund_note: "RN"
}

export const TYPE_CODES = { invoice: "01", credit_note: "02", debit_note: "03", refund_note: "04" } as const

/** One line as stored, in sen. */
export const StoredLine = Schema.Struct({
  description: Schema.String,
  quantity: Schema.Int,
  unitPriceSen: Schema.Int,
  taxRateBps: Schema.Int,
  netSen: Schema.Int,
  taxSen: Schema.Int,
  classificationCode: Schema.String
})
export type StoredLine = typeof StoredLine.Type

export const StoredDocument = Schema.Struct({
  id: Schema.String,
  accountId: Schema.String,
  type: Schema.Literal("invoice", "credit_note", "debit_note", "refund_note"),
  number: Schema.String,
  issuedAt: Schema.DateFromSelf,
  paymentTransactionId: Schema.NullOr(Schema.String),
  referencesId: Schema.NullOr(Schema.String),
  referencesNumber: Schema.NullOr(Schema.String),
  supplier: Schema.parseJson(Party),
  buyer: Schema.parseJson(Party),
  lines: Schema.parseJson(Schema.Array(StoredLine)),
  taxRateBps: Schema.Int,
  netSen: Schema.Int,
  taxSen: Schema.Int,
  totalSen: Schema.Int,
  paymentReference: Schema.NullOr(Schema.String),
  eInvoiceStatus: EInvoiceStatus,
  eInvoiceUuid: Schema.NullOr(Schema.String),
  eInvoiceLongId: Schema.NullOr(Schema.String),
  eInvoiceValidatedAt: Schema.NullOr(Schema.DateFromSelf),
  eInvoiceErrors: Schema.parseJson(Schema.Array(
    Schema.Struct({ code: Schema.String, message: Schema.String, target: Schema.NullOr(Schema.String) })
  )),
  eInvoiceRoute: Schema.Literal("single", "consolidated"),
  /** The e-invoice it is reported in: its number and when it was made (null until then). */
  eInvoiceNumber: Schema.NullOr(Schema.String),
  eInvoiceCreatedAt: Schema.NullOr(Schema.DateFromSelf)
})
export type StoredDocument = typeof StoredDocument.Type

export interface NewDocument {
  readonly accountId: string
  readonly type: DocumentType
  readonly effectKey: string
  readonly issuedAt: Date
  /** The calendar year of `issuedAt` in the business time zone: the number's year. */
  readonly year: number
  readonly paymentTransactionId: string | null
  readonly referencesId: string | null
  readonly supplier: Party
  readonly buyer: Party
  readonly lines: ReadonlyArray<StoredLine>
  readonly taxRateBps: number
  readonly paymentReference: string | null
}

export interface DocumentQuery {
  readonly page: number
  readonly limit: number
  readonly type?: DocumentType | undefined
  readonly from?: Date | undefined
  readonly to?: Date | undefined
}

export const StoredProfile = Schema.Struct({
  profile: Schema.parseJson(Party),
  updatedAt: Schema.DateFromSelf
})
export type StoredProfile = typeof StoredProfile.Type

const AccountName = Schema.Struct({ name: Schema.NullOr(Schema.String), email: Schema.NullOr(Schema.String) })
const Numbered = Schema.Struct({ lastNumber: Schema.Int })
const Reference = Schema.Struct({ id: Schema.String, number: Schema.String })

type Q<A> = Effect.Effect<A, SqlError.SqlError>

const documentColumns = `d.id, d.account_id, d.type, d.number, d.issued_at, d.payment_transaction_id,
  d.references_document_id AS references_id, r.number AS references_number, d.supplier::text, d.buyer::text, d.lines::text,
  d.tax_rate_bps, d.net_sen, d.tax_sen, d.total_sen, d.payment_reference, d.e_invoice_status, d.e_invoice_uuid,
  d.e_invoice_long_id, d.e_invoice_validated_at, d.e_invoice_errors::text, d.e_invoice_route,
  e.code_number AS e_invoice_number, COALESCE(e.issued_at, e.created_at) AS e_invoice_created_at`

export class InvoicesRepo extends Context.Tag("nenas/InvoicesRepo")<InvoicesRepo, {
  readonly profile: (accountId: string) => Q<StoredProfile | undefined>
  /** Keeps the buyer a profile makes (`buyerOf`), for documents issued from now on. */
  readonly saveProfile: (accountId: string, buyer: Party, memberId: string | null) => Q<StoredProfile>
  /** The account as a buyer without a profile: its name (or email). */
  readonly accountName: (accountId: string) => Q<typeof AccountName.Type | undefined>
  /** True when a document records this money movement already. */
  readonly hasEffect: (effectKey: string) => Q<boolean>
  /** The invoice a payment issued, which its notes reference. */
  readonly invoiceOf: (paymentTransactionId: string) => Q<typeof Reference.Type | undefined>
  /**
   * Takes the next number of the type's prefix and year and writes the document with it, in the caller's
   * transaction: the number row stays locked until it ends, and a rollback gives the number back.
   */
  readonly insert: (document: NewDocument) => Q<StoredDocument>
  readonly list: (accountId: string, query: DocumentQuery) => Q<ReadonlyArray<StoredDocument>>
  /** How a document is reported to MyInvois (its notes follow it). */
  readonly routeOf: (id: string) => Q<"single" | "consolidated">
  readonly setRoute: (id: string, route: "single" | "consolidated") => Q<void>
  /** The gross refunded so far against an invoice: its refund notes' totals, in sen. */
  readonly refundedOf: (invoiceId: string) => Q<number>
  readonly totalOf: (id: string) => Q<number>
  readonly find: (accountId: string, id: string) => Q<StoredDocument | undefined>
}>() {
  static readonly layer = Layer.effect(
    InvoicesRepo,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      /** A row of another shape is a defect; a missing row where one must be, too. */
      const die = <A>(self: Effect.Effect<A, ParseError | NoSuchElementException | SqlError.SqlError>): Q<A> =>
        Effect.catchIf(
          self,
          (error): error is ParseError | NoSuchElementException => error._tag !== "SqlError",
          Effect.die
        )
      const findProfile = SqlSchema.findOne({
        Request: Schema.String,
        Result: StoredProfile,
        execute: (accountId) =>
          sql`SELECT profile::text, updated_at FROM billing_profiles WHERE account_id = ${accountId}`
      })
      const findDocument = SqlSchema.findOne({
        Request: Schema.Struct({ accountId: Schema.String, id: Schema.String }),
        Result: StoredDocument,
        execute: ({ accountId, id }) =>
          sql`
            SELECT ${sql.literal(documentColumns)} FROM billing_documents d
            LEFT JOIN billing_documents r ON r.id = d.references_document_id
            LEFT JOIN e_invoices e ON e.id = d.e_invoice_id
            WHERE d.account_id = ${accountId} AND d.id = ${id}
          `
      })
      const byId = SqlSchema.single({
        Request: Schema.String,
        Result: StoredDocument,
        execute: (id) =>
          sql`
            SELECT ${sql.literal(documentColumns)} FROM billing_documents d
            LEFT JOIN billing_documents r ON r.id = d.references_document_id
            LEFT JOIN e_invoices e ON e.id = d.e_invoice_id
            WHERE d.id = ${id}
          `
      })
      const listDocuments = SqlSchema.findAll({
        Request: Schema.Struct({
          accountId: Schema.String,
          page: Schema.Int,
          limit: Schema.Int,
          type: Schema.NullOr(Schema.String),
          from: Schema.NullOr(Schema.DateFromSelf),
          to: Schema.NullOr(Schema.DateFromSelf)
        }),
        Result: StoredDocument,
        execute: ({ accountId, from, limit, page, to, type }) =>
          sql`
            SELECT ${sql.literal(documentColumns)} FROM billing_documents d
            LEFT JOIN billing_documents r ON r.id = d.references_document_id
            LEFT JOIN e_invoices e ON e.id = d.e_invoice_id
            WHERE d.account_id = ${accountId}
              AND (${type}::text IS NULL OR d.type = ${type})
              AND (${from}::timestamptz IS NULL OR d.issued_at >= ${from})
              AND (${to}::timestamptz IS NULL OR d.issued_at < ${to})
            ORDER BY d.issued_at DESC, d.id DESC
            LIMIT ${limit} OFFSET ${(page - 1) * limit}
          `
      })
      const accountName = SqlSchema.findOne({
        Request: Schema.String,
        Result: AccountName,
        execute: (accountId) => sql`SELECT name, email FROM accounts WHERE id = ${accountId}`
      })
      const invoiceOf = SqlSchema.findOne({
        Request: Schema.String,
        Result: Reference,
        execute: (transactionId) =>
          sql`
            SELECT id, number FROM billing_documents
            WHERE payment_transaction_id = ${transactionId} AND type = 'invoice'
            ORDER BY issued_at LIMIT 1
          `
      })
      const nextNumber = SqlSchema.single({
        Request: Schema.Struct({ prefix: Schema.String, year: Schema.Int }),
        Result: Numbered,
        execute: ({ prefix, year }) =>
          sql`
            INSERT INTO document_numbers (prefix, year, last_number) VALUES (${prefix}, ${year}, 1)
            ON CONFLICT (prefix, year) DO UPDATE SET last_number = document_numbers.last_number + 1
            RETURNING last_number
          `
      })

      return InvoicesRepo.of({
        profile: (accountId) => die(Effect.map(findProfile(accountId), Option.getOrUndefined)),
        saveProfile: (accountId, buyer, memberId) =>
          Effect.gen(function*() {
            const at = yield* now
            yield* sql`
              INSERT INTO billing_profiles (account_id, profile, updated_at, updated_by_member_id)
              VALUES (${accountId}, ${JSON.stringify(buyer)}::jsonb, ${at}, ${memberId})
              ON CONFLICT (account_id) DO UPDATE
                SET profile = EXCLUDED.profile, updated_at = EXCLUDED.updated_at,
                    updated_by_member_id = EXCLUDED.updated_by_member_id
            `
            const saved = yield* die(findProfile(accountId))
            return Option.isSome(saved) ? saved.value : yield* Effect.dieMessage("the profile was not saved")
          }),
        accountName: (accountId) => die(Effect.map(accountName(accountId), Option.getOrUndefined)),
        hasEffect: (effectKey) =>
          Effect.map(
            sql`SELECT 1 FROM billing_documents WHERE effect_key = ${effectKey}`,
            (rows) => rows.length > 0
          ),
        invoiceOf: (transactionId) => die(Effect.map(invoiceOf(transactionId), Option.getOrUndefined)),
        insert: (document) =>
          Effect.gen(function*() {
            const prefix = PREFIXES[document.type]
            const { lastNumber } = yield* die(nextNumber({ prefix, year: document.year }))
            const id = newId("doc")
            const number = `${prefix}-${document.year}-${String(lastNumber).padStart(6, "0")}`
            const netSen = document.lines.reduce((sum, line) => sum + line.netSen, 0)
            const taxSen = document.lines.reduce((sum, line) => sum + line.taxSen, 0)
            yield* sql`
              INSERT INTO billing_documents (
                id, account_id, type, number, year, sequence, issued_at, effect_key, payment_transaction_id,
                references_document_id, supplier, buyer, lines, tax_rate_bps, net_sen, tax_sen, total_sen,
                payment_reference)
              VALUES (
                ${id}, ${document.accountId}, ${document.type}, ${number}, ${document.year}, ${lastNumber},
                ${document.issuedAt}, ${document.effectKey}, ${document.paymentTransactionId},
                ${document.referencesId}, ${JSON.stringify(document.supplier)}::jsonb,
                ${JSON.stringify(document.buyer)}::jsonb, ${JSON.stringify(document.lines)}::jsonb,
                ${document.taxRateBps}, ${netSen}, ${taxSen}, ${netSen + taxSen}, ${document.paymentReference})
            `
            return yield* die(byId(id))
          }),
        list: (accountId, query) =>
          die(listDocuments({
            accountId,
            page: query.page,
            limit: query.limit,
            type: query.type ?? null,
            from: query.from ?? null,
            to: query.to ?? null
          })),
        find: (accountId, id) => die(Effect.map(findDocument({ accountId, id }), Option.getOrUndefined)),
        routeOf: (id) =>
          Effect.map(
            sql<
              { route: "single" | "consolidated" }
            >`SELECT e_invoice_route AS route FROM billing_documents WHERE id = ${id}`,
            (rows) => rows[0]?.route ?? "consolidated"
          ),
        setRoute: (id, route) =>
          Effect.asVoid(sql`UPDATE billing_documents SET e_invoice_route = ${route} WHERE id = ${id}`),
        refundedOf: (invoiceId) =>
          Effect.map(
            sql<{ sen: number }>`
              SELECT COALESCE(sum(total_sen), 0)::int AS sen FROM billing_documents
              WHERE references_document_id = ${invoiceId} AND type = 'refund_note'
            `,
            (rows) => rows[0]?.sen ?? 0
          ),
        totalOf: (id) =>
          Effect.map(
            sql<{ sen: number }>`SELECT total_sen::int AS sen FROM billing_documents WHERE id = ${id}`,
            (rows) => rows[0]?.sen ?? 0
          )
      })
    })
  )
}
