import { SqlClient, type SqlError } from "@effect/sql"
import { Context, Effect, Layer } from "effect"
import { AppConfig } from "../AppConfig.js"
import { MICRO_PER_SEN, microMyr, toMyrNumber } from "../Domain/Money.js"
import { now } from "../Domain/Time.js"
import { emit } from "../Outbox/Events.js"
import type { DocumentDetail, DocumentSummary, DocumentType, Party } from "./Api.js"
import { EInvoiceRepo } from "./EInvoiceRepo.js"
import { CANCEL_WINDOW_MS, OVERDUE_AFTER_MS } from "./EInvoiceWorker.js"
import { InvoicesRepo, type StoredDocument, type StoredLine, TYPE_CODES } from "./Repo.js"

/** MyInvois' classification of the service sold: 022, "Others" (prepaid API credits fit no narrower code). */
export const CLASSIFICATION_CODE = "022"

export interface IssueInput {
  readonly accountId: string
  readonly type: DocumentType
  /** The money movement the document records (the ledger's effect key): one document per movement. */
  readonly effectKey: string
  readonly paymentTransactionId: string
  readonly paymentReference: string | null
  readonly description: string
  readonly netSen: number
  readonly taxSen: number
  readonly taxRateBps: number
}

/** A document above RM 10,000 is never consolidated: MyInvois wants it reported on its own. */
export const CONSOLIDATION_LIMIT_SEN = 1_000_000

/** How a document is reported to MyInvois: on its own (a buyer with a TIN, or above RM 10,000) or consolidated. */
export const routeOf = (buyer: Party, totalSen: number): "single" | "consolidated" =>
  buyer.tin !== null || totalSen > CONSOLIDATION_LIMIT_SEN ? "single" : "consolidated"

/** The calendar year of `at` in `timeZone`: a document's number counts within it. */
export const yearIn = (at: Date, timeZone: string): number =>
  Number(new Intl.DateTimeFormat("en", { timeZone, year: "numeric" }).format(at))

const myr = (sen: number): number => toMyrNumber(microMyr(sen * MICRO_PER_SEN))

/** A document waiting for its month's consolidation is overdue past this: the longest month, 7 days and 24 hours. */
const CONSOLIDATION_DEADLINE_MS = (31 + 7 + 1) * 24 * 60 * 60 * 1000

/**
 * Whether a document's e-invoice is overdue at `at` (docs/api/e-invoices.md, "Lifecycle"): not valid 24 hours
 * after its e-invoice's issue, or, still waiting for consolidation, past the month's deadline.
 */
export const isOverdue = (document: StoredDocument, at: Date): boolean => {
  if (document.eInvoiceStatus === "valid" || document.eInvoiceStatus === "cancelled") return false
  const since = at.getTime() - (document.eInvoiceCreatedAt ?? document.issuedAt).getTime()
  return document.eInvoiceCreatedAt === null ? since > CONSOLIDATION_DEADLINE_MS : since > OVERDUE_AFTER_MS
}

/** A stored document as the list gives it, at `at`. */
export const toSummary = (document: StoredDocument, validationUrl: string | null, at: Date): DocumentSummary => ({
  id: document.id,
  number: document.number,
  type: document.type,
  type_code: TYPE_CODES[document.type],
  issued_at: document.issuedAt.toISOString(),
  currency: "MYR",
  net_myr: myr(document.netSen),
  tax_myr: myr(document.taxSen),
  total_myr: myr(document.totalSen),
  e_invoice: {
    status: document.eInvoiceStatus,
    uuid: document.eInvoiceUuid,
    validation_url: validationUrl,
    validated_at: document.eInvoiceValidatedAt?.toISOString() ?? null,
    errors: document.eInvoiceErrors,
    route: document.eInvoiceRoute,
    number: document.eInvoiceNumber,
    overdue: isOverdue(document, at)
  }
})

/** A stored document as the API gives it: its parties, lines and references too. */
export const toDetail = (document: StoredDocument, validationUrl: string | null, at: Date): DocumentDetail => ({
  ...toSummary(document, validationUrl, at),
  supplier: document.supplier,
  buyer: document.buyer,
  lines: document.lines.map((line) => ({
    description: line.description,
    quantity: line.quantity,
    unit_price_myr: myr(line.unitPriceSen),
    tax_rate_bps: line.taxRateBps,
    tax_myr: myr(line.taxSen),
    subtotal_myr: myr(line.netSen),
    total_myr: myr(line.netSen + line.taxSen),
    classification_code: line.classificationCode
  })),
  tax_rate_bps: document.taxRateBps,
  payment_reference: document.paymentReference,
  transaction_id: document.paymentTransactionId,
  references: document.referencesId === null || document.referencesNumber === null
    ? null
    : { id: document.referencesId, number: document.referencesNumber }
})

