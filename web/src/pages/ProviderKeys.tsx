import { useEffect, useRef, useState, type FormEvent } from "react"
import {
  ApiError,
  PROVIDER_KEY_MODES,
  api,
  type NewProviderKey,
  type ProviderKey,
  type ProviderKeyMode,
  type ProviderKeyStatus
} from "../api"
import { useAccounts } from "../accounts"
import { DateTime, Empty, ErrorPanel, Field, Load, PageHeading, useSubmission } from "../components"
import { neededRoles } from "../roles"
import { useApi, useSession } from "../session"

const MODE_LABELS: Record<ProviderKeyMode, string> = { first: "First", fallback: "Fallback", only: "Only" }

/** Where a call goes under each mode (docs/api/provider-keys.md, "Routing"). */
const MODE_DUTIES: Record<ProviderKeyMode, string> = {
  first: "your key first, before nenas's own upstreams",
  fallback: "nenas's own upstreams first, your key after them",
  only: "your key alone, never nenas's upstreams"
}

/** The dashboard's badge colours: green for a key the provider took, amber while unchecked, red when failing. */
const STATUS_BADGES: Record<ProviderKeyStatus, string> = {
  ok: "badge-succeeded",
  unchecked: "badge-pending",
  refused: "badge-revoked",
  failing: "badge-failed"
}

const modeOf = (value: string): ProviderKeyMode => PROVIDER_KEY_MODES.find((mode) => mode === value) ?? "first"

/** Marks and focuses the control that a refusal's `param` names (`api_key`, `models.general`). */
const useRefusedField = (error: ApiError | null) => {
  const form = useRef<HTMLFormElement>(null)
  const param = error?.status === 400 ? error.body.param : null
  useEffect(() => {
    if (param !== null) form.current?.querySelector<HTMLElement>(`[data-param="${param}"]`)?.focus()
  }, [error, param])
  /** The props of the control sending `name`: marked invalid while the service's refusal names it. */
  const control = (name: string) => ({ "data-param": name, ...(param === name ? { "aria-invalid": true as const } : {}) })
  return { form, control }
}

const EMPTY = { name: "", baseUrl: "", apiKey: "", general: "", reasoning: "", embedding: "", mode: "first" as ProviderKeyMode }

const AddForm = ({ onAdded }: { onAdded: (key: ProviderKey) => void }) => {
  const { caller } = useSession()
  const [draft, setDraft] = useState(EMPTY)
  const { busy, error, submit } = useSubmission()
  const { form, control } = useRefusedField(error)
  const set = (part: keyof typeof EMPTY) => (e: { target: { value: string } }) => {
    const value = e.target.value
    setDraft((current) => ({ ...current, [part]: value }))
  }

  const add = (event: FormEvent) => {
    event.preventDefault()
    void submit(async () => {
      const json: NewProviderKey = {
        name: draft.name,
        base_url: draft.baseUrl,
        api_key: draft.apiKey,
        models: { general: draft.general, reasoning: draft.reasoning, embedding: draft.embedding.trim() === "" ? null : draft.embedding },
        mode: draft.mode
      }
      const { provider_key } = await api("POST /dashboard/provider-keys", { caller, json })
      // The secret leaves the page with the save: nothing shows it again.
      setDraft(EMPTY)
      onAdded(provider_key)
    })
  }

  return (
    <form ref={form} className="card" aria-labelledby="add-provider-key" onSubmit={add}>
      <h2 id="add-provider-key">Add a provider key</h2>
      <p className="note">
        On save, nenas checks the key with one <code>GET {"{base URL}"}/models</code>. It keeps the key encrypted and never
        shows it again, only its last four characters.
      </p>
      {error === null ? null : <ErrorPanel error={error} />}
      <div className="form-grid">
        <Field label="Name" hint="What you call this account: “our OpenAI account”.">
          {(props) => <input {...props} {...control("name")} required maxLength={100} value={draft.name} onChange={set("name")} />}
        </Field>
        <Field label="Base URL" hint="The root of an OpenAI-compatible API, where /models and /chat/completions are: most end in /v1.">
          {(props) => (
            <input {...props} {...control("base_url")} type="url" required maxLength={2048} placeholder="https://api.openai.com/v1"
              autoComplete="off" spellCheck="false" value={draft.baseUrl} onChange={set("baseUrl")} />
          )}
        </Field>
        <Field label="API key" hint="The provider's key for this account.">
          {(props) => (
            <input {...props} {...control("api_key")} type="password" required maxLength={1000} autoComplete="new-password"
              spellCheck="false" value={draft.apiKey} onChange={set("apiKey")} />
          )}
        </Field>
        <Field label="Mode" hint={`${MODE_LABELS[draft.mode]}: ${MODE_DUTIES[draft.mode]}.`}>
          {(props) => (
            <select {...props} {...control("mode")} value={draft.mode} onChange={(e) => {
              const mode = modeOf(e.target.value)
              setDraft((current) => ({ ...current, mode }))
            }}>
              {PROVIDER_KEY_MODES.map((mode) => <option key={mode} value={mode}>{MODE_LABELS[mode]}</option>)}
            </select>
          )}
        </Field>
      </div>
      <fieldset>
        <legend>Models at the provider</legend>
        <div className="form-grid">
          <Field label="General model" hint="For general calls: gpt-4.1-mini.">
            {(props) => <input {...props} {...control("models.general")} required maxLength={200} spellCheck="false" value={draft.general} onChange={set("general")} />}
          </Field>
          <Field label="Reasoning model" hint="For reasoning calls: o4-mini.">
            {(props) => <input {...props} {...control("models.reasoning")} required maxLength={200} spellCheck="false" value={draft.reasoning} onChange={set("reasoning")} />}
          </Field>
          <Field label="Embedding model" hint="Optional: without it, embeddings never go to this key.">
            {(props) => <input {...props} {...control("models.embedding")} maxLength={200} spellCheck="false" value={draft.embedding} onChange={set("embedding")} />}
          </Field>
        </div>
      </fieldset>
      <button type="submit" disabled={busy} aria-busy={busy}>{busy ? "Checking the key…" : "Add key"}</button>
    </form>
  )
}

