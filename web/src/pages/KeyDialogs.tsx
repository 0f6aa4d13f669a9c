import { useEffect, useId, useRef, useState, type FormEvent } from "react"
import {
  GUARDRAIL_ACTIONS,
  INJECTION_ACTIONS,
  api,
  type ApiKey,
  type GuardrailAction,
  type GuardrailOverride,
  type GuardrailPolicy,
  type InjectionAction,
  type RotatedKey,
  type UpdateKey
} from "../api"
import { useAccounts } from "../accounts"
import { CACHE_TTL_MAX, CACHE_TTL_MIN, cacheTtlRefusal, parseCacheTtl } from "../cacheTtl"
import { ErrorPanel, Field, useSubmission } from "../components"
import { fromLocalInput, toLocalInput } from "../format"
import { useApi, useSession } from "../session"

/** Micro-MYR as the MYR an input shows, exact (integers divided once, no float sums). */
const microToMyrInput = (micro: number | null): string => micro === null ? "" : String(micro / 1_000_000)

/** A modal dialog opened on mount: it traps focus, and Escape cancels. */
const useModal = () => {
  const dialog = useRef<HTMLDialogElement>(null)
  useEffect(() => {
    dialog.current?.showModal()
  }, [])
  return dialog
}

/**
 * A key's response cache TTL as a form edits it (docs/api/cache.md): what is wrong with it shows beneath the
 * field once it is left or a save is tried, and nothing is sent; the service's 400 naming `cache_ttl_seconds`
 * shows there too, until the field changes.
 */
export const useCacheTtl = (initial: number | null) => {
  const [value, setValue] = useState(initial === null ? "" : String(initial))
  const [checked, setChecked] = useState(false)
  const [refused, setRefused] = useState<string | null>(null)
  const input = useRef<HTMLInputElement>(null)
  const parsed = parseCacheTtl(value)
  const problem = "problem" in parsed ? parsed.problem : null
  return {
    value,
    error: (checked ? problem : null) ?? refused,
    input,
    change: (next: string) => {
      setValue(next)
      setRefused(null)
    },
    /** Shows the problem once the field is left. */
    leave: () => setChecked(true),
    /** Whether the field was changed from `initial`. */
    changed: value.trim() !== (initial === null ? "" : String(initial)),
    /** The TTL to send (null: none), or undefined, the problem shown and the field focused, when it cannot be sent. */
    check: (): { readonly ttl: number | null } | undefined => {
      if ("ttl" in parsed) return parsed
      setChecked(true)
      input.current?.focus()
      return undefined
    },
    /** Takes the service's refusal of the TTL onto the field: false when `cause` is some other failure. */
    refuse: (cause: unknown): boolean => {
      const message = cacheTtlRefusal(cause)
      if (message === null) return false
      setRefused(message)
      input.current?.focus()
      return true
    },
    reset: () => {
      setValue(initial === null ? "" : String(initial))
      setChecked(false)
      setRefused(null)
    }
  }
}

/** The TTL's field: text with a numeric keyboard, so that a mistyped value is shown, not emptied as a number field would. */
export const CacheTtlField = ({ ttl }: { ttl: ReturnType<typeof useCacheTtl> }) => (
  <Field label="Response cache TTL (seconds)" error={ttl.error}
    hint={`Optional, ${CACHE_TTL_MIN}–${CACHE_TTL_MAX}: repeated calls are answered from the cache, free, for this long. Empty means only calls that ask are cached.`}>
    {(props) => (
      <input {...props} ref={ttl.input} inputMode="numeric" autoComplete="off" value={ttl.value}
        onChange={(e) => ttl.change(e.target.value)} onBlur={ttl.leave} />
    )}
  </Field>
)

/** A key's guardrails as the dialog edits them: its own PII and injection actions, `""` where the account's apply. */
interface GuardrailChoice {
  readonly own: boolean
  readonly pii: GuardrailAction | ""
  readonly injection: InjectionAction | ""
}

const choiceOf = (override: GuardrailOverride | null): GuardrailChoice => ({
  own: override !== null,
  pii: override?.pii?.action ?? "",
  injection: override?.injection?.action ?? ""
})

/**
 * The override to send: the key's other parts kept (filters, directions), PII and injection as chosen, the PII
 * types the key's or else the account's; none at all (`null`, the account's policy) when it names no part.
 */
const overrideOf = (
  choice: GuardrailChoice,
  current: GuardrailOverride | null,
  account: GuardrailPolicy | undefined
): GuardrailOverride | null => {
  if (!choice.own) return null
  const { injection: _injection, pii: _pii, ...kept } = current ?? {}
  const types = current?.pii?.types ?? account?.pii?.types
  const override: GuardrailOverride = {
    ...kept,
    ...(choice.pii === "" ? {} : { pii: types === undefined ? { action: choice.pii } : { action: choice.pii, types } }),
    ...(choice.injection === "" ? {} : { injection: { action: choice.injection } })
  }
  return Object.keys(override).length === 0 ? null : override
}

