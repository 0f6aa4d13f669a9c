import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Signed webhooks to the developer and alert email
 * (docs/api/alerts.md, "Never run dry: alerts, auto top-up and webhooks"),
 * owned by `src/Outbox/`. An event is written to `outbox_events` in the
 * transaction of the money movement that causes it, together with one
 * `webhook_deliveries` row per enabled endpoint of the account subscribed to
 * its type, and an `outbox_emails` row when it is worth an email: a commit
 * either has them all or none. Deliveries are claimed across instances with
 * `FOR UPDATE SKIP LOCKED` and a lease (`claimed_until`), so a process killed
 * mid-delivery leaves its claim to lapse and another instance delivers. Every
 * attempt is kept in `webhook_attempts`. Endpoint secrets are kept readable:
 * they sign.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
CREATE TABLE webhook_endpoints (
  id              text PRIMARY KEY,
  account_id      text NOT NULL REFERENCES accounts(id),
  url             text NOT NULL,
  description     text NOT NULL DEFAULT '',
  events          text[] NOT NULL,
  secret          text NOT NULL,
  disabled_at     timestamptz,
  disabled_reason text,
  failing_since   timestamptz,
  created_at      timestamptz NOT NULL,
  updated_at      timestamptz NOT NULL
);
CREATE INDEX webhook_endpoints_account_idx ON webhook_endpoints (account_id);

CREATE TABLE outbox_events (
  id         text PRIMARY KEY,
  account_id text NOT NULL REFERENCES accounts(id),
  type       text NOT NULL,
  payload    jsonb NOT NULL,
  created_at timestamptz NOT NULL
);
CREATE INDEX outbox_events_account_idx ON outbox_events (account_id, created_at DESC);

CREATE TABLE webhook_deliveries (
  id              text PRIMARY KEY,
  event_id        text NOT NULL REFERENCES outbox_events(id),
  endpoint_id     text NOT NULL REFERENCES webhook_endpoints(id) ON DELETE CASCADE,
  status          text NOT NULL CHECK (status IN ('pending', 'delivered', 'failed')),
  attempts        integer NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL,
  claimed_until   timestamptz,
  created_at      timestamptz NOT NULL,
  delivered_at    timestamptz
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_endpoint_idx ON webhook_deliveries (endpoint_id, created_at DESC);

CREATE TABLE webhook_attempts (
  id               text PRIMARY KEY,
  delivery_id      text NOT NULL REFERENCES webhook_deliveries(id) ON DELETE CASCADE,
  attempt          integer NOT NULL,
  attempted_at     timestamptz NOT NULL,
  status_code      integer,
  latency_ms       integer NOT NULL,
  ok               boolean NOT NULL,
  error            text,
  response_excerpt text NOT NULL DEFAULT '',
  instance_id      text NOT NULL
);
CREATE INDEX webhook_attempts_delivery_idx ON webhook_attempts (delivery_id, attempt);

CREATE TABLE outbox_emails (
  id              text PRIMARY KEY,
  account_id      text NOT NULL REFERENCES accounts(id),
  event_id        text REFERENCES outbox_events(id),
  to_address      text NOT NULL,
  subject         text NOT NULL,
  body            text NOT NULL,
  status          text NOT NULL CHECK (status IN ('pending', 'sent', 'kept', 'failed')),
  attempts        integer NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL,
  claimed_until   timestamptz,
  last_error      text,
  created_at      timestamptz NOT NULL,
  sent_at         timestamptz
);
CREATE INDEX outbox_emails_due_idx ON outbox_emails (next_attempt_at) WHERE status = 'pending';
CREATE INDEX outbox_emails_created_idx ON outbox_emails (created_at DESC);
`))
