import { SqlClient } from "@effect/sql"
import { Context, Data, Effect, Layer, Schema } from "effect"
import { now } from "../Domain/Time.js"
import { ProviderKeyMode, ProviderKeyStatus } from "./Api.js"

/**
 * `provider_keys`: this module is the table's only reader and writer. Its trigger announces every change on
 * `nenas_provider_keys` with the account's id (migration 0028), which every instance's `ProviderKeys` hears.
 */

/** An account's provider keys at most (docs/api/provider-keys.md, "Adding a key"). */
export const MAX_PROVIDER_KEYS = 10

const Models = Schema.Struct({
  general: Schema.String,
  reasoning: Schema.String,
  embedding: Schema.NullOr(Schema.String)
})
export type ProviderKeyModels = typeof Models.Type

const Row = Schema.Struct({
  id: Schema.String,
  accountId: Schema.String,
  name: Schema.String,
  baseUrl: Schema.String,
  // Read as text and decoded here: the client's name transform would rename keys inside the jsonb.
  models: Schema.parseJson(Models),
  mode: ProviderKeyMode,
  secret: Schema.Uint8ArrayFromSelf,
  secretKeyId: Schema.String,
  last4: Schema.String,
  status: ProviderKeyStatus,
  lastError: Schema.NullOr(Schema.String),
  createdAt: Schema.DateFromSelf,
  /** `updated_at` in milliseconds, which every change moves forward. */
  version: Schema.String
})
export type ProviderKeyRow = Omit<typeof Row.Type, "secret"> & { readonly secret: Buffer }

const decodeRows = Schema.decodeUnknown(Schema.Array(Row))

const COLUMNS = `id, account_id, name, base_url, models::text AS models, mode, secret, secret_key_id, last4, status,
  last_error, created_at, (extract(epoch FROM updated_at) * 1000)::bigint::text AS version`

/** What a sealed API key is stored as. */
export interface SealedKey {
  readonly secret: Buffer
  readonly secretKeyId: string
  readonly last4: string
}

export interface NewProviderKey extends SealedKey {
  readonly id: string
  readonly accountId: string
  readonly name: string
  readonly baseUrl: string
  readonly models: ProviderKeyModels
  readonly mode: typeof ProviderKeyMode.Type
  readonly status: typeof ProviderKeyStatus.Type
}

export interface ProviderKeyChanges {
  readonly name?: string | undefined
  readonly baseUrl?: string | undefined
  readonly models?: ProviderKeyModels | undefined
  readonly mode?: typeof ProviderKeyMode.Type | undefined
  readonly sealed?: SealedKey | undefined
  /** A check on save: the status it gave, the last error cleared. */
  readonly status?: typeof ProviderKeyStatus.Type | undefined
}

export class TooManyProviderKeys extends Data.TaggedError("TooManyProviderKeys")<{ readonly limit: number }> {}

