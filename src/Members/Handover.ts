import type { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import type { Role } from "../Domain/Roles.js"

/** A key's new secret, made by the caller (which knows the key format): its hash and its shown prefix. */
export type NewSecret = (environment: "live" | "test") => { readonly keyHash: Buffer; readonly prefix: string }

/**
 * Gives a removed member's keys to `to`, each with a new secret nobody is shown: the one who left still knows the
 * old one, which answers `revoked_api_key` from now on (a tombstone, as a rotation leaves), grace secret included.
 * Runs in the removal's transaction; the keys' replaced secrets follow them, so their spend counts for `to` only.
 */
export const handOverKeys = (
  sql: SqlClient.SqlClient,
  accountId: string,
  from: string,
  to: string,
  newSecret: NewSecret
) =>
  Effect.gen(function*() {
    const keys = yield* sql<{ id: string; environment: "live" | "test"; keyHash: Buffer }>`
      SELECT id, environment, key_hash FROM api_keys WHERE member_id = ${from} AND account_id = ${accountId} ORDER BY id FOR UPDATE`
    // Handed over by an owner or admin: the limits the keys have are theirs now, for a developer recipient to tighten only.
    const givenControls = sql`ARRAY(SELECT DISTINCT c FROM unnest(admin_controls || array_remove(ARRAY[
      CASE WHEN disabled_at IS NOT NULL THEN 'disabled' END,
      CASE WHEN monthly_spend_limit_micro_myr IS NOT NULL THEN 'monthly_spend_limit_myr' END,
      CASE WHEN rate_limit_rpm IS NOT NULL THEN 'rate_limit_rpm' END,
      CASE WHEN rate_limit_concurrent IS NOT NULL THEN 'rate_limit_concurrent' END
    ], NULL)) AS c ORDER BY c)`
    for (const key of keys) {
      const secret = newSecret(key.environment)
      yield* sql`
        INSERT INTO api_key_tombstones (key_hash, key_id, account_id, member_id)
        VALUES (${key.keyHash}, ${key.id}, ${accountId}, ${to})
        ON CONFLICT (key_hash) DO NOTHING`
      yield* sql`
        UPDATE api_keys SET member_id = ${to}, key_hash = ${secret.keyHash}, prefix = ${secret.prefix},
          previous_key_hash = NULL, previous_valid_until = NULL, rotation_token_hash = NULL, rotation_sealed = NULL,
          rotated_at = now(), admin_controls = ${givenControls}
        WHERE id = ${key.id}`
    }
    const ids = keys.map((key) => key.id)
    if (ids.length > 0) yield* sql`UPDATE api_key_tombstones SET member_id = ${to} WHERE key_id IN ${sql.in(ids)}`
    return ids
  })

/**
 * Revokes the open invitations `memberId` sent that its role no longer lets it send: all of them once it is no
 * owner or admin (or removed: `role` null), its owner invitations once it is an admin.
 */
export const revokeInvitationsBy = (sql: SqlClient.SqlClient, memberId: string, role: Role | null) =>
  role === "owner"
    ? Effect.void
    : sql`
      UPDATE invitations SET revoked_at = now()
      WHERE invited_by = ${memberId} AND accepted_at IS NULL AND revoked_at IS NULL
        ${role === "admin" ? sql`AND role = 'owner'` : sql``}`.pipe(Effect.asVoid)
