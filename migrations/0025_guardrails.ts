import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Guardrails (docs/api/guardrails.md, "Policies"): an account's policy in `guardrail_policies`, a key's
 * override in `api_keys.guardrails` (null: the account's), and what each call's guardrails did in
 * `request_logs.guardrails` (rule names and counts only). A policy's change is announced on `nenas_keys`
 * as the account's, so every instance drops the keys it remembered of it and reads the new policy with
 * them; a key's change is announced already (0004, 0018).
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
CREATE TABLE guardrail_policies (
  account_id  text PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
  policy      jsonb NOT NULL,
  updated_at  timestamptz NOT NULL DEFAULT now(),
  updated_by  text
);

CREATE FUNCTION nenas_notify_guardrails() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('nenas_keys', 'account:' || COALESCE(NEW.account_id, OLD.account_id));
  RETURN NULL;
END
$$;
CREATE TRIGGER guardrail_policies_notify AFTER INSERT OR UPDATE OR DELETE ON guardrail_policies
  FOR EACH ROW EXECUTE FUNCTION nenas_notify_guardrails();

ALTER TABLE api_keys ADD COLUMN guardrails jsonb;
ALTER TABLE request_logs ADD COLUMN guardrails jsonb;
CREATE INDEX request_logs_guardrails_idx ON request_logs (account_id, created_at DESC)
  WHERE guardrails IS NOT NULL;
`))
