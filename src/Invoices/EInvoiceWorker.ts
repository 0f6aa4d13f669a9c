import { SqlClient } from "@effect/sql"
import { Context, Duration, Effect, Layer, Option, Schedule } from "effect"
import { readFileSync } from "node:fs"
import { AppConfig } from "../AppConfig.js"
import { MICRO_PER_SEN, microMyr, toMyrNumber } from "../Domain/Money.js"
import { now } from "../Domain/Time.js"
import {
  documentHash,
  type EInvoiceError,
  EInvoicing,
  type MyInvoisFailure,
  type SubmittedDocument
} from "../EInvoicing/MyInvois.js"
import { makeSigner, type Signer } from "../EInvoicing/Signing.js"
import { buildDocument, type UblInput, type UblReference } from "../EInvoicing/Ubl.js"
import { Metrics } from "../Observability/Metrics.js"
import { DASHBOARD_URL, emit } from "../Outbox/Events.js"
import { backoffMs } from "../Outbox/Retries.js"
import { Consolidation, lineOf, runsOf } from "./Consolidation.js"
import { type Covered, EInvoiceRepo, type EInvoiceRow } from "./EInvoiceRepo.js"
import { InvoicesRepo } from "./Repo.js"

/**
 * Submits e-invoices to MyInvois, off every request's path (docs/api/e-invoices.md, "How submission works").
 * Each instance claims due e-invoices from the table, each leased to one instance at a time, and:
 * - builds a pending one's document on its first attempt (signed when a key is configured) and keeps it,
 *   so every retry sends the same bytes; a note waits until what it references has a UUID;
 * - looks a document up by number before sending it again when an earlier send may have reached MyInvois
 *   (a crash after sending, before the answer was kept), so none is submitted twice;
 * - submits at most 100 documents and 5 MB at once; a document that failed before goes alone;
 * - polls what was submitted until MyInvois validates or rejects it, telling the account either way;
 * - cancels what a full refund within 72 hours asked to cancel, its notes first.
 * Every failure is retried with back-off, honouring `Retry-After`. The scheduler also consolidates ended months.
 */

const MAX_DOCUMENTS = 100
/** MyInvois' limit of a submission, its documents base64-encoded; kept under with room for the envelope. */
const MAX_SUBMISSION_BYTES = 5 * 1024 * 1024 - 64 * 1024
/** MyInvois' limit of one document. */
export const MAX_DOCUMENT_BYTES = 300 * 1024
const LEASE = Duration.minutes(2)
/** A note waits this long before looking again whether what it references is valid. */
const REFERENCE_WAIT_MS = 60_000
/** MyInvois lets a valid document be cancelled for this long after validation. */
export const CANCEL_WINDOW_MS = 72 * 60 * 60 * 1000
/** An e-invoice not valid this long after its issue is overdue (counted, and shown on its documents). */
export const OVERDUE_AFTER_MS = 24 * 60 * 60 * 1000
const CONSOLIDATE_EVERY = Duration.minutes(10)

/** The wait before polling a submitted document again: 1 s doubling to 5 minutes. */
const pollDelayMs = (polls: number): number => Math.min(1_000 * 2 ** Math.min(polls, 10), 5 * 60 * 1000)

const myr = (sen: number): number => toMyrNumber(microMyr(sen * MICRO_PER_SEN))

const monthPeriod = (month: string) => {
  const [year, monthNumber] = month.split("-").map(Number) as [number, number]
  const last = new Date(Date.UTC(year, monthNumber, 0)).getUTCDate()
  return { start: `${month}-01`, end: `${month}-${String(last).padStart(2, "0")}` }
}

type Built = { readonly _tag: "built"; readonly text: string; readonly issuedAt: Date } | {
  readonly _tag: "waiting"
  readonly reason: string
}

