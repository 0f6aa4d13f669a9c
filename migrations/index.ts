import initial from "./0001_initial.js"
import payments from "./0002_payments.js"
import settlement from "./0003_settlement.js"
import keyNotify from "./0004_key_notify.js"
import creditGrants from "./0005_credit_grants.js"
import settlementParked from "./0006_settlement_parked.js"
import accountsIssuer from "./0007_accounts_issuer.js"
import keyManagement from "./0008_key_management.js"
import keyGrantHolds from "./0009_key_grant_holds.js"
import storedResponses from "./0010_stored_responses.js"
import usageRollups from "./0011_usage_rollups.js"
import tagRollups from "./0012_tag_rollups.js"
import webhooks from "./0013_webhooks.js"
import balanceAlerts from "./0014_balance_alerts.js"
import upstreamAttempts from "./0015_upstream_attempts.js"
import storedResponseBounds from "./0016_stored_response_bounds.js"
import webhookFairness from "./0017_webhook_fairness.js"
import keyIdNotify from "./0018_key_id_notify.js"
import teams from "./0019_teams.js"
import memberBudgets from "./0020_member_budgets.js"
import invitationPace from "./0021_invitation_pace.js"
import keyControls from "./0022_key_controls.js"
import webhookCreators from "./0023_webhook_creators.js"
import invoices from "./0024_invoices.js"
import guardrails from "./0025_guardrails.js"
import eInvoices from "./0026_e_invoices.js"
import responseCache from "./0027_response_cache.js"
import providerKeys from "./0028_provider_keys.js"
import ownKeyCalls from "./0029_own_key_calls.js"

/**
 * Every migration, by `NNNN_name`, applied in order at start-up. A static
 * record (not a directory read) so that compiled `dist/`, tsx and vitest load
 * the same files; a test checks that every file in this folder is listed.
 */
export const migrations = {
  "0001_initial": initial,
  "0002_payments": payments,
  "0003_settlement": settlement,
  "0004_key_notify": keyNotify,
  "0005_credit_grants": creditGrants,
  "0006_settlement_parked": settlementParked,
  "0007_accounts_issuer": accountsIssuer,
  "0008_key_management": keyManagement,
  "0009_key_grant_holds": keyGrantHolds,
  "0010_stored_responses": storedResponses,
  "0011_usage_rollups": usageRollups,
  "0012_tag_rollups": tagRollups,
  "0013_webhooks": webhooks,
  "0014_balance_alerts": balanceAlerts,
  "0015_upstream_attempts": upstreamAttempts,
  "0016_stored_response_bounds": storedResponseBounds,
  "0017_webhook_fairness": webhookFairness,
  "0018_key_id_notify": keyIdNotify,
  "0019_teams": teams,
  "0020_member_budgets": memberBudgets,
  "0021_invitation_pace": invitationPace,
  "0022_key_controls": keyControls,
  "0023_webhook_creators": webhookCreators,
  "0024_invoices": invoices,
  "0025_guardrails": guardrails,
  "0026_e_invoices": eInvoices,
  "0027_response_cache": responseCache,
  "0028_provider_keys": providerKeys,
  "0029_own_key_calls": ownKeyCalls
}
