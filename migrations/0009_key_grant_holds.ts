import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * A key's calls on credit grants, counted against its monthly spend limit
 * (docs/money.md, "Spend limits and budgets"). A key without a limit may spend from an instance's
 * grant, in memory; when a limit is set on it, every instance writes here
 * what the key's calls in flight hold of its grants, and what they were
 * charged but not yet written, and keeps the row true with each flush until
 * nothing is left. The limit's check adds these rows to the key's spend.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
CREATE TABLE key_grant_holds (
  holder         text NOT NULL,
  api_key_id     text NOT NULL,
  amount_micro_myr bigint NOT NULL CHECK (amount_micro_myr > 0),
  updated_at     timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (api_key_id, holder)
);
`))
