import { useEffect, useRef, useState, type FormEvent } from "react"
import { useSearchParams } from "react-router"
import { api, type ApiKey, type CreatedKey, type RotatedKey } from "../api"
import { DateTime, Empty, ErrorPanel, Field, Load, PageHeading, SpendOfLimit, useSubmission } from "../components"
import { useAccounts } from "../accounts"
import { formatCacheTtl } from "../cacheTtl"
import { formatCount, fromLocalInput } from "../format"
import { mayChangeKey, neededRoles } from "../roles"
import { useApi, useSession } from "../session"
import { CacheTtlField, EditKey, RotateKey, useCacheTtl } from "./KeyDialogs"

const CreateKeyForm = ({ onCreated }: { onCreated: (created: CreatedKey) => void }) => {
  const { caller } = useSession()
  const [name, setName] = useState("")
  const [environment, setEnvironment] = useState<"live" | "test">("live")
  const [limit, setLimit] = useState("")
  const [expires, setExpires] = useState("")
  const ttl = useCacheTtl(null)
  const { busy, error, submit: run } = useSubmission()

  const submit = (event: FormEvent) => {
    event.preventDefault()
    const cache = ttl.check()
    if (cache === undefined) return
    void run(async () => {
      const expiresAt = fromLocalInput(expires)
      let created: CreatedKey
      try {
        created = await api("POST /dashboard/api-keys", {
          caller,
          json: {
            name,
            environment,
            ...(limit === "" ? {} : { monthly_spend_limit_myr: Number(limit) }),
            ...(expiresAt === undefined ? {} : { expires_at: expiresAt }),
            ...(cache.ttl === null ? {} : { cache_ttl_seconds: cache.ttl })
          }
        })
      } catch (cause) {
        if (ttl.refuse(cause)) return
        throw cause
      }
      setName("")
      setLimit("")
      setExpires("")
      ttl.reset()
      onCreated(created)
    })
  }

  return (
    <form className="card" onSubmit={submit} aria-labelledby="create-heading">
      <h2 id="create-heading">Create a key</h2>
      {error === null ? null : <ErrorPanel error={error} />}
      <div className="form-grid">
        <Field label="Name">
          {(props) => <input {...props} required maxLength={100} value={name} onChange={(e) => setName(e.target.value)} />}
        </Field>
        <Field label="Environment" hint="Test keys use the simulated model and cost nothing.">
          {(props) => (
            <select {...props} value={environment} onChange={(e) => setEnvironment(e.target.value === "test" ? "test" : "live")}>
              <option value="live">Live</option>
              <option value="test">Test</option>
            </select>
          )}
        </Field>
        <Field label="Monthly spend limit (RM)" hint="Optional; empty means no limit.">
          {(props) => <input {...props} type="number" min={0} step="0.01" inputMode="decimal" value={limit} onChange={(e) => setLimit(e.target.value)} />}
        </Field>
        <Field label="Expires" hint="Optional; in your time zone.">
          {(props) => <input {...props} type="datetime-local" value={expires} onChange={(e) => setExpires(e.target.value)} />}
        </Field>
        <CacheTtlField ttl={ttl} />
      </div>
      <button type="submit" disabled={busy}>{busy ? "Creating…" : "Create key"}</button>
    </form>
  )
}

