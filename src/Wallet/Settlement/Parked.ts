import { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Cause, Effect, Exit, Option, Schema } from "effect"
import { storable, storableJson } from "../../Domain/Strict.js"
import { now } from "../../Domain/Time.js"
import type { LogWrite } from "../../Logs/RequestLogs.js"
import { RequestLogs } from "../../Logs/RequestLogs.js"
import { settleBatch } from "./Settle.js"
import type { Batch, SettleItem } from "./SettleBatch.js"

// Hand-cast SQL (docs/performance.md, "Hand-cast SQL on the call path"): parking and replaying the flush's refused entries.

/**
 * Settlements the database kept refusing (docs/money.md, "Parking and replay"), kept in
 * `settlement_parked` so that the rest of the queue flows on. Parking gives
 * the call's hold back to its wallet — its reservation released, or its
 * charge handed back from the grant — in the transaction that parks it; the
 * replay (`npm run settlement:replay`, `ReplayParked.ts`) then bills the call
 * from what the wallet holds, once, as a late capture is billed.
 */

/** A settlement as the queue holds it: money to move, a log row, or both (values already clamped). */
export interface Settlement {
  readonly item?: SettleItem | undefined
  readonly log?: LogWrite | undefined
}

export type ParkedKind = SettleItem["_tag"] | "Log"

export const kindOf = (settlement: Settlement): ParkedKind => settlement.item?._tag ?? "Log"

/** The call a settlement belongs to. */
export const requestIdOf = (settlement: Settlement): string =>
  settlement.log?.requestId ?? settlement.item?.log?.requestId ??
    (settlement.item === undefined
      ? "unknown"
      : settlement.item._tag === "GrantCharge" || settlement.item._tag === "LateCharge"
      ? settlement.item.requestId
      : settlement.item.reservationId)

const accountIdOf = (settlement: Settlement): string | null => {
  const { item, log } = settlement
  if (item !== undefined && (item._tag === "GrantCharge" || item._tag === "LateCharge")) return item.accountId
  return log?.accountId ?? item?.log?.accountId ?? null
}

export interface Parking {
  /** The same for every try at parking one settlement: parked once, its hold given back once. */
  readonly id: string
  readonly settlement: Settlement
  readonly error: string
  readonly attempts: number
  readonly firstFailedAt: Date
  readonly lastFailedAt: Date
  readonly holder: string
}

/**
 * Parks a settlement and gives its call's hold back to the wallet, in one transaction; false when it was parked already.
 * Its text is made storable (U+0000, lone surrogates → U+FFFD): what the database refused cannot refuse its parking too.
 */
export const park = (parking: Parking): Effect.Effect<boolean, SqlError.SqlError, SqlClient.SqlClient | RequestLogs> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    return yield* sql.withTransaction(Effect.gen(function*() {
      const { settlement } = parking
      const inserted = yield* sql`
        INSERT INTO settlement_parked
          (id, request_id, account_id, kind, item, error, attempts, holder, first_failed_at, last_failed_at)
        VALUES (${parking.id}, ${requestIdOf(settlement)}, ${accountIdOf(settlement)}, ${kindOf(settlement)},
                ${storableJson(settlement)}::jsonb, ${storable(parking.error)}, ${parking.attempts}, ${parking.holder},
                ${parking.firstFailedAt}, ${parking.lastFailedAt})
        ON CONFLICT (id) DO NOTHING
        RETURNING id
      `
      if (inserted.length === 0) return false
      const { item } = settlement
      const holdBack: Batch = {
        items: item !== undefined && (item._tag === "Capture" || item._tag === "Release")
          ? [{ _tag: "Release", reservationId: item.reservationId }]
          : [],
        // Unnumbered: the parked row just inserted makes sure it is handed back once.
        returns: item?._tag === "GrantCharge"
          ? [{ grantId: item.grantId, accountId: item.accountId, amountMicroMyr: item.amountMicroMyr }]
          : [],
        logs: [],
        close: [],
        at: parking.lastFailedAt,
        holder: parking.holder
      }
      yield* settleBatch(holdBack)
      return true
    }))
  })

const LogWriteJson = Schema.Struct({
  requestId: Schema.String,
  accountId: Schema.String,
  apiKeyId: Schema.String,
  publicModel: Schema.String,
  upstreamModel: Schema.String,
  routingCategory: Schema.String,
  endpoint: Schema.String,
  stream: Schema.Boolean,
  inputTokens: Schema.Number,
  environment: Schema.optional(Schema.Literal("live", "test")),
  metadata: Schema.optional(Schema.NullOr(Schema.Record({ key: Schema.String, value: Schema.String }))),
  endUser: Schema.optional(Schema.NullOr(Schema.String)),
  outputTokens: Schema.Number,
  reasoningTokens: Schema.Number,
  cachedTokens: Schema.Number,
  usageSource: Schema.Literal("provider", "estimated"),
  searchCount: Schema.Number,
  contentPages: Schema.Number,
  costMicroMyr: Schema.Number,
  latencyMs: Schema.Number,
  attempts: Schema.optional(
    Schema.Array(Schema.Struct({ target: Schema.String, outcome: Schema.String, latencyMs: Schema.Number }))
  ),
  cache: Schema.optional(Schema.Struct({
    status: Schema.Literal("hit", "miss", "bypass"),
    sourceRequestId: Schema.NullOr(Schema.String),
    savedMicroMyr: Schema.Number
  })),
  reservationId: Schema.NullOr(Schema.String),
  status: Schema.Literal("pending", "succeeded", "failed", "billed"),
  errorCode: Schema.NullOr(Schema.String),
  createdAt: Schema.Date,
  completedAt: Schema.NullOr(Schema.Date)
})

