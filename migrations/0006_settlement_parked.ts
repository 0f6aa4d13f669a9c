import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Settlement that cannot be poisoned (docs/money.md, "Parking and replay"): a settlement the
 * database keeps refusing is parked here, with its error, and the queue flows
 * on; `npm run settlement:replay` writes it once it can succeed. What a grant
 * hands back carries a number, so a hand-back retried after a commit whose
 * answer was lost is recognised and written once.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
ALTER TABLE credit_grants ADD COLUMN returned_seq bigint NOT NULL DEFAULT 0;

CREATE TABLE settlement_parked (
  id              text PRIMARY KEY,
  request_id      text NOT NULL,
  account_id      text,
  kind            text NOT NULL CHECK (kind IN ('Capture', 'Release', 'GrantCharge', 'Log')),
  -- The settlement as the queue held it (values already clamped): { item?, log? }.
  item            jsonb NOT NULL,
  error           text NOT NULL,
  attempts        integer NOT NULL CHECK (attempts > 0),
  holder          text NOT NULL,
  first_failed_at timestamptz NOT NULL,
  last_failed_at  timestamptz NOT NULL,
  status          text NOT NULL DEFAULT 'parked' CHECK (status IN ('parked', 'replayed')),
  replayed_at     timestamptz
);
CREATE INDEX settlement_parked_waiting_idx ON settlement_parked (first_failed_at) WHERE status = 'parked';
CREATE INDEX settlement_parked_request_idx ON settlement_parked (request_id);
`))
