import { SqlClient, type SqlError, SqlSchema } from "@effect/sql"
import { Context, Duration, Effect, Layer, Schedule, Schema } from "effect"
import { deflateRaw, inflateRaw } from "node:zlib"
import { makeTestLayer } from "../Domain/TestLayer.js"
import { now } from "../Domain/Time.js"

/** How long a stored response is kept (docs/api/models.md, "Stored responses"): 30 days, a test key's 24 hours. */
export const RETENTION_DAYS = 30
export const RETENTION_MS = RETENTION_DAYS * 24 * 60 * 60 * 1000
export const TEST_RETENTION_MS = 24 * 60 * 60 * 1000
export const retentionMs = (environment: "live" | "test") => environment === "test" ? TEST_RETENTION_MS : RETENTION_MS
/** Expired rows are deleted this many per statement, so a purge never holds a long lock. */
export const PURGE_BATCH = 1000
const PURGE_INTERVAL = Duration.minutes(10)
/** The most of a chain that is ever read (docs/api/models.md, "Stored responses"): responses, and their records' bytes. */
export const MAX_CHAIN_RESPONSES = 1000
export const MAX_CHAIN_BYTES = 16 * 1024 * 1024
/** Bodies are fetched in queries of about this many bytes, so no one reply takes long to decode. */
const PIECE_BYTES = 1024 * 1024
/** An account over its quota loses at most this many of its oldest rows a write; the next write goes on. */
const QUOTA_BATCH = 1000

export type Json = { readonly [key: string]: unknown }

/** What a stored response keeps: the answer as it was sent, its own input items (references resolved), its instructions. */
export interface StoredRecord {
  readonly response: Json
  readonly input: ReadonlyArray<Json>
  readonly instructions: string | null
}

/** A stored response as the settlement flush writes it: the record deflated, and its size as read back. */
export interface StoredWrite {
  readonly id: string
  readonly accountId: string
  readonly apiKeyId: string
  readonly previousResponseId: string | null
  readonly body: Uint8Array
  /** The record's JSON in bytes: what reading it back costs, counted in chains and quotas. */
  readonly bytes: number
  /** `STORED_RESPONSES_MAX_BYTES`: the account's oldest rows go past it. */
  readonly quotaBytes: number
  readonly createdAt: Date
  readonly expiresAt: Date
}

export interface StoredResponse extends StoredRecord {
  readonly id: string
  readonly accountId: string
  readonly previousResponseId: string | null
}

/** A read that would go past a chain's bounds: more responses, or more bytes, than may be read. */
export class BeyondBounds extends Schema.TaggedError<BeyondBounds>()("BeyondBounds", {
  limit: Schema.Literal("responses", "bytes")
}) {}

/** The stored response of a call, by its request id (`req_X` answers as `resp_X`). */
export const responseIdOf = (requestId: string) => `resp_${requestId.replace(/^req_/, "")}`

/** zlib on its thread pool: a large body never holds the event loop. */
const deflate = (input: Uint8Array) =>
  Effect.async<Buffer>((resume) => {
    deflateRaw(input, (error, result) => resume(error === null ? Effect.succeed(result) : Effect.die(error)))
  })

const inflate = (body: Uint8Array, maxOutputLength: number) =>
  Effect.async<Buffer, BeyondBounds>((resume) => {
    inflateRaw(body, { maxOutputLength }, (error, result) => {
      if (error === null) return resume(Effect.succeed(result))
      // A body that inflates past what is left of the budget (`maxOutputLength`) is refused, not read.
      resume(
        (error as NodeJS.ErrnoException).code === "ERR_BUFFER_TOO_LARGE"
          ? Effect.fail(new BeyondBounds({ limit: "bytes" }))
          : Effect.die(error)
      )
    })
  })

