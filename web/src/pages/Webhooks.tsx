import { useState } from "react"
import { ApiError, api, WEBHOOK_EVENTS, type CreatedWebhook, type WebhookEndpoint, type WebhookEventType } from "../api"
import { useAccounts } from "../accounts"
import { DateTime, Empty, ErrorPanel, Field, Load, PageHeading } from "../components"
import { neededRoles } from "../roles"
import { useApi, useSession } from "../session"

const Deliveries = ({ endpoint }: { endpoint: WebhookEndpoint }) => {
  const { caller } = useSession()
  const { can } = useAccounts()
  const resendable = can("POST /dashboard/webhooks/{id}/deliveries/{delivery_id}/resend")
  const [list, reload] = useApi("GET /dashboard/webhooks/{id}/deliveries", { path: { id: endpoint.id } })
  const resend = async (id: string) => {
    await api("POST /dashboard/webhooks/{id}/deliveries/{delivery_id}/resend", { caller, path: { id: endpoint.id, delivery_id: id } })
    reload()
  }
  return (
    <Load value={list} what="deliveries" retry={reload}>
      {(data) => data.deliveries.length === 0 ? <Empty>No deliveries yet.</Empty> : (
        <table aria-label={`Deliveries to ${endpoint.url}`}>
          <thead><tr><th>Event</th><th>Status</th><th>Attempts</th><th>Last answer</th><th>Created</th>{resendable ? <th /> : null}</tr></thead>
          <tbody>
            {data.deliveries.map((d) => {
              const last = d.attempt_log[d.attempt_log.length - 1]
              return (
                <tr key={d.id}>
                  <td><code>{d.event_type}</code></td>
                  <td>{d.status}</td>
                  <td>{d.attempt_log.length}</td>
                  <td>{last === undefined ? "—" : `${last.status_code ?? last.error ?? "no answer"} · ${last.latency_ms} ms`}</td>
                  <td><DateTime iso={d.created_at} /></td>
                  {resendable ? <td><button type="button" className="quiet small" onClick={() => void resend(d.id)}>Resend</button></td> : null}
                </tr>
              )
            })}
          </tbody>
        </table>
      )}
    </Load>
  )
}

const EndpointCard = ({ endpoint, onChange }: { endpoint: WebhookEndpoint; onChange: () => void }) => {
  const { caller } = useSession()
  const { can } = useAccounts()
  const [open, setOpen] = useState(false)
  const [round, setRound] = useState(0)
  const path = { id: endpoint.id }
  const act = async (call: Promise<unknown>) => {
    await call
    onChange()
    setRound((n) => n + 1)
  }
  return (
    <article className="card" aria-label={`Endpoint ${endpoint.url}`}>
      <h3><code>{endpoint.url}</code></h3>
      <p className="note">{endpoint.status}{endpoint.disabled_reason === null ? "" : ` (${endpoint.disabled_reason})`} · {endpoint.events.join(", ")}</p>
      <div className="actions">
        {can("POST /dashboard/webhooks/{id}/test")
          ? <button type="button" onClick={() => void act(api("POST /dashboard/webhooks/{id}/test", { caller, path })).then(() => setOpen(true))}>Send test event</button>
          : null}
        <button type="button" className="quiet" onClick={() => setOpen((o) => !o)}>{open ? "Hide deliveries" : "Show deliveries"}</button>
        {can("PATCH /dashboard/webhooks/{id}")
          ? (
            <button type="button" className="quiet" onClick={() => void act(api("PATCH /dashboard/webhooks/{id}", { caller, path, json: { disabled: endpoint.status === "enabled" } }))}>
              {endpoint.status === "enabled" ? "Disable" : "Enable"}
            </button>
          )
          : null}
        {can("DELETE /dashboard/webhooks/{id}")
          ? <button type="button" className="danger" onClick={() => void act(api("DELETE /dashboard/webhooks/{id}", { caller, path }))}>Delete</button>
          : null}
      </div>
      {open ? <Deliveries key={round} endpoint={endpoint} /> : null}
    </article>
  )
}

export const WebhooksPage = () => {
  const { caller } = useSession()
  const { can } = useAccounts()
  const [list, reload] = useApi("GET /dashboard/webhooks")
  const [url, setUrl] = useState("")
  const [events, setEvents] = useState<ReadonlyArray<WebhookEventType>>(["balance.low", "topup.succeeded", "auto_topup.failed"])
  const [created, setCreated] = useState<CreatedWebhook | null>(null)
  const [error, setError] = useState<ApiError | null>(null)
  const create = async () => {
    setError(null)
    try {
      setCreated(await api("POST /dashboard/webhooks", { caller, json: { url, events } }))
      setUrl("")
      reload()
    } catch (cause) {
      if (cause instanceof ApiError) setError(cause)
      else throw cause
    }
  }
  return (
    <>
      <PageHeading title="Webhooks" />
      {can("POST /dashboard/webhooks")
        ? (
          <form className="card" aria-labelledby="new-webhook" onSubmit={(e) => {
            e.preventDefault()
            void create()
          }}>
            <h2 id="new-webhook">Add an endpoint</h2>
            <p className="note">Deliveries are signed as Standard Webhooks and retried for 3 days. Verify them with the signing secret.</p>
            {error === null ? null : <ErrorPanel error={error} />}
            <Field label="Endpoint URL" hint="https, on a public address.">
              {(props) => <input {...props} type="url" required value={url} onChange={(e) => setUrl(e.target.value)} />}
            </Field>
            <fieldset>
              <legend>Events</legend>
              {WEBHOOK_EVENTS.map((type) => (
                <label key={type} className="check">
                  <input type="checkbox" checked={events.includes(type)}
                    onChange={(e) => setEvents(e.target.checked ? [...events, type] : events.filter((t) => t !== type))} />
                  <code>{type}</code>
                </label>
              ))}
            </fieldset>
            <button type="submit">Add endpoint</button>
          </form>
        )
        : <p className="note">Adding and changing endpoints needs the role {neededRoles("POST /dashboard/webhooks")} in this account.</p>}
      {created === null ? null : (
        <div className="notice success" role="status">
          <p>Store this signing secret now: it is shown only once.</p>
          <Field label="Signing secret">
            {(props) => <input {...props} readOnly value={created.secret} />}
          </Field>
          <button type="button" className="quiet small" onClick={() => setCreated(null)}>I have saved it</button>
        </div>
      )}
      <section aria-labelledby="endpoints-heading">
        <h2 id="endpoints-heading">Endpoints</h2>
        <Load value={list} what="your endpoints" retry={reload}>
          {(data) => data.endpoints.length === 0
            ? <Empty>No endpoints yet.</Empty>
            : <>{data.endpoints.map((endpoint) => <EndpointCard key={endpoint.id} endpoint={endpoint} onChange={reload} />)}</>}
        </Load>
      </section>
    </>
  )
}
