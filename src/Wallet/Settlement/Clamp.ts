import { storable } from "../../Domain/Strict.js"
import type { LogWrite } from "../../Logs/RequestLogs.js"
import type { SettleItem } from "./SettleBatch.js"

/**
 * Values a settlement would write that PostgreSQL refuses, made writable
 * before the flush, so that one call's absurd usage (3e9 tokens into an
 * `integer` column, U+0000 in a tag) cannot hold back its batch. Each change is an anomaly:
 * the queue counts it (`nenas_settlement_clamped_total`) and logs it with the
 * call's request id. Money is clamped the same way: whole, at least 0.
 */

/** The largest value of a PostgreSQL `integer` column (the logs' token counts, pages and latency). */
export const INT_MAX = 2_147_483_647

export interface Anomaly {
  readonly requestId: string
  /** The value's name, as the log row or the item calls it. */
  readonly field: string
  /** What the settlement said (a number, or a description of it), and what was written instead. */
  readonly value: string
  readonly written: string
}

type Found = Array<Anomaly>

/** A whole number in [0, max]: what an `integer` or `bigint` column with a `>= 0` check takes. */
const whole = (requestId: string, field: string, value: number, max: number, found: Found): number => {
  if (Number.isInteger(value) && value >= 0 && value <= max) return value
  const written = Number.isNaN(value) ? 0 : Math.min(Math.max(Math.round(value), 0), max)
  found.push({ requestId, field, value: String(value), written: String(written) })
  return written
}

/** PostgreSQL's text refuses U+0000 and jsonb a lone surrogate's escape: each becomes U+FFFD, so the charge is still written. */
const text = (requestId: string, field: string, value: string, found: Found): string => {
  const written = storable(value)
  if (written !== value) {
    found.push({ requestId, field, value: JSON.stringify(value), written: JSON.stringify(written) })
  }
  return written
}

/** The caller's tags, each key and value storable; the same object when all were. */
const tags = (
  requestId: string,
  metadata: Readonly<Record<string, string>>,
  found: Found
): Readonly<Record<string, string>> => {
  const before = found.length
  const fixed = Object.fromEntries(
    Object.entries(metadata).map((
      [key, value]
    ) => [text(requestId, "metadata", key, found), text(requestId, `metadata.${storable(key)}`, value, found)])
  )
  return found.length === before ? metadata : fixed
}

const INT_FIELDS = [
  "inputTokens",
  "outputTokens",
  "reasoningTokens",
  "cachedTokens",
  "searchCount",
  "contentPages",
  "latencyMs"
] as const
const TEXT_FIELDS = ["publicModel", "upstreamModel", "routingCategory", "endpoint"] as const

/** The row, writable; the same object when nothing needed a change (the usual case). */
export const clampLog = (row: LogWrite, found: Found): LogWrite => {
  const before = found.length
  const fixed: { -readonly [K in keyof LogWrite]: LogWrite[K] } = { ...row }
  for (const field of INT_FIELDS) fixed[field] = whole(row.requestId, field, row[field], INT_MAX, found)
  for (const field of TEXT_FIELDS) fixed[field] = text(row.requestId, field, row[field], found)
  fixed.costMicroMyr = whole(row.requestId, "costMicroMyr", row.costMicroMyr, Number.MAX_SAFE_INTEGER, found)
  if (row.errorCode !== null) fixed.errorCode = text(row.requestId, "errorCode", row.errorCode, found)
  // The caller's own words: validated at the door (`SqlString`), made storable here whatever got through.
  if (row.endUser != null) fixed.endUser = text(row.requestId, "endUser", row.endUser, found)
  if (row.metadata != null) fixed.metadata = tags(row.requestId, row.metadata, found)
  if (row.attempts !== undefined) {
    fixed.attempts = row.attempts.map((a) => ({
      ...a,
      target: text(row.requestId, "attempts.target", a.target, found),
      outcome: text(row.requestId, "attempts.outcome", a.outcome, found)
    }))
  }
  return found.length === before ? row : fixed
}

const requestIdOf = (item: SettleItem): string =>
  item.log?.requestId ??
    (item._tag === "GrantCharge" || item._tag === "LateCharge" ? item.requestId : item.reservationId)

/** The item (and its log row), writable; the same object when nothing needed a change. */
export const clampItem = (item: SettleItem, found: Found): SettleItem => {
  const before = found.length
  const log = item.log === undefined ? undefined : clampLog(item.log, found)
  if (item._tag === "Release") return found.length === before ? item : { ...item, log }
  const requestId = requestIdOf(item)
  // A charge that is not a number is billed nothing, and shows as an anomaly for an operator to bill by hand.
  const amountMicroMyr = whole(requestId, "amountMicroMyr", item.amountMicroMyr, Number.MAX_SAFE_INTEGER, found)
  const description = text(requestId, "description", item.description, found)
  return found.length === before ? item : { ...item, amountMicroMyr, description, log }
}
