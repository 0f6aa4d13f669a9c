import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Service tax on top-ups, the buyer's billing profile, and the tax invoices and notes issued with each money
 * movement (docs/money.md, "Service tax" and docs/api/invoices.md, "Invoices and service tax").
 * - A payment transaction keeps the tax it charged on top of its amount, and the rate it was charged at;
 *   `refunded_micro_myr` is from now on the cumulative gross Stripe refunded (amount and tax), which equals
 *   the net part while no tax is charged.
 * - `document_numbers` holds the last number of each prefix and year; a document takes the next in the
 *   transaction that moves its money, so numbers stay gapless on any number of instances.
 * - A document keeps its parties and lines as issued (jsonb); `effect_key` is the money movement it records,
 *   so a movement never has two documents.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
ALTER TABLE payment_transactions ADD COLUMN tax_sen integer NOT NULL DEFAULT 0 CHECK (tax_sen >= 0);
ALTER TABLE payment_transactions ADD COLUMN tax_rate_bps integer NOT NULL DEFAULT 0
  CHECK (tax_rate_bps BETWEEN 0 AND 10000);
DO $$
DECLARE name text;
BEGIN
  SELECT conname INTO name FROM pg_constraint
  WHERE conrelid = 'payment_transactions'::regclass AND contype = 'c'
    AND pg_get_constraintdef(oid) LIKE '%refunded_micro_myr <= amount_micro_myr%';
  EXECUTE format('ALTER TABLE payment_transactions DROP CONSTRAINT %I', name);
END $$;
ALTER TABLE payment_transactions ADD CONSTRAINT payment_transactions_refunded_gross_check
  CHECK (refunded_micro_myr >= 0 AND refunded_micro_myr <= (amount_sen::bigint + tax_sen) * 10000);

CREATE TABLE billing_profiles (
  account_id           text PRIMARY KEY REFERENCES accounts(id) ON DELETE CASCADE,
  profile              jsonb NOT NULL,
  updated_at           timestamptz NOT NULL,
  updated_by_member_id text
);

CREATE TABLE document_numbers (
  prefix      text NOT NULL,
  year        integer NOT NULL,
  last_number integer NOT NULL CHECK (last_number > 0),
  PRIMARY KEY (prefix, year)
);

CREATE TABLE billing_documents (
  id                     text PRIMARY KEY,
  account_id             text NOT NULL REFERENCES accounts(id),
  type                   text NOT NULL CHECK (type IN ('invoice', 'credit_note', 'debit_note', 'refund_note')),
  number                 text NOT NULL UNIQUE,
  year                   integer NOT NULL,
  sequence               integer NOT NULL CHECK (sequence > 0),
  issued_at              timestamptz NOT NULL,
  effect_key             text NOT NULL UNIQUE,
  payment_transaction_id text REFERENCES payment_transactions(id),
  references_document_id text REFERENCES billing_documents(id),
  supplier               jsonb NOT NULL,
  buyer                  jsonb NOT NULL,
  lines                  jsonb NOT NULL,
  tax_rate_bps           integer NOT NULL CHECK (tax_rate_bps BETWEEN 0 AND 10000),
  net_sen                bigint NOT NULL CHECK (net_sen >= 0),
  tax_sen                bigint NOT NULL CHECK (tax_sen >= 0),
  total_sen              bigint NOT NULL CHECK (total_sen = net_sen + tax_sen),
  payment_reference      text,
  e_invoice_status       text NOT NULL DEFAULT 'pending'
    CHECK (e_invoice_status IN ('pending', 'submitted', 'valid', 'invalid', 'cancelled')),
  e_invoice_uuid         text,
  e_invoice_long_id      text,
  e_invoice_validated_at timestamptz,
  e_invoice_errors       jsonb NOT NULL DEFAULT '[]',
  UNIQUE (type, year, sequence)
);
CREATE INDEX billing_documents_account ON billing_documents (account_id, issued_at DESC, id DESC);
CREATE INDEX billing_documents_transaction ON billing_documents (payment_transaction_id, type);
`))
