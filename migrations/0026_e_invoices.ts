import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * E-invoices validated by LHDN's MyInvois (docs/api/e-invoices.md). An `e_invoices` row is one e-invoice as
 * submitted: a document's own (`single`) or a month's consolidated one covering many documents. It is also
 * the outbox of its submission: `next_attempt_at` says when a worker may claim it (null: nothing to do until
 * something else happens), `claimed_until` leases it to one instance (`claimed_by`, which a restart of that
 * instance releases at once), and `submission_uid` is written as soon
 * as MyInvois answers. `body` is the document exactly as first submitted (built, and signed, on the first
 * attempt), so every retry sends the same bytes with the same hash. A resubmission after a rejection is a new
 * row of the same code number with the next `attempt`; the rejected one becomes `superseded`.
 *
 * A billing document points at its current e-invoice (`e_invoice_id`) and keeps a copy of its state in its
 * `e_invoice_*` columns, written in the same transaction as the e-invoice's. `e_invoice_route` says how it is
 * reported: on its own (a buyer with a TIN, or over RM 10,000) or in the month's consolidated e-invoice.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
CREATE TABLE e_invoices (
  id                  text PRIMARY KEY,
  kind                text NOT NULL CHECK (kind IN ('single', 'consolidated')),
  type_code           text NOT NULL CHECK (type_code IN ('01', '02', '03', '04')),
  code_number         text NOT NULL,
  attempt             integer NOT NULL DEFAULT 1 CHECK (attempt > 0),
  account_id          text REFERENCES accounts (id),
  document_id         text REFERENCES billing_documents (id),
  month               text CHECK (month ~ '^[0-9]{4}-[0-9]{2}$'),
  buyer               jsonb,
  status              text NOT NULL DEFAULT 'pending'
    CHECK (status IN ('pending', 'submitted', 'valid', 'invalid', 'cancelled', 'superseded')),
  body                text,
  hash                text,
  issued_at           timestamptz,
  submission_uid      text,
  uuid                text,
  long_id             text,
  errors              jsonb NOT NULL DEFAULT '[]',
  attempts            integer NOT NULL DEFAULT 0,
  next_attempt_at     timestamptz,
  claimed_until       timestamptz,
  claimed_by          text,
  last_error          text,
  submitted_at        timestamptz,
  validated_at        timestamptz,
  cancel_requested_at timestamptz,
  cancelled_at        timestamptz,
  held_by             text REFERENCES e_invoices (id),
  created_at          timestamptz NOT NULL,
  UNIQUE (code_number, attempt),
  CHECK ((kind = 'single') = (document_id IS NOT NULL)),
  CHECK ((kind = 'consolidated') = (month IS NOT NULL))
);
CREATE INDEX e_invoices_due ON e_invoices (next_attempt_at) WHERE next_attempt_at IS NOT NULL;
CREATE INDEX e_invoices_document ON e_invoices (document_id);

ALTER TABLE billing_documents ADD COLUMN e_invoice_id text REFERENCES e_invoices (id);
ALTER TABLE billing_documents ADD COLUMN e_invoice_route text NOT NULL DEFAULT 'consolidated'
  CHECK (e_invoice_route IN ('single', 'consolidated'));
CREATE INDEX billing_documents_unconsolidated ON billing_documents (issued_at)
  WHERE e_invoice_route = 'consolidated' AND e_invoice_id IS NULL;
CREATE INDEX billing_documents_e_invoice ON billing_documents (e_invoice_id);

UPDATE billing_documents SET e_invoice_route = 'single'
WHERE buyer->>'tin' IS NOT NULL OR total_sen > 1000000;
INSERT INTO e_invoices (id, kind, type_code, code_number, account_id, document_id, buyer, next_attempt_at, created_at)
SELECT 'ein_' || substr(md5(id), 1, 24), 'single',
  CASE type WHEN 'invoice' THEN '01' WHEN 'credit_note' THEN '02' WHEN 'debit_note' THEN '03' ELSE '04' END,
  number, account_id, id, buyer, now(), now()
FROM billing_documents WHERE e_invoice_route = 'single';
UPDATE billing_documents SET e_invoice_id = 'ein_' || substr(md5(id), 1, 24) WHERE e_invoice_route = 'single';
`))
