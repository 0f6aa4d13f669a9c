import { useState } from "react"
import { useNavigate, useSearchParams } from "react-router"
import { api, type AccountSummary, type Invitation } from "../api"
import { personally, useAccounts } from "../accounts"
import { DateTime, Empty, ErrorPanel, Load, PageHeading, useSubmission } from "../components"
import { ROLE_DUTIES } from "../roles"
import { tokenClaims, useApi, useSession } from "../session"

/** The inviting account by its name, else by who invited (an account named by no one has only its id). */
const accountOf = (invitation: Invitation): string =>
  invitation.account_name ?? (invitation.invited_by_email === null ? invitation.account_id : `the account of ${invitation.invited_by_email}`)

const InvitationCard = ({ invitation, linked, onAccepted }: {
  invitation: Invitation
  linked: boolean
  onAccepted: (account: AccountSummary) => void
}) => {
  const { caller } = useSession()
  const { busy, error, submit } = useSubmission()
  const accept = () =>
    submit(async () => {
      const { account } = await api("POST /dashboard/invitations/{id}/accept", { caller: personally(caller), path: { id: invitation.id } })
      onAccepted(account)
    })
  return (
    <article className={linked ? "card invitation linked" : "card invitation"} aria-label={`Invitation to ${accountOf(invitation)}`}>
      <h2>Join {accountOf(invitation)} as {invitation.role}</h2>
      <p>
        {invitation.invited_by_email ?? "A member"} invited {invitation.email}. {invitation.role === "admin" || invitation.role === "owner" ? "An" : "A"}{" "}
        {invitation.role} {ROLE_DUTIES[invitation.role]}.
      </p>
      <p className="note">Sent <DateTime iso={invitation.created_at} />; it can be accepted until <DateTime iso={invitation.expires_at} />.</p>
      {error === null ? null : <ErrorPanel error={error} />}
      <button type="button" onClick={() => void accept()} disabled={busy}>{busy ? "Accepting…" : "Accept invitation"}</button>
    </article>
  )
}

/** Invitations to the signed-in person's email, from any account; the email's link opens this with `?id=`. */
export const InvitationsPage = () => {
  const { caller, token } = useSession()
  const accounts = useAccounts()
  const navigate = useNavigate()
  const [params] = useSearchParams()
  const linkedId = params.get("id")
  const [list, reload] = useApi("GET /dashboard/invitations", { caller: personally(caller) })
  const [joined, setJoined] = useState<AccountSummary | null>(null)
  const email = token === null ? null : tokenClaims(token)?.["email"]
  const listed = accounts.accounts.some((account) => account.id === joined?.id)
  return (
    <>
      <PageHeading title="Your invitations">
        <button type="button" className="quiet" onClick={reload}>Refresh</button>
      </PageHeading>
      {joined === null ? null : (
        <div className="notice success" role="status">
          <p>You joined <strong>{joined.name ?? joined.id}</strong> as {joined.role}. Choose it in the account menu at the top to work in it.</p>
          <button type="button" className="small" disabled={!listed} onClick={() => {
            accounts.choose(joined.id)
            navigate("/")
          }}>Switch to {joined.name ?? joined.id}</button>
        </div>
      )}
      <Load value={list} what="your invitations" retry={reload}>
        {(data) => {
          const linked = linkedId === null ? undefined : data.invitations.find((invitation) => invitation.id === linkedId)
          const rest = data.invitations.filter((invitation) => invitation !== linked)
          return (
            <>
              {linkedId !== null && linked === undefined && joined === null
                ? (
                  <div className="error" role="alert">
                    <p className="error-message"><strong>The invitation in this link is not open for {typeof email === "string" ? email : "you"}.</strong></p>
                    <p className="error-guidance">
                      It may have been accepted, revoked or expired (they last 7 days), or sent to another email address:
                      sign in with the address it was sent to, or ask the account's owner or admin for a new one.
                    </p>
                  </div>
                )
                : null}
              {linked === undefined ? null : <InvitationCard invitation={linked} linked onAccepted={(account) => {
                setJoined(account)
                reload()
                accounts.reload()
                accounts.reloadInvitations()
              }} />}
              {rest.length === 0 && linked === undefined
                ? <Empty>No open invitations to {typeof email === "string" ? email : "your email address"}.</Empty>
                : rest.map((invitation) => (
                  <InvitationCard key={invitation.id} invitation={invitation} linked={false} onAccepted={(account) => {
                    setJoined(account)
                    reload()
                    accounts.reload()
                    accounts.reloadInvitations()
                  }} />
                ))}
            </>
          )
        }}
      </Load>
    </>
  )
}
