import { Data, Schema } from "effect"
import { MicroMyr } from "../Domain/Money.js"
import { Environment } from "./Api.js"

/** The rows `KeysRepo` reads and writes, decoded, and its refusal of one key too many. */

/** A `bytea` column or parameter: pg gives and takes it as a Node `Buffer`. */
export const Bytes = Schema.declare((input: unknown): input is Buffer => Buffer.isBuffer(input), {
  identifier: "Buffer"
})
export const NullableDate = Schema.NullOr(Schema.DateFromSelf)

export const KeyRow = Schema.Struct({
  id: Schema.String,
  accountId: Schema.String,
  name: Schema.String,
  prefix: Schema.String,
  environment: Environment,
  monthlySpendLimitMicroMyr: Schema.NullOr(MicroMyr),
  expiresAt: NullableDate,
  createdAt: Schema.DateFromSelf,
  lastUsedAt: NullableDate,
  disabledAt: NullableDate,
  /** Null: the operator's default (`RATE_LIMIT_RPM`). */
  rateLimitRpm: Schema.NullOr(Schema.Int),
  /** Null: the operator's default (`RATE_LIMIT_CONCURRENT`). */
  rateLimitConcurrent: Schema.NullOr(Schema.Int),
  /** The member who created the key (or was given it); its budget caps the key's spend with its siblings'. */
  memberId: Schema.NullOr(Schema.String),
  /** The key's guardrail override as JSON (docs/api/guardrails.md, "Policies"); null: the account's policy. */
  guardrails: Schema.NullOr(Schema.String),
  /** Caches the key's calls for this long (docs/api/cache.md, "Turning it on"); null: only when a request asks. */
  cacheTtlSeconds: Schema.NullOr(Schema.Int)
})
export interface KeyRow extends Schema.Schema.Type<typeof KeyRow> {}

/** The fields `PATCH /dashboard/api-keys/{id}` may change; an absent field stays as it is. */
export const KeyChanges = Schema.Struct({
  name: Schema.optionalWith(Schema.String, { exact: true }),
  monthlySpendLimitMicroMyr: Schema.optionalWith(Schema.NullOr(Schema.Number), { exact: true }),
  expiresAt: Schema.optionalWith(NullableDate, { exact: true }),
  disabled: Schema.optionalWith(Schema.Boolean, { exact: true }),
  rateLimitRpm: Schema.optionalWith(Schema.NullOr(Schema.Number), { exact: true }),
  rateLimitConcurrent: Schema.optionalWith(Schema.NullOr(Schema.Number), { exact: true }),
  /** The override as JSON; null returns the key to the account's policy. */
  guardrails: Schema.optionalWith(Schema.NullOr(Schema.String), { exact: true }),
  cacheTtlSeconds: Schema.optionalWith(Schema.NullOr(Schema.Number), { exact: true })
})
export interface KeyChanges extends Schema.Schema.Type<typeof KeyChanges> {}

/** A rotation to write: the new hash, and what lets a repeat with the same Idempotency-Key answer the same secret. */
export interface Rotation {
  readonly keyHash: Buffer
  readonly prefix: string
  readonly graceSeconds: number
  readonly repeat: { readonly tokenHash: Buffer; readonly sealed: Buffer } | null
}

export const NewKey = Schema.Struct({
  id: Schema.String,
  accountId: Schema.String,
  name: Schema.String,
  prefix: Schema.String,
  environment: Environment,
  keyHash: Bytes,
  /** The member creating it; absent or null: none recorded (a key made outside the dashboard, in tests). */
  memberId: Schema.optionalWith(Schema.NullOr(Schema.String), { exact: true }),
  monthlySpendLimitMicroMyr: Schema.NullOr(Schema.Number),
  expiresAt: NullableDate,
  /** Absent or null: the operator's defaults. */
  rateLimitRpm: Schema.optionalWith(Schema.NullOr(Schema.Number), { exact: true }),
  rateLimitConcurrent: Schema.optionalWith(Schema.NullOr(Schema.Number), { exact: true }),
  cacheTtlSeconds: Schema.optionalWith(Schema.NullOr(Schema.Number), { exact: true })
})
export type NewKey = Schema.Schema.Type<typeof NewKey>

/** What a key hash resolves to when a `/v1` call presents it. */
export type KeyLookup =
  | {
    readonly _tag: "Active"
    readonly key: KeyRow
    readonly accountSuspended: boolean
    /** The key's member's monthly budget over all its keys; null for none (or no member, or a removed one). */
    readonly memberMonthlySpendLimitMicroMyr: MicroMyr | null
    /** The account's guardrail policy as JSON; null: none set. */
    readonly accountGuardrails: string | null
    /** Set when the hash is the key's previous secret, in its grace period until then. */
    readonly graceUntil: Date | null
  }
  /** A tombstone: `rotatedOf` names the key when the secret was replaced by a rotation and the key still exists. */
  | { readonly _tag: "Revoked"; readonly rotatedOf: string | null }
  | { readonly _tag: "Unknown" }

export const OwnKey = Schema.Struct({ accountId: Schema.String, keyId: Schema.String })

/** The account has its most keys, or (`member`) the member creating one has the most a developer may. */
export class TooManyKeys
  extends Data.TaggedError("TooManyKeys")<{ readonly limit: number; readonly of: "account" | "member" }>
{}
