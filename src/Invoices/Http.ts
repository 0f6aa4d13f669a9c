import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Effect } from "effect"
import { NenasApi } from "../Api.js"
import { AppConfig } from "../AppConfig.js"
import { AuditLog } from "../Audit/Repo.js"
import { CurrentAccount } from "../Auth/Api.js"
import { InvalidRequest, NotFound } from "../Domain/Errors.js"
import { now } from "../Domain/Time.js"
import { checkRange, dateOf } from "../Logs/Range.js"
import { type BillingProfileInput, buyerOf, type Party } from "./Api.js"
import { Consolidation } from "./Consolidation.js"
import { toDetail, toSummary } from "./Documents.js"
import { EInvoiceRepo } from "./EInvoiceRepo.js"
import { renderPdf } from "./Pdf.js"
import { InvoicesRepo, type StoredDocument, type StoredProfile } from "./Repo.js"

const profileView = (stored: StoredProfile | undefined) => ({
  profile: stored === undefined ? null : { ...stored.profile, updated_at: stored.updatedAt.toISOString() }
})

/** The fields a change touched, by name: the audit log says what changed, never the buyer's details. */
const changedFields = (before: Party | undefined, after: Party): ReadonlyArray<string> =>
  (Object.keys(after) as Array<keyof Party>).filter((field) =>
    JSON.stringify(before?.[field] ?? null) !== JSON.stringify(after[field])
  )

export const InvoicesLive = HttpApiBuilder.group(NenasApi, "invoices", (handlers) =>
  Effect.gen(function*() {
    const repo = yield* InvoicesRepo
    const eInvoices = yield* EInvoiceRepo
    const audit = yield* AuditLog
    const config = yield* AppConfig
    /** MyInvois' public validation page of a valid e-invoice (docs/api/invoices.md, "Documents"). */
    const validationUrl = (document: StoredDocument) =>
      document.eInvoiceStatus === "valid" && document.eInvoiceUuid !== null && document.eInvoiceLongId !== null
        ? `${config.myinvoisPortalUrl}/${document.eInvoiceUuid}/share/${document.eInvoiceLongId}`
        : null
    const found = (accountId: string, id: string) =>
      Effect.flatMap(Effect.orDie(repo.find(accountId, id)), (document) =>
        document === undefined
          ? Effect.fail(new NotFound({ message: `No invoice ${id} in this account.`, param: "id" }))
          : Effect.succeed(document))
    return handlers
      .handle("profile", () =>
        Effect.flatMap(CurrentAccount, (account) => Effect.map(Effect.orDie(repo.profile(account.id)), profileView)))
      .handle("updateProfile", ({ payload }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const buyer = buyerOf(payload satisfies BillingProfileInput)
          const before = yield* Effect.orDie(repo.profile(account.id))
          const saved = yield* audit.within(
            Effect.orDie(repo.saveProfile(account.id, buyer, account.member.id)),
            () => ({
              action: "billing.profile_updated",
              targetType: "billing",
              targetId: account.id,
              details: { fields: changedFields(before?.profile, buyer) }
            })
          )
          return profileView(saved)
        }))
      .handle("list", ({ urlParams }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const range = { from: dateOf(urlParams.from), to: dateOf(urlParams.to) }
          yield* checkRange(range)
          const rows = yield* Effect.orDie(repo.list(account.id, {
            page: urlParams.page,
            limit: urlParams.limit,
            type: urlParams.type,
            ...range
          }))
          const at = yield* now
          return {
            data: rows.map((row) =>
              toSummary(row, validationUrl(row), at)
            ),
            page: urlParams.page,
            limit: urlParams.limit
          }
        }))
      .handle("get", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const document = yield* found(account.id, path.id)
          return toDetail(document, validationUrl(document), yield* now)
        }))
      .handle("pdf", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const document = yield* found(account.id, path.id)
          const bytes = yield* renderPdf(toDetail(document, validationUrl(document), yield* now), {})
          return HttpServerResponse.uint8Array(bytes, {
            contentType: "application/pdf",
            headers: { "content-disposition": `attachment; filename="${document.number}.pdf"` }
          })
        }))
      .handle("resubmit", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const document = yield* found(account.id, path.id)
          const current = yield* Effect.orDie(eInvoices.ofDocument(document.id))
          if (current === undefined || current.kind !== "single" || current.status !== "invalid") {
            return yield* Effect.fail(
              new InvalidRequest({
                message:
                  `Only an e-invoice of its own that MyInvois found invalid is resubmitted; ${document.number}'s is ${
                    current === undefined
                      ? "not made yet"
                      : current.kind === "consolidated"
                      ? "consolidated"
                      : current.status
                  }.`,
                param: "id"
              })
            )
          }
          const at = yield* now
          // The buyer as the profile says now: the fix a rejection asked for.
          const buyer = (yield* Effect.orDie(repo.profile(account.id)))?.profile ?? document.buyer
          yield* audit.within(
            Effect.orDie(eInvoices.supersede(current, {
              kind: "single",
              typeCode: current.typeCode,
              codeNumber: current.codeNumber,
              attempt: current.attempt + 1,
              accountId: account.id,
              documentId: document.id,
              month: null,
              buyer,
              dueAt: at,
              at
            })),
            () => ({
              action: "billing.e_invoice_resubmitted",
              targetType: "billing",
              targetId: document.id,
              details: { number: document.number, attempt: current.attempt + 1 }
            })
          )
          const resubmitted = yield* found(account.id, document.id)
          return toDetail(resubmitted, validationUrl(resubmitted), at)
        }))
  }))

/** The development route that consolidates a month now (the current one closed early). */
export const DevEInvoicesLive = HttpApiBuilder.group(
  NenasApi,
  "devEInvoices",
  (handlers) =>
    Effect.map(
      Consolidation,
      (consolidation) =>
        handlers.handle("consolidate", ({ payload }) =>
          consolidation.consolidate(payload.month, { early: true }).pipe(
            Effect.catchTag("SqlError", Effect.die),
            Effect.map((outcome) => ({
              month: outcome.month,
              early: outcome.early,
              e_invoices: outcome.created.map((part) => ({
                id: part.id,
                number: part.codeNumber,
                type_code: part.typeCode,
                documents: part.documents,
                lines: part.lines
              }))
            }))
          ))
    )
)
