import { deflateRawSync, inflateRawSync } from "node:zlib"
import { SqlClient, type SqlError } from "@effect/sql"
import { Clock, Context, Duration, Effect, Layer, Schedule } from "effect"

/** How long a stored response is kept (DESIGN.md, Stored responses). */
export const RETENTION_DAYS = 30
export const RETENTION_MS = RETENTION_DAYS * 24 * 60 * 60 * 1000
/** Expired rows are deleted this many per statement, so a purge never holds a long lock. */
export const PURGE_BATCH = 1000
const PURGE_INTERVAL = Duration.minutes(10)

export type Json = { readonly [key: string]: unknown }

/** What a stored response keeps: the answer as it was sent, its own input items (references resolved), its instructions. */
export interface StoredRecord {
  readonly response: Json
  readonly input: ReadonlyArray<Json>
  readonly instructions: string | null
}

/** A stored response as the settlement flush writes it: the record deflated. */
export interface StoredWrite {
  readonly id: string
  readonly accountId: string
  readonly apiKeyId: string
  readonly previousResponseId: string | null
  readonly body: Uint8Array
  readonly createdAt: Date
  readonly expiresAt: Date
}

export interface StoredResponse extends StoredRecord {
  readonly id: string
  readonly accountId: string
  readonly previousResponseId: string | null
}

/** The record as its row keeps it: deflated JSON, a few hundred bytes for a short turn. */
/** The stored response of a call, by its request id (`req_X` answers as `resp_X`). */
export const responseIdOf = (requestId: string) => `resp_${requestId.replace(/^req_/, "")}`

export const packRecord = (record: StoredRecord): Uint8Array => deflateRawSync(JSON.stringify(record))

interface Row {
  readonly id: string
  readonly accountId: string
  readonly previousResponseId: string | null
  readonly body: Uint8Array
}

const unpack = (row: Row): StoredResponse => ({
  ...(JSON.parse(inflateRawSync(row.body).toString("utf8")) as StoredRecord),
  id: row.id,
  accountId: row.accountId,
  previousResponseId: row.previousResponseId
})

const hex = (bytes: Uint8Array) => Buffer.from(bytes).toString("hex")

/**
 * Writes stored responses; one statement, run in the settlement batch's
 * transaction. A row written twice (a batch retried after a commit whose
 * answer was lost) is written once.
 */
export const writeStored = (sql: SqlClient.SqlClient, rows: ReadonlyArray<StoredWrite>) => {
  if (rows.length === 0) return Effect.void
  const column = <A>(f: (row: StoredWrite) => A) => rows.map(f)
  return Effect.asVoid(sql`
    INSERT INTO stored_responses (id, account_id, api_key_id, previous_response_id, body, created_at, expires_at)
    SELECT id, account_id, api_key_id, previous_response_id, decode(body, 'hex'), created_at, expires_at FROM unnest(
      ${column((r) => r.id)}::text[], ${column((r) => r.accountId)}::text[], ${column((r) => r.apiKeyId)}::text[],
      ${column((r) => r.previousResponseId)}::text[], ${column((r) => hex(r.body))}::text[],
      ${column((r) => r.createdAt.toISOString())}::timestamptz[], ${column((r) => r.expiresAt.toISOString())}::timestamptz[]
    ) AS t(id, account_id, api_key_id, previous_response_id, body, created_at, expires_at)
    ON CONFLICT (id) DO NOTHING
  `)
}

/**
 * The one owner of `stored_responses` besides the flush's write: reads of a
 * response, its conversation and its items, deletion, and the purge of
 * expired rows. Reads see only unexpired rows, by the service's clock.
 */
export class StoredResponses extends Context.Tag("nenas/StoredResponses")<StoredResponses, {
  /** The unexpired responses among `ids`, whichever account they belong to (the caller checks). */
  readonly find: (ids: ReadonlyArray<string>) => Effect.Effect<ReadonlyArray<StoredResponse>, SqlError.SqlError>
  /** The account's conversation up to `id`, oldest first; empty when `id` is not the account's. */
  readonly chain: (accountId: string, id: string) => Effect.Effect<ReadonlyArray<StoredResponse>, SqlError.SqlError>
  /** Which of `ids` the account has stored (unexpired). */
  readonly present: (accountId: string, ids: ReadonlyArray<string>) => Effect.Effect<ReadonlySet<string>, SqlError.SqlError>
  /** Deletes the account's response; whether there was one. */
  readonly remove: (accountId: string, id: string) => Effect.Effect<boolean, SqlError.SqlError>
  /** Deletes expired rows, `PURGE_BATCH` per statement; how many. */
  readonly purgeExpired: Effect.Effect<number, SqlError.SqlError>
}>() {
  static readonly layer = Layer.scoped(
    StoredResponses,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const now = Effect.map(Clock.currentTimeMillis, (ms) => new Date(ms).toISOString())

      const find = (ids: ReadonlyArray<string>) =>
        ids.length === 0 ? Effect.succeed([]) : Effect.flatMap(now, (at) =>
          Effect.map(sql<Row>`
            SELECT id, account_id, previous_response_id, body FROM stored_responses
            WHERE id = ANY(${ids}::text[]) AND expires_at > ${at}::timestamptz
          `, (rows) => rows.map(unpack)))

      const chain = (accountId: string, id: string) =>
        Effect.flatMap(now, (at) =>
          Effect.map(sql<Row>`
            WITH RECURSIVE chain AS (
              SELECT id, account_id, previous_response_id, body, 0 AS depth FROM stored_responses
              WHERE id = ${id} AND account_id = ${accountId} AND expires_at > ${at}::timestamptz
              UNION ALL
              SELECT s.id, s.account_id, s.previous_response_id, s.body, c.depth + 1
              FROM stored_responses s JOIN chain c ON s.id = c.previous_response_id
              WHERE s.account_id = ${accountId} AND s.expires_at > ${at}::timestamptz
            )
            SELECT id, account_id, previous_response_id, body FROM chain ORDER BY depth DESC
          `, (rows) => rows.map(unpack)))

      const present = (accountId: string, ids: ReadonlyArray<string>) =>
        ids.length === 0 ? Effect.succeed(new Set<string>()) : Effect.flatMap(now, (at) =>
          Effect.map(sql<{ id: string }>`
            SELECT id FROM stored_responses
            WHERE id = ANY(${ids}::text[]) AND account_id = ${accountId} AND expires_at > ${at}::timestamptz
          `, (rows) => new Set(rows.map((row) => row.id))))

      const remove = (accountId: string, id: string) =>
        Effect.map(
          sql`DELETE FROM stored_responses WHERE id = ${id} AND account_id = ${accountId} RETURNING id`,
          (rows) => rows.length > 0
        )

      const purgeExpired = Effect.flatMap(now, (at) =>
        Effect.gen(function*() {
          let total = 0
          while (true) {
            const deleted = yield* sql`
              DELETE FROM stored_responses WHERE id IN (
                SELECT id FROM stored_responses WHERE expires_at <= ${at}::timestamptz LIMIT ${PURGE_BATCH}
              ) RETURNING id
            `
            total += deleted.length
            if (deleted.length < PURGE_BATCH) return total
          }
        }))

      yield* purgeExpired.pipe(
        Effect.catchAllCause((cause) => Effect.logWarning("expired stored responses not deleted; tried again later", cause)),
        Effect.repeat(Schedule.spaced(PURGE_INTERVAL)),
        Effect.delay(PURGE_INTERVAL),
        Effect.forkScoped
      )
      return StoredResponses.of({ find, chain, present, remove, purgeExpired })
    })
  )
}
