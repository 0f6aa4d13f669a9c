import { SqlClient, type SqlError } from "@effect/sql"
import { Context, Effect, Layer } from "effect"
import { AppConfig } from "../AppConfig.js"
import { MICRO_PER_SEN, microMyr, toMyrNumber } from "../Domain/Money.js"
import { now } from "../Domain/Time.js"
import { emit } from "../Outbox/Events.js"
import type { DocumentDetail, DocumentSummary, DocumentType, Party } from "./Api.js"
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

/** The calendar year of `at` in `timeZone`: a document's number counts within it. */
export const yearIn = (at: Date, timeZone: string): number =>
  Number(new Intl.DateTimeFormat("en", { timeZone, year: "numeric" }).format(at))

const myr = (sen: number): number => toMyrNumber(microMyr(sen * MICRO_PER_SEN))

/** A stored document as the list gives it. */
export const toSummary = (document: StoredDocument, validationUrl: string | null): DocumentSummary => ({
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
    errors: document.eInvoiceErrors
  }
})

/** A stored document as the API gives it: its parties, lines and references too. */
export const toDetail = (document: StoredDocument, validationUrl: string | null): DocumentDetail => ({
  ...toSummary(document, validationUrl),
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
            return document
          })
      })
    })
  )
}
