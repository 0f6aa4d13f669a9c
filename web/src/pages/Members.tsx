import { useEffect, useRef, useState, type FormEvent } from "react"
import { api, type Invitation, type Member, type RemovedMember, type Success } from "../api"
import { accountLabel, useAccounts } from "../accounts"
import { DateTime, Empty, ErrorPanel, Field, Load, PageHeading, SpendOfLimit, useSubmission } from "../components"
import { ROLE_DUTIES, ROLES, grantableRoles, mayChangeMember, mayRemoveMember, neededRoles, type Role } from "../roles"
import { useApi, useSession, type Loadable } from "../session"

const who = (member: Member): string => member.name ?? member.email ?? member.id

/** Micro-MYR as the MYR an input shows, exact. */
const microToMyrInput = (micro: number | null): string => micro === null ? "" : String(micro / 1_000_000)

/** A modal dialog opened on mount: it traps focus, and Escape cancels. */
const useModal = () => {
  const dialog = useRef<HTMLDialogElement>(null)
  useEffect(() => {
    dialog.current?.showModal()
  }, [])
  return dialog
}

const RoleSelect = ({ roles, value, onChange, label }: { roles: ReadonlyArray<Role>; value: Role; onChange: (role: Role) => void; label: string }) => (
  <Field label={label} hint={ROLE_DUTIES[value]}>
    {(props) => (
      <select {...props} value={value} onChange={(e) => onChange(roles.find((role) => role === e.target.value) ?? value)}>
        {roles.map((role) => <option key={role} value={role}>{role}</option>)}
      </select>
    )}
  </Field>
)

const InviteForm = ({ roles, onInvited }: { roles: ReadonlyArray<Role>; onInvited: () => void }) => {
  const { caller } = useSession()
  const [email, setEmail] = useState("")
  const [role, setRole] = useState<Role>(roles.includes("developer") ? "developer" : roles[0] ?? "viewer")
  const [sent, setSent] = useState<Invitation | null>(null)
  const { busy, error, submit } = useSubmission()
  const invite = (event: FormEvent) => {
    event.preventDefault()
    void submit(async () => {
      setSent(await api("POST /dashboard/members/invitations", { caller, json: { email, role } }))
      setEmail("")
      onInvited()
    })
  }
  return (
    <form className="card" onSubmit={invite} aria-labelledby="invite-heading">
      <h2 id="invite-heading">Invite someone</h2>
      <p className="note">They get an email with a link, valid 7 days; they accept after signing in with that address.</p>
      {error === null ? null : <ErrorPanel error={error} />}
      <div className="form-grid">
        <Field label="Email address">
          {(props) => <input {...props} type="email" required maxLength={254} autoComplete="off" value={email} onChange={(e) => setEmail(e.target.value)} />}
        </Field>
        <RoleSelect label="Role" roles={roles} value={role} onChange={setRole} />
      </div>
      <button type="submit" disabled={busy}>{busy ? "Inviting…" : "Send invitation"}</button>
      {sent === null ? null : (
        <p role="status" className="note">
          Invited {sent.email} as {sent.role}; the link (also in the email) is <code>{sent.accept_url}</code>, until <DateTime iso={sent.expires_at} />.
        </p>
      )}
    </form>
  )
}

/** Changes a member's role or monthly budget; only what was changed is sent. */
const ChangeMember = ({ member, roles, onClose, onSaved }: {
  member: Member
  roles: ReadonlyArray<Role>
  onClose: () => void
  onSaved: (member: Member) => void
}) => {
  const { caller } = useSession()
  const dialog = useModal()
  const initialBudget = microToMyrInput(member.monthly_spend_limit_micro_myr)
  const [role, setRole] = useState<Role>(member.role)
  const [budget, setBudget] = useState(initialBudget)
  const { busy, error, submit } = useSubmission()
  const save = (event: FormEvent) => {
    event.preventDefault()
    void submit(async () => {
      const changedBudget = budget.trim() !== initialBudget
      onSaved(await api("PATCH /dashboard/members/{id}", {
        caller,
        path: { id: member.id },
        json: {
          ...(role === member.role ? {} : { role }),
          ...(changedBudget ? { monthly_spend_limit_myr: budget.trim() === "" ? null : Number(budget) } : {})
        }
      }))
    })
  }
  return (
    <dialog ref={dialog} className="dialog" aria-labelledby="change-heading" onCancel={onClose}>
      <h2 id="change-heading">Change {who(member)}</h2>
      <form onSubmit={save}>
        {error === null ? null : <ErrorPanel error={error} />}
        <div className="form-grid">
          <RoleSelect label="Role" roles={roles.includes(member.role) ? roles : [member.role, ...roles]} value={role} onChange={setRole} />
          <Field label="Monthly budget (RM)" hint="Caps what all their keys spend this month; empty: no budget.">
            {(props) => <input {...props} type="number" min={0} step="any" inputMode="decimal" value={budget} onChange={(e) => setBudget(e.target.value)} />}
          </Field>
        </div>
        <div className="actions">
          <button type="button" className="quiet" onClick={onClose}>Cancel</button>
          <button type="submit" disabled={busy}>{busy ? "Saving…" : "Save changes"}</button>
        </div>
      </form>
    </dialog>
  )
}

