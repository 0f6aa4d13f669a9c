import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Stored responses' bounds (docs/api/models.md, "Stored responses"): `bytes` is
 * a response's record as it is read back (its JSON, instructions included), so
 * a chain's size is summed without inflating it; rows written before this
 * column count their deflated size. `stored_response_totals` keeps each
 * account's sum, kept by statement triggers (every writer, the purge and
 * deletions included), so the per-account quota is checked with one read; the
 * account index finds its oldest first.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
ALTER TABLE stored_responses ADD COLUMN bytes bigint NOT NULL DEFAULT 0;
UPDATE stored_responses SET bytes = octet_length(body);
CREATE INDEX stored_responses_account_age_idx ON stored_responses (account_id, created_at, id);

CREATE TABLE stored_response_totals (
  account_id text PRIMARY KEY,
  bytes bigint NOT NULL
);
INSERT INTO stored_response_totals (account_id, bytes)
  SELECT account_id, sum(bytes) FROM stored_responses GROUP BY account_id;

-- Totals rows are locked in account order, so concurrent writers and the purge cannot deadlock on them.
CREATE FUNCTION stored_response_totals_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO stored_response_totals (account_id, bytes)
    SELECT account_id, sum(bytes) FROM added GROUP BY account_id ORDER BY account_id
    ON CONFLICT (account_id) DO UPDATE SET bytes = stored_response_totals.bytes + excluded.bytes;
  RETURN NULL;
END $$;

CREATE FUNCTION stored_response_totals_remove() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM 1 FROM stored_response_totals WHERE account_id IN (SELECT account_id FROM removed)
    ORDER BY account_id FOR UPDATE;
  UPDATE stored_response_totals t SET bytes = t.bytes - r.bytes
    FROM (SELECT account_id, sum(bytes) AS bytes FROM removed GROUP BY account_id) r
    WHERE t.account_id = r.account_id;
  RETURN NULL;
END $$;

CREATE TRIGGER stored_response_totals_insert AFTER INSERT ON stored_responses REFERENCING NEW TABLE AS added
  FOR EACH STATEMENT EXECUTE FUNCTION stored_response_totals_add();
CREATE TRIGGER stored_response_totals_delete AFTER DELETE ON stored_responses REFERENCING OLD TABLE AS removed
  FOR EACH STATEMENT EXECUTE FUNCTION stored_response_totals_remove();
`))
