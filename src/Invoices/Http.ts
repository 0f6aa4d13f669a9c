import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Effect } from "effect"
import { NenasApi } from "../Api.js"
import { AppConfig } from "../AppConfig.js"
import { AuditLog } from "../Audit/Repo.js"
import { CurrentAccount } from "../Auth/Api.js"
import { NotFound } from "../Domain/Errors.js"
import { checkRange, dateOf } from "../Logs/Range.js"
import { type BillingProfileInput, buyerOf, type Party } from "./Api.js"
import { toDetail, toSummary } from "./Documents.js"
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
          return {
            data: rows.map((row) =>
              toSummary(row, validationUrl(row))
            ),
            page: urlParams.page,
            limit: urlParams.limit
          }
        }))
      .handle("get", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const document = yield* found(account.id, path.id)
          return toDetail(document, validationUrl(document))
        }))
      .handle("pdf", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const document = yield* found(account.id, path.id)
          const bytes = yield* renderPdf(toDetail(document, validationUrl(document)), {})
          return HttpServerResponse.uint8Array(bytes, {
            contentType: "application/pdf",
            headers: { "content-disposition": `attachment; filename="${document.number}.pdf"` }
          })
        }))
  }))
