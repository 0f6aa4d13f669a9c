import { SqlClient, type SqlError, SqlSchema } from "@effect/sql"
import { Context, Effect, Layer, Schema } from "effect"
import { AppConfig } from "../AppConfig.js"
import { InvalidRequest } from "../Domain/Errors.js"
import { now } from "../Domain/Time.js"
import { CONSOLIDATED_CLASSIFICATION, type TypeCode, type UblLine } from "../EInvoicing/Ubl.js"
import { Covered, EInvoiceRepo } from "./EInvoiceRepo.js"
import { PREFIXES, TYPE_CODES } from "./Repo.js"

/**
 * The month's consolidated e-invoices (docs/api/e-invoices.md, "Consolidated e-invoices"). Every document
 * reported in consolidation (a buyer without a TIN, RM 10,000 or less) goes, once its month has ended in
 * `BUSINESS_TIMEZONE`, into one consolidated e-invoice per type, buyer "General Public": one line per run of
 * consecutive numbers at one tax rate, split into parts of at most `LINES_PER_PART` lines so each stays well
 * under MyInvois' 300 KB a document. Runs are idempotent: a document is consolidated once (its `e_invoice_id`),
 * under a transaction-scoped advisory lock, so two instances, or the scheduler and a person, never split
 * one month twice. Documents issued after a month was closed early go into a supplementary part.
 */

/** Lines of one consolidated e-invoice: about 1 KB each in UBL JSON, far below 300 KB with the rest. */
export const LINES_PER_PART = 150
/** Documents consolidated in one transaction; a larger month is done in several. */
const DOCUMENTS_PER_PASS = 20_000
const LOCK_KEY = "nenas:e-invoice-consolidation"

const TYPE_OF_CODE: Record<TypeCode, keyof typeof PREFIXES> = {
  "01": "invoice",
  "02": "credit_note",
  "03": "debit_note",
  "04": "refund_note"
}

/** `YYYY-MM`, a real month. */
export const isMonth = (text: string): boolean => /^\d{4}-(0[1-9]|1[0-2])$/.test(text)

/** A run of consecutive numbers at one tax rate: one line of a consolidated e-invoice. */
export interface Run {
  readonly documents: ReadonlyArray<Covered>
}

/** The runs of `documents` (in number order): a run breaks at a gap in the numbers, a new year, or another rate. */
export const runsOf = (documents: ReadonlyArray<Covered>): ReadonlyArray<Run> => {
  const runs: Array<Array<Covered>> = []
  for (const document of documents) {
    const current = runs[runs.length - 1]
    const last = current?.[current.length - 1]
    const continues = last !== undefined && last.year === document.year && last.sequence + 1 === document.sequence &&
      last.taxRateBps === document.taxRateBps && last.type === document.type
    if (continues) current!.push(document)
    else runs.push([document])
  }
  return runs.map((documents) => ({ documents }))
}

/** A run as a line: "Receipts INV-2026-000001 to INV-2026-000120 (120)", its amounts summed. */
export const lineOf = (run: Run): UblLine => {
  const first = run.documents[0]!
  const last = run.documents[run.documents.length - 1]!
  const netSen = run.documents.reduce((sum, document) => sum + document.netSen, 0)
  const taxSen = run.documents.reduce((sum, document) => sum + document.taxSen, 0)
  return {
    description: run.documents.length === 1
      ? `Receipt ${first.number}`
      : `Receipts ${first.number} to ${last.number} (${run.documents.length})`,
    quantity: 1,
    unitPriceSen: netSen,
    netSen,
    taxSen,
    taxRateBps: first.taxRateBps,
    classificationCode: CONSOLIDATED_CLASSIFICATION
  }
}

/** Splits runs into parts of at most `LINES_PER_PART` lines, in number order. */
export const partsOf = (runs: ReadonlyArray<Run>): ReadonlyArray<ReadonlyArray<Run>> => {
  const parts: Array<ReadonlyArray<Run>> = []
  for (let start = 0; start < runs.length; start += LINES_PER_PART) {
    parts.push(runs.slice(start, start + LINES_PER_PART))
  }
  return parts
}

/** `CON-INV-2026-11-001`: a consolidated e-invoice's number, by type, month and part. */
export const consolidatedNumber = (typeCode: TypeCode, month: string, part: number): string =>
  `CON-${PREFIXES[TYPE_OF_CODE[typeCode]]}-${month}-${String(part).padStart(3, "0")}`

export interface ConsolidatedPart {
  readonly id: string
  readonly codeNumber: string
  readonly typeCode: TypeCode
  readonly documents: number
  readonly lines: number
}

export interface ConsolidationOutcome {
  readonly month: string
  /** The parts this run made; empty when the month was consolidated already. */
  readonly created: ReadonlyArray<ConsolidatedPart>
  /** True when the month had not ended: documents issued later go into a supplementary part. */
  readonly early: boolean
}

