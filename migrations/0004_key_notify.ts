import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Every change that alters what a key hash resolves to (`KeysRepo.lookup`)
 * announces itself on the `nenas_keys` channel when its transaction commits,
 * so each instance drops what it remembered (`src/Keys/KeyCache.ts`):
 * `key:<hash hex>` for a key or tombstone inserted, changed or deleted (an
 * inserted key ends a remembered "unknown"), `account:<id>` when an account's
 * suspension changes. Recording `last_used_at` changes no lookup and is silent.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
CREATE FUNCTION nenas_notify_key_hash() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP <> 'INSERT' THEN
    PERFORM pg_notify('nenas_keys', 'key:' || encode(OLD.key_hash, 'hex'));
  END IF;
  IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.key_hash IS DISTINCT FROM OLD.key_hash) THEN
    PERFORM pg_notify('nenas_keys', 'key:' || encode(NEW.key_hash, 'hex'));
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER api_keys_notify_insert_delete AFTER INSERT OR DELETE ON api_keys
  FOR EACH ROW EXECUTE FUNCTION nenas_notify_key_hash();
CREATE TRIGGER api_keys_notify_update AFTER UPDATE ON api_keys
  FOR EACH ROW
  WHEN ((to_jsonb(OLD) - 'last_used_at') IS DISTINCT FROM (to_jsonb(NEW) - 'last_used_at'))
  EXECUTE FUNCTION nenas_notify_key_hash();
CREATE TRIGGER api_key_tombstones_notify AFTER INSERT OR UPDATE OR DELETE ON api_key_tombstones
  FOR EACH ROW EXECUTE FUNCTION nenas_notify_key_hash();

CREATE FUNCTION nenas_notify_account() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('nenas_keys', 'account:' || NEW.id);
  RETURN NULL;
END
$$;

CREATE TRIGGER accounts_notify_suspension AFTER UPDATE ON accounts
  FOR EACH ROW
  WHEN (OLD.suspended_at IS DISTINCT FROM NEW.suspended_at)
  EXECUTE FUNCTION nenas_notify_account();
`))