/** The full key, once: the API never shows it again. */
const NewKey = ({ created, onDone }: { created: CreatedKey | RotatedKey; onDone: () => void }) => {
  const rotated = "previous_key_valid_until" in created
  const [copied, setCopied] = useState<"no" | "yes" | "failed">("no")
  const ref = useRef<HTMLInputElement>(null)
  useEffect(() => ref.current?.select(), [])
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(created.full_key)
      setCopied("yes")
    } catch {
      ref.current?.select()
      setCopied("failed")
    }
  }
  return (
    <section className="card new-key" aria-labelledby="new-key-heading">
      <h2 id="new-key-heading">{rotated ? "The new secret of" : "Your new key"} “{created.key.name}”</h2>
      <p className="warning" role="note"><strong>{created.warning}</strong></p>
      {"previous_key_valid_until" in created
        ? (
          <p className="note">
            {created.previous_key_valid_until === null
              ? <>The old secret no longer works: calls with it answer <code>revoked_api_key</code>.</>
              : <>The old secret keeps working until <DateTime iso={created.previous_key_valid_until} />, then answers <code>revoked_api_key</code>.</>}
          </p>
        )
        : null}
      <div className="copy-row">
        <label htmlFor="full-key" className="visually-hidden">Full API key</label>
        <input id="full-key" ref={ref} className="mono" readOnly value={created.full_key} onFocus={(e) => e.target.select()} />
        <button type="button" onClick={copy}>Copy</button>
      </div>
      <p aria-live="polite" className="note">
        {copied === "yes" ? "Copied to the clipboard." : copied === "failed" ? "Copying was refused: the key is selected, copy it with Ctrl+C." : ""}
      </p>
      <button type="button" className="quiet" onClick={onDone}>I have saved it</button>
    </section>
  )
}

/** Confirms a deletion in a modal dialog: it traps focus, and Escape cancels. */
const ConfirmDelete = ({ apiKey, onCancel, onDeleted }: { apiKey: ApiKey; onCancel: () => void; onDeleted: (key: ApiKey) => void }) => {
  const { caller } = useSession()
  const dialog = useRef<HTMLDialogElement>(null)
  const { busy, error, submit } = useSubmission()
  useEffect(() => {
    dialog.current?.showModal()
  }, [])
  const remove = () =>
    submit(async () => {
      await api("DELETE /dashboard/api-keys/{id}", { caller, path: { id: apiKey.id } })
      onDeleted(apiKey)
    })
  return (
    <dialog ref={dialog} className="dialog" aria-labelledby="delete-heading" aria-describedby="delete-text" onCancel={onCancel}>
      <h2 id="delete-heading">Delete the key “{apiKey.name}”?</h2>
      <p id="delete-text">
        Every call made with <code>{apiKey.prefix}…</code> will be refused (<code>revoked_api_key</code>) from now on.
        This cannot be undone: the key cannot be restored or shown again; you would create a new one.
      </p>
      {error === null ? null : <ErrorPanel error={error} />}
      <div className="actions">
        <button type="button" className="quiet" onClick={onCancel} autoFocus>Cancel</button>
        <button type="button" className="danger" onClick={remove} disabled={busy}>{busy ? "Deleting…" : "Delete key"}</button>
      </div>
    </dialog>
  )
}

const StatusBadge = ({ status }: { status: ApiKey["status"] | "revoked" }) => (
  <span className={`badge badge-${status}`}>{status}</span>
)