/** Removes a member: their keys are disabled, or given to another member. */
const RemoveMember = ({ member, others, onClose, onRemoved }: {
  member: Member
  others: ReadonlyArray<Member>
  onClose: () => void
  onRemoved: (removed: RemovedMember) => void
}) => {
  const { caller } = useSession()
  const dialog = useModal()
  const [keys, setKeys] = useState<"disable" | "transfer">("disable")
  const [to, setTo] = useState(others[0]?.id ?? "")
  const { busy, error, submit } = useSubmission()
  const remove = () =>
    submit(async () =>
      onRemoved(await api("DELETE /dashboard/members/{id}", {
        caller,
        path: { id: member.id },
        query: { transfer_keys_to: keys === "transfer" ? to : undefined }
      }))
    )
  return (
    <dialog ref={dialog} className="dialog" aria-labelledby="remove-heading" aria-describedby="remove-text" onCancel={onClose}>
      <h2 id="remove-heading">Remove {who(member)}?</h2>
      <p id="remove-text">
        They lose access to this account at once. {member.key_count === 0
          ? "They have no keys here."
          : `Their ${member.key_count === 1 ? "key" : `${member.key_count} keys`} stop working within a second, or go to another member:`}
      </p>
      {member.key_count === 0 ? null : (
        <fieldset>
          <legend>Their keys</legend>
          <label className="check">
            <input type="radio" name="keys" checked={keys === "disable"} onChange={() => setKeys("disable")} /> Disable their keys
          </label>
          <label className="check">
            <input type="radio" name="keys" checked={keys === "transfer"} disabled={others.length === 0} onChange={() => setKeys("transfer")} /> Give them to another member
          </label>
          {keys === "transfer"
            ? (
              <Field label="Give the keys to">
                {(props) => (
                  <select {...props} value={to} onChange={(e) => setTo(e.target.value)}>
                    {others.map((other) => <option key={other.id} value={other.id}>{who(other)} ({other.role})</option>)}
                  </select>
                )}
              </Field>
            )
            : null}
        </fieldset>
      )}
      {error === null ? null : <ErrorPanel error={error} />}
      <div className="actions">
        <button type="button" className="quiet" onClick={onClose} autoFocus>Cancel</button>
        <button type="button" className="danger" onClick={() => void remove()} disabled={busy || (keys === "transfer" && to === "")}>
          {busy ? "Removing…" : "Remove member"}
        </button>
      </div>
    </dialog>
  )
}