export class EInvoiceWorker extends Context.Tag("nenas/EInvoiceWorker")<EInvoiceWorker, {
  /** Claims what is due and acts on it; the number of e-invoices handled. */
  readonly runOnce: Effect.Effect<number>
  /** Counts overdue e-invoices (every instance's) into the metric, as `/metrics` is scraped; the count. */
  readonly countOverdue: Effect.Effect<number>
}>() {
  static readonly layer = Layer.effect(
    EInvoiceWorker,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const config = yield* AppConfig
      const myinvois = yield* EInvoicing
      const eInvoices = yield* EInvoiceRepo
      const documents = yield* InvoicesRepo
      const metrics = yield* Metrics
      const signer: Signer | undefined = Option.isSome(config.myinvoisSigningKey) &&
          Option.isSome(config.myinvoisSigningCert)
        ? yield* makeSigner(
          readFileSync(config.myinvoisSigningKey.value, "utf8"),
          readFileSync(config.myinvoisSigningCert.value, "utf8")
        )
        : undefined
      const version = signer === undefined ? "1.0" as const : "1.1" as const

      const validationUrl = (uuid: string, longId: string) => `${config.myinvoisPortalUrl}/${uuid}/share/${longId}`

      /** What a note references: every e-invoice its documents' invoices were reported in, each with a UUID. */
      const referencesFor = (referencedIds: ReadonlyArray<string>) =>
        Effect.map(eInvoices.referencesOf(referencedIds), (found) => {
          const missing = found.filter((reference) => reference.uuid === null || reference.status !== "valid")
          if (found.length === 0 || missing.length > 0) return undefined
          return found.map((reference): UblReference => ({ number: reference.codeNumber, uuid: reference.uuid! }))
        })

      const finish = (input: Omit<UblInput, "version">): Built => {
        const document = buildDocument({ ...input, version })
        const text = signer === undefined ? JSON.stringify(document) : signer.sign(document, input.issuedAt)
        return { _tag: "built", text, issuedAt: input.issuedAt }
      }

      /** The document of an e-invoice, issued now, or why it must wait. */
      const build = (row: EInvoiceRow) =>
        Effect.gen(function*() {
          const issuedAt = yield* now
          if (row.kind === "single") {
            const document = yield* documents.find(row.accountId ?? "", row.documentId ?? "")
            if (document === undefined) return yield* Effect.dieMessage(`e-invoice ${row.id} has no document`)
            const references = document.referencesId === null ? [] : yield* referencesFor([document.referencesId])
            if (references === undefined) {
              return {
                _tag: "waiting",
                reason: `waits for ${document.referencesNumber}'s e-invoice to be valid`
              } as Built
            }
            return finish({
              number: row.codeNumber,
              typeCode: row.typeCode,
              issuedAt,
              supplier: document.supplier,
              buyer: row.buyer ?? document.buyer,
              lines: document.lines,
              references,
              paymentReference: document.paymentReference
            })
          }
          const covered = yield* eInvoices.covered(row.id)
          const referenced = [
            ...new Set(covered.flatMap((document) => document.referencesId === null ? [] : [document.referencesId]))
          ]
          const references = referenced.length === 0 ? [] : yield* referencesFor(referenced)
          if (references === undefined) {
            return { _tag: "waiting", reason: "waits for the consolidated e-invoices it adjusts to be valid" } as Built
          }
          return finish({
            number: row.codeNumber,
            typeCode: row.typeCode,
            issuedAt,
            supplier: config.supplier,
            buyer: "general public",
            lines: runsOf(covered).map(lineOf),
            references,
            period: monthPeriod(row.month ?? ""),
            paymentReference: null
          })
        })

      /** Each covered document's account hears of it: `e_invoice.validated` or `e_invoice.rejected`. */
      const tell = (
        row: EInvoiceRow,
        outcome: { readonly _tag: "validated"; readonly uuid: string; readonly longId: string } | {
          readonly _tag: "rejected"
          readonly errors: ReadonlyArray<EInvoiceError>
        },
        at: Date
      ) =>
        Effect.gen(function*() {
          const covered: ReadonlyArray<Covered> = yield* eInvoices.covered(row.id)
          for (const document of covered) {
            const base = {
              account_id: document.accountId,
              invoice_id: document.id,
              number: document.number,
              type: document.type,
              e_invoice: { code_number: row.codeNumber, consolidated: row.kind === "consolidated" }
            }
            if (outcome._tag === "validated") {
              yield* emit({
                accountId: document.accountId,
                type: "e_invoice.validated",
                at,
                data: {
                  ...base,
                  e_invoice: {
                    ...base.e_invoice,
                    uuid: outcome.uuid,
                    long_id: outcome.longId,
                    validation_url: validationUrl(outcome.uuid, outcome.longId)
                  },
                  total_myr: myr(document.netSen + document.taxSen)
                }
              })
            } else if (row.kind === "single") {
              // A consolidated e-invoice's rejection is the operator's to mend: no account can fix it.
              yield* emit({
                accountId: document.accountId,
                type: "e_invoice.rejected",
                at,
                data: { ...base, errors: outcome.errors },
                email: {
                  subject: `MyInvois rejected the e-invoice of ${document.number}`,
                  body: `MyInvois did not validate the e-invoice of ${document.number}:\n\n${
                    outcome.errors.slice(0, 10).map((error) =>
                      `- ${error.code}: ${error.message}${error.target === null ? "" : ` (${error.target})`}`
                    ).join("\n")
                  }\n\nCorrect the billing profile, then resubmit it from the Invoices page: ${DASHBOARD_URL}/invoices`
                }
              })
            }
          }
          if (outcome._tag === "rejected" && row.kind === "consolidated") {
            yield* Effect.logError(
              `MyInvois rejected the consolidated e-invoice ${row.codeNumber}: ${JSON.stringify(outcome.errors)}`
            )
          }
        })

      const markInvalid = (row: EInvoiceRow, errors: ReadonlyArray<EInvoiceError>, at: Date) =>
        sql.withTransaction(Effect.gen(function*() {
          if (!(yield* eInvoices.invalid(row.id, errors, at))) return
          yield* tell(row, { _tag: "rejected", errors }, at)
          // Nothing valid to cancel: the notes it held go out, and wait for it to be valid after a resubmission.
          if (row.cancelRequestedAt !== null) yield* eInvoices.dropCancel(row.id, at, "invalid: nothing to cancel")
        }))

      const markValid = (row: EInvoiceRow, uuid: string, longId: string, validatedAt: Date, at: Date) =>
        sql.withTransaction(Effect.gen(function*() {
          const nextAt = row.cancelRequestedAt === null ? null : at
          if (yield* eInvoices.valid(row.id, longId, validatedAt, nextAt)) {
            yield* tell(row, { _tag: "validated", uuid, longId }, at)
            // A note waiting for this one to be valid need not wait out its minute.
            yield* eInvoices.wakeWaiting(at)
          }
        }))

      /** After a failure: back off (at least as long as MyInvois asked). */
      const retry = (row: EInvoiceRow, failure: MyInvoisFailure, at: Date) =>
        eInvoices.later(
          row.id,
          new Date(at.getTime() + Math.max(backoffMs(row.attempts + 1), failure.retryAfterMs ?? 0)),
          `${failure.code}: ${failure.message}`.slice(0, 300),
          true
        )

      /** Ready to send: its document built and kept; undefined when it waits, or was found already sent. */
      const prepare = (row: EInvoiceRow, at: Date) =>
        Effect.gen(function*() {
          let text = row.body
          if (text === null) {
            const built = yield* build(row)
            if (built._tag === "waiting") {
              yield* eInvoices.later(row.id, new Date(at.getTime() + REFERENCE_WAIT_MS), built.reason, false)
              return undefined
            }
            if (Buffer.byteLength(built.text) > MAX_DOCUMENT_BYTES) {
              return yield* Effect.dieMessage(`e-invoice ${row.codeNumber} is over MyInvois' 300 KB a document`)
            }
            yield* eInvoices.saveBody(row.id, built.text, documentHash(built.text), built.issuedAt)
            text = built.text
          }
          if (row.submittedAt !== null && row.submissionUid === null) {
            // Sent before with no answer kept: MyInvois may have it. Look it up by number before sending again.
            const found = yield* Effect.either(myinvois.findByNumber(row.codeNumber, row.issuedAt ?? row.submittedAt))
            if (found._tag === "Left") {
              yield* retry(row, found.left, at)
              return undefined
            }
            if (Option.isSome(found.right)) {
              const state = found.right.value
              yield* eInvoices.accepted(row.id, state.submissionUid ?? "unknown", state.uuid, at)
              return undefined
            }
          }
          return { row, document: { codeNumber: row.codeNumber, text } satisfies SubmittedDocument }
        })

      /** Batches of at most 100 documents and 5 MB; a document that failed before is sent on its own. */
      const batchesOf = (ready: ReadonlyArray<{ row: EInvoiceRow; document: SubmittedDocument }>) => {
        const batches: Array<Array<{ row: EInvoiceRow; document: SubmittedDocument }>> = []
        let current: Array<{ row: EInvoiceRow; document: SubmittedDocument }> = []
        let bytes = 0
        for (const item of ready) {
          const size = Math.ceil(Buffer.byteLength(item.document.text) / 3) * 4 + 200
          if (item.row.attempts > 0) {
            batches.push([item])
            continue
          }
          if (current.length >= MAX_DOCUMENTS || bytes + size > MAX_SUBMISSION_BYTES) {
            batches.push(current)
            current = []
            bytes = 0
          }
          current.push(item)
          bytes += size
        }
        if (current.length > 0) batches.push(current)
        return batches
      }

      const submitBatch = (batch: ReadonlyArray<{ row: EInvoiceRow; document: SubmittedDocument }>, at: Date) =>
        Effect.gen(function*() {
          yield* eInvoices.sending(batch.map(({ row }) => row.id), at)
          const answer = yield* Effect.either(myinvois.submit(batch.map((item) => item.document)))
          if (answer._tag === "Left") {
            const failure = answer.left
            for (const { row } of batch) {
              // MyInvois refused the submission itself: a document alone is invalid; a batch goes one by one.
              if (failure.kind === "refused" && batch.length === 1) {
                yield* markInvalid(row, [{ code: failure.code, message: failure.message, target: null }], at)
              } else yield* retry(row, failure, at)
            }
            return
          }
          const { accepted, rejected, submissionUid } = answer.right
          for (const { row } of batch) {
            const taken = accepted.find((document) => document.codeNumber === row.codeNumber)
            const refused = rejected.find((document) => document.codeNumber === row.codeNumber)
            if (taken !== undefined) {
              yield* eInvoices.accepted(
                row.id,
                submissionUid ?? "unknown",
                taken.uuid,
                new Date(at.getTime() + pollDelayMs(0))
              )
            } else if (refused !== undefined) yield* markInvalid(row, refused.errors, at)
            else {
              yield* eInvoices.later(
                row.id,
                new Date(at.getTime() + backoffMs(row.attempts + 1)),
                "MyInvois' answer did not name it",
                true
              )
            }
          }
        })

      const poll = (rows: ReadonlyArray<EInvoiceRow>, at: Date) =>
        Effect.gen(function*() {
          const uid = rows[0]!.submissionUid!
          const states = yield* Effect.either(
            uid === "unknown" ? Effect.succeed([]) : myinvois.submission(uid)
          )
          for (const row of rows) {
            const fromSubmission = states._tag === "Right"
              ? states.right.find((state) => state.uuid === row.uuid)
              : undefined
            // Not in the submission (or no submission uid kept): ask for the document itself.
            const state = fromSubmission ?? (yield* Effect.either(myinvois.details(row.uuid ?? "")).pipe(
              Effect.map((details) => details._tag === "Right" ? details.right : undefined)
            ))
            if (state === undefined) {
              const failure = states._tag === "Left" ? states.left : undefined
              yield* failure === undefined
                ? eInvoices.later(row.id, new Date(at.getTime() + backoffMs(row.attempts + 1)), "not found", true)
                : retry(row, failure, at)
              continue
            }
            if (state.status === "Valid") {
              yield* markValid(row, state.uuid, state.longId ?? "", state.validatedAt ?? at, at)
            } else if (state.status === "Invalid") {
              const details = yield* Effect.either(myinvois.details(state.uuid))
              if (details._tag === "Left") yield* retry(row, details.left, at)
              else yield* markInvalid(row, details.right.errors, at)
            } else if (state.status === "Cancelled") yield* eInvoices.cancelled(row.id, at)
            else yield* eInvoices.later(row.id, new Date(at.getTime() + pollDelayMs(row.attempts + 1)), null, true)
          }
        })

      const cancel = (row: EInvoiceRow, at: Date) =>
        Effect.gen(function*() {
          const reason = "Payment refunded in full"
          if (row.validatedAt === null || at.getTime() - row.validatedAt.getTime() >= CANCEL_WINDOW_MS) {
            yield* eInvoices.dropCancel(row.id, at, "more than 72 hours after validation: a refund note is issued")
            return
          }
          // MyInvois refuses to cancel a document a valid note references: the notes go first.
          const notes = row.documentId === null ? [] : yield* eInvoices.validNotesOf(row.documentId)
          for (const note of [...notes, row]) {
            const done = yield* Effect.either(myinvois.cancel(note.uuid ?? "", reason))
            if (done._tag === "Left") {
              yield* done.left.kind === "refused" || done.left.kind === "not_found"
                ? eInvoices.dropCancel(row.id, at, `${done.left.code}: ${done.left.message}`)
                : retry(row, done.left, at)
              return
            }
            yield* note.id === row.id
              ? sql.withTransaction(Effect.zipRight(eInvoices.cancelled(row.id, at), eInvoices.settleHeld(row.id, at)))
              : eInvoices.cancelled(note.id, at)
          }
        })

      const runOnce = Effect.gen(function*() {
        const at = yield* now
        const claimed = yield* eInvoices.claim(
          at,
          new Date(at.getTime() + Duration.toMillis(LEASE)),
          MAX_DOCUMENTS,
          config.instanceId
        )
        const ready: Array<{ row: EInvoiceRow; document: SubmittedDocument }> = []
        const submitted = new Map<string, Array<EInvoiceRow>>()
        for (const row of claimed) {
          if (row.status === "pending" && row.heldBy === null) {
            const item = yield* prepare(row, at)
            if (item !== undefined) ready.push(item)
          } else if (row.status === "submitted") {
            const key = row.submissionUid ?? "unknown"
            submitted.set(key, [...(submitted.get(key) ?? []), row])
          } else if (row.status === "valid" && row.cancelRequestedAt !== null) yield* cancel(row, at)
          else yield* eInvoices.later(row.id, null, null, false)
        }
        for (const batch of batchesOf(ready)) yield* submitBatch(batch, at)
        for (const rows of submitted.values()) yield* poll(rows, at)
        return claimed.length
      }).pipe(
        Effect.provideService(SqlClient.SqlClient, sql),
        Effect.catchAllCause((cause) => Effect.as(Effect.logWarning("e-invoice submission failed", cause), 0)),
        Effect.withSpan("EInvoiceWorker.runOnce")
      )

      const countOverdue = Effect.gen(function*() {
        const at = yield* now
        const count = yield* eInvoices.overdue(new Date(at.getTime() - OVERDUE_AFTER_MS))
        metrics.eInvoicesOverdue.set(count)
        return count
      }).pipe(
        Effect.catchAllCause((cause) => Effect.as(Effect.logWarning("counting overdue e-invoices failed", cause), 0))
      )

      return EInvoiceWorker.of({ runOnce, countOverdue })
    })
  )

  /** Submits in the background for the life of the service, and consolidates ended months every 10 minutes. */
  static readonly layerRunning = Layer.scopedDiscard(Effect.gen(function*() {
    const worker = yield* EInvoiceWorker
    const consolidation = yield* Consolidation
    const config = yield* AppConfig
    const eInvoices = yield* EInvoiceRepo
    // An earlier process of this identity is dead (the instance lease says so): what it held is free now.
    yield* eInvoices.releaseClaims(config.instanceId).pipe(
      Effect.catchAllCause((cause) => Effect.logWarning("releasing e-invoice claims failed", cause))
    )
    yield* Effect.forkScoped(Effect.repeat(worker.runOnce, Schedule.spaced(Duration.millis(config.eInvoicePollMs))))
    const scheduled = consolidation.consolidateEnded.pipe(
      Effect.catchAllCause((cause) => Effect.logWarning("consolidating ended months failed", cause))
    )
    yield* Effect.forkScoped(Effect.repeat(scheduled, Schedule.spaced(CONSOLIDATE_EVERY)))
  }))
}
