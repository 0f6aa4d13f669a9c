import { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import { CACHE_COUNTERS, FIRST_COUNTERS, rollupFunctions } from "./usageRollupSql.js"

/** The rollups' counters from here on: 0011's, the cache hits, and what they saved. */
const COUNTERS = [...FIRST_COUNTERS, ...CACHE_COUNTERS]

/**
 * The response cache (docs/api/cache.md, "What is stored"): each account's stored answers by cache key,
 * with what the answer cost when it was made (what a hit saves), when it expires and when it was last used
 * (the per-account bound drops the least recently used first). A key may opt in with `cache_ttl_seconds`.
 * Each log row says what the cache did (`hit`, `miss`, `bypass`; null: not asked), which answer a hit
 * replayed, and what it saved; usage rollups count hits and savings.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
CREATE TABLE response_cache (
  account_id        text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  cache_key         text NOT NULL,
  answer            text NOT NULL,
  bytes             integer NOT NULL CHECK (bytes > 0),
  source_request_id text NOT NULL,
  cost_micro_myr    bigint NOT NULL CHECK (cost_micro_myr >= 0),
  created_at        timestamptz NOT NULL,
  expires_at        timestamptz NOT NULL,
  last_used_at      timestamptz NOT NULL,
  PRIMARY KEY (account_id, cache_key)
);
CREATE INDEX response_cache_recency_idx ON response_cache (account_id, last_used_at DESC, cache_key);
CREATE INDEX response_cache_expiry_idx ON response_cache (expires_at);

ALTER TABLE api_keys ADD COLUMN cache_ttl_seconds integer CHECK (cache_ttl_seconds BETWEEN 60 AND 86400);

ALTER TABLE request_logs ADD COLUMN cache text CHECK (cache IN ('hit', 'miss', 'bypass')),
  ADD COLUMN cache_source_request_id text,
  ADD COLUMN cache_saved_micro_myr bigint NOT NULL DEFAULT 0;

ALTER TABLE usage_rollups ADD COLUMN cache_hits bigint NOT NULL DEFAULT 0,
  ADD COLUMN cache_saved_micro_myr bigint NOT NULL DEFAULT 0;
ALTER TABLE usage_rollup_deltas ADD COLUMN cache_hits bigint NOT NULL DEFAULT 0,
  ADD COLUMN cache_saved_micro_myr bigint NOT NULL DEFAULT 0;
${rollupFunctions(COUNTERS, "CREATE OR REPLACE")}
`))
