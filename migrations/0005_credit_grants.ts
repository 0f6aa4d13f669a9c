import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Credit grants (docs/money.md, "Credit grants"): an instance holds part of a wallet, taken
 * under the wallet's lock, and reserves calls from it in memory. What grants
 * hold is its own column, so that the wallet reads as available + reserved +
 * granted = the sum of the ledger, and what calls in flight hold stays
 * `reserved`. One grant per account and instance.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
ALTER TABLE wallets ADD COLUMN granted_micro_myr bigint NOT NULL DEFAULT 0 CHECK (granted_micro_myr >= 0);

CREATE TABLE credit_grants (
  id               text PRIMARY KEY,
  account_id       text NOT NULL REFERENCES accounts(id),
  holder           text NOT NULL,
  amount_micro_myr bigint NOT NULL CHECK (amount_micro_myr >= 0),
  created_at       timestamptz NOT NULL DEFAULT now(),
  updated_at       timestamptz NOT NULL DEFAULT now(),
  UNIQUE (account_id, holder)
);
CREATE INDEX credit_grants_holder_idx ON credit_grants (holder);
`))