/** Confirms a deletion in a modal dialog: it traps focus, and Escape cancels. */
const ConfirmDelete = ({ providerKey, onCancel, onDeleted }: {
  providerKey: ProviderKey
  onCancel: () => void
  onDeleted: (key: ProviderKey) => void
}) => {
  const { caller } = useSession()
  const dialog = useRef<HTMLDialogElement>(null)
  const { busy, error, submit } = useSubmission()
  useEffect(() => {
    dialog.current?.showModal()
  }, [])
  const remove = () =>
    submit(async () => {
      await api("DELETE /dashboard/provider-keys/{id}", { caller, path: { id: providerKey.id } })
      onDeleted(providerKey)
    })
  return (
    <dialog ref={dialog} className="dialog" aria-labelledby="delete-heading" aria-describedby="delete-text" onCancel={onCancel}>
      <h2 id="delete-heading">Delete the provider key “{providerKey.name}”?</h2>
      <p id="delete-text">
        Calls stop going to <code>{providerKey.base_url}</code> within a second. nenas forgets the key, so adding it again
        means typing it again. The account at the provider is not touched.
      </p>
      {error === null ? null : <ErrorPanel error={error} />}
      <div className="actions">
        <button type="button" className="quiet" onClick={onCancel} autoFocus>Cancel</button>
        <button type="button" className="danger" onClick={() => void remove()} disabled={busy}>{busy ? "Deleting…" : "Delete key"}</button>
      </div>
    </dialog>
  )
}

/** A URL that may wrap after each `/` rather than anywhere in its host. */
const BreakAfterSlashes = ({ text }: { text: string }) => (
  <>{text.split("/").map((part, index) => index === 0 ? part : <span key={index}>/<wbr />{part}</span>)}</>
)

/** What the last change on the list did: said in a line, or the service's refusal. */
type Outcome = { readonly said: string } | { readonly error: ApiError }

const KeyRow = ({ providerKey, editable, testing, onMode, onTest, onDelete }: {
  providerKey: ProviderKey
  editable: boolean
  testing: boolean
  onMode: (mode: ProviderKeyMode) => void
  onTest: () => void
  onDelete: () => void
}) => {
  const { name, models } = providerKey
  return (
    <tr>
      <th scope="row">{name}</th>
      <td data-label="Base URL"><code className="provider-url"><BreakAfterSlashes text={providerKey.base_url} /></code></td>
      <td data-label="Models">
        <span className="provider-models">
          <span>general <code>{models.general}</code></span>
          <span>reasoning <code>{models.reasoning}</code></span>
          <span>embedding {models.embedding === null ? <span className="muted">none</span> : <code>{models.embedding}</code>}</span>
        </span>
      </td>
      <td data-label="Mode">
        {editable
          ? (
            <select aria-label={`Mode of ${name}`} value={providerKey.mode} onChange={(e) => onMode(modeOf(e.target.value))}>
              {PROVIDER_KEY_MODES.map((mode) => <option key={mode} value={mode}>{MODE_LABELS[mode]}</option>)}
            </select>
          )
          : MODE_LABELS[providerKey.mode]}
      </td>
      <td data-label="Key">{providerKey.last4 === "" ? <span className="muted">short key</span> : <code className="provider-last4">…{providerKey.last4}</code>}</td>
      <td data-label="Status">
        <span className="provider-status">
          <span className={`badge ${STATUS_BADGES[providerKey.status]}`}>{providerKey.status}</span>
          {providerKey.last_error === null ? null : <span className="field-error">{providerKey.last_error}</span>}
        </span>
      </td>
      <td data-label="Created"><DateTime iso={providerKey.created_at} /></td>
      {editable
        ? (
          <td className="row-actions">
            <button type="button" className="small" onClick={onTest} disabled={testing} aria-busy={testing}
              aria-label={`Test ${name}`}>{testing ? "Testing…" : "Test"}</button>
            <button type="button" className="danger small" onClick={onDelete} aria-label={`Delete ${name}`}>Delete</button>
          </td>
        )
        : null}
    </tr>
  )
}

