import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Effect } from "effect"
import { NenasApi } from "../Api.js"
import { CurrentAccount } from "../Auth/Api.js"
import { checkRange, dateOf } from "../Logs/Range.js"
import { type AuditFilter, AuditLog } from "./Repo.js"

interface FilterParams {
  readonly action?: AuditFilter["action"]
  readonly member_id?: string | undefined
  readonly target_id?: string | undefined
  readonly from?: Parameters<typeof dateOf>[0]
  readonly to?: Parameters<typeof dateOf>[0]
}

/** The filter the list and its export share, its range checked. */
const filterOf = (params: FilterParams) =>
  Effect.gen(function*() {
    const range = { from: dateOf(params.from), to: dateOf(params.to) }
    yield* checkRange(range)
    return {
      action: params.action,
      memberId: params.member_id,
      targetId: params.target_id,
      ...range
    } satisfies AuditFilter
  })

export const AuditLive = HttpApiBuilder.group(NenasApi, "audit", (handlers) =>
  Effect.gen(function*() {
    const log = yield* AuditLog
    return handlers
      .handle("list", ({ urlParams }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const filter = yield* filterOf(urlParams)
          const { entries, total } = yield* log.page(account.id, filter, {
            limit: urlParams.limit,
            offset: (urlParams.page - 1) * urlParams.limit
          })
          return { entries, total, has_more: urlParams.page * urlParams.limit < total }
        }))
      .handle("export", ({ urlParams }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const filter = yield* filterOf(urlParams)
          return HttpServerResponse.stream(log.csv(account.id, filter), {
            contentType: "text/csv; charset=utf-8",
            headers: {
              "content-disposition": "attachment; filename=\"nenas-audit-log.csv\"",
              "cache-control": "no-store"
            }
          })
        }))
  }))