/** The record deflated (off the event loop), with its size as read back. */
export const packRecord = (record: StoredRecord) =>
  Effect.suspend(() => {
    const json = Buffer.from(JSON.stringify(record), "utf8")
    return Effect.map(deflate(json), (body) => ({ body: new Uint8Array(body), bytes: json.length }))
  })

const Row = Schema.Struct({
  id: Schema.String,
  accountId: Schema.String,
  previousResponseId: Schema.NullOr(Schema.String),
  body: Schema.Uint8ArrayFromSelf
})
type Row = typeof Row.Type

/** A row the walk or the size check found, before its body is read. */
const Head = Schema.Struct({ id: Schema.String, bytes: Schema.Number })
type Head = typeof Head.Type

/** A step of the walk back along a conversation: how deep, and the bytes up to it. */
const Walked = Schema.Struct({ ...Head.fields, depth: Schema.Int, total: Schema.Number })

const Id = Schema.Struct({ id: Schema.String })

const unpack = (row: Row, json: Buffer): StoredResponse => ({
  ...(JSON.parse(json.toString("utf8")) as StoredRecord),
  id: row.id,
  accountId: row.accountId,
  previousResponseId: row.previousResponseId
})

/** `heads` in runs of about `PIECE_BYTES` (a larger row alone), in order. */
const piecesOf = (heads: ReadonlyArray<Head>): ReadonlyArray<ReadonlyArray<Head>> => {
  const pieces: Array<Array<Head>> = []
  let size = Infinity
  for (const head of heads) {
    if (size + head.bytes > PIECE_BYTES) {
      pieces.push([])
      size = 0
    }
    pieces[pieces.length - 1]?.push(head)
    size += head.bytes
  }
  return pieces
}

const hex = (bytes: Uint8Array) => Buffer.from(bytes).toString("hex")

/**
 * Writes stored responses, then deletes the oldest of any account they took
 * past its quota (`STORED_RESPONSES_MAX_BYTES`); run in the settlement batch's
 * transaction. A row written twice (a batch retried after a commit whose answer
 * was lost) is written once. Accounts' totals are kept by triggers (0016).
 */
export const writeStored = (sql: SqlClient.SqlClient, rows: ReadonlyArray<StoredWrite>) => {
  if (rows.length === 0) return Effect.void
  const column = <A>(f: (row: StoredWrite) => A) => rows.map(f)
  const quotas = new Map<string, number>()
  for (const row of rows) quotas.set(row.accountId, Math.min(row.quotaBytes, quotas.get(row.accountId) ?? Infinity))
  return Effect.zipRight(
    sql`
      INSERT INTO stored_responses (id, account_id, api_key_id, previous_response_id, body, bytes, created_at, expires_at)
      SELECT id, account_id, api_key_id, previous_response_id, decode(body, 'hex'), bytes, created_at, expires_at FROM unnest(
        ${column((r) => r.id)}::text[], ${column((r) => r.accountId)}::text[], ${column((r) => r.apiKeyId)}::text[],
        ${column((r) => r.previousResponseId)}::text[], ${column((r) => hex(r.body))}::text[], ${
      column((r) => r.bytes)
    }::bigint[],
        ${column((r) => r.createdAt.toISOString())}::timestamptz[], ${
      column((r) => r.expiresAt.toISOString())
    }::timestamptz[]
      ) AS t(id, account_id, api_key_id, previous_response_id, body, bytes, created_at, expires_at)
      ON CONFLICT (id) DO NOTHING
    `,
    // Oldest first, just enough of them: each row goes if the rows older than it leave the account still over.
    sql`
      DELETE FROM stored_responses d USING (
        SELECT o.id FROM unnest(${[...quotas.keys()]}::text[], ${[
      ...quotas.values()
    ]}::bigint[]) AS q(account_id, quota)
        JOIN stored_response_totals t ON t.account_id = q.account_id AND t.bytes > q.quota
        CROSS JOIN LATERAL (
          SELECT id, sum(bytes) OVER (ORDER BY created_at, id) - bytes AS before FROM (
            SELECT id, bytes, created_at FROM stored_responses s WHERE s.account_id = q.account_id
            ORDER BY created_at, id LIMIT ${QUOTA_BATCH}
          ) oldest
        ) o
        WHERE o.before < t.bytes - q.quota
      ) doomed WHERE d.id = doomed.id
    `
  ).pipe(Effect.asVoid)
}

