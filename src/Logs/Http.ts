import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Effect } from "effect"
import { NenasApi } from "../Api.js"
import { CurrentAccount } from "../Auth/Api.js"
import { InvalidRequest, NotFound } from "../Domain/Errors.js"
import { requireAccountKey } from "../Keys/AccountKey.js"
import { KeysRepo } from "../Keys/Repo.js"
import { responseIdOf, StoredResponses } from "../Responses/Store.js"
import { conversationLines } from "../Responses/View.js"
import { Spending } from "../Wallet/Spending.js"
import type { LogEntry, LogsExportParams } from "./Api.js"
import { logsCsv } from "./LogsCsv.js"
import { checkRange, dateOf } from "./Range.js"
import { type LogCursor, type LogFilter, type LogRow, RequestLogReads } from "./Reads.js"

const toLogEntry = (row: LogRow, stored: ReadonlySet<string>): typeof LogEntry.Type => ({
  requestId: row.requestId,
  apiKeyId: row.apiKeyId,
  publicModel: row.publicModel,
  endpoint: row.endpoint,
  stream: row.stream,
  status: row.status,
  routingCategory: row.routingCategory,
  errorCode: row.errorCode,
  environment: row.environment,
  metadata: row.metadata,
  user: row.endUser,
  inputTokens: row.inputTokens,
  outputTokens: row.outputTokens,
  reasoningTokens: row.reasoningTokens,
  cachedTokens: row.cachedTokens,
  usageSource: row.usageSource,
  searchCount: row.searchCount,
  contentPages: row.contentPages,
  costMicroMyr: row.costMicroMyr,
  latencyMs: row.latencyMs,
  attempts: row.attempts ?? [],
  guardrails: row.guardrails,
  cache: row.cache,
  cacheSourceRequestId: row.cacheSourceRequestId,
  cacheSavedMicroMyr: row.cacheSavedMicroMyr,
  providerKeyId: row.providerKeyId,
  byokFeeMicroMyr: row.byokFeeMicroMyr,
  createdAt: row.createdAt.toISOString(),
  storedResponseId: stored.has(responseIdOf(row.requestId)) ? responseIdOf(row.requestId) : null
})

/** A page's last row as an opaque `cursor`: its position in the order of logs. */
const encodeCursor = (cursor: LogCursor): string =>
  Buffer.from(`${cursor.atMicros}.${cursor.requestId}`).toString("base64url")

const decodeCursor = (cursor: string) => {
  const [, atMicros, requestId] = /^(-?\d{1,20})\.(.{1,255})$/s.exec(Buffer.from(cursor, "base64url").toString()) ?? []
  return atMicros === undefined || requestId === undefined
    ? Effect.fail(new InvalidRequest({ message: "'cursor' is not a cursor this API returned.", param: "cursor" }))
    : Effect.succeed({ atMicros, requestId })
}

export const LogsLive = HttpApiBuilder.group(NenasApi, "logs", (handlers) =>
  Effect.gen(function*() {
    const requestLogs = yield* RequestLogReads
    const keys = yield* KeysRepo
    const storedResponses = yield* StoredResponses
    /** Every call this instance answered is written before a read. */
    const settled = (yield* Spending).settled

    /** The one tag filter: `tag=key:value` (split at the first colon), or `tag_key` with an optional `tag_value`. */
    const tagFilter = (params: Pick<typeof LogsExportParams.Type, "tag" | "tag_key" | "tag_value">) =>
      Effect.gen(function*() {
        if (params.tag === undefined) {
          return params.tag_key === undefined ? undefined : { key: params.tag_key, value: params.tag_value }
        }
        if (params.tag_key !== undefined) {
          return yield* new InvalidRequest({ message: "Pass either 'tag' or 'tag_key', not both.", param: "tag" })
        }
        const colon = params.tag.indexOf(":")
        const key = params.tag.slice(0, colon)
        if (colon < 1 || key.length > 64 || params.tag.length - colon - 1 > 512) {
          return yield* new InvalidRequest({
            message:
              "Invalid 'tag': must be key:value, e.g. tag=team:search (a key of 1 to 64 characters, a value of at most 512).",
            param: "tag"
          })
        }
        return { key, value: params.tag.slice(colon + 1) }
      })

    /** The logs' filters from their params, checked. */
    const logFilter = (accountId: string, params: Omit<typeof LogsExportParams.Type, "format">) =>
      Effect.gen(function*() {
        const from = dateOf(params.from)
        const to = dateOf(params.to)
        yield* checkRange({ from, to })
        yield* requireAccountKey(keys, accountId, params.api_key_id)
        if (params.tag_value !== undefined && params.tag_key === undefined) {
          return yield* new InvalidRequest({ message: "'tag_value' needs 'tag_key'.", param: "tag_value" })
        }
        const tag = yield* tagFilter(params)
        return {
          status: params.status,
          apiKeyId: params.api_key_id,
          endpoint: params.endpoint,
          environment: params.environment,
          tag,
          endUser: params.user,
          guardrail: params.guardrail,
          from,
          to
        } satisfies LogFilter
      })

    return handlers
      .handle("logs", ({ urlParams }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const filter = yield* logFilter(account.id, urlParams)
          if (urlParams.cursor !== undefined && urlParams.page > 1) {
            return yield* new InvalidRequest({ message: "Pass either 'cursor' or 'page', not both.", param: "cursor" })
          }
          const after = urlParams.cursor === undefined ? undefined : yield* decodeCursor(urlParams.cursor)
          yield* settled
          const { rows, total } = yield* requestLogs.logs(
            account.id,
            filter,
            { limit: urlParams.limit, offset: (urlParams.page - 1) * urlParams.limit, after }
          )
          const page = rows.slice(0, urlParams.limit)
          const last = page.at(-1)
          const more = rows.length > urlParams.limit
          const responses = page.flatMap((row) => row.endpoint === "/v1/responses" ? [responseIdOf(row.requestId)] : [])
          const stored = yield* storedResponses.present(account.id, responses)
          return {
            logs: page.map((row) => toLogEntry(row, stored)),
            total,
            has_more: after === undefined ? urlParams.page * urlParams.limit < total : more,
            next_cursor: more && last !== undefined
              ? encodeCursor({ atMicros: last.atMicros, requestId: last.requestId })
              : null
          }
        }))
      .handle("conversation", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          yield* settled
          const responseId = responseIdOf(path.request_id)
          // A conversation past the bounds shows its newest part, as far as they go: never refused, so a refusal is a defect.
          const chain = yield* Effect.orDie(storedResponses.chain(account.id, responseId, false))
          if (chain.length === 0) {
            return yield* new NotFound({
              message: `No stored conversation for request '${path.request_id}'.`,
              param: "request_id"
            })
          }
          return { responseId, lines: conversationLines(chain) }
        }))
      .handle("exportLogs", ({ urlParams }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const filter = yield* logFilter(account.id, urlParams)
          yield* settled
          return HttpServerResponse.stream(logsCsv(requestLogs, account.id, filter), {
            contentType: "text/csv; charset=utf-8",
            headers: { "content-disposition": "attachment; filename=\"nenas-logs.csv\"", "cache-control": "no-store" }
          })
        }))
  }))
