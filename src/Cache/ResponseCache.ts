import { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Context, Duration, Effect, Layer, Option, Schema } from "effect"
import { AppConfig } from "../AppConfig.js"
import { Listener } from "../Database/Listener.js"

/**
 * The response cache's store (docs/api/cache.md, "What is stored"): answers by account and cache key, shared
 * by every instance in `response_cache`, with a bounded in-memory front. A stored answer is in the front at
 * once and reaches the table with the next flush, at most `FLUSH_EVERY` later; so do the times answers are
 * used, which order the per-account bound (`CACHE_MAX_BYTES`: past it the least recently used go first). A
 * cache that cannot reach its table answers from the front and misses the rest: a call is never failed by it.
 */

/** One stored answer. */
export interface CacheEntry {
  /** The answer as its endpoint's replay reads it (JSON). */
  readonly answer: string
  /** The call that made it, and what it cost: what each hit saves. */
  readonly sourceRequestId: string
  readonly costMicroMyr: number
  /** Epoch ms. */
  readonly createdAt: number
  readonly expiresAt: number
}

/** The channel `DELETE /dashboard/cache` announces an account's emptied cache on: every instance drops its front. */
export const CACHE_CHANNEL = "nenas_cache"

export const FLUSH_EVERY = Duration.millis(100)
/** The front of each instance: its most recently used answers, up to this many bytes in all. */
const FRONT_MAX_BYTES = 16 * 1024 * 1024
/** Answers waiting for the flush, up to this many bytes; past it the oldest are dropped (a cache may forget). */
const QUEUE_MAX_BYTES = 32 * 1024 * 1024
/** One flush writes at most this many answers; the rest wait for the next. */
const FLUSH_BATCH = 200
/** An account's bound is checked at most this often, after answers were stored for it. */
const EVICT_EVERY_MS = 1000

interface Held {
  readonly accountId: string
  readonly key: string
  readonly entry: CacheEntry
  readonly bytes: number
}

const slot = (accountId: string, key: string) => `${accountId}\n${key}`

const entryBytes = (entry: CacheEntry) => Buffer.byteLength(entry.answer) + 128

const StoredRow = Schema.Struct({
  answer: Schema.String,
  sourceRequestId: Schema.String,
  costMicroMyr: Schema.Number,
  createdAt: Schema.DateFromSelf,
  expiresAt: Schema.DateFromSelf
})
const decodeRows = Schema.decodeUnknown(Schema.Array(StoredRow))