/** The account's own provider keys (docs/api/provider-keys.md): listed for every role, changed by owners and admins. */
export const ProviderKeysPage = () => {
  const { caller } = useSession()
  const { can } = useAccounts()
  const editable = can("POST /dashboard/provider-keys")
  const [list, reload] = useApi("GET /dashboard/provider-keys")
  const [outcome, setOutcome] = useState<Outcome | null>(null)
  const [testing, setTesting] = useState<string | null>(null)
  const [deleting, setDeleting] = useState<ProviderKey | null>(null)

  const changeMode = async (key: ProviderKey, mode: ProviderKeyMode) => {
    setOutcome(null)
    try {
      const { provider_key } = await api("PATCH /dashboard/provider-keys/{id}", { caller, path: { id: key.id }, json: { mode } })
      setOutcome({ said: `“${provider_key.name}” is now ${MODE_LABELS[provider_key.mode]}: ${MODE_DUTIES[provider_key.mode]}.` })
    } catch (cause) {
      if (cause instanceof ApiError) setOutcome({ error: cause })
      else throw cause
    } finally {
      reload()
    }
  }

  /** Asks the provider again with the stored key; the key's status says how it went. */
  const test = async (key: ProviderKey) => {
    setOutcome(null)
    setTesting(key.id)
    try {
      const { provider_key } = await api("POST /dashboard/provider-keys/{id}/check", { caller, path: { id: key.id } })
      setOutcome(provider_key.status === "ok"
        ? { said: `Tested “${provider_key.name}”: the provider took the key.` }
        : { said: `Tested “${provider_key.name}”: ${provider_key.status}. ${provider_key.last_error ?? ""}` })
    } catch (cause) {
      if (cause instanceof ApiError) setOutcome({ error: cause })
      else throw cause
    } finally {
      setTesting(null)
      reload()
    }
  }

  return (
    <>
      <PageHeading title="Provider keys" />
      <p className="note">
        Your own OpenAI-compatible provider accounts (OpenAI, OpenRouter, Gemini, your vLLM or Ollama), for nenas to send
        the account's calls to. A call answered on one of your keys costs a BYOK fee, 5% of nenas's price for it by
        default; the provider bills its tokens to your account there.
      </p>
      <ul className="note provider-modes" aria-label="Modes">
        {PROVIDER_KEY_MODES.map((mode) => <li key={mode}><strong>{MODE_LABELS[mode]}</strong>: {MODE_DUTIES[mode]}.</li>)}
      </ul>
      {editable
        ? <AddForm onAdded={(key) => {
          setOutcome({ said: `Added “${key.name}”: the provider took the key.` })
          reload()
        }} />
        : <p className="note">Adding and changing provider keys needs the role {neededRoles("POST /dashboard/provider-keys")} in this account.</p>}
      <section aria-labelledby="provider-keys-heading">
        <h2 id="provider-keys-heading">The account's provider keys</h2>
        {outcome === null ? null : "error" in outcome
          ? <ErrorPanel error={outcome.error} />
          : <p role="status" className="saved">{outcome.said}</p>}
        <Load value={list} what="the provider keys" retry={reload}>
          {(data) => data.provider_keys.length === 0
            ? <Empty>{editable ? "No provider keys yet. Add one above to send calls to your own provider account." : "No provider keys yet."}</Empty>
            : (
              <div className="table-wrap">
                <table className="provider-keys stack">
                  <thead>
                    <tr>
                      <th scope="col">Name</th><th scope="col">Base URL</th><th scope="col">Models</th><th scope="col">Mode</th>
                      <th scope="col">Key</th><th scope="col">Status</th><th scope="col">Created</th>
                      {editable ? <th scope="col"><span className="visually-hidden">Actions</span></th> : null}
                    </tr>
                  </thead>
                  <tbody>
                    {data.provider_keys.map((key) => (
                      <KeyRow key={key.id} providerKey={key} editable={editable}
                        onMode={(mode) => void changeMode(key, mode)}
                        testing={testing === key.id}
                        onTest={() => void test(key)}
                        onDelete={() => {
                          setOutcome(null)
                          setDeleting(key)
                        }} />
                    ))}
                  </tbody>
                </table>
              </div>
            )}
        </Load>
      </section>
      {deleting === null ? null : (
        <ConfirmDelete providerKey={deleting} onCancel={() => setDeleting(null)} onDeleted={(key) => {
          setDeleting(null)
          setOutcome({ said: `Deleted “${key.name}”.` })
          reload()
        }} />
      )}
    </>
  )
}
