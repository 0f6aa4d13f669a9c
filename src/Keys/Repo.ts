import { SqlClient, type SqlError } from "@effect/sql"
import { Context, Data, Effect, Layer } from "effect"
import type { Environment } from "./Api.js"
import { MAX_KEYS_PER_ACCOUNT } from "./ApiKeys.js"

export interface KeyRow {
  readonly id: string
  readonly accountId: string
  readonly name: string
  readonly prefix: string
  readonly environment: Environment
  readonly monthlySpendLimitMicroMyr: number | null
  readonly expiresAt: Date | null
  readonly createdAt: Date
  readonly lastUsedAt: Date | null
  readonly disabledAt: Date | null
  /** Null: the operator's default (`RATE_LIMIT_RPM`). */
  readonly rateLimitRpm: number | null
  /** Null: the operator's default (`RATE_LIMIT_CONCURRENT`). */
  readonly rateLimitConcurrent: number | null
}

/** The fields `PATCH /dashboard/api-keys/{id}` may change; an absent field stays as it is. */
export interface KeyChanges {
  readonly name?: string
  readonly monthlySpendLimitMicroMyr?: number | null
  readonly expiresAt?: Date | null
  readonly disabled?: boolean
  readonly rateLimitRpm?: number | null
  readonly rateLimitConcurrent?: number | null
}

/** A rotation to write: the new hash, and what lets a repeat with the same Idempotency-Key answer the same secret. */
export interface Rotation {
  readonly keyHash: Buffer
  readonly prefix: string
  readonly graceSeconds: number
  readonly repeat: { readonly tokenHash: Buffer; readonly sealed: Buffer } | null
}

export type NewKey = {
  readonly id: string
  readonly accountId: string
  readonly name: string
  readonly prefix: string
  readonly environment: Environment
  readonly keyHash: Buffer
  readonly monthlySpendLimitMicroMyr: number | null
  readonly expiresAt: Date | null
  /** Absent or null: the operator's defaults. */
  readonly rateLimitRpm?: number | null
  readonly rateLimitConcurrent?: number | null
}

/** What a key hash resolves to when a `/v1` call presents it. */
export type KeyLookup =
  | {
    readonly _tag: "Active"
    readonly key: KeyRow
    readonly accountSuspended: boolean
    /** Set when the hash is the key's previous secret, in its grace period until then. */
    readonly graceUntil: Date | null
  }
  /** A tombstone: `rotatedOf` names the key when the secret was replaced by a rotation and the key still exists. */
  | { readonly _tag: "Revoked"; readonly rotatedOf: string | null }
  | { readonly _tag: "Unknown" }

export class TooManyKeys extends Data.TaggedError("TooManyKeys")<{ readonly limit: number }> {}

const keyColumns = "k.id, k.account_id, k.name, k.prefix, k.environment, k.monthly_spend_limit_micro_myr, k.expires_at, k.created_at, k.last_used_at, k.disabled_at, k.rate_limit_rpm, k.rate_limit_concurrent"