/**
 * The one owner of `stored_responses` besides the flush's write: reads of a
 * response, its conversation and its items, deletion, and the purge of
 * expired rows. Reads see only unexpired rows, by the service's clock; they
 * size what they read before reading it, fetch bodies in pieces and inflate
 * them off the event loop, never more than `MAX_CHAIN_BYTES` a read. Rows are
 * decoded; a failed read or delete is a defect (the purge's failures stay its own).
 */
export class StoredResponses extends Context.Tag("nenas/StoredResponses")<StoredResponses, {
  /** The account's unexpired responses among `ids`; more than `MAX_CHAIN_BYTES` of them together is refused unread. */
  readonly find: (
    accountId: string,
    ids: ReadonlyArray<string>
  ) => Effect.Effect<ReadonlyArray<StoredResponse>, BeyondBounds>
  /**
   * The account's conversation up to `id`, oldest first; empty when `id` is not the account's. One longer than
   * `MAX_CHAIN_RESPONSES` or larger than `MAX_CHAIN_BYTES` is refused unread (`whole`), or read back only as far
   * as the bounds go (its newest part).
   */
  readonly chain: (
    accountId: string,
    id: string,
    whole: boolean
  ) => Effect.Effect<ReadonlyArray<StoredResponse>, BeyondBounds>
  /** Which of `ids` the account has stored (unexpired). */
  readonly present: (accountId: string, ids: ReadonlyArray<string>) => Effect.Effect<ReadonlySet<string>>
  /** Deletes the account's response; whether there was one. */
  readonly remove: (accountId: string, id: string) => Effect.Effect<boolean>
  /** Deletes expired rows, `PURGE_BATCH` per statement; how many. */
  readonly purgeExpired: Effect.Effect<number, SqlError.SqlError>
}>() {
  static readonly layer = Layer.scoped(
    StoredResponses,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const isoNow = Effect.map(now, (at) => at.toISOString())
      /** The rows of `statement`, decoded. */
      const all = <A, I>(
        Result: Schema.Schema<A, I>,
        statement: Effect.Effect<ReadonlyArray<unknown>, SqlError.SqlError>
      ) => SqlSchema.findAll({ Request: Schema.Void, Result, execute: () => statement })(undefined)

      /**
       * The bodies of `heads` (in their order), a piece at a time, each inflated within what is left of
       * `MAX_CHAIN_BYTES`; past it, refused (`whole`) or cut there. A row deleted meanwhile is left out.
       */
      const load = (accountId: string, heads: ReadonlyArray<Head>, whole: boolean) =>
        Effect.gen(function*() {
          const loaded: Array<StoredResponse> = []
          let left = MAX_CHAIN_BYTES
          for (const piece of piecesOf(heads)) {
            const rows = yield* all(
              Row,
              sql`
              SELECT id, account_id, previous_response_id, body FROM stored_responses
              WHERE id = ANY(${piece.map((head) => head.id)}::text[]) AND account_id = ${accountId}
            `
            ).pipe(Effect.orDie)
            const byId = new Map(rows.map((row) => [row.id, row]))
            for (const head of piece) {
              const row = byId.get(head.id)
              if (row === undefined) continue
              const json = yield* inflate(row.body, Math.max(1, left)).pipe(
                Effect.catchTag("BeyondBounds", (error) => whole ? Effect.fail(error) : Effect.succeed(undefined))
              )
              if (json === undefined) return loaded
              left -= json.length
              loaded.push(unpack(row, json))
              // Parsing is the one part on the event loop: other requests run between records.
              yield* Effect.yieldNow()
            }
          }
          return loaded
        })

      const find = (accountId: string, ids: ReadonlyArray<string>) =>
        ids.length === 0 ? Effect.succeed([]) : Effect.gen(function*() {
          const at = yield* isoNow
          const heads = yield* all(
            Head,
            sql`
            SELECT id, bytes FROM stored_responses
            WHERE id = ANY(${ids}::text[]) AND account_id = ${accountId} AND expires_at > ${at}::timestamptz
          `
          ).pipe(Effect.orDie)
          if (heads.reduce((sum, head) => sum + head.bytes, 0) > MAX_CHAIN_BYTES) {
            return yield* new BeyondBounds({ limit: "bytes" })
          }
          return yield* load(accountId, heads, true)
        }).pipe(Effect.withSpan("StoredResponses.find"))

      const chain = (accountId: string, id: string, whole: boolean) =>
        Effect.gen(function*() {
          const at = yield* isoNow
          // Ids and sizes only, newest first; the walk stops one step past either bound.
          const walked = yield* all(
            Walked,
            sql`
            WITH RECURSIVE chain AS (
              SELECT id, previous_response_id, bytes, 1 AS depth, bytes AS total FROM stored_responses
              WHERE id = ${id} AND account_id = ${accountId} AND expires_at > ${at}::timestamptz
              UNION ALL
              SELECT s.id, s.previous_response_id, s.bytes, c.depth + 1, c.total + s.bytes
              FROM chain c JOIN stored_responses s ON s.id = c.previous_response_id
              WHERE c.depth <= ${MAX_CHAIN_RESPONSES} AND c.total <= ${MAX_CHAIN_BYTES}
                AND s.account_id = ${accountId} AND s.expires_at > ${at}::timestamptz
            )
            SELECT id, bytes, depth, total FROM chain ORDER BY depth
          `
          ).pipe(Effect.orDie)
          const within = walked.filter((row) => row.depth <= MAX_CHAIN_RESPONSES && row.total <= MAX_CHAIN_BYTES)
          if (whole && within.length < walked.length) {
            const last = walked[walked.length - 1]
            return yield* new BeyondBounds({
              limit: last !== undefined && last.depth > MAX_CHAIN_RESPONSES ? "responses" : "bytes"
            })
          }
          const loaded = yield* load(accountId, within.map((row) => ({ id: row.id, bytes: row.bytes })), whole)
          return loaded.reverse()
        }).pipe(Effect.withSpan("StoredResponses.chain"))

      const present = (accountId: string, ids: ReadonlyArray<string>) =>
        ids.length === 0 ? Effect.succeed(new Set<string>()) : Effect.flatMap(isoNow, (at) =>
          Effect.map(
            all(
              Id,
              sql`
            SELECT id FROM stored_responses
            WHERE id = ANY(${ids}::text[]) AND account_id = ${accountId} AND expires_at > ${at}::timestamptz
          `
            ),
            (rows) => new Set(rows.map((row) => row.id))
          )).pipe(Effect.orDie, Effect.withSpan("StoredResponses.present"))

      const remove = (accountId: string, id: string) =>
        Effect.map(
          sql`DELETE FROM stored_responses WHERE id = ${id} AND account_id = ${accountId} RETURNING id`,
          (rows) => rows.length > 0
        ).pipe(Effect.orDie, Effect.withSpan("StoredResponses.remove"))

      const purgeExpired = Effect.flatMap(isoNow, (at) =>
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
        Effect.catchAllCause((cause) =>
          Effect.logWarning("expired stored responses not deleted; tried again later", cause)
        ),
        Effect.repeat(Schedule.spaced(PURGE_INTERVAL)),
        Effect.delay(PURGE_INTERVAL),
        Effect.forkScoped
      )
      return StoredResponses.of({ find, chain, present, remove, purgeExpired })
    })
  )

  static readonly Test = makeTestLayer(StoredResponses)
}
