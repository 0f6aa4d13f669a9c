import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Stored responses (OpenAI's Responses API state:
 * docs/api/models.md, "Stored responses"): one row per `/v1/responses` call
 * made with `store` (the default), written by the settlement flush in the
 * billing transaction. `body` is the answer, its input items and its
 * instructions as deflated JSON (content never sits in plain columns a log or
 * metric could pick up); `previous_response_id` links a conversation's turns.
 * The id is the call's request id with `resp_` for `req_`, so a request log
 * finds its response without a column of its own. Rows live 30 days
 * (`expires_at`) and are deleted in batches.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
CREATE TABLE stored_responses (
  id text PRIMARY KEY,
  account_id text NOT NULL,
  api_key_id text NOT NULL,
  previous_response_id text,
  body bytea NOT NULL,
  created_at timestamptz NOT NULL,
  expires_at timestamptz NOT NULL
);
CREATE INDEX stored_responses_expires_idx ON stored_responses (expires_at);
`))