/** The key's guardrails: the account's policy, or its own PII and injection actions over it. */
const KeyGuardrails = ({ choice, onChange, override, policy }: {
  choice: GuardrailChoice
  onChange: (choice: GuardrailChoice) => void
  override: GuardrailOverride | null
  /** The account's policy, once read. */
  policy: GuardrailPolicy | undefined
}) => {
  const name = useId()
  const { role } = useAccounts()
  const inherited = (action: string | undefined) => action === undefined ? "Account's" : `Account's: ${action}`
  const kept = [override?.filters === undefined ? null : "filters", override?.apply_to === undefined ? null : "directions"]
    .filter((part) => part !== null)
  return (
    <fieldset className="key-guardrails">
      <legend>Guardrails</legend>
      <label className="check">
        <input type="radio" name={name} checked={!choice.own} onChange={() => onChange({ ...choice, own: false })} /> Use the account's policy
      </label>
      <label className="check">
        <input type="radio" name={name} checked={choice.own} onChange={() => onChange({ ...choice, own: true })} /> Override it for this key
      </label>
      {choice.own
        ? (
          <div className="form-grid">
            <Field label="PII action">
              {(props) => (
                <select {...props} value={choice.pii} onChange={(e) => onChange({ ...choice, pii: GUARDRAIL_ACTIONS.find((one) => one === e.target.value) ?? "" })}>
                  <option value="">{inherited(policy?.pii?.action)}</option>
                  {GUARDRAIL_ACTIONS.map((one) => <option key={one} value={one}>{one}</option>)}
                </select>
              )}
            </Field>
            <Field label="Injection action">
              {(props) => (
                <select {...props} value={choice.injection} onChange={(e) => onChange({ ...choice, injection: INJECTION_ACTIONS.find((one) => one === e.target.value) ?? "" })}>
                  <option value="">{inherited(policy?.injection?.action)}</option>
                  {INJECTION_ACTIONS.map((one) => <option key={one} value={one}>{one}</option>)}
                </select>
              )}
            </Field>
          </div>
        )
        : null}
      {choice.own && kept.length > 0 ? <p className="note">This key's own {kept.join(" and ")} stay as they are.</p> : null}
      {role === "developer" ? <p className="note">As a developer you may make a key's guardrails stricter, not looser.</p> : null}
    </fieldset>
  )
}

/**
 * Edits a key in place. Only the fields changed are sent, so the rate limits a
 * key inherits from the operator's defaults stay inherited unless edited;
 * an emptied field is sent as `null` (no limit, no expiry, the default).
 */
export const EditKey = ({ apiKey, onClose, onSaved }: {
  apiKey: ApiKey
  onClose: () => void
  /** `done`: the form was saved (close); otherwise the key was disabled or enabled and the dialog stays. */
  onSaved: (key: ApiKey, done: boolean) => void
}) => {
  const { caller } = useSession()
  const dialog = useModal()
  const initial = {
    name: apiKey.name,
    limit: microToMyrInput(apiKey.monthly_spend_limit_micro_myr),
    expires: apiKey.expires_at === null ? "" : toLocalInput(new Date(apiKey.expires_at)),
    rpm: String(apiKey.rate_limit_rpm),
    concurrent: String(apiKey.rate_limit_concurrent)
  }
  const [form, setForm] = useState(initial)
  const initialGuardrails = choiceOf(apiKey.guardrails)
  const [guardrails, setGuardrails] = useState(initialGuardrails)
  const [account] = useApi("GET /dashboard/guardrails")
  const ttl = useCacheTtl(apiKey.cache_ttl_seconds)
  const { busy, error, submit } = useSubmission()
  const set = (field: keyof typeof initial) => (value: string) => setForm((current) => ({ ...current, [field]: value }))

  const patch = (body: UpdateKey, done: boolean) =>
    submit(async () => onSaved(await api("PATCH /dashboard/api-keys/{id}", { caller, path: { id: apiKey.id }, json: body }), done))

  const save = (event: FormEvent) => {
    event.preventDefault()
    const cache = ttl.changed ? ttl.check() : undefined
    if (ttl.changed && cache === undefined) return
    const changed = (field: keyof typeof initial) => form[field].trim() !== initial[field].trim()
    const number = (value: string) => value.trim() === "" ? null : Number(value)
    const body: UpdateKey = {
      ...(changed("name") ? { name: form.name } : {}),
      ...(changed("limit") ? { monthly_spend_limit_myr: number(form.limit) } : {}),
      ...(changed("expires") ? { expires_at: fromLocalInput(form.expires) ?? null } : {}),
      ...(changed("rpm") ? { rate_limit_rpm: number(form.rpm) } : {}),
      ...(changed("concurrent") ? { rate_limit_concurrent: number(form.concurrent) } : {}),
      ...(cache === undefined ? {} : { cache_ttl_seconds: cache.ttl }),
      ...(JSON.stringify(guardrails) === JSON.stringify(initialGuardrails)
        ? {}
        : { guardrails: overrideOf(guardrails, apiKey.guardrails, account.data?.policy) })
    }
    void submit(async () => {
      try {
        onSaved(await api("PATCH /dashboard/api-keys/{id}", { caller, path: { id: apiKey.id }, json: body }), true)
      } catch (cause) {
        if (!ttl.refuse(cause)) throw cause
      }
    })
  }

  const disabled = apiKey.status === "disabled"
  return (
    <dialog ref={dialog} className="dialog" aria-labelledby="edit-heading" onCancel={onClose}>
      <h2 id="edit-heading">Edit the key “{apiKey.name}”</h2>
      <form onSubmit={save}>
        {error === null ? null : <ErrorPanel error={error} />}
        <div className="form-grid">
          <Field label="Key name">
            {(props) => <input {...props} required maxLength={100} value={form.name} onChange={(e) => set("name")(e.target.value)} />}
          </Field>
          <Field label="Monthly limit (RM)" hint="Empty means no limit. Spend this month counts against it.">
            {(props) => <input {...props} type="number" min={0} step="any" inputMode="decimal" value={form.limit} onChange={(e) => set("limit")(e.target.value)} />}
          </Field>
          <Field label="Expiry" hint="Empty means it never expires; in your time zone.">
            {(props) => <input {...props} type="datetime-local" value={form.expires} onChange={(e) => set("expires")(e.target.value)} />}
          </Field>
          <Field label="Requests per minute" hint="Empty means the service's default.">
            {(props) => <input {...props} type="number" min={1} step={1} inputMode="numeric" value={form.rpm} onChange={(e) => set("rpm")(e.target.value)} />}
          </Field>
          <Field label="Concurrent calls" hint="Empty means the service's default.">
            {(props) => <input {...props} type="number" min={1} step={1} inputMode="numeric" value={form.concurrent} onChange={(e) => set("concurrent")(e.target.value)} />}
          </Field>
          <CacheTtlField ttl={ttl} />
        </div>
        <KeyGuardrails choice={guardrails} onChange={setGuardrails} override={apiKey.guardrails} policy={account.data?.policy} />
        <div className="actions">
          <button type="button" className="quiet" onClick={onClose}>Close</button>
          <button type="button" className={disabled ? "" : "danger"} disabled={busy} onClick={() => void patch({ disabled: !disabled }, false)}>
            {disabled ? "Enable key" : "Disable key"}
          </button>
          <button type="submit" disabled={busy}>{busy ? "Saving…" : "Save changes"}</button>
        </div>
        <p className="note" aria-live="polite">
          {disabled
            ? "This key is disabled: calls with it answer permission_denied until you enable it."
            : "Disabling refuses every call with this key (permission_denied) until you enable it again."}
        </p>
      </form>
    </dialog>
  )
}

const GRACE_CHOICES = [
  { seconds: 0, label: "None: the old secret stops at once" },
  { seconds: 3_600, label: "1 hour" },
  { seconds: 86_400, label: "24 hours" }
] as const

/**
 * Replaces a key's secret. One idempotency key per dialog: a repeated click
 * or a retry after a lost answer returns the same new secret, not another.
 */
export const RotateKey = ({ apiKey, onCancel, onRotated }: { apiKey: ApiKey; onCancel: () => void; onRotated: (rotated: RotatedKey) => void }) => {
  const { caller } = useSession()
  const dialog = useModal()
  const [idempotencyKey] = useState(() => crypto.randomUUID())
  const [grace, setGrace] = useState<number>(0)
  const { busy, error, submit } = useSubmission()

  const rotate = () =>
    submit(async () =>
      onRotated(await api("POST /dashboard/api-keys/{id}/rotate", {
        caller,
        path: { id: apiKey.id },
        json: { grace_seconds: grace },
        headers: { "idempotency-key": idempotencyKey }
      }))
    )

  return (
    <dialog ref={dialog} className="dialog" aria-labelledby="rotate-heading" aria-describedby="rotate-text" onCancel={onCancel}>
      <h2 id="rotate-heading">Rotate the key “{apiKey.name}”?</h2>
      <p id="rotate-text">
        A new secret replaces <code>{apiKey.prefix}…</code>; the key's id, name, limits and history stay.
        After the grace period, calls with the old secret answer <code>revoked_api_key</code>.
      </p>
      <Field label="Grace period">
        {(props) => (
          <select {...props} value={grace} onChange={(e) => setGrace(Number(e.target.value))}>
            {GRACE_CHOICES.map((choice) => <option key={choice.seconds} value={choice.seconds}>{choice.label}</option>)}
          </select>
        )}
      </Field>
      {error === null ? null : <ErrorPanel error={error} />}
      <div className="actions">
        <button type="button" className="quiet" onClick={onCancel} autoFocus>Cancel</button>
        <button type="button" className="danger" onClick={() => void rotate()} disabled={busy}>{busy ? "Rotating…" : "Rotate key"}</button>
      </div>
    </dialog>
  )
}