const log = Schema.optional(LogWriteJson)
const charge = {
  accountId: Schema.String,
  apiKeyId: Schema.String,
  requestId: Schema.String,
  amountMicroMyr: Schema.Number,
  description: Schema.String,
  log
}
const SettleItemJson = Schema.Union(
  Schema.TaggedStruct("Capture", {
    reservationId: Schema.String,
    amountMicroMyr: Schema.Number,
    description: Schema.String,
    log
  }),
  Schema.TaggedStruct("Release", { reservationId: Schema.String, log }),
  Schema.TaggedStruct("GrantCharge", { grantId: Schema.String, ...charge }),
  Schema.TaggedStruct("LateCharge", charge)
)
const SettlementJson = Schema.Struct({ item: Schema.optional(SettleItemJson), log })

/** What replaying writes: the call's hold went back to its wallet when it was parked, so its charge is billed from the wallet. */
const replayBatch = (settlement: Settlement, holder: string, at: Date): Batch => {
  const { item } = settlement
  const items: Array<SettleItem> = []
  if (item?._tag === "GrantCharge") {
    const { grantId: _returned, ...rest } = item
    items.push({ ...rest, _tag: "LateCharge" })
  } else if (item !== undefined) {
    items.push(item)
  }
  return { items, returns: [], logs: settlement.log === undefined ? [] : [settlement.log], close: [], at, holder }
}

export interface Replayed {
  readonly id: string
  readonly requestId: string
  readonly kind: string
  /** `replayed`: written now; `failed`: still refused (the row stays parked, its attempts counted). */
  readonly outcome: "replayed" | "failed"
  /** What the call was billed (a charge or capture replayed). */
  readonly chargedMicroMyr: number | null
  readonly error: string | null
}

/** The message an operator reads for a settlement's failure: the database's own words when it refused. */
export const failureText = (cause: Cause.Cause<unknown>): string => {
  const failure = Cause.failureOption(cause)
  const error = Option.isSome(failure) ? failure.value : Cause.squash(cause)
  const inner = typeof error === "object" && error !== null && "cause" in error ? error.cause : undefined
  return inner instanceof Error ? inner.message : error instanceof Error ? error.message : String(error)
}

const replayOne = (sql: SqlClient.SqlClient, id: string) =>
  sql.withTransaction(Effect.gen(function*() {
    const rows = yield* sql<{ requestId: string; kind: string; item: unknown; holder: string }>`
      SELECT request_id, kind, item, holder FROM settlement_parked WHERE id = ${id} AND status = 'parked' FOR UPDATE
    `
    const row = rows[0]
    if (row === undefined) return undefined
    const at = yield* now
    // A savepoint: a replay still refused is rolled back alone, and its attempt is counted.
    const exit = yield* Effect.exit(
      Schema.decodeUnknown(SettlementJson)(row.item).pipe(
        Effect.flatMap((settlement) => settleBatch(replayBatch(settlement, row.holder, at))),
        sql.withTransaction
      )
    )
    if (Exit.isSuccess(exit)) {
      yield* sql`UPDATE settlement_parked SET status = 'replayed', replayed_at = ${at} WHERE id = ${id}`
      const charged = exit.value.items[0]?.chargedMicroMyr ?? null
      return {
        id,
        requestId: row.requestId,
        kind: row.kind,
        outcome: "replayed",
        chargedMicroMyr: charged,
        error: null
      } satisfies Replayed
    }
    const error = failureText(exit.cause)
    yield* sql`
      UPDATE settlement_parked SET attempts = attempts + 1, last_failed_at = ${at}, error = ${error} WHERE id = ${id}
    `
    return {
      id,
      requestId: row.requestId,
      kind: row.kind,
      outcome: "failed",
      chargedMicroMyr: null,
      error
    } satisfies Replayed
  }))

/**
 * Replays parked settlements, oldest first: all of them, or those whose id or
 * request id is in `only`. Each in a transaction of its own; one replayed is
 * marked `replayed` in it, so a second replay finds nothing to do.
 */
export const replayParked = (
  only?: ReadonlyArray<string>
): Effect.Effect<ReadonlyArray<Replayed>, SqlError.SqlError, SqlClient.SqlClient | RequestLogs> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const filter = only === undefined
      ? sql``
      : sql`AND (id = ANY(${only}::text[]) OR request_id = ANY(${only}::text[]))`
    const waiting = yield* sql<{ id: string }>`
      SELECT id FROM settlement_parked WHERE status = 'parked' ${filter} ORDER BY first_failed_at, id
    `
    const results: Array<Replayed> = []
    for (const { id } of waiting) {
      const result = yield* replayOne(sql, id)
      if (result !== undefined) results.push(result)
    }
    return results
  })
