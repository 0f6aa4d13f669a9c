import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Low-balance alerts and auto top-up settings (docs/api/alerts.md, "Alerts"), on the wallet that
 * `src/Wallet/` owns: the settlement transaction that takes the balance below
 * a threshold reads them under the wallet's lock, so a crossing is seen by
 * exactly one transaction on any number of instances. Auto top-up charges a
 * payment method saved on the account's Stripe customer (`billing_cards`, with
 * the setup sessions that save it in `card_setups`, owned by `src/Billing/`).
 * The settlement transaction queues an attempt in `auto_topups` (owned by
 * `src/Wallet/`, which Billing's worker calls), at most one unfinished per account.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
ALTER TABLE wallets
  ADD COLUMN low_balance_threshold_micro_myr bigint CHECK (low_balance_threshold_micro_myr >= 0),
  ADD COLUMN auto_topup_enabled boolean NOT NULL DEFAULT false,
  ADD COLUMN auto_topup_threshold_micro_myr bigint CHECK (auto_topup_threshold_micro_myr >= 0),
  ADD COLUMN auto_topup_amount_sen integer CHECK (auto_topup_amount_sen > 0),
  ADD COLUMN auto_topup_max_per_day integer NOT NULL DEFAULT 3 CHECK (auto_topup_max_per_day BETWEEN 1 AND 3),
  ADD COLUMN auto_topup_disabled_reason text,
  ADD COLUMN auto_topup_action_url text;

CREATE TABLE auto_topups (
  id                text PRIMARY KEY,
  account_id        text NOT NULL REFERENCES accounts(id),
  amount_sen        integer NOT NULL CHECK (amount_sen > 0),
  status            text NOT NULL CHECK (status IN ('queued', 'charging', 'succeeded', 'failed')),
  payment_intent_id text UNIQUE,
  transaction_id    text,
  failure_code      text,
  claimed_until     timestamptz,
  created_at        timestamptz NOT NULL,
  finished_at       timestamptz
);
-- One attempt unfinished per account, whichever instance saw the crossing.
CREATE UNIQUE INDEX auto_topups_one_in_flight ON auto_topups (account_id) WHERE status IN ('queued', 'charging');
CREATE INDEX auto_topups_account_idx ON auto_topups (account_id, created_at DESC);
CREATE INDEX auto_topups_due_idx ON auto_topups (created_at) WHERE status IN ('queued', 'charging');

-- The expiry a key.expiring event was sent for (owned by src/Keys/): a new expires_at is announced again.
ALTER TABLE api_keys ADD COLUMN expiring_announced_for timestamptz,
  -- The month (YYYY-MM, BUSINESS_TIMEZONE) whose spend limit a key.limit_reached event was sent for.
  ADD COLUMN limit_announced_month text;

CREATE TABLE billing_cards (
  account_id        text PRIMARY KEY REFERENCES accounts(id),
  customer_id       text NOT NULL,
  payment_method_id text,
  brand             text,
  last4             text,
  exp_month         integer,
  exp_year          integer,
  updated_at        timestamptz NOT NULL
);

CREATE TABLE card_setups (
  id         text PRIMARY KEY,
  account_id text NOT NULL REFERENCES accounts(id),
  session_id text UNIQUE,
  status     text NOT NULL CHECK (status IN ('open', 'complete')),
  created_at timestamptz NOT NULL
);
`))
