import { SqlClient, type SqlError, SqlSchema } from "@effect/sql"
import { Context, Effect, Layer, Option, Schema } from "effect"
import { MicroMyr } from "../Domain/Money.js"
import { makeTestLayer } from "../Domain/TestLayer.js"
import { MAX_KEYS_PER_ACCOUNT } from "./ApiKeys.js"
import type { Control } from "./Controls.js"
import {
  Bytes,
  KeyChanges,
  type KeyLookup,
  KeyRow,
  NewKey,
  NullableDate,
  OwnKey,
  type Rotation,
  TooManyKeys
} from "./KeyRows.js"

export { KeyChanges, type KeyLookup, KeyRow, NewKey, type Rotation, TooManyKeys } from "./KeyRows.js"
const keyColumns =
  "k.id, k.account_id, k.name, k.prefix, k.environment, k.monthly_spend_limit_micro_myr, k.expires_at, k.created_at, k.last_used_at, k.disabled_at, k.rate_limit_rpm, k.rate_limit_concurrent, k.member_id, k.guardrails::text AS guardrails, k.cache_ttl_seconds"

export class KeysRepo extends Context.Tag("nenas/KeysRepo")<KeysRepo, {
  /** Refuses past the account's most keys, and past `memberLimit` keys of the key's member when given. */
  readonly create: (key: NewKey, memberLimit?: number) => Effect.Effect<KeyRow, TooManyKeys>
  readonly list: (accountId: string) => Effect.Effect<ReadonlyArray<KeyRow>>
  /** Deletes the key for good and keeps its hash as a tombstone; false when the account has no such key. */
  readonly remove: (accountId: string, keyId: string) => Effect.Effect<boolean>
  readonly lookup: (keyHash: Buffer) => Effect.Effect<KeyLookup>
  /**
   * Records when keys were last used, many keys in one statement. Its `SqlError` stays a failure:
   * `KeyLastUsed` catches it to keep the batch for its next flush.
   */
  readonly recordLastUsed: (
    uses: ReadonlyArray<{ readonly id: string; readonly at: Date }>
  ) => Effect.Effect<void, SqlError.SqlError>
  /** Whether the key is, or was before its deletion, one of the account's keys. */
  readonly isAccountKey: (accountId: string, keyId: string) => Effect.Effect<boolean>
  /**
   * Applies `changes` to the account's key, and records `controls` (those an owner or admin set, and those they
   * lifted); undefined when the account has no such key.
   */
  readonly update: (
    accountId: string,
    keyId: string,
    changes: KeyChanges,
    controls?: { readonly add: ReadonlyArray<Control>; readonly drop: ReadonlyArray<Control> }
  ) => Effect.Effect<KeyRow | undefined>
  /** The controls an owner or admin set on the account's key, which a developer may not loosen. */
  readonly adminControls: (accountId: string, keyId: string) => Effect.Effect<ReadonlyArray<string>>
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
    { readonly row: KeyRow; readonly repeatOf: Buffer | null; readonly graceUntil: Date | null } | undefined
  >
  /** The account's keys, and those of them that work at `at`: not disabled, not past `expires_at` (deleted ones are gone). */
  readonly counts: (accountId: string, at: Date) => Effect.Effect<{ readonly total: number; readonly active: number }>
}>() {
  static readonly layer = Layer.effect(
    KeysRepo,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const columns = sql.literal(keyColumns)
      const returning = sql.literal(keyColumns.replaceAll("k.", ""))

      const countKeys = SqlSchema.single({
        Request: Schema.String,
        Result: Schema.Struct({ count: Schema.Int }),
        execute: (accountId) => sql`SELECT count(*)::int AS count FROM api_keys WHERE account_id = ${accountId}`
      })
      const insertKey = SqlSchema.single({
        Request: NewKey,
        Result: KeyRow,
        execute: (key) =>
          sql`
            INSERT INTO api_keys ${
            sql.insert({
              ...key,
              memberId: key.memberId ?? null,
              rateLimitRpm: key.rateLimitRpm ?? null,
              rateLimitConcurrent: key.rateLimitConcurrent ?? null,
              cacheTtlSeconds: key.cacheTtlSeconds ?? null
            })
          }
            RETURNING ${returning}
          `
      })
      const listKeys = SqlSchema.findAll({
        Request: Schema.String,
        Result: KeyRow,
        execute: (accountId) =>
          sql`SELECT ${columns} FROM api_keys k WHERE k.account_id = ${accountId} ORDER BY k.created_at DESC, k.id DESC`
      })
      const deleteKey = SqlSchema.findOne({
        Request: OwnKey,
        Result: Schema.Struct({ keyHash: Bytes, memberId: Schema.NullOr(Schema.String) }),
        execute: ({ accountId, keyId }) =>
          sql`DELETE FROM api_keys WHERE id = ${keyId} AND account_id = ${accountId} RETURNING key_hash, member_id`
      })
      const findActive = SqlSchema.findOne({
        Request: Bytes,
        Result: Schema.Struct({
          ...KeyRow.fields,
          suspendedAt: NullableDate,
          graceUntil: NullableDate,
          memberMonthlySpendLimitMicroMyr: Schema.NullOr(MicroMyr),
          accountGuardrails: Schema.NullOr(Schema.String)
        }),
        // A removed member's keys are disabled by its removal; were one not, it would answer to no budget.
        execute: (keyHash) =>
          sql`
            SELECT ${columns}, a.suspended_at,
              CASE WHEN k.key_hash = ${keyHash} THEN NULL ELSE k.previous_valid_until END AS grace_until,
              m.monthly_spend_limit_micro_myr AS member_monthly_spend_limit_micro_myr,
              g.policy::text AS account_guardrails
            FROM api_keys k JOIN accounts a ON a.id = k.account_id
              LEFT JOIN members m ON m.id = k.member_id AND m.removed_at IS NULL
              LEFT JOIN guardrail_policies g ON g.account_id = k.account_id
            WHERE k.key_hash = ${keyHash} OR (k.previous_key_hash = ${keyHash} AND k.previous_valid_until > now())
          `
      })
      // A tombstone whose key still exists is a rotated-out secret; a deleted key's tombstones have no key.
      const findTombstone = SqlSchema.findOne({
        Request: Bytes,
        Result: Schema.Struct({ rotatedOf: Schema.NullOr(Schema.String) }),
        execute: (keyHash) =>
          sql`
            SELECT (SELECT k.id FROM api_keys k WHERE k.id = t.key_id) AS rotated_of
            FROM api_key_tombstones t WHERE t.key_hash = ${keyHash}
          `
      })
      const everAccountKey = SqlSchema.single({
        Request: OwnKey,
        Result: Schema.Struct({ found: Schema.Boolean }),
        execute: ({ accountId, keyId }) =>
          sql`
            SELECT EXISTS (SELECT 1 FROM api_keys WHERE id = ${keyId} AND account_id = ${accountId})
              OR EXISTS (SELECT 1 FROM api_key_tombstones WHERE key_id = ${keyId} AND account_id = ${accountId}) AS found
          `
      })
      const countMemberKeys = SqlSchema.single({
        Request: Schema.Struct({ accountId: Schema.String, memberId: Schema.String }),
        Result: Schema.Struct({ count: Schema.Int }),
        execute: ({ accountId, memberId }) =>
          sql`SELECT count(*)::int AS count FROM api_keys WHERE account_id = ${accountId} AND member_id = ${memberId}`
      })
      const findControls = SqlSchema.findOne({
        Request: OwnKey,
        Result: Schema.Struct({ adminControls: Schema.Array(Schema.String) }),
        execute: ({ accountId, keyId }) =>
          sql`SELECT admin_controls FROM api_keys WHERE id = ${keyId} AND account_id = ${accountId}`
      })
      const Controls = Schema.Struct({ add: Schema.Array(Schema.String), drop: Schema.Array(Schema.String) })
      const updateKey = SqlSchema.findOne({
        Request: Schema.Struct({ ...OwnKey.fields, changes: KeyChanges, controls: Controls }),
        Result: KeyRow,
        execute: ({ accountId, changes, controls, keyId }) => {
          const set = {
            ...(changes.name === undefined ? {} : { name: changes.name }),
            ...(changes.monthlySpendLimitMicroMyr === undefined
              ? {}
              : { monthly_spend_limit_micro_myr: changes.monthlySpendLimitMicroMyr }),
            ...(changes.expiresAt === undefined ? {} : { expires_at: changes.expiresAt }),
            ...(changes.rateLimitRpm === undefined ? {} : { rate_limit_rpm: changes.rateLimitRpm }),
            ...(changes.rateLimitConcurrent === undefined
              ? {}
              : { rate_limit_concurrent: changes.rateLimitConcurrent }),
            ...(changes.guardrails === undefined ? {} : { guardrails: changes.guardrails }),
            ...(changes.cacheTtlSeconds === undefined ? {} : { cache_ttl_seconds: changes.cacheTtlSeconds })
          }
          // Disabling keeps the first moment it was disabled; enabling clears it.
          const disabled = changes.disabled === undefined
            ? sql`disabled_at`
            : changes.disabled
            ? sql`COALESCE(disabled_at, now())`
            : sql`NULL`
          // Comma-joined: control names hold no comma, and text binds the same on every driver.
          const recorded = sql`ARRAY(
            SELECT DISTINCT c FROM unnest(admin_controls || string_to_array(${controls.add.join(",")}, ',')) AS c
            WHERE c <> ALL (string_to_array(${controls.drop.join(",")}, ',')) ORDER BY c)`
          return Object.keys(set).length === 0
            ? sql`
              UPDATE api_keys SET disabled_at = ${disabled}, admin_controls = ${recorded}
              WHERE id = ${keyId} AND account_id = ${accountId}
              RETURNING ${returning}`
            : sql`
              UPDATE api_keys SET ${sql.update(set)}, disabled_at = ${disabled}, admin_controls = ${recorded}
              WHERE id = ${keyId} AND account_id = ${accountId}
              RETURNING ${returning}`
        }
      })
      // Locked, so that two concurrent repeats of one rotation cannot both rotate.
      const lockForRotation = SqlSchema.findOne({
        Request: Schema.Struct({
          ...OwnKey.fields,
          tokenHash: Schema.NullOr(Bytes),
          repeatWindowSeconds: Schema.Number
        }),
        Result: Schema.Struct({ keyHash: Bytes, repeatOf: Schema.NullOr(Bytes), previousValidUntil: NullableDate }),
        execute: ({ accountId, keyId, repeatWindowSeconds, tokenHash }) =>
          sql`
            SELECT key_hash, previous_valid_until,
              CASE WHEN rotation_token_hash = ${tokenHash}
                AND rotated_at > now() - ${repeatWindowSeconds} * interval '1 second'
              THEN rotation_sealed END AS repeat_of
            FROM api_keys WHERE id = ${keyId} AND account_id = ${accountId} FOR UPDATE
          `
      })
      const findKey = SqlSchema.single({
        Request: Schema.String,
        Result: KeyRow,
        execute: (keyId) => sql`SELECT ${columns} FROM api_keys k WHERE k.id = ${keyId}`
      })
      const replaceSecret = SqlSchema.single({
        Request: Schema.Struct({
          keyId: Schema.String,
          keyHash: Bytes,
          prefix: Schema.String,
          oldKeyHash: Bytes,
          graceSeconds: Schema.Number,
          tokenHash: Schema.NullOr(Bytes),
          sealed: Schema.NullOr(Bytes)
        }),
        Result: Schema.Struct({ ...KeyRow.fields, previousValidUntil: NullableDate }),
        execute: (rotation) =>
          sql`
            UPDATE api_keys SET
              key_hash = ${rotation.keyHash},
              prefix = ${rotation.prefix},
              previous_key_hash = ${rotation.graceSeconds > 0 ? rotation.oldKeyHash : null},
              previous_valid_until = ${
            rotation.graceSeconds > 0 ? sql`now() + ${rotation.graceSeconds} * interval '1 second'` : null
          },
              rotation_token_hash = ${rotation.tokenHash},
              rotation_sealed = ${rotation.sealed},
              rotated_at = now()
            WHERE id = ${rotation.keyId}
            RETURNING ${returning}, previous_valid_until
          `
      })
      const countWorking = SqlSchema.single({
        Request: Schema.Struct({ accountId: Schema.String, at: Schema.DateFromSelf }),
        Result: Schema.Struct({ total: Schema.Int, active: Schema.Int }),
        execute: ({ accountId, at }) =>
          sql`
            SELECT count(*)::int AS total,
              (count(*) FILTER (WHERE disabled_at IS NULL AND (expires_at IS NULL OR expires_at > ${at}::timestamptz)))::int AS active
            FROM api_keys WHERE account_id = ${accountId}
          `
      })

      return KeysRepo.of({
        create: (key, memberLimit) =>
          sql.withTransaction(Effect.gen(function*() {
            // Lock the account so that concurrent creations cannot pass the limit together.
            yield* sql`SELECT id FROM accounts WHERE id = ${key.accountId} FOR UPDATE`
            const { count } = yield* countKeys(key.accountId)
            if (count >= MAX_KEYS_PER_ACCOUNT) {
              return yield* new TooManyKeys({ limit: MAX_KEYS_PER_ACCOUNT, of: "account" })
            }
            if (memberLimit !== undefined && key.memberId != null) {
              const mine = yield* countMemberKeys({ accountId: key.accountId, memberId: key.memberId })
              if (mine.count >= memberLimit) {
                return yield* new TooManyKeys({ limit: memberLimit, of: "member" })
              }
            }
            return yield* insertKey(key)
          })).pipe(
            Effect.catchTags({ SqlError: Effect.die, ParseError: Effect.die, NoSuchElementException: Effect.die }),
            Effect.withSpan("KeysRepo.create")
          ),
        list: (accountId) => listKeys(accountId).pipe(Effect.orDie, Effect.withSpan("KeysRepo.list")),
        remove: (accountId, keyId) =>
          sql.withTransaction(Effect.gen(function*() {
            const deleted = yield* deleteKey({ accountId, keyId })
            if (Option.isNone(deleted)) return false
            yield* sql`
              INSERT INTO api_key_tombstones (key_hash, key_id, account_id, member_id)
              VALUES (${deleted.value.keyHash}, ${keyId}, ${accountId}, ${deleted.value.memberId})
            `
            return true
          })).pipe(Effect.orDie, Effect.withSpan("KeysRepo.remove")),
        // Runs on a `KeyCache` miss only, so decoding its row costs a model call nothing most of the time.
        lookup: (keyHash) =>
          Effect.gen(function*() {
            const found = yield* findActive(keyHash)
            if (Option.isSome(found)) {
              const { accountGuardrails, graceUntil, memberMonthlySpendLimitMicroMyr, suspendedAt, ...key } =
                found.value
              return {
                _tag: "Active",
                key,
                accountSuspended: suspendedAt !== null,
                memberMonthlySpendLimitMicroMyr,
                accountGuardrails,
                graceUntil
              } as const
            }
            const tombstone = yield* findTombstone(keyHash)
            return Option.isSome(tombstone)
              ? { _tag: "Revoked", rotatedOf: tombstone.value.rotatedOf } as const
              : { _tag: "Unknown" } as const
          }).pipe(Effect.orDie, Effect.withSpan("KeysRepo.lookup")),
        recordLastUsed: (uses) =>
          (uses.length === 0 ? Effect.void : sql`
            UPDATE api_keys AS k SET last_used_at = GREATEST(k.last_used_at, u.at)
            FROM jsonb_to_recordset(${JSON.stringify(uses)}::jsonb) AS u(id text, at timestamptz)
            WHERE k.id = u.id
          `.pipe(Effect.asVoid)).pipe(Effect.withSpan("KeysRepo.recordLastUsed")),
        isAccountKey: (accountId, keyId) =>
          everAccountKey({ accountId, keyId }).pipe(
            Effect.map((row) => row.found),
            Effect.orDie,
            Effect.withSpan("KeysRepo.isAccountKey")
          ),
        update: (accountId, keyId, changes, controls = { add: [], drop: [] }) =>
          updateKey({ accountId, keyId, changes, controls }).pipe(
            Effect.map(Option.getOrUndefined),
            Effect.orDie,
            Effect.withSpan("KeysRepo.update")
          ),
        rotate: (accountId, keyId, rotation, repeatWindowSeconds) =>
          sql.withTransaction(Effect.gen(function*() {
            const locked = yield* lockForRotation({
              accountId,
              keyId,
              tokenHash: rotation.repeat?.tokenHash ?? null,
              repeatWindowSeconds
            })
            if (Option.isNone(locked)) return undefined
            const old = locked.value
            if (old.repeatOf !== null) {
              return { row: yield* findKey(keyId), repeatOf: old.repeatOf, graceUntil: old.previousValidUntil }
            }
            yield* sql`
              INSERT INTO api_key_tombstones (key_hash, key_id, account_id, member_id)
              SELECT ${old.keyHash}, id, account_id, member_id FROM api_keys WHERE id = ${keyId}
              ON CONFLICT (key_hash) DO NOTHING
            `
            const { previousValidUntil, ...row } = yield* replaceSecret({
              keyId,
              keyHash: rotation.keyHash,
              prefix: rotation.prefix,
              oldKeyHash: old.keyHash,
              graceSeconds: rotation.graceSeconds,
              tokenHash: rotation.repeat?.tokenHash ?? null,
              sealed: rotation.repeat?.sealed ?? null
            })
            return { row, repeatOf: null, graceUntil: previousValidUntil }
          })).pipe(Effect.orDie, Effect.withSpan("KeysRepo.rotate")),
        adminControls: (accountId, keyId) =>
          findControls({ accountId, keyId }).pipe(
            Effect.map(Option.match({ onNone: () => [], onSome: (row) => row.adminControls })),
            Effect.orDie,
            Effect.withSpan("KeysRepo.adminControls")
          ),
        counts: (accountId, at) =>
          countWorking({ accountId, at }).pipe(Effect.orDie, Effect.withSpan("KeysRepo.counts"))
      })
    })
  )
  /** Only the members a test gives; any other dies when used. */
  static readonly Test = makeTestLayer(KeysRepo)
}
