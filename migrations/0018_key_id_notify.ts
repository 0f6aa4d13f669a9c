import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * A change to a key announces its id as well (`key_id:<id>` on `nenas_keys`),
 * so that every instance drops what it remembered of the key under any of its
 * secrets: a rotated key's previous secret, within its grace period, hears of a
 * new limit, a disabling or an expiry as its current secret does
 * (docs/architecture.md, "Listening"). 0004's hash announcements stay:
 * tombstones and unknown hashes have no key.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
CREATE FUNCTION nenas_notify_key_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('nenas_keys', 'key_id:' || OLD.id);
  RETURN NULL;
END
$$;

CREATE TRIGGER api_keys_notify_id_delete AFTER DELETE ON api_keys
  FOR EACH ROW EXECUTE FUNCTION nenas_notify_key_id();
CREATE TRIGGER api_keys_notify_id_update AFTER UPDATE ON api_keys
  FOR EACH ROW
  WHEN ((to_jsonb(OLD) - 'last_used_at') IS DISTINCT FROM (to_jsonb(NEW) - 'last_used_at'))
  EXECUTE FUNCTION nenas_notify_key_id();
`))
