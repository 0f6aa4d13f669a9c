import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Each call's upstream attempts (docs/operations.md, "Several upstreams and fallbacks"): a
 * JSON array `[{target, outcome, latency_ms}]` on its log row, in the order
 * they ran, written with the row by the settlement's batches. NULL: no
 * attempt was recorded (a test key's call, a call refused before it ran, or
 * a row older than this column).
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
ALTER TABLE request_logs ADD COLUMN attempts jsonb;
`))