const OpenInvitations = ({ list, reload, revocable }: {
  list: Loadable<Success<"GET /dashboard/members/invitations">>
  reload: () => void
  revocable: boolean
}) => {
  const { caller } = useSession()
  const { error, submit } = useSubmission()
  const revoke = (invitation: Invitation) =>
    submit(async () => {
      await api("DELETE /dashboard/members/invitations/{id}", { caller, path: { id: invitation.id } })
      reload()
    })
  return (
    <section aria-labelledby="invitations-heading">
      <h2 id="invitations-heading">Open invitations</h2>
      {error === null ? null : <ErrorPanel error={error} />}
      <Load value={list} what="the invitations" retry={reload}>
        {(data) => data.invitations.length === 0 ? <Empty>No open invitations.</Empty> : (
          <div className="table-wrap">
            <table className="stack">
              <thead>
                <tr>
                  <th scope="col">Email</th><th scope="col">Role</th><th scope="col">Invited by</th><th scope="col">Expires</th>
                  {revocable ? <th scope="col"><span className="visually-hidden">Actions</span></th> : null}
                </tr>
              </thead>
              <tbody>
                {data.invitations.map((invitation) => (
                  <tr key={invitation.id}>
                    <th scope="row">{invitation.email}</th>
                    <td data-label="Role">{invitation.role}</td>
                    <td data-label="Invited by">{invitation.invited_by_email ?? "—"}</td>
                    <td data-label="Expires"><DateTime iso={invitation.expires_at} /></td>
                    {revocable
                      ? (
                        <td className="row-actions">
                          <button type="button" className="danger small" onClick={() => void revoke(invitation)} aria-label={`Revoke the invitation of ${invitation.email}`}>Revoke</button>
                        </td>
                      )
                      : null}
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )}
      </Load>
    </section>
  )
}

export const MembersPage = () => {
  const accounts = useAccounts()
  const { role, current, can } = accounts
  const [members, reloadMembers] = useApi("GET /dashboard/members")
  const [invitations, reloadInvitations] = useApi("GET /dashboard/members/invitations")
  const reload = () => {
    reloadMembers()
    reloadInvitations()
  }
  const [changing, setChanging] = useState<Member | null>(null)
  const [removing, setRemoving] = useState<Member | null>(null)
  const [removed, setRemoved] = useState<string | null>(null)
  const grantable = grantableRoles(role)
  return (
    <>
      <PageHeading title="Members">
        <button type="button" className="quiet" onClick={reload}>Refresh</button>
      </PageHeading>
      <p className="note">
        The people of <strong>{accountLabel(current)}</strong>: they share its balance and keys, each with a role.
        {grantable.length === 0 ? ` Inviting and changing members needs the role ${neededRoles("PATCH /dashboard/members/{id}")}.` : ""}
      </p>
      {grantable.length === 0 ? null : <InviteForm roles={grantable} onInvited={reloadInvitations} />}
      {removed === null ? null : (
        <div className="notice success" role="status">
          <p>{removed}</p>
          <button type="button" className="quiet small" onClick={() => setRemoved(null)}>Dismiss</button>
        </div>
      )}
      <section aria-labelledby="members-heading">
        <h2 id="members-heading">Members</h2>
        <Load value={members} what="the members" retry={reloadMembers}>
          {(data) => (
            <div className="table-wrap">
              <table className="members stack">
                <thead>
                  <tr>
                    <th scope="col">Member</th><th scope="col">Role</th><th scope="col">Spent this month</th>
                    <th scope="col" className="num">Keys</th><th scope="col">Joined</th>
                    <th scope="col"><span className="visually-hidden">Actions</span></th>
                  </tr>
                </thead>
                <tbody>
                  {data.members.map((member) => (
                    <tr key={member.id}>
                      <th scope="row">
                        {who(member)}{member.you ? <span className="muted"> (you)</span> : null}
                        {member.name !== null && member.email !== null ? <div className="note">{member.email}</div> : null}
                      </th>
                      <td data-label="Role"><span className={`badge role role-${member.role}`}>{member.role}</span></td>
                      <td data-label="Spent this month">
                        <SpendOfLimit spent={member.month_to_date_spend_micro_myr} limit={member.monthly_spend_limit_micro_myr} what="monthly budget" />
                      </td>
                      <td data-label="Keys" className="num">{member.key_count}</td>
                      <td data-label="Joined"><DateTime iso={member.created_at} /></td>
                      <td className="row-actions">
                        {mayChangeMember(role, member.role)
                          ? <button type="button" className="small" onClick={() => setChanging(member)} aria-label={`Change ${who(member)}`}>Change</button>
                          : null}
                        {!member.you && mayRemoveMember(role, member.role)
                          ? <button type="button" className="danger small" onClick={() => setRemoving(member)} aria-label={`Remove ${who(member)}`}>Remove</button>
                          : null}
                      </td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )}
        </Load>
      </section>
      <OpenInvitations list={invitations} reload={reloadInvitations} revocable={can("DELETE /dashboard/members/invitations/{id}")} />
      <details className="card roles">
        <summary>What each role may do</summary>
        <dl className="details">
          {ROLES.map((one) => <div key={one}><dt>{one}</dt><dd>{ROLE_DUTIES[one]}</dd></div>)}
        </dl>
      </details>
      {changing === null ? null : (
        <ChangeMember member={changing} roles={grantable} onClose={() => setChanging(null)} onSaved={(member) => {
          setChanging(null)
          reload()
          // A change of one's own role changes what this dashboard offers.
          if (member.you) accounts.reload()
        }} />
      )}
      {removing === null ? null : (
        <RemoveMember member={removing} others={(members.data?.members ?? []).filter((m) => m.id !== removing.id)}
          onClose={() => setRemoving(null)} onRemoved={(result) => {
            setRemoving(null)
            setRemoved(`${who(removing)} was removed; ${
              result.keys_transferred.length > 0
                ? `${result.keys_transferred.length} of their keys were given to another member.`
                : `${result.keys_disabled.length} of their keys were disabled.`
            }`)
            reload()
          }} />
      )}
    </>
  )
}