export class KeysRepo extends Context.Tag("nenas/KeysRepo")<KeysRepo, {
  readonly create: (key: NewKey) => Effect.Effect<KeyRow, SqlError.SqlError | TooManyKeys>
  readonly list: (accountId: string) => Effect.Effect<ReadonlyArray<KeyRow>, SqlError.SqlError>
  /** Deletes the key for good and keeps its hash as a tombstone; false when the account has no such key. */
  readonly remove: (accountId: string, keyId: string) => Effect.Effect<boolean, SqlError.SqlError>
  readonly lookup: (keyHash: Buffer) => Effect.Effect<KeyLookup, SqlError.SqlError>
  /** Records when keys were last used, many keys in one statement. */
  readonly recordLastUsed: (uses: ReadonlyArray<{ readonly id: string; readonly at: Date }>) => Effect.Effect<void, SqlError.SqlError>
  /** Whether the key is, or was before its deletion, one of the account's keys. */
  readonly isAccountKey: (accountId: string, keyId: string) => Effect.Effect<boolean, SqlError.SqlError>
  /** Applies `changes` to the account's key; undefined when the account has no such key. */
  readonly update: (accountId: string, keyId: string, changes: KeyChanges) => Effect.Effect<KeyRow | undefined, SqlError.SqlError>
  /**
   * Replaces the key's secret (its hash): the replaced one gets a tombstone
   * and, with a grace period, keeps authenticating until it ends (replacing
   * any earlier grace secret). Undefined when the account has no such key.
   * A rotation with the token of the key's last rotation, within
   * `repeatWindowSeconds` of it, writes nothing and answers what that one sealed.
   */
  readonly rotate: (
    accountId: string,
    keyId: string,
    rotation: Rotation,
    repeatWindowSeconds: number
  ) => Effect.Effect<
    { readonly row: KeyRow; readonly repeatOf: Buffer | null; readonly graceUntil: Date | null } | undefined,
    SqlError.SqlError
  >
  /** The account's keys, and those of them that work at `at`: not disabled, not past `expires_at` (deleted ones are gone). */
  readonly counts: (
    accountId: string,
    at: Date
  ) => Effect.Effect<{ readonly total: number; readonly active: number }, SqlError.SqlError>
}>() {
  static readonly layer = Layer.effect(
    KeysRepo,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const columns = sql.literal(keyColumns)
      const first = <A>(rows: ReadonlyArray<A>) =>
        rows[0] === undefined ? Effect.dieMessage("the query returned no row") : Effect.succeed(rows[0])
      return KeysRepo.of({
        create: (key) =>
          sql.withTransaction(Effect.gen(function*() {
            // Lock the account so that concurrent creations cannot pass the limit together.
            yield* sql`SELECT id FROM accounts WHERE id = ${key.accountId} FOR UPDATE`
            const [count] = yield* sql<{ count: number }>`
              SELECT count(*)::int AS count FROM api_keys WHERE account_id = ${key.accountId}
            `
            if ((count?.count ?? 0) >= MAX_KEYS_PER_ACCOUNT) return yield* new TooManyKeys({ limit: MAX_KEYS_PER_ACCOUNT })
            const rows = yield* sql<KeyRow>`
              INSERT INTO api_keys ${sql.insert({ ...key, rateLimitRpm: key.rateLimitRpm ?? null, rateLimitConcurrent: key.rateLimitConcurrent ?? null })}
              RETURNING ${sql.literal(keyColumns.replaceAll("k.", ""))}
            `
            const row = rows[0]
            if (row === undefined) return yield* Effect.dieMessage("INSERT returned no row")
            return row
          })),
        list: (accountId) =>
          sql<KeyRow>`SELECT ${columns} FROM api_keys k WHERE k.account_id = ${accountId} ORDER BY k.created_at DESC, k.id DESC`,
        remove: (accountId, keyId) =>
          sql.withTransaction(Effect.gen(function*() {
            const deleted = yield* sql<{ keyHash: Buffer }>`
              DELETE FROM api_keys WHERE id = ${keyId} AND account_id = ${accountId} RETURNING key_hash
            `
            const hash = deleted[0]?.keyHash
            if (hash === undefined) return false
            yield* sql`
              INSERT INTO api_key_tombstones (key_hash, key_id, account_id)
              VALUES (${hash}, ${keyId}, ${accountId})
            `
            return true
          })),
        lookup: (keyHash) =>
          Effect.gen(function*() {
            const found = yield* sql<KeyRow & { readonly suspendedAt: Date | null; readonly graceUntil: Date | null }>`
              SELECT ${columns}, a.suspended_at,
                CASE WHEN k.key_hash = ${keyHash} THEN NULL ELSE k.previous_valid_until END AS grace_until
              FROM api_keys k JOIN accounts a ON a.id = k.account_id
              WHERE k.key_hash = ${keyHash} OR (k.previous_key_hash = ${keyHash} AND k.previous_valid_until > now())
            `
            const row = found[0]
            if (row !== undefined) {
              const { graceUntil, suspendedAt, ...key } = row
              return { _tag: "Active", key, accountSuspended: suspendedAt !== null, graceUntil } as const
            }
            // A tombstone whose key still exists is a rotated-out secret; a deleted key's tombstones have no key.
            const tombstones = yield* sql<{ rotatedOf: string | null }>`
              SELECT (SELECT k.id FROM api_keys k WHERE k.id = t.key_id) AS rotated_of
              FROM api_key_tombstones t WHERE t.key_hash = ${keyHash}
            `
            const tombstone = tombstones[0]
            return tombstone !== undefined ? { _tag: "Revoked", rotatedOf: tombstone.rotatedOf } as const : { _tag: "Unknown" } as const
          }),
        recordLastUsed: (uses) =>
          uses.length === 0 ? Effect.void : sql`
            UPDATE api_keys AS k SET last_used_at = GREATEST(k.last_used_at, u.at)
            FROM jsonb_to_recordset(${JSON.stringify(uses)}::jsonb) AS u(id text, at timestamptz)
            WHERE k.id = u.id
          `.pipe(Effect.asVoid),
        isAccountKey: (accountId, keyId) =>
          sql<{ found: boolean }>`
            SELECT EXISTS (SELECT 1 FROM api_keys WHERE id = ${keyId} AND account_id = ${accountId})
              OR EXISTS (SELECT 1 FROM api_key_tombstones WHERE key_id = ${keyId} AND account_id = ${accountId}) AS found
          `.pipe(Effect.flatMap(first), Effect.map((row) => row.found)),
        update: (accountId, keyId, changes) =>
          Effect.gen(function*() {
            const set = {
              ...(changes.name === undefined ? {} : { name: changes.name }),
              ...(changes.monthlySpendLimitMicroMyr === undefined
                ? {}
                : { monthly_spend_limit_micro_myr: changes.monthlySpendLimitMicroMyr }),
              ...(changes.expiresAt === undefined ? {} : { expires_at: changes.expiresAt }),
              ...(changes.rateLimitRpm === undefined ? {} : { rate_limit_rpm: changes.rateLimitRpm }),
              ...(changes.rateLimitConcurrent === undefined ? {} : { rate_limit_concurrent: changes.rateLimitConcurrent })
            }
            // Disabling keeps the first moment it was disabled; enabling clears it.
            const disabled = changes.disabled === undefined
              ? sql`disabled_at`
              : changes.disabled
              ? sql`COALESCE(disabled_at, now())`
              : sql`NULL`
            const rows = Object.keys(set).length === 0
              ? yield* sql<KeyRow>`
                UPDATE api_keys SET disabled_at = ${disabled} WHERE id = ${keyId} AND account_id = ${accountId}
                RETURNING ${sql.literal(keyColumns.replaceAll("k.", ""))}`
              : yield* sql<KeyRow>`
                UPDATE api_keys SET ${sql.update(set)}, disabled_at = ${disabled}
                WHERE id = ${keyId} AND account_id = ${accountId}
                RETURNING ${sql.literal(keyColumns.replaceAll("k.", ""))}`
            return rows[0]
          }),
        rotate: (accountId, keyId, rotation, repeatWindowSeconds) =>
          sql.withTransaction(Effect.gen(function*() {
            // Locked, so that two concurrent repeats of one rotation cannot both rotate.
            const locked = yield* sql<{ keyHash: Buffer; repeatOf: Buffer | null; previousValidUntil: Date | null }>`
              SELECT key_hash, previous_valid_until,
                CASE WHEN rotation_token_hash = ${rotation.repeat?.tokenHash ?? null}
                  AND rotated_at > now() - ${repeatWindowSeconds} * interval '1 second'
                THEN rotation_sealed END AS repeat_of
              FROM api_keys WHERE id = ${keyId} AND account_id = ${accountId} FOR UPDATE
            `
            const old = locked[0]
            if (old === undefined) return undefined
            if (old.repeatOf !== null) {
              const same = yield* sql<KeyRow>`SELECT ${columns} FROM api_keys k WHERE k.id = ${keyId}`
              return { row: yield* first(same), repeatOf: old.repeatOf, graceUntil: old.previousValidUntil }
            }
            yield* sql`
              INSERT INTO api_key_tombstones (key_hash, key_id, account_id)
              VALUES (${old.keyHash}, ${keyId}, ${accountId}) ON CONFLICT (key_hash) DO NOTHING
            `
            const grace = rotation.graceSeconds > 0
            const rows = yield* sql<KeyRow & { readonly previousValidUntil: Date | null }>`
              UPDATE api_keys SET
                key_hash = ${rotation.keyHash},
                prefix = ${rotation.prefix},
                previous_key_hash = ${grace ? old.keyHash : null},
                previous_valid_until = ${grace ? sql`now() + ${rotation.graceSeconds} * interval '1 second'` : null},
                rotation_token_hash = ${rotation.repeat?.tokenHash ?? null},
                rotation_sealed = ${rotation.repeat?.sealed ?? null},
                rotated_at = now()
              WHERE id = ${keyId}
              RETURNING ${sql.literal(keyColumns.replaceAll("k.", ""))}, previous_valid_until
            `
            const { previousValidUntil, ...row } = yield* first(rows)
            return { row, repeatOf: null, graceUntil: previousValidUntil }
          })),
        counts: (accountId, at) =>
          sql<{ total: number; active: number }>`
            SELECT count(*)::int AS total,
              (count(*) FILTER (WHERE disabled_at IS NULL AND (expires_at IS NULL OR expires_at > ${at}::timestamptz)))::int AS active
            FROM api_keys WHERE account_id = ${accountId}
          `.pipe(Effect.flatMap(first))
      })
    })
  )
}

