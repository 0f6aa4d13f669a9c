import { SqlClient, type SqlError, SqlSchema } from "@effect/sql"
import { Context, Effect, Layer, Schema } from "effect"
import type { ParseError } from "effect/ParseResult"
import { newId } from "../Domain/Ids.js"
import type { EInvoiceError } from "../EInvoicing/MyInvois.js"
import type { TypeCode } from "../EInvoicing/Ubl.js"
import { Party } from "./Api.js"

/**
 * The `e_invoices` table, and the copy of each e-invoice's state its documents keep in their `e_invoice_*`
 * columns: this module is their only writer, and writes both in one statement's transaction so a document
 * never shows a state its e-invoice is not in (docs/api/e-invoices.md, "Lifecycle").
 */

export const EInvoiceRow = Schema.Struct({
  id: Schema.String,
  kind: Schema.Literal("single", "consolidated"),
  typeCode: Schema.Literal("01", "02", "03", "04"),
  codeNumber: Schema.String,
  attempt: Schema.Int,
  accountId: Schema.NullOr(Schema.String),
  documentId: Schema.NullOr(Schema.String),
  month: Schema.NullOr(Schema.String),
  buyer: Schema.NullOr(Schema.parseJson(Party)),
  status: Schema.Literal("pending", "submitted", "valid", "invalid", "cancelled", "superseded"),
  body: Schema.NullOr(Schema.String),
  issuedAt: Schema.NullOr(Schema.DateFromSelf),
  submissionUid: Schema.NullOr(Schema.String),
  uuid: Schema.NullOr(Schema.String),
  longId: Schema.NullOr(Schema.String),
  attempts: Schema.Int,
  submittedAt: Schema.NullOr(Schema.DateFromSelf),
  validatedAt: Schema.NullOr(Schema.DateFromSelf),
  cancelRequestedAt: Schema.NullOr(Schema.DateFromSelf),
  heldBy: Schema.NullOr(Schema.String),
  createdAt: Schema.DateFromSelf
})
export type EInvoiceRow = typeof EInvoiceRow.Type

const columns = `id, kind, type_code, code_number, attempt, account_id, document_id, month, buyer::text, status, body,
  issued_at, submission_uid, uuid, long_id, attempts, submitted_at, validated_at, cancel_requested_at, held_by,
  created_at`
/** The same columns of `e_invoices e` in a join. */
const joinedColumns = columns.split(",").map((column) => `e.${column.trim()}`).join(", ")

/** A document an e-invoice covers, as a consolidated one lists it and as events name it. */
export const Covered = Schema.Struct({
  id: Schema.String,
  accountId: Schema.String,
  type: Schema.Literal("invoice", "credit_note", "debit_note", "refund_note"),
  number: Schema.String,
  year: Schema.Int,
  sequence: Schema.Int,
  taxRateBps: Schema.Int,
  netSen: Schema.Int,
  taxSen: Schema.Int,
  referencesId: Schema.NullOr(Schema.String)
})
export type Covered = typeof Covered.Type

/** The e-invoice a document was reported in: what a note's BillingReference names. */
const Reference = Schema.Struct({
  codeNumber: Schema.String,
  uuid: Schema.NullOr(Schema.String),
  status: Schema.String
})

export interface NewEInvoice {
  readonly kind: "single" | "consolidated"
  readonly typeCode: TypeCode
  readonly codeNumber: string
  readonly attempt?: number
  readonly accountId: string | null
  readonly documentId: string | null
  readonly month: string | null
  readonly buyer: Party | null
  /** When a worker may first claim it; null: held until something releases it. */
  readonly dueAt: Date | null
  readonly heldBy?: string | null
  readonly at: Date
}

type Q<A> = Effect.Effect<A, SqlError.SqlError>

