import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Every table of the service. Money is integer micro-MYR in bigint columns; the
 * checks below are the last line of defence for the rules the docs state
 * (docs/money.md, "The money rules" first among them).
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
CREATE TABLE accounts (
  id           text PRIMARY KEY,
  subject      text NOT NULL UNIQUE,
  email        text,
  name         text,
  suspended_at timestamptz,
  created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE wallets (
  account_id               text PRIMARY KEY REFERENCES accounts(id),
  available_micro_myr      bigint NOT NULL DEFAULT 0,
  reserved_micro_myr       bigint NOT NULL DEFAULT 0 CHECK (reserved_micro_myr >= 0),
  lifetime_topup_micro_myr bigint NOT NULL DEFAULT 0 CHECK (lifetime_topup_micro_myr >= 0),
  lifetime_spend_micro_myr bigint NOT NULL DEFAULT 0 CHECK (lifetime_spend_micro_myr >= 0),
  updated_at               timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
  id                            text PRIMARY KEY,
  account_id                    text NOT NULL REFERENCES accounts(id),
  name                          text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 100),
  prefix                        text NOT NULL,
  environment                   text NOT NULL CHECK (environment IN ('live', 'test')),
  key_hash                      bytea NOT NULL UNIQUE CHECK (octet_length(key_hash) = 32),
  monthly_spend_limit_micro_myr bigint CHECK (monthly_spend_limit_micro_myr >= 0),
  expires_at                    timestamptz,
  created_at                    timestamptz NOT NULL DEFAULT now(),
  last_used_at                  timestamptz
);
CREATE INDEX api_keys_account_idx ON api_keys (account_id, created_at DESC);

-- A deleted key's hash stays here so that using it answers revoked_api_key.
CREATE TABLE api_key_tombstones (
  key_hash   bytea PRIMARY KEY CHECK (octet_length(key_hash) = 32),
  key_id     text NOT NULL UNIQUE,
  account_id text NOT NULL REFERENCES accounts(id),
  deleted_at timestamptz NOT NULL DEFAULT now()
);

-- Keys are not foreign keys below: money and logs outlive a deleted key.
CREATE TABLE reservations (
  id                 text PRIMARY KEY,
  account_id         text NOT NULL REFERENCES accounts(id),
  api_key_id         text NOT NULL,
  request_id         text NOT NULL UNIQUE,
  amount_micro_myr   bigint NOT NULL CHECK (amount_micro_myr > 0),
  status             text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'captured', 'released')),
  captured_micro_myr bigint CHECK (captured_micro_myr >= 0 AND captured_micro_myr <= amount_micro_myr),
  expires_at         timestamptz NOT NULL,
  created_at         timestamptz NOT NULL DEFAULT now(),
  settled_at         timestamptz,
  CHECK ((status = 'captured') = (captured_micro_myr IS NOT NULL)),
  CHECK ((status = 'open') = (settled_at IS NULL))
);
CREATE INDEX reservations_open_idx ON reservations (expires_at) WHERE status = 'open';
CREATE INDEX reservations_key_open_idx ON reservations (api_key_id) WHERE status = 'open';

CREATE TABLE payment_transactions (
  id                  text PRIMARY KEY,
  account_id          text NOT NULL REFERENCES accounts(id),
  amount_sen          integer NOT NULL CHECK (amount_sen IN (1000, 2500, 5000, 10000, 25000, 50000)),
  amount_micro_myr    bigint NOT NULL CHECK (amount_micro_myr = amount_sen::bigint * 10000),
  currency            text NOT NULL DEFAULT 'myr',
  status              text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'succeeded', 'failed')),
  checkout_session_id text UNIQUE,
  payment_intent_id   text UNIQUE,
  charge_id           text UNIQUE,
  refunded_micro_myr  bigint NOT NULL DEFAULT 0 CHECK (refunded_micro_myr >= 0 AND refunded_micro_myr <= amount_micro_myr),
  created_at          timestamptz NOT NULL DEFAULT now(),
  updated_at          timestamptz NOT NULL DEFAULT now(),
  completed_at        timestamptz
);
CREATE INDEX payment_transactions_account_idx ON payment_transactions (account_id, created_at DESC);

CREATE TABLE disputes (
  id                     text PRIMARY KEY,
  account_id             text NOT NULL REFERENCES accounts(id),
  payment_transaction_id text REFERENCES payment_transactions(id),
  charge_id              text NOT NULL,
  amount_micro_myr       bigint NOT NULL CHECK (amount_micro_myr > 0),
  status                 text NOT NULL CHECK (status IN ('open', 'won', 'lost', 'closed')),
  created_at             timestamptz NOT NULL DEFAULT now(),
  closed_at              timestamptz
);
CREATE INDEX disputes_open_idx ON disputes (account_id) WHERE status = 'open';

