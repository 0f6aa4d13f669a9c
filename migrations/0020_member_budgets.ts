import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Member budgets (docs/money.md, "Spend limits and budgets"): a member's
 * monthly budget is checked on every call of its keys against what all of them
 * spent this month, a deleted key's included (its tombstone names its member),
 * so the tombstones are found by member as the keys are
 * (`api_keys_member_idx`).
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
CREATE INDEX api_key_tombstones_member_idx ON api_key_tombstones (member_id);
`))
