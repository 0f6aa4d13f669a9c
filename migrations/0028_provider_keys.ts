import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * A team's own provider keys (docs/api/provider-keys.md, "Adding a key"): an OpenAI-compatible base URL, the
 * models to ask there per routing category, and its API key sealed (AES-256-GCM: iv, tag, ciphertext, with the
 * row's id and account as associated data) under the server's secret, whose fingerprint `secret_key_id` names
 * (docs/api/provider-keys.md, "Rotating the server secret"). Every change is announced on `nenas_provider_keys`
 * with the account's id, so every instance reloads that account's keys.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
CREATE TABLE provider_keys (
  id             text PRIMARY KEY,
  account_id     text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  name           text NOT NULL,
  base_url       text NOT NULL,
  models         jsonb NOT NULL,
  mode           text NOT NULL CHECK (mode IN ('first', 'fallback', 'only')),
  secret         bytea NOT NULL,
  secret_key_id  text NOT NULL,
  last4          text NOT NULL,
  status         text NOT NULL DEFAULT 'unchecked' CHECK (status IN ('unchecked', 'ok', 'refused', 'failing')),
  last_error     text,
  created_at     timestamptz NOT NULL DEFAULT now(),
  updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX provider_keys_account_idx ON provider_keys (account_id, created_at, id);
CREATE INDEX provider_keys_secret_key_idx ON provider_keys (secret_key_id);

CREATE FUNCTION nenas_notify_provider_keys() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('nenas_provider_keys', COALESCE(NEW.account_id, OLD.account_id));
  RETURN NULL;
END
$$;
CREATE TRIGGER provider_keys_notify AFTER INSERT OR UPDATE OR DELETE ON provider_keys
  FOR EACH ROW EXECUTE FUNCTION nenas_notify_provider_keys();
`))