CREATE TABLE ledger_entries (
  id                      text PRIMARY KEY,
  account_id              text NOT NULL REFERENCES accounts(id),
  type                    text NOT NULL CHECK (type IN ('topup', 'usage', 'refund', 'chargeback', 'chargeback_reversal', 'adjustment')),
  amount_micro_myr        bigint NOT NULL,
  balance_after_micro_myr bigint NOT NULL,
  description             text NOT NULL,
  api_key_id              text,
  request_id              text,
  payment_transaction_id  text REFERENCES payment_transactions(id),
  -- What the entry applies (a top-up, a dispute, a refunded total): each effect is posted once.
  effect_key              text UNIQUE,
  created_at              timestamptz NOT NULL DEFAULT now(),
  CHECK (type <> 'usage' OR (amount_micro_myr <= 0 AND request_id IS NOT NULL)),
  CHECK (type NOT IN ('topup', 'chargeback_reversal') OR amount_micro_myr > 0),
  CHECK (type NOT IN ('refund', 'chargeback') OR amount_micro_myr < 0)
);
CREATE UNIQUE INDEX ledger_usage_once_idx ON ledger_entries (request_id) WHERE type = 'usage';
CREATE INDEX ledger_account_idx ON ledger_entries (account_id, created_at DESC, id DESC);
CREATE INDEX ledger_account_type_idx ON ledger_entries (account_id, type, created_at DESC);
CREATE INDEX ledger_key_usage_idx ON ledger_entries (api_key_id, created_at) WHERE type = 'usage';

CREATE TABLE webhook_events (
  id           text PRIMARY KEY,
  type         text NOT NULL,
  payload      jsonb NOT NULL,
  received_at  timestamptz NOT NULL DEFAULT now(),
  processed_at timestamptz
);

CREATE TABLE request_logs (
  request_id      text PRIMARY KEY,
  account_id      text NOT NULL REFERENCES accounts(id),
  api_key_id      text NOT NULL,
  reservation_id  text REFERENCES reservations(id),
  public_model    text NOT NULL,
  upstream_model  text,
  routing_category text,
  endpoint        text NOT NULL,
  status          text NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed', 'billed')),
  input_tokens    integer NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
  output_tokens   integer NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
  reasoning_tokens integer NOT NULL DEFAULT 0 CHECK (reasoning_tokens >= 0),
  cached_tokens   integer NOT NULL DEFAULT 0 CHECK (cached_tokens >= 0),
  usage_source    text NOT NULL DEFAULT 'provider' CHECK (usage_source IN ('provider', 'estimated')),
  search_count    integer NOT NULL DEFAULT 0 CHECK (search_count >= 0),
  content_pages   integer NOT NULL DEFAULT 0 CHECK (content_pages >= 0),
  cost_micro_myr  bigint NOT NULL DEFAULT 0 CHECK (cost_micro_myr >= 0),
  latency_ms      integer NOT NULL DEFAULT 0 CHECK (latency_ms >= 0),
  stream          boolean NOT NULL DEFAULT false,
  error_code      text,
  created_at      timestamptz NOT NULL DEFAULT now(),
  completed_at    timestamptz,
  CHECK (status <> 'failed' OR cost_micro_myr = 0)
);
CREATE INDEX request_logs_account_idx ON request_logs (account_id, created_at DESC);
CREATE INDEX request_logs_account_status_idx ON request_logs (account_id, status, created_at DESC);
CREATE INDEX request_logs_key_idx ON request_logs (api_key_id, created_at DESC);

CREATE TABLE idempotency_records (
  api_key_id      text NOT NULL,
  idempotency_key text NOT NULL CHECK (char_length(idempotency_key) BETWEEN 1 AND 255),
  endpoint        text NOT NULL,
  request_hash    bytea NOT NULL,
  request_id      text NOT NULL,
  status          text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'completed')),
  response_status integer,
  response_body   text,
  created_at      timestamptz NOT NULL DEFAULT now(),
  expires_at      timestamptz NOT NULL,
  PRIMARY KEY (api_key_id, idempotency_key),
  CHECK ((status = 'completed') = (response_status IS NOT NULL))
);
CREATE INDEX idempotency_records_expiry_idx ON idempotency_records (expires_at);
`))
