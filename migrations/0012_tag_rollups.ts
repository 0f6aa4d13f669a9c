import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

const COUNTERS = ["requests", "input_tokens", "output_tokens", "reasoning_tokens", "cost_micro_myr"] as const
const KEY = "account_id, tag_key, bucket, tagged, tag_value, api_key_id, environment"
const BUCKET = "date_bin('30 minutes', r.created_at, timestamptz '1970-01-01 00:00:00+00')"

/** Rows `(s, …log columns)` of a transition table, per grouping tag of their account, summed per rollup key. */
const deltas = (rows: string) => `
  SELECT r.account_id, g.tag_key, ${BUCKET} AS bucket, COALESCE(r.metadata ? g.tag_key, false) AS tagged,
    COALESCE(r.metadata ->> g.tag_key, '') AS tag_value, r.api_key_id, r.environment,
    sum(s)::bigint, sum(s * r.input_tokens::bigint)::bigint, sum(s * r.output_tokens::bigint)::bigint,
    sum(s * r.reasoning_tokens::bigint)::bigint, sum(s * r.cost_micro_myr)::bigint
  FROM (${rows}) r JOIN grouping_tags g ON g.account_id = r.account_id
  GROUP BY 1, 2, 3, 4, 5, 6, 7
  HAVING sum(s) <> 0 OR sum(s * r.input_tokens::bigint) <> 0 OR sum(s * r.output_tokens::bigint) <> 0
    OR sum(s * r.reasoning_tokens::bigint) <> 0 OR sum(s * r.cost_micro_myr) <> 0`

const stage = (name: string, rows: string) => `
CREATE FUNCTION ${name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO usage_tag_rollup_deltas (${KEY}, ${COUNTERS.join(", ")}) ${deltas(rows)};
  RETURN NULL;
END $$;`

/**
 * Usage by tag, rolled up for the tag keys a developer marks as grouping keys
 * (docs/api/dashboard.md, "Dashboard analytics: rollups, paging, tags and export"):
 * per account, key, 30-minute bucket, value (or none: `tagged` false), API key
 * and environment, the requests, tokens and cost of its request logs. Kept as
 * `usage_rollups` are (0011): each statement that writes logs stages its net
 * change, joined with the account's grouping keys, and one deferred statement
 * folds the transaction's changes in at commit, in key order. A key marked later
 * is backfilled from the account's logs when it is marked.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
CREATE TABLE grouping_tags (
  account_id text NOT NULL REFERENCES accounts(id),
  tag_key    text NOT NULL CHECK (char_length(tag_key) BETWEEN 1 AND 64),
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (account_id, tag_key)
);

CREATE TABLE usage_tag_rollups (
  account_id  text NOT NULL,
  tag_key     text NOT NULL,
  bucket      timestamptz NOT NULL,
  tagged      boolean NOT NULL,
  tag_value   text NOT NULL,
  api_key_id  text NOT NULL,
  environment text NOT NULL,
  ${COUNTERS.map((c) => `${c} bigint NOT NULL DEFAULT 0`).join(",\n  ")},
  PRIMARY KEY (${KEY})
);

CREATE TABLE usage_tag_rollup_deltas (
  txid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
  account_id  text NOT NULL,
  tag_key     text NOT NULL,
  bucket      timestamptz NOT NULL,
  tagged      boolean NOT NULL,
  tag_value   text NOT NULL,
  api_key_id  text NOT NULL,
  environment text NOT NULL,
  ${COUNTERS.map((c) => `${c} bigint NOT NULL`).join(",\n  ")}
);
CREATE INDEX usage_tag_rollup_deltas_txid_idx ON usage_tag_rollup_deltas (txid);

${stage("usage_tag_rollups_stage_insert", "SELECT 1 AS s, * FROM new_rows")}
${stage("usage_tag_rollups_stage_update", "SELECT 1 AS s, * FROM new_rows UNION ALL SELECT -1, * FROM old_rows")}
${stage("usage_tag_rollups_stage_delete", "SELECT -1 AS s, * FROM old_rows")}

CREATE TRIGGER usage_tag_rollups_insert AFTER INSERT ON request_logs REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION usage_tag_rollups_stage_insert();
CREATE TRIGGER usage_tag_rollups_update AFTER UPDATE ON request_logs REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION usage_tag_rollups_stage_update();
CREATE TRIGGER usage_tag_rollups_delete AFTER DELETE ON request_logs REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION usage_tag_rollups_stage_delete();

CREATE FUNCTION usage_tag_rollups_fold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  WITH mine AS (DELETE FROM usage_tag_rollup_deltas WHERE txid = pg_current_xact_id() RETURNING *)
  INSERT INTO usage_tag_rollups (${KEY}, ${COUNTERS.join(", ")})
  SELECT ${KEY}, ${COUNTERS.map((c) => `sum(${c})`).join(", ")}
  FROM mine GROUP BY ${KEY} ORDER BY ${KEY}
  ON CONFLICT (${KEY}) DO UPDATE SET
    ${COUNTERS.map((c) => `${c} = usage_tag_rollups.${c} + EXCLUDED.${c}`).join(",\n    ")};
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER usage_tag_rollups_fold AFTER INSERT ON usage_tag_rollup_deltas
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION usage_tag_rollups_fold();
`))