export class Consolidation extends Context.Tag("nenas/Consolidation")<Consolidation, {
  /**
   * Consolidates `month`'s documents not yet reported. The month must have ended (400 naming `month`), unless
   * `early`, which closes the current month now.
   */
  readonly consolidate: (
    month: string,
    options?: { readonly early?: boolean }
  ) => Effect.Effect<ConsolidationOutcome, InvalidRequest | SqlError.SqlError>
  /** Consolidates every ended month that still has documents to report: what the scheduler runs. */
  readonly consolidateEnded: Effect.Effect<ReadonlyArray<ConsolidationOutcome>, SqlError.SqlError>
}>() {
  static readonly layer = Layer.effect(
    Consolidation,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const config = yield* AppConfig
      const eInvoices = yield* EInvoiceRepo
      const tz = config.businessTimezone

      const pending = SqlSchema.findAll({
        Request: Schema.Struct({ month: Schema.String, until: Schema.DateFromSelf }),
        Result: Covered,
        execute: ({ month, until }) =>
          sql`
            SELECT id, account_id, type, number, year, sequence, tax_rate_bps, net_sen, tax_sen,
              references_document_id AS references_id
            FROM billing_documents
            WHERE e_invoice_route = 'consolidated' AND e_invoice_id IS NULL
              AND issued_at >= ((${month} || '-01')::timestamp AT TIME ZONE ${tz})
              AND issued_at < (((${month} || '-01')::timestamp + interval '1 month') AT TIME ZONE ${tz})
              AND issued_at <= ${until}
            ORDER BY type, year, sequence
            LIMIT ${DOCUMENTS_PER_PASS}
            FOR UPDATE
          `
      })

      const monthState = (month: string, at: Date) =>
        Effect.map(
          sql<{ ended: boolean; current: boolean }>`
            SELECT ((((${month} || '-01')::timestamp + interval '1 month') AT TIME ZONE ${tz}) <= ${at}) AS ended,
              (((${month} || '-01')::timestamp AT TIME ZONE ${tz}) <= ${at}) AS current
          `,
          (rows) => rows[0] ?? { ended: false, current: false }
        )

      const partsSoFar = (month: string, typeCode: TypeCode) =>
        Effect.map(
          sql<{ n: number }>`
            SELECT count(DISTINCT code_number)::int AS n FROM e_invoices
            WHERE kind = 'consolidated' AND month = ${month} AND type_code = ${typeCode}
          `,
          (rows) => rows[0]?.n ?? 0
        )

      /** One pass: at most `DOCUMENTS_PER_PASS` documents, in one transaction under the lock. */
      const pass = (month: string, at: Date) =>
        sql.withTransaction(Effect.gen(function*() {
          yield* sql`SELECT pg_advisory_xact_lock(hashtext(${LOCK_KEY}))`
          const documents = yield* Effect.orDie(pending({ month, until: at }))
          const created: Array<ConsolidatedPart> = []
          for (const typeCode of ["01", "02", "03", "04"] as const) {
            const ofType = documents.filter((document) => TYPE_CODES[document.type] === typeCode)
            if (ofType.length === 0) continue
            let part = yield* partsSoFar(month, typeCode)
            for (const runs of partsOf(runsOf(ofType))) {
              part += 1
              const codeNumber = consolidatedNumber(typeCode, month, part)
              const ids = runs.flatMap((run) => run.documents.map((document) => document.id))
              const id = yield* eInvoices.create({
                kind: "consolidated",
                typeCode,
                codeNumber,
                accountId: null,
                documentId: null,
                month,
                buyer: null,
                dueAt: at,
                at
              }, ids)
              created.push({ id, codeNumber, typeCode, documents: ids.length, lines: runs.length })
            }
          }
          return { created, more: documents.length === DOCUMENTS_PER_PASS }
        }))

      const consolidate = (month: string, options: { readonly early?: boolean } = {}) =>
        Effect.gen(function*() {
          if (!isMonth(month)) {
            return yield* Effect.fail(new InvalidRequest({ message: "month must be YYYY-MM", param: "month" }))
          }
          const at = yield* now
          const state = yield* monthState(month, at)
          if (!state.current) {
            return yield* Effect.fail(
              new InvalidRequest({ message: `${month} has not begun in ${tz}: nothing to consolidate`, param: "month" })
            )
          }
          if (!state.ended && options.early !== true) {
            return yield* Effect.fail(
              new InvalidRequest({
                message: `${month} has not ended in ${tz}: a month is consolidated after it ends`,
                param: "month"
              })
            )
          }
          const created: Array<ConsolidatedPart> = []
          // Bounded: each pass takes up to DOCUMENTS_PER_PASS documents; a month holds far fewer passes than this.
          for (let passes = 0; passes < 1_000; passes++) {
            const outcome = yield* pass(month, at)
            created.push(...outcome.created)
            if (!outcome.more) break
          }
          if (created.length > 0) {
            yield* Effect.logInfo(
              `consolidated ${month}: ${
                created.map((part) => `${part.codeNumber} (${part.documents} documents)`).join(", ")
              }`
            )
          }
          return { month, created, early: !state.ended }
        })

      const consolidateEnded = Effect.gen(function*() {
        const at = yield* now
        const months = yield* sql<{ month: string }>`
          SELECT DISTINCT to_char(issued_at AT TIME ZONE ${tz}, 'YYYY-MM') AS month FROM billing_documents
          WHERE e_invoice_route = 'consolidated' AND e_invoice_id IS NULL
            AND issued_at < (date_trunc('month', ${at}::timestamptz AT TIME ZONE ${tz}) AT TIME ZONE ${tz})
          ORDER BY month LIMIT 24
        `
        const outcomes: Array<ConsolidationOutcome> = []
        for (const { month } of months) {
          const outcome = yield* consolidate(month).pipe(Effect.catchTag("InvalidRequest", Effect.die))
          outcomes.push(outcome)
        }
        return outcomes
      })

      return Consolidation.of({ consolidate, consolidateEnded })
    })
  )
}
