import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Who set a key's controls (docs/api/teams.md, "Roles that hold"): `admin_controls` names those an
 * owner or admin set (`disabled`, `monthly_spend_limit_myr`, `rate_limit_rpm`,
 * `rate_limit_concurrent`), which a developer may tighten but not loosen. Who
 * set them before was not kept: each control a key has now counts as set by an
 * owner or admin, the side that refuses a loosening rather than allows one.
 *
 * Names reach invitation emails: an account's or member's name already stored
 * is made one line of at most 100 characters, as new ones are.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
ALTER TABLE api_keys ADD COLUMN admin_controls text[] NOT NULL DEFAULT '{}';
UPDATE api_keys SET admin_controls = array_remove(ARRAY[
  CASE WHEN disabled_at IS NOT NULL THEN 'disabled' END,
  CASE WHEN monthly_spend_limit_micro_myr IS NOT NULL THEN 'monthly_spend_limit_myr' END,
  CASE WHEN rate_limit_rpm IS NOT NULL THEN 'rate_limit_rpm' END,
  CASE WHEN rate_limit_concurrent IS NOT NULL THEN 'rate_limit_concurrent' END
], NULL);

UPDATE accounts SET name = NULLIF(left(btrim(regexp_replace(name, '[[:cntrl:]\\u2028\\u2029[:space:]]+', ' ', 'g')), 100), '')
  WHERE name IS NOT NULL AND (name ~ '[[:cntrl:]\\u2028\\u2029]' OR length(name) > 100);
UPDATE members SET name = NULLIF(left(btrim(regexp_replace(name, '[[:cntrl:]\\u2028\\u2029[:space:]]+', ' ', 'g')), 100), '')
  WHERE name IS NOT NULL AND (name ~ '[[:cntrl:]\\u2028\\u2029]' OR length(name) > 100);
`))
