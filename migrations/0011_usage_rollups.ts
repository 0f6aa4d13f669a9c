import { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import { FIRST_COUNTERS, ROLLUP_KEY, rollupDeltas, rollupFunctions } from "./usageRollupSql.js"

const COUNTERS = FIRST_COUNTERS.map((c) => c.name)
const KEY = ROLLUP_KEY

/**
 * Usage rollups
 * (docs/api/dashboard.md, "Dashboard analytics: rollups, paging, tags and export"):
 * per account, 30-minute UTC bucket, key, environment and endpoint, the sums of
 * its request logs: requests, counts per status, tokens, searches, pages and
 * cost. 30 minutes, because every business time zone on a whole or half hour
 * (Asia/Kolkata) starts its hours and days on a bucket boundary; the reads fall
 * back to the logs for a zone that does not.
 *
 * Kept by triggers on `request_logs`, in the transaction that writes the logs
 * (the settlement flush, which also bills them). A statement stages its net
 * change (new rows minus old rows) in `usage_rollup_deltas`, which takes no
 * lock on a shared row; at commit one deferred statement folds the
 * transaction's deltas into `usage_rollups` in key order. So two instances
 * flushing at once wait for each other's rollup rows at most, in one order,
 * and never deadlock on them; and a transaction that rolls back leaves none.
 *
 * Also the logs' environment (the key's, at the call) and an index per filter
 * of the dashboard's logs, ordered for keyset paging.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
-- The key's environment at the call; logs of keys deleted before this migration count as live.
ALTER TABLE request_logs ADD COLUMN environment text NOT NULL DEFAULT 'live' CHECK (environment IN ('live', 'test'));
-- The caller's tags (OpenAI's metadata) and chat user.
ALTER TABLE request_logs ADD COLUMN metadata jsonb, ADD COLUMN end_user text;
UPDATE request_logs l SET environment = 'test' FROM api_keys k WHERE k.id = l.api_key_id AND k.environment = 'test';

CREATE TABLE usage_rollups (
  account_id  text NOT NULL,
  bucket      timestamptz NOT NULL,
  api_key_id  text NOT NULL,
  environment text NOT NULL,
  endpoint    text NOT NULL,
  ${COUNTERS.map((c) => `${c} bigint NOT NULL DEFAULT 0`).join(",\n  ")},
  PRIMARY KEY (${KEY})
);
CREATE INDEX usage_rollups_key_idx ON usage_rollups (account_id, api_key_id, bucket);

-- Empty outside a transaction: each transaction's staged changes, folded in at its commit.
CREATE TABLE usage_rollup_deltas (
  txid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
  account_id  text NOT NULL,
  bucket      timestamptz NOT NULL,
  api_key_id  text NOT NULL,
  environment text NOT NULL,
  endpoint    text NOT NULL,
  ${COUNTERS.map((c) => `${c} bigint NOT NULL`).join(",\n  ")}
);
CREATE INDEX usage_rollup_deltas_txid_idx ON usage_rollup_deltas (txid);

${rollupFunctions(FIRST_COUNTERS, "CREATE")}

CREATE TRIGGER usage_rollups_insert AFTER INSERT ON request_logs REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION usage_rollups_stage_insert();
CREATE TRIGGER usage_rollups_update AFTER UPDATE ON request_logs REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION usage_rollups_stage_update();
CREATE TRIGGER usage_rollups_delete AFTER DELETE ON request_logs REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION usage_rollups_stage_delete();

CREATE CONSTRAINT TRIGGER usage_rollups_fold AFTER INSERT ON usage_rollup_deltas
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION usage_rollups_fold();

-- An index per filter of the dashboard's logs, in their order (newest first, then by id: keyset paging).
DROP INDEX request_logs_account_idx;
DROP INDEX request_logs_account_status_idx;
DROP INDEX request_logs_key_idx;
CREATE INDEX request_logs_account_idx ON request_logs (account_id, created_at DESC, request_id DESC);
CREATE INDEX request_logs_account_status_idx ON request_logs (account_id, status, created_at DESC, request_id DESC);
CREATE INDEX request_logs_account_key_idx ON request_logs (account_id, api_key_id, created_at DESC, request_id DESC);
CREATE INDEX request_logs_account_endpoint_idx ON request_logs (account_id, endpoint, created_at DESC, request_id DESC);
CREATE INDEX request_logs_account_environment_idx ON request_logs (account_id, environment, created_at DESC, request_id DESC);
CREATE INDEX request_logs_metadata_idx ON request_logs USING gin (metadata jsonb_path_ops) WHERE metadata IS NOT NULL;

-- Backfill: the logs written before this migration.
INSERT INTO usage_rollups (${KEY}, ${COUNTERS.join(", ")}) ${
    rollupDeltas(FIRST_COUNTERS, "SELECT 1 AS s, * FROM request_logs")
  };
`))
