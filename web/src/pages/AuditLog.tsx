import { useState } from "react"
import { AUDIT_ACTIONS, download, type AuditAction, type AuditEntry } from "../api"
import { DateTime, Empty, Field, Load, PageHeading, Pager } from "../components"
import { ExportButton } from "../ExportButton"
import { formatCount, fromLocalInput } from "../format"
import { useApi } from "../session"

const PAGE_SIZE = 25

const ACTION_LABELS: Record<AuditAction, string> = {
  "api_key.created": "Key created",
  "api_key.updated": "Key changed",
  "api_key.rotated": "Key rotated",
  "api_key.deleted": "Key deleted",
  "member.invited": "Member invited",
  "member.invitation_revoked": "Invitation revoked",
  "member.joined": "Member joined",
  "member.updated": "Member changed",
  "member.removed": "Member removed",
  "billing.settings_updated": "Billing settings changed",
  "billing.card_setup_started": "Card setup started",
  "billing.card_saved": "Card saved",
  "billing.card_removed": "Card removed",
  "webhook.created": "Webhook created",
  "webhook.updated": "Webhook changed",
  "webhook.deleted": "Webhook deleted",
  "webhook.secret_rotated": "Webhook secret rotated",
  "webhook.disabled": "Webhook disabled",
  "webhook.test_sent": "Webhook test sent",
  "webhook.delivery_resent": "Webhook delivery resent",
  "billing.checkout_created": "Checkout started",
  "usage.grouping_tags_updated": "Grouping tags changed",
  "response.deleted": "Stored response deleted",
  "billing.profile_updated": "Billing profile changed",
  "guardrails.updated": "Guardrails changed",
  "billing.e_invoice_resubmitted": "E-invoice resubmitted",
  "provider_key.created": "Provider key added",
  "provider_key.updated": "Provider key changed",
  "provider_key.deleted": "Provider key deleted"
}

const isChange = (value: unknown): value is { from: unknown; to: unknown } =>
  typeof value === "object" && value !== null && "from" in value && "to" in value && Object.keys(value).length === 2

const shown = (value: unknown): string =>
  value === null ? "none" : typeof value === "string" ? value : JSON.stringify(value)

/** What changed, a line a field: `role: developer → admin`. */
const Details = ({ details }: { details: AuditEntry["details"] }) => {
  const fields = Object.entries(details)
  if (fields.length === 0) return <span className="muted">—</span>
  return (
    <ul className="audit-details">
      {fields.map(([name, value]) => (
        <li key={name}><span className="muted">{name}:</span> {isChange(value) ? `${shown(value.from)} → ${shown(value.to)}` : shown(value)}</li>
      ))}
    </ul>
  )
}

export const AuditLogPage = () => {
  const [action, setAction] = useState<AuditAction | "">("")
  const [memberId, setMemberId] = useState("")
  const [from, setFrom] = useState("")
  const [to, setTo] = useState("")
  const [page, setPage] = useState(1)
  const [members] = useApi("GET /dashboard/members")
  const filters = {
    action: action === "" ? undefined : action,
    member_id: memberId === "" ? undefined : memberId,
    from: fromLocalInput(from),
    to: fromLocalInput(to)
  }
  const [entries, reload] = useApi("GET /dashboard/audit-log", { query: { page: String(page), limit: String(PAGE_SIZE), ...filters } })
  // Every filter change starts again at the first page.
  const filter = <A,>(set: (value: A) => void) => (value: A) => {
    set(value)
    setPage(1)
  }
  const filtered = action !== "" || memberId !== "" || from !== "" || to !== ""

  return (
    <>
      <PageHeading title="Audit log">
        <button type="button" className="quiet" onClick={reload}>Refresh</button>
        <ExportButton save={(caller) => download("GET /dashboard/audit-log/export", { caller, query: { ...filters, format: "csv" } }, "nenas-audit-log.csv")} />
      </PageHeading>
      <p className="note">Who changed keys, members, billing settings, the card and webhooks: when, and from which address. Kept one year.</p>
      <form className="filters" aria-label="Filter the audit log" onSubmit={(e) => e.preventDefault()}>
        <Field label="Action">
          {(props) => (
            <select {...props} value={action} onChange={(e) => filter(setAction)(AUDIT_ACTIONS.find((one) => one === e.target.value) ?? "")}>
              <option value="">Any</option>
              {AUDIT_ACTIONS.map((one) => <option key={one} value={one}>{ACTION_LABELS[one]}</option>)}
            </select>
          )}
        </Field>
        <Field label="Member">
          {(props) => (
            <select {...props} value={memberId} onChange={(e) => filter(setMemberId)(e.target.value)}>
              <option value="">Anyone</option>
              {(members.data?.members ?? []).map((member) => (
                <option key={member.id} value={member.id}>{member.name ?? member.email ?? member.id}</option>
              ))}
            </select>
          )}
        </Field>
        <Field label="From" hint="Your time zone">
          {(props) => <input {...props} type="datetime-local" value={from} onChange={(e) => filter(setFrom)(e.target.value)} />}
        </Field>
        <Field label="To" hint="Your time zone">
          {(props) => <input {...props} type="datetime-local" value={to} onChange={(e) => filter(setTo)(e.target.value)} />}
        </Field>
      </form>
      <Load value={entries} what="the audit log" retry={reload}>
        {(data) => (
          <>
            {data.entries.length === 0
              ? <Empty>{filtered ? "No entries match these filters." : page > 1 ? "No more entries." : "No changes recorded yet."}</Empty>
              : (
                <div className="table-wrap">
                  <table className="audit stack">
                    <thead>
                      <tr>
                        <th scope="col">When</th><th scope="col">Who</th><th scope="col">What</th><th scope="col">Target</th>
                        <th scope="col">Details</th><th scope="col">From</th>
                      </tr>
                    </thead>
                    <tbody>
                      {data.entries.map((entry) => (
                        <tr key={entry.id}>
                          <td data-label="When"><DateTime iso={entry.created_at} /></td>
                          <td data-label="Who">{entry.actor_email ?? (entry.member_id === null ? "the service" : <code>{entry.member_id}</code>)}</td>
                          <td data-label="What"><span data-action={entry.action}>{ACTION_LABELS[entry.action]}</span></td>
                          <td data-label="Target">{entry.target_id === null ? entry.target_type : <code>{entry.target_id}</code>}</td>
                          <td data-label="Details"><Details details={entry.details} /></td>
                          <td data-label="From">
                            <div>
                              {entry.client_address ?? "—"}
                              {entry.request_id === null ? null : <div className="note"><code>{entry.request_id}</code></div>}
                            </div>
                          </td>
                        </tr>
                      ))}
                    </tbody>
                  </table>
                </div>
              )}
            <Pager page={page} hasMore={data.has_more} onPage={setPage} summary={`${formatCount(data.total)} entries`} />
          </>
        )}
      </Load>
    </>
  )
}
