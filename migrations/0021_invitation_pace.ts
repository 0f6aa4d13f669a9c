import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Invitations an account sends a day are bounded (each is an email we send to
 * an address the caller chose, and revoking one frees its place among the open
 * ones): they are counted by account and time, revoked and accepted included.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
CREATE INDEX invitations_account_created ON invitations (account_id, created_at);
`))