export const ApiKeysPage = () => {
  const { current, can } = useAccounts()
  const me = { role: current.role, memberId: current.member_id }
  const [keys, reload] = useApi("GET /dashboard/api-keys")
  const [created, setCreated] = useState<CreatedKey | null>(null)
  const [deleting, setDeleting] = useState<ApiKey | null>(null)
  const [deleted, setDeleted] = useState<ReadonlyArray<ApiKey>>([])
  const [rotating, setRotating] = useState<ApiKey | null>(null)
  const [rotated, setRotated] = useState<RotatedKey | null>(null)
  // The open edit view is in the URL (`?edit=<id>`), so an error's action_url opens it directly.
  const [params, setParams] = useSearchParams()
  const editId = params.get("edit")
  const found = editId === null ? undefined : keys.data?.keys.find((key) => key.id === editId)
  // A key the member may not change opens no edit view: the service would refuse each change.
  const editing = found !== undefined && mayChangeKey(me, found, "PATCH /dashboard/api-keys/{id}") ? found : undefined
  const setEditing = (key: ApiKey | null) => setParams(key === null ? {} : { edit: key.id })

  return (
    <>
      <PageHeading title="API keys" />
      {created === null ? null : <NewKey created={created} onDone={() => setCreated(null)} />}
      {rotated === null ? null : <NewKey created={rotated} onDone={() => setRotated(null)} />}
      {found !== undefined && editing === undefined
        ? <div className="error" role="alert"><p className="error-message"><strong>You cannot change the key “{found.name}”: {current.role === "developer" ? "a developer changes only the keys it created" : `changing keys needs the role ${neededRoles("PATCH /dashboard/api-keys/{id}")}`}.</strong></p></div>
        : null}
      {editId !== null && keys.data !== undefined && found === undefined
        ? <div className="error" role="alert"><p className="error-message"><strong>No key of yours has the id <code>{editId}</code>; it may have been deleted.</strong></p></div>
        : null}
      {can("POST /dashboard/api-keys")
        ? <CreateKeyForm onCreated={(next) => {
          setCreated(next)
          reload()
        }} />
        : null}
      <section aria-labelledby="keys-heading">
        <h2 id="keys-heading">{current.personal ? "Your keys" : "The account's keys"}</h2>
        <Load value={keys} what="your keys" retry={reload}>
          {(data) => data.keys.length === 0 && deleted.length === 0
            ? <Empty>{can("POST /dashboard/api-keys") ? "No API keys yet. Create one above to call the model API." : "No API keys yet."}</Empty>
            : (
              <div className="table-wrap">
                <table className="keys stack">
                  <thead>
                    <tr>
                      <th scope="col">Name</th><th scope="col">Key</th><th scope="col">Environment</th><th scope="col">Status</th>
                      <th scope="col">Spent this month</th><th scope="col">Created</th><th scope="col">Last used</th><th scope="col">Expires</th>
                      <th scope="col">Response cache</th>
                      <th scope="col"><span className="visually-hidden">Actions</span></th>
                    </tr>
                  </thead>
                  <tbody>
                    {data.keys.map((key) => (
                      <tr key={key.id}>
                        <th scope="row">{key.name}</th>
                        <td data-label="Key"><code>{key.prefix}…</code></td>
                        <td data-label="Environment">{key.environment}</td>
                        <td data-label="Status"><StatusBadge status={key.status} /></td>
                        <td data-label="Spent this month"><MonthToDate apiKey={key} /></td>
                        <td data-label="Created"><DateTime iso={key.created_at} /></td>
                        <td data-label="Last used">{key.last_used_at === null ? "never" : <DateTime iso={key.last_used_at} />}</td>
                        <td data-label="Expires">{key.expires_at === null ? "never" : <DateTime iso={key.expires_at} />}</td>
                        <td data-label="Response cache">
                          {key.cache_ttl_seconds === null ? <span className="muted">when asked</span> : formatCacheTtl(key.cache_ttl_seconds)}
                        </td>
                        <td className="row-actions">
                          {mayChangeKey(me, key, "PATCH /dashboard/api-keys/{id}")
                            ? <button type="button" className="small" onClick={() => setEditing(key)} aria-label={`Edit ${key.name}`}>Edit</button>
                            : null}
                          {mayChangeKey(me, key, "POST /dashboard/api-keys/{id}/rotate")
                            ? <button type="button" className="small" onClick={() => setRotating(key)} aria-label={`Rotate ${key.name}`}>Rotate</button>
                            : null}
                          {mayChangeKey(me, key, "DELETE /dashboard/api-keys/{id}")
                            ? <button type="button" className="danger small" onClick={() => setDeleting(key)} aria-label={`Delete ${key.name}`}>Delete</button>
                            : null}
                        </td>
                      </tr>
                    ))}
                    {deleted.map((key) => (
                      <tr key={key.id} className="revoked">
                        <th scope="row">{key.name}</th>
                        <td data-label="Key"><code>{key.prefix}…</code></td>
                        <td data-label="Environment">{key.environment}</td>
                        <td data-label="Status"><StatusBadge status="revoked" /></td>
                        <td colSpan={6} className="full">Deleted just now; calls with it answer <code>revoked_api_key</code>. It leaves this list when you reload.</td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </div>
            )}
        </Load>
      </section>
      <ResponseCache />
      {editing === undefined ? null : (
        <EditKey key={editing.id} apiKey={editing} onClose={() => setEditing(null)} onSaved={(_key, done) => {
          if (done) setEditing(null)
          reload()
        }} />
      )}
      {rotating === null ? null : (
        <RotateKey apiKey={rotating} onCancel={() => setRotating(null)} onRotated={(next) => {
          setRotating(null)
          setCreated(null)
          setRotated(next)
          reload()
        }} />
      )}
      {deleting === null ? null : (
        <ConfirmDelete apiKey={deleting} onCancel={() => setDeleting(null)} onDeleted={(key) => {
          setDeleting(null)
          setDeleted((list) => [...list, key])
          reload()
        }} />
      )}
    </>
  )
}

/** The key's month-to-date spend against its monthly limit, if it has one. */
function MonthToDate({ apiKey }: { readonly apiKey: ApiKey }) {
  return <SpendOfLimit spent={apiKey.month_to_date_spend_micro_myr} limit={apiKey.monthly_spend_limit_micro_myr} what="monthly limit" />
}

/**
 * The account's response cache (docs/api/cache.md, "Emptying it"): owners and admins empty it, after a
 * confirmation, and see how many answers went; the other roles are told who may.
 */
const ResponseCache = () => {
  const { can } = useAccounts()
  const [confirming, setConfirming] = useState(false)
  const [emptied, setEmptied] = useState<number | null>(null)
  return (
    <section className="card response-cache" aria-labelledby="cache-heading">
      <h2 id="cache-heading">Response cache</h2>
      <p className="note">
        A key with a cache TTL (or a call sending <code>Nenas-Cache: on</code>) answers a repeated call from the cache, free.
        Emptying it makes the next call of each kind run, and cost, afresh.
      </p>
      {can("DELETE /dashboard/cache")
        ? (
          <div className="actions">
            <button type="button" className="danger" onClick={() => setConfirming(true)}>Empty cache</button>
          </div>
        )
        : <p className="note">Emptying it needs the role {neededRoles("DELETE /dashboard/cache")}.</p>}
      <p role="status" className="note">
        {emptied === null ? "" : `Emptied: ${formatCount(emptied)} ${emptied === 1 ? "answer" : "answers"}.`}
      </p>
      {confirming
        ? (
          <ConfirmEmptyCache onCancel={() => setConfirming(false)} onEmptied={(deleted) => {
            setConfirming(false)
            setEmptied(deleted)
          }} />
        )
        : null}
    </section>
  )
}

/** Confirms emptying the cache in a modal dialog: it traps focus, and Escape cancels. */
const ConfirmEmptyCache = ({ onCancel, onEmptied }: { onCancel: () => void; onEmptied: (deleted: number) => void }) => {
  const { caller } = useSession()
  const dialog = useRef<HTMLDialogElement>(null)
  const { busy, error, submit } = useSubmission()
  useEffect(() => {
    dialog.current?.showModal()
  }, [])
  const empty = () =>
    submit(async () => {
      onEmptied((await api("DELETE /dashboard/cache", { caller })).deleted)
    })
  return (
    <dialog ref={dialog} className="dialog" aria-labelledby="empty-cache-heading" aria-describedby="empty-cache-text" onCancel={onCancel}>
      <h2 id="empty-cache-heading">Empty the response cache?</h2>
      <p id="empty-cache-text">
        Every answer this account's keys have cached is dropped, on every instance within moments. Until a call is
        answered again, repeating it runs the model and is billed. This cannot be undone.
      </p>
      {error === null ? null : <ErrorPanel error={error} />}
      <div className="actions">
        <button type="button" className="quiet" onClick={onCancel} autoFocus>Cancel</button>
        <button type="button" className="danger" onClick={() => void empty()} disabled={busy}>{busy ? "Emptying…" : "Empty cache"}</button>
      </div>
    </dialog>
  )
}
