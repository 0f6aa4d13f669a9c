import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Accounts are keyed by the token's issuer and subject: with a JWKS shared by
 * several applications or tenants, one `sub` can name different people.
 * Existing accounts keep their rows with a NULL issuer (they were made when the
 * issuer was not recorded, and a development key cannot be told from a real one
 * by its row); the first verified sign-in with the same subject, from the
 * identity provider configured then, claims the row (`AccountsRepo.signIn`).
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
ALTER TABLE accounts ADD COLUMN issuer text;
ALTER TABLE accounts DROP CONSTRAINT accounts_subject_key;
CREATE UNIQUE INDEX accounts_issuer_subject ON accounts (issuer, subject);
-- One unclaimed row per subject, as before; found by subject when it is claimed.
CREATE UNIQUE INDEX accounts_unclaimed_subject ON accounts (subject) WHERE issuer IS NULL;
`))
