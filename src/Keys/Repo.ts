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
}

/** What a key hash resolves to when a `/v1` call presents it. */
export type KeyLookup =
  | { readonly _tag: "Active"; readonly key: KeyRow; readonly accountSuspended: boolean }
  | { readonly _tag: "Revoked" }
  | { readonly _tag: "Unknown" }

export class TooManyKeys extends Data.TaggedError("TooManyKeys")<{ readonly limit: number }> {}

const keyColumns = "k.id, k.account_id, k.name, k.prefix, k.environment, k.monthly_spend_limit_micro_myr, k.expires_at, k.created_at, k.last_used_at"

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
  /** The account's keys, and those of them not past `expires_at` at `at`. */
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
              INSERT INTO api_keys ${sql.insert(key)}
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
            const found = yield* sql<KeyRow & { readonly suspendedAt: Date | null }>`
              SELECT ${columns}, a.suspended_at
              FROM api_keys k JOIN accounts a ON a.id = k.account_id
              WHERE k.key_hash = ${keyHash}
            `
            const row = found[0]
            if (row !== undefined) {
              const { suspendedAt, ...key } = row
              return { _tag: "Active", key, accountSuspended: suspendedAt !== null } as const
            }
            const tombstones = yield* sql`SELECT 1 FROM api_key_tombstones WHERE key_hash = ${keyHash}`
            return tombstones.length > 0 ? { _tag: "Revoked" } as const : { _tag: "Unknown" } as const
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
        counts: (accountId, at) =>
          sql<{ total: number; active: number }>`
            SELECT count(*)::int AS total,
              (count(*) FILTER (WHERE expires_at IS NULL OR expires_at > ${at}::timestamptz))::int AS active
            FROM api_keys WHERE account_id = ${accountId}
          `.pipe(Effect.flatMap(first))
      })
    })
  )
}

