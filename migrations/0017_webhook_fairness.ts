import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Fair webhook delivery (docs/api/alerts.md, "Fairness of webhook deliveries"):
 * deliveries in flight (claimed, not yet recorded) are counted per endpoint and
 * per account at every claim, so they get their own index;
 * `webhook_send_windows` counts each account's test events and resends in a
 * fixed one-minute window, shared by every instance.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
CREATE INDEX webhook_deliveries_in_flight_idx ON webhook_deliveries (endpoint_id, claimed_until)
  WHERE status = 'pending' AND claimed_until IS NOT NULL;

CREATE TABLE webhook_send_windows (
  account_id   text PRIMARY KEY REFERENCES accounts(id) ON DELETE CASCADE,
  window_start timestamptz NOT NULL,
  sends        integer NOT NULL
);
`))
