import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Money that follows Stripe's movements and holds that resolve quickly after a
 * crash: disputes record whether their funds were withdrawn and reinstated
 * (inquiries move none); each process registers itself with a heartbeat, and
 * the reservations, request logs and idempotency records it holds name it, so
 * another process can tell what is provably dead.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
ALTER TABLE disputes ADD COLUMN funds_withdrawn boolean NOT NULL DEFAULT false;
ALTER TABLE disputes ADD COLUMN funds_reinstated boolean NOT NULL DEFAULT false;
-- Disputes recorded before this migration debited when recorded: they were treated as withdrawn.
UPDATE disputes SET funds_withdrawn = true, funds_reinstated = (status = 'won');

-- One row per process start; heartbeat_at is the database's now() at its last beat.
CREATE TABLE instances (
  id           text PRIMARY KEY,
  identity     text NOT NULL,
  started_at   timestamptz NOT NULL DEFAULT now(),
  heartbeat_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX instances_identity_idx ON instances (identity);

ALTER TABLE reservations ADD COLUMN holder text;
CREATE INDEX reservations_holder_open_idx ON reservations (holder) WHERE status = 'open';
ALTER TABLE request_logs ADD COLUMN holder text;
CREATE INDEX request_logs_pending_idx ON request_logs (created_at) WHERE status = 'pending';

ALTER TABLE idempotency_records ADD COLUMN holder text;
ALTER TABLE idempotency_records ADD COLUMN lease_expires_at timestamptz;
CREATE INDEX idempotency_records_running_idx ON idempotency_records (request_id) WHERE status = 'running';
`))