export class EInvoiceRepo extends Context.Tag("nenas/EInvoiceRepo")<EInvoiceRepo, {
  /** Writes a new e-invoice and points `documentIds` at it (their state copy becomes pending). */
  readonly create: (invoice: NewEInvoice, documentIds: ReadonlyArray<string>) => Q<string>
  readonly byId: (id: string) => Q<EInvoiceRow | undefined>
  /** The e-invoice a document is reported in now. */
  readonly ofDocument: (documentId: string) => Q<EInvoiceRow | undefined>
  /** Leases due e-invoices to `instanceId` until `leaseUntil`: each is claimed by one instance at a time. */
  readonly claim: (now: Date, leaseUntil: Date, limit: number, instanceId: string) => Q<ReadonlyArray<EInvoiceRow>>
  /** Gives back what an earlier process of this identity held when it died: a restart resumes at once. */
  readonly releaseClaims: (instanceId: string) => Q<void>
  /** Keeps the document as it will be sent, every time, and the issue time inside it. */
  readonly saveBody: (id: string, body: string, hash: string, issuedAt: Date) => Q<void>
  /** Notes that a submission of these is about to be sent (kept before sending, so a crash is looked up later). */
  readonly sending: (ids: ReadonlyArray<string>, at: Date) => Q<void>
  readonly accepted: (id: string, submissionUid: string, uuid: string, pollAt: Date) => Q<void>
  /** Invalid, with MyInvois' errors (rejected at submission or at validation); answers true when this made it so. */
  readonly invalid: (id: string, errors: ReadonlyArray<EInvoiceError>, at: Date) => Q<boolean>
  /** Valid; answers true when this made it so (once per e-invoice, whoever polls). */
  readonly valid: (id: string, longId: string, validatedAt: Date, nextAt: Date | null) => Q<boolean>
  readonly cancelled: (id: string, at: Date) => Q<void>
  /** Tries again at `at` (null: not until something else happens), after a failure (counted) or a wait. */
  readonly later: (id: string, at: Date | null, error: string | null, failed: boolean) => Q<void>
  /** Notes waiting for what they reference to be valid look again now (something just became valid). */
  readonly wakeWaiting: (at: Date) => Q<void>
  /** Asks for the e-invoice's cancellation; the worker cancels once it is valid. */
  readonly requestCancel: (id: string, at: Date) => Q<void>
  /** The cancellation will not happen: drops the request and sends the notes it held. */
  readonly dropCancel: (id: string, at: Date, reason: string) => Q<void>
  /** The notes held by a cancellation, settled with it: they need no e-invoice of their own. */
  readonly settleHeld: (id: string, at: Date) => Q<void>
  /** Replaces an invalid e-invoice by a new attempt of the same number (the old one superseded). */
  readonly supersede: (old: EInvoiceRow, replacement: NewEInvoice) => Q<string>
  /** The documents an e-invoice covers, in number order. */
  readonly covered: (id: string) => Q<ReadonlyArray<Covered>>
  /** The e-invoices the documents `documentIds` were reported in (a note's references). */
  readonly referencesOf: (documentIds: ReadonlyArray<string>) => Q<ReadonlyArray<typeof Reference.Type>>
  /** The valid single e-invoices of notes that reference `documentId`: cancelled before it. */
  readonly validNotesOf: (documentId: string) => Q<ReadonlyArray<EInvoiceRow>>
  /** E-invoices not valid 24 hours after their issue (or creation), for the metric. */
  readonly overdue: (before: Date) => Q<number>
}>() {
  static readonly layer = Layer.effect(
    EInvoiceRepo,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const die = <A>(self: Effect.Effect<A, ParseError | SqlError.SqlError>): Q<A> =>
        Effect.catchIf(self, (error): error is ParseError => error._tag === "ParseError", Effect.die)
      const findById = SqlSchema.findAll({
        Request: Schema.String,
        Result: EInvoiceRow,
        execute: (id) => sql`SELECT ${sql.literal(columns)} FROM e_invoices WHERE id = ${id}`
      })
      const claim = SqlSchema.findAll({
        Request: Schema.Struct({
          now: Schema.DateFromSelf,
          leaseUntil: Schema.DateFromSelf,
          limit: Schema.Int,
          instanceId: Schema.String
        }),
        Result: EInvoiceRow,
        execute: ({ instanceId, leaseUntil, limit, now }) =>
          sql`
            UPDATE e_invoices SET claimed_until = ${leaseUntil}, claimed_by = ${instanceId}
            WHERE id IN (
              SELECT id FROM e_invoices
              WHERE next_attempt_at <= ${now} AND (claimed_until IS NULL OR claimed_until < ${now})
              ORDER BY next_attempt_at LIMIT ${limit} FOR UPDATE SKIP LOCKED
            )
            RETURNING ${sql.literal(columns)}
          `
      })
      const covered = SqlSchema.findAll({
        Request: Schema.String,
        Result: Covered,
        execute: (id) =>
          sql`
            SELECT id, account_id, type, number, year, sequence, tax_rate_bps, net_sen, tax_sen,
              references_document_id AS references_id
            FROM billing_documents WHERE e_invoice_id = ${id} ORDER BY year, sequence
          `
      })
      const references = SqlSchema.findAll({
        Request: Schema.Array(Schema.String),
        Result: Reference,
        execute: (ids) =>
          sql`
            SELECT DISTINCT e.code_number, e.uuid, e.status FROM billing_documents d
            JOIN e_invoices e ON e.id = d.e_invoice_id
            WHERE d.id IN ${sql.in(ids)}
          `
      })
      const validNotes = SqlSchema.findAll({
        Request: Schema.String,
        Result: EInvoiceRow,
        execute: (documentId) =>
          sql`
            SELECT ${sql.literal(joinedColumns)} FROM e_invoices e
            JOIN billing_documents d ON d.id = e.document_id
            WHERE d.references_document_id = ${documentId} AND e.kind = 'single' AND e.status = 'valid'
          `
      })

      /** The documents' copy of the e-invoice's state, in the same transaction as the change. */
      const mirror = (id: string) =>
        sql`
          UPDATE billing_documents d SET
            e_invoice_status = CASE e.status WHEN 'superseded' THEN 'invalid' ELSE e.status END,
            e_invoice_uuid = e.uuid, e_invoice_long_id = e.long_id,
            e_invoice_validated_at = e.validated_at, e_invoice_errors = e.errors
          FROM e_invoices e WHERE e.id = ${id} AND d.e_invoice_id = e.id
        `
      const changed = <A>(id: string, change: Effect.Effect<A, SqlError.SqlError>) =>
        sql.withTransaction(Effect.tap(change, () => mirror(id)))

      const create = (invoice: NewEInvoice, documentIds: ReadonlyArray<string>) =>
        sql.withTransaction(Effect.gen(function*() {
          const id = newId("ein")
          yield* sql`
            INSERT INTO e_invoices (id, kind, type_code, code_number, attempt, account_id, document_id, month, buyer,
              next_attempt_at, held_by, created_at)
            VALUES (${id}, ${invoice.kind}, ${invoice.typeCode}, ${invoice.codeNumber}, ${invoice.attempt ?? 1},
              ${invoice.accountId}, ${invoice.documentId}, ${invoice.month},
              ${invoice.buyer === null ? null : JSON.stringify(invoice.buyer)}::jsonb, ${invoice.dueAt},
              ${invoice.heldBy ?? null}, ${invoice.at})
          `
          if (documentIds.length > 0) {
            yield* sql`UPDATE billing_documents SET e_invoice_id = ${id} WHERE id IN ${sql.in(documentIds)}`
            yield* mirror(id)
          }
          return id
        }))

      return EInvoiceRepo.of({
        create,
        byId: (id) => die(Effect.map(findById(id), (rows) => rows[0])),
        ofDocument: (documentId) =>
          Effect.flatMap(
            sql<{ id: string }>`SELECT e_invoice_id AS id FROM billing_documents WHERE id = ${documentId}`,
            (rows) =>
              rows[0]?.id === undefined || rows[0].id === null
                ? Effect.succeed(undefined)
                : die(Effect.map(findById(rows[0].id), (found) => found[0]))
          ),
        claim: (now, leaseUntil, limit, instanceId) => die(claim({ now, leaseUntil, limit, instanceId })),
        releaseClaims: (instanceId) =>
          Effect.asVoid(sql`UPDATE e_invoices SET claimed_until = NULL WHERE claimed_by = ${instanceId}`),
        saveBody: (id, body, hash, issuedAt) =>
          Effect.asVoid(sql`UPDATE e_invoices SET body = ${body}, hash = ${hash}, issued_at = ${issuedAt}
            WHERE id = ${id} AND body IS NULL`),
        sending: (ids, at) =>
          ids.length === 0 ? Effect.void : Effect.asVoid(
            sql`UPDATE e_invoices SET submitted_at = COALESCE(submitted_at, ${at}) WHERE id IN ${sql.in(ids)}`
          ),
        accepted: (id, submissionUid, uuid, pollAt) =>
          changed(
            id,
            sql`
              UPDATE e_invoices SET status = 'submitted', submission_uid = ${submissionUid}, uuid = ${uuid},
                attempts = 0, next_attempt_at = ${pollAt}, claimed_until = NULL, last_error = NULL
              WHERE id = ${id} AND status = 'pending'
            `
          ).pipe(Effect.asVoid),
        invalid: (id, errors, at) =>
          changed(
            id,
            sql<{ id: string }>`
              UPDATE e_invoices SET status = 'invalid', errors = ${JSON.stringify(errors)}::jsonb,
                next_attempt_at = NULL, claimed_until = NULL, last_error = ${`invalid at ${at.toISOString()}`}
              WHERE id = ${id} AND status IN ('pending', 'submitted') RETURNING id
            `
          ).pipe(Effect.map((rows) => rows.length > 0)),
        valid: (id, longId, validatedAt, nextAt) =>
          changed(
            id,
            sql<{ id: string }>`
              UPDATE e_invoices SET status = 'valid', long_id = ${longId}, validated_at = ${validatedAt},
                errors = '[]', attempts = 0, next_attempt_at = ${nextAt}, claimed_until = NULL, last_error = NULL
              WHERE id = ${id} AND status IN ('pending', 'submitted') RETURNING id
            `
          ).pipe(Effect.map((rows) => rows.length > 0)),
        cancelled: (id, at) =>
          changed(
            id,
            sql`
              UPDATE e_invoices SET status = 'cancelled', cancelled_at = ${at}, next_attempt_at = NULL,
                claimed_until = NULL
              WHERE id = ${id}
            `
          ).pipe(Effect.asVoid),
        later: (id, at, error, failed) =>
          Effect.asVoid(sql`
            UPDATE e_invoices SET next_attempt_at = ${at}, claimed_until = NULL,
              attempts = attempts + ${failed ? 1 : 0}, last_error = COALESCE(${error}, last_error)
            WHERE id = ${id}
          `),
        wakeWaiting: (at) =>
          Effect.asVoid(sql`
            UPDATE e_invoices SET next_attempt_at = ${at}
            WHERE status = 'pending' AND body IS NULL AND type_code <> '01' AND held_by IS NULL
              AND next_attempt_at > ${at}
          `),
        requestCancel: (id, at) =>
          Effect.asVoid(sql`
            UPDATE e_invoices SET cancel_requested_at = ${at},
              next_attempt_at = CASE WHEN status = 'valid' THEN ${at} ELSE next_attempt_at END
            WHERE id = ${id} AND cancel_requested_at IS NULL
          `),
        dropCancel: (id, at, reason) =>
          sql.withTransaction(Effect.gen(function*() {
            yield* sql`
              UPDATE e_invoices SET cancel_requested_at = NULL, next_attempt_at = NULL, claimed_until = NULL,
                last_error = ${reason.slice(0, 300)}
              WHERE id = ${id}
            `
            yield* sql`UPDATE e_invoices SET held_by = NULL, next_attempt_at = ${at} WHERE held_by = ${id}`
          })),
        settleHeld: (id, at) =>
          Effect.gen(function*() {
            const held = yield* sql<{ id: string }>`
              UPDATE e_invoices SET status = 'cancelled', cancelled_at = ${at}, next_attempt_at = NULL
              WHERE held_by = ${id} AND status = 'pending' RETURNING id
            `
            for (const row of held) yield* mirror(row.id)
          }).pipe(sql.withTransaction),
        supersede: (old, replacement) =>
          sql.withTransaction(Effect.gen(function*() {
            yield* sql`UPDATE e_invoices SET status = 'superseded', next_attempt_at = NULL WHERE id = ${old.id}`
            const documents = yield* sql<
              { id: string }
            >`SELECT id FROM billing_documents WHERE e_invoice_id = ${old.id}`
            return yield* create(replacement, documents.map((row) => row.id))
          })),
        covered: (id) => die(covered(id)),
        referencesOf: (documentIds) => documentIds.length === 0 ? Effect.succeed([]) : die(references(documentIds)),
        validNotesOf: (documentId) => die(validNotes(documentId)),
        overdue: (before) =>
          Effect.map(
            sql<{ n: number }>`
              SELECT count(*)::int AS n FROM e_invoices
              WHERE status IN ('pending', 'submitted', 'invalid') AND held_by IS NULL
                AND COALESCE(issued_at, created_at) < ${before}
            `,
            (rows) => rows[0]?.n ?? 0
          )
      })
    })
  )
}