/**
 * Issues the tax documents of money movements (docs/api/invoices.md, "Documents"): an invoice for each paid
 * top-up, a refund note for each refund or dispute debit (money returned), a debit note for money won back.
 * `issue` runs inside the SQL transaction that moves the money and is given only a movement that transaction
 * made; the document takes its number there, with the supplier and buyer as they are at that moment, and an
 * `invoice.issued` event for the account's webhooks goes out with the same commit.
 */
export class Documents extends Context.Tag("nenas/Documents")<Documents, {
  readonly issue: (input: IssueInput) => Effect.Effect<StoredDocument | undefined, SqlError.SqlError>
}>() {
  static readonly layer = Layer.effect(
    Documents,
    Effect.gen(function*() {
      const repo = yield* InvoicesRepo
      const eInvoices = yield* EInvoiceRepo
      const sql = yield* SqlClient.SqlClient
      const config = yield* AppConfig

      const buyerOf = (accountId: string) =>
        Effect.gen(function*() {
          const profile = yield* repo.profile(accountId)
          if (profile !== undefined) return profile.profile
          const account = yield* repo.accountName(accountId)
          const named: Party = {
            legal_name: account?.name ?? account?.email ?? accountId,
            tin: null,
            id_type: null,
            id_value: null,
            sst_number: null,
            msic: null,
            email: account?.email ?? null,
            phone: null,
            address: null
          }
          return named
        })

      /**
       * Queues the document's own e-invoice, in the same transaction (docs/api/e-invoices.md, "Who gets what"):
       * a note follows its invoice (on its own, or consolidated); a consolidated one waits for its month's end.
       * A refund note that completes a full refund within 72 hours of its invoice's validation asks for the
       * invoice's cancellation instead, and waits on it.
       */
      const reportable = (document: StoredDocument, at: Date) =>
        Effect.gen(function*() {
          const invoice = document.referencesId === null
            ? undefined
            : yield* eInvoices.ofDocument(document.referencesId)
          const route = document.referencesId === null
            ? routeOf(document.buyer, document.totalSen)
            : yield* repo.routeOf(document.referencesId)
          yield* repo.setRoute(document.id, route)
          if (route === "consolidated") return
          const fullRefund = document.type === "refund_note" && invoice !== undefined && invoice.kind === "single" &&
            ["pending", "submitted", "valid"].includes(invoice.status) &&
            (invoice.validatedAt === null || at.getTime() - invoice.validatedAt.getTime() < CANCEL_WINDOW_MS) &&
            (yield* repo.refundedOf(invoice.documentId ?? "")) >= (yield* repo.totalOf(invoice.documentId ?? ""))
          if (fullRefund) yield* eInvoices.requestCancel(invoice.id, at)
          yield* eInvoices.create({
            kind: "single",
            typeCode: TYPE_CODES[document.type],
            codeNumber: document.number,
            accountId: document.accountId,
            documentId: document.id,
            month: null,
            buyer: document.buyer,
            dueAt: fullRefund ? null : at,
            heldBy: fullRefund ? invoice.id : null,
            at
          }, [document.id])
        })

      return Documents.of({
        issue: (input) =>
          Effect.gen(function*() {
            if (yield* repo.hasEffect(input.effectKey)) return undefined
            const issuedAt = yield* now
            const line: StoredLine = {
              description: input.description,
              quantity: 1,
              unitPriceSen: input.netSen,
              taxRateBps: input.taxRateBps,
              netSen: input.netSen,
              taxSen: input.taxSen,
              classificationCode: CLASSIFICATION_CODE
            }
            const references = input.type === "invoice" ? undefined : yield* repo.invoiceOf(input.paymentTransactionId)
            const document = yield* repo.insert({
              accountId: input.accountId,
              type: input.type,
              effectKey: input.effectKey,
              issuedAt,
              year: yearIn(issuedAt, config.businessTimezone),
              paymentTransactionId: input.paymentTransactionId,
              referencesId: references?.id ?? null,
              supplier: config.supplier,
              buyer: yield* buyerOf(input.accountId),
              lines: [line],
              taxRateBps: input.taxRateBps,
              paymentReference: input.paymentReference
            })
            yield* emit({
              accountId: input.accountId,
              type: "invoice.issued",
              at: issuedAt,
              data: {
                account_id: input.accountId,
                invoice_id: document.id,
                number: document.number,
                type: document.type,
                transaction_id: input.paymentTransactionId,
                net_myr: myr(document.netSen),
                tax_myr: myr(document.taxSen),
                total_myr: myr(document.totalSen),
                references: document.referencesNumber
              }
            }).pipe(Effect.provideService(SqlClient.SqlClient, sql))
            yield* reportable(document, issuedAt)
            return document
          })
      })
    })
  )
}
