import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * What the money core needs beyond the first schema: a strict order of ledger
 * entries (for the running balance and "newest first"), Stripe charges as
 * facts that may arrive before the payment they belong to, and disputes that
 * may arrive before their account is known.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
ALTER TABLE ledger_entries ADD COLUMN seq bigserial NOT NULL UNIQUE;
DROP INDEX ledger_account_idx;
DROP INDEX ledger_account_type_idx;
CREATE INDEX ledger_account_idx ON ledger_entries (account_id, seq DESC);
CREATE INDEX ledger_account_type_idx ON ledger_entries (account_id, type, seq DESC);

-- The highest cumulative refunded amount Stripe reported per charge.
CREATE TABLE stripe_charges (
  id                        text PRIMARY KEY,
  payment_intent_id         text,
  amount_refunded_micro_myr bigint NOT NULL CHECK (amount_refunded_micro_myr >= 0),
  updated_at                timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stripe_charges_intent_idx ON stripe_charges (payment_intent_id);

ALTER TABLE disputes ALTER COLUMN account_id DROP NOT NULL;
ALTER TABLE disputes ADD COLUMN payment_intent_id text;
CREATE INDEX disputes_intent_idx ON disputes (payment_intent_id);
CREATE INDEX disputes_charge_idx ON disputes (charge_id);
`))
