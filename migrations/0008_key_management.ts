import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Keys managed in place (docs/api/dashboard.md, "API keys"): a key can be
 * disabled, carry its own rate limits, and be rotated with a grace period
 * during which its previous hash still authenticates. Every replaced hash gets
 * a tombstone at once (so it answers `revoked_api_key` when its grace ends),
 * which is why a key id may now have several tombstones. Changing these columns
 * is announced by 0004's `api_keys_notify_update` trigger (it watches every
 * column but `last_used_at`); the previous hash is announced here as well, so
 * that a grace secret replaced or deleted is dropped from every instance's
 * memory. A rotation repeated with its `Idempotency-Key` within a day gets the
 * same secret back: it is kept sealed with a key derived from that
 * Idempotency-Key (which only the caller holds), never in the clear.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
ALTER TABLE api_keys
  ADD COLUMN disabled_at timestamptz,
  ADD COLUMN rate_limit_rpm integer CHECK (rate_limit_rpm > 0),
  ADD COLUMN rate_limit_concurrent integer CHECK (rate_limit_concurrent > 0),
  ADD COLUMN previous_key_hash bytea UNIQUE CHECK (octet_length(previous_key_hash) = 32),
  ADD COLUMN previous_valid_until timestamptz,
  ADD COLUMN rotation_token_hash bytea,
  ADD COLUMN rotation_sealed bytea,
  ADD COLUMN rotated_at timestamptz;

ALTER TABLE api_key_tombstones DROP CONSTRAINT api_key_tombstones_key_id_key;
CREATE INDEX api_key_tombstones_key_idx ON api_key_tombstones (key_id);

CREATE FUNCTION nenas_notify_previous_key_hash() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.previous_key_hash IS NOT NULL
    AND (TG_OP = 'DELETE' OR NEW.previous_key_hash IS DISTINCT FROM OLD.previous_key_hash
      OR NEW.previous_valid_until IS DISTINCT FROM OLD.previous_valid_until) THEN
    PERFORM pg_notify('nenas_keys', 'key:' || encode(OLD.previous_key_hash, 'hex'));
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER api_keys_notify_previous AFTER UPDATE OR DELETE ON api_keys
  FOR EACH ROW EXECUTE FUNCTION nenas_notify_previous_key_hash();
`))
