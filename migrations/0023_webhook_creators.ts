import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Who made each webhook endpoint (docs/api/teams.md, "Webhooks and members"): an endpoint whose maker is
 * removed from the account is disabled and flagged (`creator_removed_at`) until an owner or admin enables it
 * again. Endpoints made before this take their maker from the audit log's `webhook.created` entry, when it
 * has one.
 */
export default Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.unsafe(`
ALTER TABLE webhook_endpoints ADD COLUMN created_by_member_id text;
ALTER TABLE webhook_endpoints ADD COLUMN creator_removed_at timestamptz;
UPDATE webhook_endpoints e SET created_by_member_id = a.member_id
  FROM audit_log a
  WHERE a.action = 'webhook.created' AND a.target_id = e.id AND a.account_id = e.account_id AND a.member_id IS NOT NULL;
CREATE INDEX webhook_endpoints_created_by ON webhook_endpoints (account_id, created_by_member_id)
  WHERE created_by_member_id IS NOT NULL;
`))