export class ResponseCache extends Context.Tag("nenas/ResponseCache")<ResponseCache, {
  /** The account's answer under `key`, unexpired; none when there is none (or the table cannot be read). */
  readonly lookup: (accountId: string, key: string) => Effect.Effect<Option.Option<CacheEntry>>
  /** Stores an answer: readable here at once, everywhere after the next flush. Never fails. */
  readonly put: (accountId: string, key: string, entry: CacheEntry) => Effect.Effect<void>
  /** Empties the account's cache on every instance; returns how many stored answers it dropped. */
  readonly clear: (accountId: string) => Effect.Effect<number, SqlError.SqlError>
  /** Writes what is queued now (tests; the layer also does it when it closes). */
  readonly flush: Effect.Effect<void>
}>() {
  static readonly layer = Layer.scoped(
    ResponseCache,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const { cacheMaxBytes } = yield* AppConfig
      const listener = yield* Listener
      const clock = yield* Effect.clock

      // The front: insertion order is recency (a hit moves its answer to the end).
      const front = new Map<string, Held>()
      let frontBytes = 0
      const forget = (at: string) => {
        const held = front.get(at)
        if (held === undefined) return
        front.delete(at)
        frontBytes -= held.bytes
      }
      const remember = (held: Held) => {
        const at = slot(held.accountId, held.key)
        forget(at)
        if (held.bytes > FRONT_MAX_BYTES / 4) return
        front.set(at, held)
        frontBytes += held.bytes
        for (const [oldest] of front) {
          if (frontBytes <= FRONT_MAX_BYTES) break
          forget(oldest)
        }
      }

      // What the next flush writes: answers stored, and answers used (their time of use).
      const queued = new Map<string, Held>()
      let queuedBytes = 0
      const used = new Map<string, { readonly accountId: string; readonly key: string; readonly at: number }>()
      const evictedAt = new Map<string, number>()

      const dropAccount = (accountId: string) => {
        for (const [at, held] of front) if (held.accountId === accountId) forget(at)
        for (const [at, held] of queued) {
          if (held.accountId === accountId) {
            queued.delete(at)
            queuedBytes -= held.bytes
          }
        }
        for (const [at, use] of used) if (use.accountId === accountId) used.delete(at)
      }
      yield* listener.on(CACHE_CHANNEL, dropAccount)

      const lookup = (accountId: string, key: string): Effect.Effect<Option.Option<CacheEntry>> =>
        Effect.suspend(() => {
          const now = clock.unsafeCurrentTimeMillis()
          const at = slot(accountId, key)
          const held = front.get(at)
          if (held !== undefined) {
            if (held.entry.expiresAt <= now) {
              forget(at)
              return Effect.succeed(Option.none())
            }
            remember(held)
            used.set(at, { accountId, key, at: now })
            return Effect.succeed(Option.some(held.entry))
          }
          return sql`
            SELECT answer, source_request_id, cost_micro_myr, created_at, expires_at FROM response_cache
            WHERE account_id = ${accountId} AND cache_key = ${key} AND expires_at > ${new Date(now)}::timestamptz
          `.pipe(
            Effect.flatMap(decodeRows),
            Effect.map((rows) => {
              const row = rows[0]
              if (row === undefined) return Option.none()
              const entry: CacheEntry = {
                answer: row.answer,
                sourceRequestId: row.sourceRequestId,
                costMicroMyr: row.costMicroMyr,
                createdAt: row.createdAt.getTime(),
                expiresAt: row.expiresAt.getTime()
              }
              remember({ accountId, key, entry, bytes: entryBytes(entry) })
              used.set(at, { accountId, key, at: now })
              return Option.some(entry)
            }),
            Effect.catchAllCause((cause) =>
              Effect.as(
                Effect.logWarning("The response cache could not be read; the call runs uncached.", cause),
                Option.none()
              )
            )
          )
        })

      const put = (accountId: string, key: string, entry: CacheEntry): Effect.Effect<void> =>
        Effect.sync(() => {
          const bytes = entryBytes(entry)
          // An answer larger than the account's whole bound is never kept.
          if (bytes > cacheMaxBytes) return
          const held: Held = { accountId, key, entry, bytes }
          remember(held)
          const at = slot(accountId, key)
          const before = queued.get(at)
          if (before !== undefined) queuedBytes -= before.bytes
          queued.delete(at)
          queued.set(at, held)
          queuedBytes += bytes
          for (const [oldest, dropped] of queued) {
            if (queuedBytes <= QUEUE_MAX_BYTES) break
            queued.delete(oldest)
            queuedBytes -= dropped.bytes
          }
        })

      /** Each account's least recently used answers past its bound, dropped here and from the table. */
      const evict = (accountIds: ReadonlyArray<string>) =>
        Effect.forEach(accountIds, (accountId) =>
          Effect.flatMap(
            sql<{ cacheKey: string }>`
              DELETE FROM response_cache c USING (
                SELECT cache_key, sum(bytes) OVER (ORDER BY last_used_at DESC, cache_key DESC) AS running
                FROM response_cache WHERE account_id = ${accountId}
              ) r
              WHERE c.account_id = ${accountId} AND c.cache_key = r.cache_key AND r.running > ${cacheMaxBytes}
              RETURNING c.cache_key
            `,
            (rows) => Effect.sync(() => rows.forEach((row) => forget(slot(accountId, row.cacheKey))))
          ), { discard: true })

      // A flush and an emptying never overlap here: a flush's write landing after the emptying's delete
      // would put back an answer the caller has just seen dropped.
      const writing = yield* Effect.makeSemaphore(1)

      const flushOnce = Effect.suspend(() => {
        const batch = [...queued.values()].slice(0, FLUSH_BATCH)
        const touches = [...used.values()]
        if (batch.length === 0 && touches.length === 0) return Effect.void
        for (const held of batch) {
          queued.delete(slot(held.accountId, held.key))
          queuedBytes -= held.bytes
        }
        used.clear()
        const now = clock.unsafeCurrentTimeMillis()
        const accounts = [...new Set(batch.map((held) => held.accountId))].filter((accountId) =>
          now - (evictedAt.get(accountId) ?? 0) >= EVICT_EVERY_MS
        )
        for (const accountId of accounts) evictedAt.set(accountId, now)
        if (evictedAt.size > 10_000) evictedAt.clear()
        const column = <A>(f: (held: Held) => A) => batch.map(f)
        const written = batch.length === 0 ? Effect.void : sql`
          INSERT INTO response_cache (account_id, cache_key, answer, bytes, source_request_id, cost_micro_myr,
            created_at, expires_at, last_used_at)
          SELECT * FROM unnest(
            ${column((h) => h.accountId)}::text[], ${column((h) => h.key)}::text[],
            ${column((h) => h.entry.answer)}::text[], ${column((h) => h.bytes)}::int[],
            ${column((h) => h.entry.sourceRequestId)}::text[], ${column((h) => h.entry.costMicroMyr)}::bigint[],
            ${column((h) => new Date(h.entry.createdAt).toISOString())}::timestamptz[],
            ${column((h) => new Date(h.entry.expiresAt).toISOString())}::timestamptz[],
            ${column((h) => new Date(h.entry.createdAt).toISOString())}::timestamptz[]
          )
          ON CONFLICT (account_id, cache_key) DO UPDATE SET answer = EXCLUDED.answer, bytes = EXCLUDED.bytes,
            source_request_id = EXCLUDED.source_request_id, cost_micro_myr = EXCLUDED.cost_micro_myr,
            created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at, last_used_at = EXCLUDED.last_used_at
        `
        const touched = touches.length === 0 ? Effect.void : sql`
          UPDATE response_cache c SET last_used_at = greatest(c.last_used_at, u.at)
          FROM unnest(
            ${touches.map((t) => t.accountId)}::text[], ${touches.map((t) => t.key)}::text[],
            ${touches.map((t) => new Date(t.at).toISOString())}::timestamptz[]
          ) AS u(account_id, cache_key, at)
          WHERE c.account_id = u.account_id AND c.cache_key = u.cache_key
        `
        // Expired answers leave the table a batch at a time.
        const expired = sql`
          DELETE FROM response_cache WHERE ctid IN (
            SELECT ctid FROM response_cache WHERE expires_at <= ${new Date(now)}::timestamptz LIMIT 500)
        `
        return Effect.all([written, touched, evict(accounts), expired], { discard: true }).pipe(
          Effect.catchAllCause((cause) =>
            Effect.logWarning(
              "The response cache could not be written; its answers stay in this instance's front.",
              cause
            )
          )
        )
      })

      const flush = writing.withPermits(1)(flushOnce)
      yield* Effect.forkScoped(Effect.forever(Effect.zipRight(Effect.sleep(FLUSH_EVERY), flush)))
      yield* Effect.addFinalizer(() => flush)

      const clear = (accountId: string) =>
        sql.withTransaction(Effect.gen(function*() {
          const rows = yield* sql<{ count: number }>`
            WITH dropped AS (DELETE FROM response_cache WHERE account_id = ${accountId} RETURNING 1)
            SELECT count(*)::int AS count FROM dropped
          `
          yield* sql`SELECT pg_notify(${CACHE_CHANNEL}, ${accountId})`
          return rows[0]?.count ?? 0
        })).pipe(Effect.tap(() => Effect.sync(() => dropAccount(accountId))), writing.withPermits(1))

      return { lookup, put, clear, flush }
    })
  )
}
