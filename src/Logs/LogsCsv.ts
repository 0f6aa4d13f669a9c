import { Chunk, Effect, Option, Stream } from "effect"
import { microMyr, toMyrString } from "../Domain/Money.js"
import type { LogCursor, LogFilter, LogRow, RequestLogReads } from "./Reads.js"

/** Rows per read of an export: memory holds one batch at a time, however long the range. */
export const EXPORT_BATCH = 2000

/**
 * One CSV field (RFC 4180): quoted when it holds a comma, quote or line break.
 * Text a caller chose (tags, user) that a spreadsheet would run as a formula
 * gets a leading apostrophe.
 */
export const csvField = (value: string | number | boolean | null, callerText = false): string => {
  if (value === null) return ""
  const text = String(value)
  const safe = callerText && /^[=+\-@\t\r]/.test(text) ? `'${text}` : text
  return /[",\r\n]/.test(safe) ? `"${safe.replaceAll("\"", "\"\"")}"` : safe
}

/** One CSV record, its fields joined, ended by CRLF. */
export const csvLine = (fields: ReadonlyArray<string>) => `${fields.join(",")}\r\n`

export const LOG_COLUMNS = [
  "request_id",
  "created_at",
  "api_key_id",
  "environment",
  "endpoint",
  "status",
  "routing_category",
  "error_code",
  "public_model",
  "stream",
  "input_tokens",
  "output_tokens",
  "reasoning_tokens",
  "cached_tokens",
  "usage_source",
  "search_count",
  "content_pages",
  "latency_ms",
  "cost_myr",
  "cost_micro_myr",
  "user",
  "metadata"
] as const

export const logLine = (row: LogRow): string =>
  csvLine([
    csvField(row.requestId),
    csvField(row.createdAt.toISOString()),
    csvField(row.apiKeyId),
    csvField(row.environment),
    csvField(row.endpoint),
    csvField(row.status),
    csvField(row.routingCategory),
    csvField(row.errorCode),
    csvField(row.publicModel),
    csvField(row.stream),
    csvField(row.inputTokens),
    csvField(row.outputTokens),
    csvField(row.reasoningTokens),
    csvField(row.cachedTokens),
    csvField(row.usageSource),
    csvField(row.searchCount),
    csvField(row.contentPages),
    csvField(row.latencyMs),
    csvField(toMyrString(microMyr(row.costMicroMyr))),
    csvField(row.costMicroMyr),
    csvField(row.endUser, true),
    csvField(row.metadata === null ? null : JSON.stringify(row.metadata), true)
  ])

const encoder = new TextEncoder()

/** The account's logs matching `filter`, newest first, as CSV bytes: read in keyset batches, one batch in memory. */
export const logsCsv = (reads: typeof RequestLogReads.Service, accountId: string, filter: LogFilter) =>
  Stream.concat(
    Stream.succeed(encoder.encode(csvLine([...LOG_COLUMNS]))),
    Stream.paginateChunkEffect(undefined as LogCursor | undefined, (after) =>
      Effect.map(reads.rows(accountId, filter, { limit: EXPORT_BATCH, offset: 0, after }), (rows) => {
        const batch = rows.slice(0, EXPORT_BATCH)
        const last = batch.at(-1)
        const next = rows.length > EXPORT_BATCH && last !== undefined
          ? Option.some({ atMicros: last.atMicros, requestId: last.requestId })
          : Option.none()
        return [
          batch.length === 0 ? Chunk.empty<Uint8Array>() : Chunk.of(encoder.encode(batch.map(logLine).join(""))),
          next
        ] as const
      }))
  )
