import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import { SqlClient, SqlError } from "@effect/sql"
import { Chunk, Context, Effect, Layer, Option, Schedule, Schema, Stream } from "effect"
import { IpLimits } from "../Addresses/IpLimits.js"
import { CurrentAccount, CurrentApiKey } from "../Auth/Api.js"
import { newId } from "../Domain/Ids.js"
import { makeTestLayer } from "../Domain/TestLayer.js"
import { csvField, csvLine } from "../Logs/LogsCsv.js"
import { currentRequestId } from "../Request/Context.js"
import type { AuditAction, AuditEntry } from "./Api.js"

/** How long entries are kept (docs/api/teams.md, "The audit log": a year). */
export const AUDIT_RETENTION_DAYS = 365
/** Rows per read of an export: memory holds one batch at a time. */
const EXPORT_BATCH = 2000
/** Entries deleted per statement of the retention sweep: a long backlog is cleared in bounded pieces. */
const PURGE_BATCH = 5000

/** What a change records: the action and what it was done to, with the fields given (never a secret). */
export interface AuditWhat {
  readonly action: AuditAction
  readonly targetType: AuditEntry["target_type"]
  readonly targetId: string | null
  readonly details?: Record<string, unknown>
  /** Recorded in another account than the request's, as another member (an invitation accepted: the new member, in the inviting account). */
  readonly as?: { readonly accountId: string; readonly memberId: string }
}

/** Who did it, from where, in which request. */
export interface AuditWho {
  readonly accountId: string
  readonly memberId: string | null
  readonly actorEmail: string | null
  readonly clientAddress: string | null
  readonly requestId: string | null
}

export interface AuditFilter {
  readonly action?: AuditAction | undefined
  readonly memberId?: string | undefined
  readonly targetId?: string | undefined
  readonly from?: Date | undefined
  readonly to?: Date | undefined
}

const AuditRow = Schema.Struct({
  id: Schema.String,
  memberId: Schema.NullOr(Schema.String),
  actorEmail: Schema.NullOr(Schema.String),
  action: Schema.String,
  targetType: Schema.String,
  targetId: Schema.NullOr(Schema.String),
  details: Schema.parseJson(Schema.Record({ key: Schema.String, value: Schema.Unknown })),
  clientAddress: Schema.NullOr(Schema.String),
  requestId: Schema.NullOr(Schema.String),
  createdAt: Schema.DateFromSelf
})
type AuditRow = typeof AuditRow.Type

export const toEntry = (row: AuditRow): AuditEntry => ({
  id: row.id,
  member_id: row.memberId,
  actor_email: row.actorEmail,
  action: row.action as AuditAction,
  target_type: row.targetType as AuditEntry["target_type"],
  target_id: row.targetId,
  details: row.details,
  client_address: row.clientAddress,
  request_id: row.requestId,
  created_at: row.createdAt.toISOString()
})

export const AUDIT_COLUMNS = [
  "id",
  "created_at",
  "action",
  "target_type",
  "target_id",
  "member_id",
  "actor_email",
  "client_address",
  "request_id",
  "details"
] as const

const auditLine = (entry: AuditEntry): string =>
  csvLine([
    csvField(entry.id),
    csvField(entry.created_at),
    csvField(entry.action),
    csvField(entry.target_type),
    csvField(entry.target_id, true),
    csvField(entry.member_id),
    csvField(entry.actor_email, true),
    csvField(entry.client_address),
    csvField(entry.request_id),
    csvField(JSON.stringify(entry.details), true)
  ])

const encoder = new TextEncoder()

/**
 * The audit log (docs/api/teams.md, "The audit log"): the `audit_log` table is written and read here only. An entry is
 * written in the transaction of its change (`within`): it exists exactly when the change committed.
 */
