import { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import { CACHE_COUNTERS, FIRST_COUNTERS, OWN_KEY_COUNTERS, rollupFunctions } from "./usageRollupSql.js"

/** The rollups' counters from here on: 0027's, and the calls answered on a team's own key with their fees. */
const COUNTERS = [...FIRST_COUNTERS, ...CACHE_COUNTERS, ...OWN_KEY_COUNTERS]

/**
 * Calls answered on a team's own provider key (docs/api/provider-keys.md, "Billing"): each log row names the key
 * (kept after the key is deleted, so no reference) and the fee its bill holds; usage rollups count those calls
 * and fees, for usage and the overview to show them apart.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
ALTER TABLE request_logs ADD COLUMN provider_key_id text,
  ADD COLUMN byok_fee_micro_myr bigint NOT NULL DEFAULT 0 CHECK (byok_fee_micro_myr >= 0);

ALTER TABLE usage_rollups ADD COLUMN byok_calls bigint NOT NULL DEFAULT 0,
  ADD COLUMN byok_fee_micro_myr bigint NOT NULL DEFAULT 0;
ALTER TABLE usage_rollup_deltas ADD COLUMN byok_calls bigint NOT NULL DEFAULT 0,
  ADD COLUMN byok_fee_micro_myr bigint NOT NULL DEFAULT 0;
${rollupFunctions(COUNTERS, "CREATE OR REPLACE")}
`))
