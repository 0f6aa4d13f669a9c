import type { InvitationRecord } from "./Api.js"
import type { InvitationRow } from "./Repo.js"

/** How long an invitation may be accepted. */
export const INVITATION_DAYS = 7

/** Where an invitation is accepted in the dashboard. */
export const invitationUrl = (dashboardUrl: string, id: string) =>
  `${dashboardUrl}/invitations?id=${encodeURIComponent(id)}`

/** An invitation as the dashboard API answers it. */
export const toInvitation = (dashboardUrl: string) => (row: InvitationRow): InvitationRecord => ({
  id: row.id,
  account_id: row.accountId,
  account_name: row.accountName,
  email: row.email,
  role: row.role,
  invited_by_email: row.invitedByEmail,
  created_at: row.createdAt.toISOString(),
  expires_at: row.expiresAt.toISOString(),
  accept_url: invitationUrl(dashboardUrl, row.id)
})