export class AuditLog extends Context.Tag("nenas/AuditLog")<AuditLog, {
  /**
   * Runs `change` and writes its entry (`what` of its result; undefined: nothing changed, nothing written)
   * in one transaction, as the signed-in member of the current request.
   */
  readonly within: <A, E, R>(
    change: Effect.Effect<A, E, R>,
    what: (result: A) => AuditWhat | undefined
  ) => Effect.Effect<A, E, R | CurrentAccount | HttpServerRequest.HttpServerRequest>
  /** Writes `what` in the caller's transaction, as the signed-in member of the current request (one change, several entries). */
  readonly record: (what: AuditWhat) => Effect.Effect<void, never, CurrentAccount | HttpServerRequest.HttpServerRequest>
  /**
   * `within` for a change an API key makes (a `/v1` call): no member acts, so the entry names the key
   * (`details.actor_api_key_id`) and no member or email.
   */
  readonly withinAsKey: <A, E, R>(
    change: Effect.Effect<A, E, R>,
    what: (result: A) => AuditWhat | undefined
  ) => Effect.Effect<A, E, R | CurrentApiKey | HttpServerRequest.HttpServerRequest>
  /** Writes one entry in the caller's transaction, if any (a change the service made itself names no member). */
  readonly write: (who: AuditWho, what: AuditWhat) => Effect.Effect<void>
  /** One page of the account's entries, newest first, and how many match. */
  readonly page: (
    accountId: string,
    filter: AuditFilter,
    page: { readonly limit: number; readonly offset: number }
  ) => Effect.Effect<{ readonly entries: ReadonlyArray<AuditEntry>; readonly total: number }>
  /** The account's entries matching `filter`, newest first, as CSV bytes read in batches. */
  readonly csv: (accountId: string, filter: AuditFilter) => Stream.Stream<Uint8Array>
  /** Deletes entries older than the retention, in bounded batches; how many. */
  readonly purge: Effect.Effect<number>
}>() {
  static readonly layer = Layer.effect(
    AuditLog,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const limits = yield* IpLimits

      const write = (who: AuditWho, what: AuditWhat) =>
        sql`
          INSERT INTO audit_log (id, account_id, member_id, actor_email, action, target_type, target_id, details, client_address, request_id)
          VALUES (${
          newId("aud")
        }, ${who.accountId}, ${who.memberId}, ${who.actorEmail}, ${what.action}, ${what.targetType},
            ${what.targetId}, ${JSON.stringify(what.details ?? {})}::jsonb, ${who.clientAddress}, ${who.requestId})
        `.pipe(Effect.asVoid, Effect.orDie, Effect.withSpan("AuditLog.write"))

      const whoNow = Effect.gen(function*() {
        const account = yield* CurrentAccount
        return {
          accountId: account.id,
          memberId: account.member.id,
          actorEmail: account.identity.email,
          clientAddress: yield* limits.client,
          requestId: (yield* currentRequestId) || null
        } satisfies AuditWho
      })

      const where = (accountId: string, filter: AuditFilter) => {
        const conditions = [sql`account_id = ${accountId}`]
        if (filter.action !== undefined) conditions.push(sql`action = ${filter.action}`)
        if (filter.memberId !== undefined) conditions.push(sql`member_id = ${filter.memberId}`)
        if (filter.targetId !== undefined) conditions.push(sql`target_id = ${filter.targetId}`)
        if (filter.from !== undefined) conditions.push(sql`created_at >= ${filter.from}`)
        if (filter.to !== undefined) conditions.push(sql`created_at < ${filter.to}`)
        return sql.and(conditions)
      }
      // `details` as text: the client would rename the keys inside a JSON column to camelCase.
      const COLUMNS = sql.literal(
        "id, member_id, actor_email, action, target_type, target_id, details::text AS details, client_address, request_id, created_at"
      )
      const decodeRows = Schema.decodeUnknown(Schema.Array(AuditRow))
      const rows = (
        accountId: string,
        filter: AuditFilter,
        limit: number,
        offset: number,
        after: { at: Date; id: string } | null
      ) =>
        Effect.flatMap(
          sql`
            SELECT ${COLUMNS} FROM audit_log
            WHERE ${where(accountId, filter)}
              ${after === null ? sql`` : sql`AND (created_at, id) < (${after.at}, ${after.id})`}
            ORDER BY created_at DESC, id DESC
            LIMIT ${limit} OFFSET ${offset}
          `,
          decodeRows
        )
      const count = (accountId: string, filter: AuditFilter) =>
        Effect.map(
          sql<{ count: number }>`SELECT count(*)::int AS count FROM audit_log WHERE ${where(accountId, filter)}`,
          (found) => Number(found[0]?.count ?? 0)
        )

      const keyNow = Effect.gen(function*() {
        const key = yield* CurrentApiKey
        const who: AuditWho = {
          accountId: key.accountId,
          memberId: null,
          actorEmail: null,
          clientAddress: yield* limits.client,
          requestId: (yield* currentRequestId) || null
        }
        return { who, keyId: key.keyId }
      })

      return AuditLog.of({
        record: (what) =>
          Effect.flatMap(whoNow, (who) => write(what.as === undefined ? who : Object.assign({}, who, what.as), what)),
        withinAsKey: <A, E, R>(change: Effect.Effect<A, E, R>, what: (result: A) => AuditWhat | undefined) =>
          Effect.flatMap(keyNow, ({ keyId, who }) =>
            sql.withTransaction(Effect.tap(change, (result) => {
              const entry = what(result)
              if (entry === undefined) return Effect.void
              return write(
                who,
                Object.assign({}, entry, { details: Object.assign({ actor_api_key_id: keyId }, entry.details) })
              )
            }))).pipe(
              Effect.catchIf((error): error is SqlError.SqlError => error instanceof SqlError.SqlError, Effect.die)
            ) as Effect.Effect<A, E, R | CurrentApiKey | HttpServerRequest.HttpServerRequest>,
        within: <A, E, R>(change: Effect.Effect<A, E, R>, what: (result: A) => AuditWhat | undefined) =>
          Effect.gen(function*() {
            const who = yield* whoNow
            return yield* sql.withTransaction(Effect.tap(change, (result) => {
              const entry = what(result)
              if (entry === undefined) return Effect.void
              return write(entry.as === undefined ? who : { ...who, ...entry.as }, entry)
            }))
          }).pipe(
            Effect.catchIf((error): error is SqlError.SqlError => error instanceof SqlError.SqlError, Effect.die)
          ) as Effect.Effect<A, E, R | CurrentAccount | HttpServerRequest.HttpServerRequest>,
        write,
        page: (accountId, filter, page) =>
          Effect.all({
            found: rows(accountId, filter, page.limit, page.offset, null),
            total: count(accountId, filter)
          }).pipe(
            Effect.map(({ found, total }) => ({ entries: found.map(toEntry), total })),
            Effect.orDie,
            Effect.withSpan("AuditLog.page")
          ),
        csv: (accountId, filter) =>
          Stream.concat(
            Stream.succeed(encoder.encode(csvLine([...AUDIT_COLUMNS]))),
            Stream.paginateChunkEffect(null as { at: Date; id: string } | null, (after) =>
              Effect.map(
                rows(accountId, filter, EXPORT_BATCH + 1, 0, after).pipe(Effect.orDie),
                (found) => {
                  const batch = found.slice(0, EXPORT_BATCH)
                  const last = batch.at(-1)
                  const next = found.length > EXPORT_BATCH && last !== undefined
                    ? Option.some({ at: last.createdAt, id: last.id })
                    : Option.none()
                  const bytes = batch.length === 0
                    ? Chunk.empty<Uint8Array>()
                    : Chunk.of(encoder.encode(batch.map((row) => auditLine(toEntry(row))).join("")))
                  return [bytes, next] as const
                }
              ))
          ),
        purge: Effect.gen(function*() {
          let purged = 0
          // Bounded: at most 100 batches a sweep; the next sweep goes on.
          for (let round = 0; round < 100; round++) {
            const deleted = yield* sql<{ count: number }>`
              WITH gone AS (
                DELETE FROM audit_log WHERE id IN (
                  SELECT id FROM audit_log WHERE created_at < now() - ${AUDIT_RETENTION_DAYS} * interval '1 day' LIMIT ${PURGE_BATCH}
                ) RETURNING 1
              ) SELECT count(*)::int AS count FROM gone
            `
            const n = Number(deleted[0]?.count ?? 0)
            purged += n
            if (n < PURGE_BATCH) break
          }
          return purged
        }).pipe(Effect.orDie, Effect.withSpan("AuditLog.purge"))
      })
    })
  )
  /** The log, and its retention sweep every hour (each instance's; a delete twice deletes nothing more). */
  static readonly layerRunning = Layer.scopedDiscard(
    Effect.flatMap(AuditLog, (log) =>
      log.purge.pipe(
        Effect.catchAllCause((cause) =>
          Effect.logWarning("the audit log's retention sweep failed; it runs again in an hour", cause)
        ),
        Effect.repeat(Schedule.spaced("1 hour")),
        Effect.forkScoped
      ))
  ).pipe(Layer.provideMerge(AuditLog.layer))
  /** Only the members a test gives; any other dies when used. */
  static readonly Test = makeTestLayer(AuditLog)
}
