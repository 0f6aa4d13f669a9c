import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Teams (docs/api/teams.md, "Teams"): an account is one wallet shared by its members,
 * each an identity (issuer and subject) with a role and an optional monthly
 * budget. Every existing account gets its signed-in developer as its owner;
 * every existing key is recorded as that owner's. Invitations are by email,
 * kept 7 days; the audit log keeps who changed what, from where, for a year.
 *
 * A change to a member (its role, budget or removal) announces its account on
 * `nenas_keys`, as a suspension does, so every instance forgets the account's
 * keys and reads their member's budget again within moments.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
CREATE TABLE members (
  id                            text PRIMARY KEY,
  account_id                    text NOT NULL REFERENCES accounts(id),
  -- NULL for the owner of an account made before issuers were recorded, until its first sign-in claims it.
  issuer                        text,
  subject                       text NOT NULL,
  email                         text,
  name                          text,
  role                          text NOT NULL CHECK (role IN ('owner', 'admin', 'developer', 'billing', 'viewer')),
  monthly_spend_limit_micro_myr bigint CHECK (monthly_spend_limit_micro_myr >= 0),
  created_at                    timestamptz NOT NULL DEFAULT now(),
  removed_at                    timestamptz
);
CREATE UNIQUE INDEX members_identity ON members (account_id, issuer, subject) WHERE removed_at IS NULL;
CREATE INDEX members_of_identity ON members (issuer, subject) WHERE removed_at IS NULL;

INSERT INTO members (id, account_id, issuer, subject, email, name, role, created_at)
  SELECT 'mem_' || id, id, issuer, subject, email, name, 'owner', created_at FROM accounts;

ALTER TABLE api_keys ADD COLUMN member_id text REFERENCES members(id);
UPDATE api_keys SET member_id = 'mem_' || account_id;
CREATE INDEX api_keys_member_idx ON api_keys (member_id);
-- A deleted key's spend this month still counts toward its member's budget.
ALTER TABLE api_key_tombstones ADD COLUMN member_id text;
UPDATE api_key_tombstones t SET member_id = 'mem_' || t.account_id;

CREATE FUNCTION nenas_notify_member() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('nenas_keys', 'account:' || NEW.account_id);
  RETURN NULL;
END
$$;
CREATE TRIGGER members_notify AFTER UPDATE ON members
  FOR EACH ROW
  WHEN (OLD.role IS DISTINCT FROM NEW.role
    OR OLD.monthly_spend_limit_micro_myr IS DISTINCT FROM NEW.monthly_spend_limit_micro_myr
    OR OLD.removed_at IS DISTINCT FROM NEW.removed_at)
  EXECUTE FUNCTION nenas_notify_member();

CREATE TABLE invitations (
  id          text PRIMARY KEY,
  account_id  text NOT NULL REFERENCES accounts(id),
  -- Lower-cased: accepted by a signed-in identity with this email, in any case.
  email       text NOT NULL CHECK (email = lower(email)),
  role        text NOT NULL CHECK (role IN ('owner', 'admin', 'developer', 'billing', 'viewer')),
  invited_by  text REFERENCES members(id),
  created_at  timestamptz NOT NULL DEFAULT now(),
  expires_at  timestamptz NOT NULL,
  accepted_at timestamptz,
  accepted_by text REFERENCES members(id),
  revoked_at  timestamptz,
  CHECK (accepted_at IS NULL OR revoked_at IS NULL),
  CHECK ((accepted_at IS NULL) = (accepted_by IS NULL))
);
-- One open invitation per account and email; an expired one is revoked before another is made.
CREATE UNIQUE INDEX invitations_open ON invitations (account_id, email) WHERE accepted_at IS NULL AND revoked_at IS NULL;
CREATE INDEX invitations_email ON invitations (email) WHERE accepted_at IS NULL AND revoked_at IS NULL;

CREATE TABLE audit_log (
  id             text PRIMARY KEY,
  account_id     text NOT NULL REFERENCES accounts(id),
  -- Who: the member (NULL for the service itself, such as a card saved by Stripe's event).
  member_id      text,
  actor_email    text,
  action         text NOT NULL,
  target_type    text NOT NULL,
  target_id      text,
  details        jsonb NOT NULL DEFAULT '{}'::jsonb,
  client_address text,
  request_id     text,
  created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_log_account_idx ON audit_log (account_id, created_at DESC, id DESC);
CREATE INDEX audit_log_created_idx ON audit_log (created_at);
`))