export class ProviderKeysRepo extends Context.Tag("nenas/ProviderKeysRepo")<ProviderKeysRepo, {
  /** Every account's keys, by account, oldest first. */
  readonly listAll: Effect.Effect<ReadonlyArray<ProviderKeyRow>>
  readonly list: (accountId: string) => Effect.Effect<ReadonlyArray<ProviderKeyRow>>
  readonly find: (accountId: string, id: string) => Effect.Effect<ProviderKeyRow | undefined>
  /** Refuses past `MAX_PROVIDER_KEYS` of the account, counted under the account's lock. */
  readonly create: (key: NewProviderKey) => Effect.Effect<ProviderKeyRow, TooManyProviderKeys>
  /** Undefined when the account has no such key. */
  readonly update: (
    accountId: string,
    id: string,
    changes: ProviderKeyChanges
  ) => Effect.Effect<ProviderKeyRow | undefined>
  /** The key deleted, or undefined when the account had none such. */
  readonly remove: (accountId: string, id: string) => Effect.Effect<ProviderKeyRow | undefined>
  /** Writes the key's status and last error when either differs (the version stays); whether it wrote. */
  readonly setStatus: (
    id: string,
    status: typeof ProviderKeyStatus.Type,
    lastError: string | null
  ) => Effect.Effect<boolean>
  /** Up to `limit` keys sealed under the secret `secretKeyId` names, by id, after `afterId`. */
  readonly sealedUnder: (
    secretKeyId: string,
    afterId: string,
    limit: number
  ) => Effect.Effect<ReadonlyArray<ProviderKeyRow>>
  /** Replaces a key's sealed secret, if it is still sealed under `fromKeyId` (the version stays); whether it did. */
  readonly reseal: (id: string, fromKeyId: string, sealed: SealedKey) => Effect.Effect<boolean>
}>() {
  static readonly layer = Layer.effect(
    ProviderKeysRepo,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      // `secret` is a Buffer as the driver reads bytea; the Schema checks it is bytes.
      const rows = (statement: Effect.Effect<ReadonlyArray<unknown>, unknown>) =>
        Effect.orDie(Effect.flatMap(statement, (found) => decodeRows(found))) as Effect.Effect<
          ReadonlyArray<ProviderKeyRow>
        >
      const first = (statement: Effect.Effect<ReadonlyArray<unknown>, unknown>) =>
        Effect.map(rows(statement), (found) => found[0])
      const find = (accountId: string, id: string) =>
        first(sql`SELECT ${sql.unsafe(COLUMNS)} FROM provider_keys WHERE account_id = ${accountId} AND id = ${id}`)

      const update = Effect.fnUntraced(function*(accountId: string, id: string, changes: ProviderKeyChanges) {
        const at = yield* now
        const set: Record<string, string | Buffer | null> = {}
        if (changes.name !== undefined) set["name"] = changes.name
        if (changes.baseUrl !== undefined) set["baseUrl"] = changes.baseUrl
        if (changes.models !== undefined) set["models"] = JSON.stringify(changes.models)
        if (changes.mode !== undefined) set["mode"] = changes.mode
        if (changes.sealed !== undefined) {
          set["secret"] = changes.sealed.secret
          set["secretKeyId"] = changes.sealed.secretKeyId
          set["last4"] = changes.sealed.last4
        }
        if (changes.status !== undefined) {
          set["status"] = changes.status
          set["lastError"] = null
        }
        if (Object.keys(set).length === 0) return yield* find(accountId, id)
        // Strictly later than before, so that the version moves with every change.
        return yield* first(sql`
          UPDATE provider_keys
          SET ${sql.update(set)}, updated_at = GREATEST(${at}::timestamptz, updated_at + interval '1 millisecond')
          WHERE account_id = ${accountId} AND id = ${id}
          RETURNING ${sql.unsafe(COLUMNS)}
        `)
      })

      return ProviderKeysRepo.of({
        listAll: rows(sql`SELECT ${sql.unsafe(COLUMNS)} FROM provider_keys ORDER BY account_id, created_at, id`),
        list: (accountId) =>
          rows(sql`
            SELECT ${sql.unsafe(COLUMNS)} FROM provider_keys WHERE account_id = ${accountId} ORDER BY created_at, id
          `),
        find,
        create: (key) =>
          sql.withTransaction(Effect.gen(function*() {
            const at = yield* now
            // The account's lock: two creations at once cannot pass the bound together.
            yield* sql`SELECT id FROM accounts WHERE id = ${key.accountId} FOR UPDATE`
            const [counted] = yield* sql<{ readonly count: number }>`
              SELECT count(*)::int AS count FROM provider_keys WHERE account_id = ${key.accountId}
            `
            if ((counted?.count ?? 0) >= MAX_PROVIDER_KEYS) {
              return yield* new TooManyProviderKeys({ limit: MAX_PROVIDER_KEYS })
            }
            const created = yield* first(sql`
              INSERT INTO provider_keys (id, account_id, name, base_url, models, mode, secret, secret_key_id, last4,
                status, created_at, updated_at)
              VALUES (${key.id}, ${key.accountId}, ${key.name}, ${key.baseUrl}, ${JSON.stringify(key.models)}::jsonb,
                ${key.mode}, ${key.secret}, ${key.secretKeyId}, ${key.last4}, ${key.status}, ${at}, ${at})
              RETURNING ${sql.unsafe(COLUMNS)}
            `)
            if (created === undefined) return yield* Effect.dieMessage("INSERT … RETURNING answered no row")
            return created
          })).pipe(Effect.catchTag("SqlError", Effect.die)),
        update,
        remove: (accountId, id) =>
          first(sql`
            DELETE FROM provider_keys WHERE account_id = ${accountId} AND id = ${id} RETURNING ${sql.unsafe(COLUMNS)}
          `),
        setStatus: (id, status, lastError) =>
          Effect.map(
            Effect.orDie(sql`
              UPDATE provider_keys SET status = ${status}, last_error = ${lastError}
              WHERE id = ${id} AND (status IS DISTINCT FROM ${status} OR last_error IS DISTINCT FROM ${lastError})
              RETURNING id
            `),
            (written) => written.length > 0
          ),
        sealedUnder: (secretKeyId, afterId, limit) =>
          rows(sql`
            SELECT ${sql.unsafe(COLUMNS)} FROM provider_keys WHERE secret_key_id = ${secretKeyId} AND id > ${afterId}
            ORDER BY id LIMIT ${limit}
          `),
        reseal: (id, fromKeyId, sealed) =>
          Effect.map(
            Effect.orDie(sql`
              UPDATE provider_keys SET secret = ${sealed.secret}, secret_key_id = ${sealed.secretKeyId}
              WHERE id = ${id} AND secret_key_id = ${fromKeyId}
              RETURNING id
            `),
            (written) => written.length > 0
          )
      })
    })
  )
}
