import { useEffect, useId, useRef, useState, type ReactNode } from "react"
import {
  ApiError,
  GUARDRAIL_ACTIONS,
  GUARDRAIL_DIRECTIONS,
  INJECTION_ACTIONS,
  PII_TYPES,
  api,
  type GuardrailAction,
  type GuardrailDirection,
  type GuardrailPolicy,
  type GuardrailTestResult,
  type InjectionAction,
  type PiiType
} from "../api"
import { useAccounts } from "../accounts"
import { DateTime, ErrorPanel, Field, Load, PageHeading } from "../components"
import { neededRoles } from "../roles"
import { useApi, useSession } from "../session"

/** What each detector finds (docs/api/guardrails.md, "Detectors"), and its placeholder under `redact`. */
const PII_LABELS: Record<PiiType, string> = {
  email: "Email addresses [EMAIL]",
  phone: "Phone numbers [PHONE]",
  mykad: "MyKad numbers [MYKAD]",
  card: "Card numbers [CARD]",
  ip: "IP addresses [IP]"
}

const ACTION_LABELS: Record<GuardrailAction, string> = { off: "Off", flag: "Flag", redact: "Redact", block: "Block" }

const DIRECTION_LABELS: Record<GuardrailDirection, string> = {
  input: "Input: what callers send",
  output: "Output: the model's answers"
}

/** The service's limit on custom filters. */
const MAX_FILTERS = 20

interface FilterDraft {
  /** Names the row while rows are added and removed; never sent. */
  readonly row: number
  readonly label: string
  readonly pattern: string
  readonly action: GuardrailAction
}

interface Draft {
  readonly piiAction: GuardrailAction
  readonly piiTypes: ReadonlyArray<PiiType>
  readonly injectionAction: InjectionAction
  readonly applyTo: ReadonlyArray<GuardrailDirection>
  readonly filters: ReadonlyArray<FilterDraft>
}

const draftOf = (policy: GuardrailPolicy, rowId: () => number): Draft => ({
  piiAction: policy.pii?.action ?? "off",
  piiTypes: policy.pii?.types ?? PII_TYPES,
  injectionAction: policy.injection?.action ?? "off",
  applyTo: policy.apply_to ?? GUARDRAIL_DIRECTIONS,
  filters: (policy.filters ?? []).map((filter) => ({ row: rowId(), ...filter }))
})

/** The whole policy, as PUT takes it: every part given, in the contract's order. */
const policyOf = (draft: Draft): GuardrailPolicy => ({
  pii: { action: draft.piiAction, types: PII_TYPES.filter((type) => draft.piiTypes.includes(type)) },
  injection: { action: draft.injectionAction },
  filters: draft.filters.map(({ action, label, pattern }) => ({ label, pattern, action })),
  apply_to: GUARDRAIL_DIRECTIONS.filter((direction) => draft.applyTo.includes(direction))
})

/** The form's fields, as the service names them in a 400's `param` (the test endpoint's under `policy.`). */
const FIELD_PARAM = /^(pii\.action|pii\.types|injection\.action|apply_to|filters\[\d+\]\.(label|pattern|action))$/

const fieldOf = (cause: ApiError): string | null => {
  const param = cause.body.param?.replace(/^policy\./, "") ?? null
  return cause.status === 400 && param !== null && FIELD_PARAM.test(param) ? param : null
}

/** Why the last save or try failed: under the field the service named, or above the form. */
type Failure =
  | { readonly field: string; readonly message: string }
  | { readonly field: null; readonly error: ApiError }

const failureOf = (cause: unknown): Failure => {
  if (!(cause instanceof ApiError)) throw cause
  const field = fieldOf(cause)
  return field === null ? { field: null, error: cause } : { field, message: cause.body.message }
}

/** A group of checkboxes with the service's message for it beneath. */
const Checks = ({ legend, error, boxed = false, children }: {
  legend: string
  error: string | null
  /** A group of its own in the form, framed like the others, rather than one inside a frame. */
  boxed?: boolean
  children: (props: { "aria-describedby"?: string; "aria-invalid"?: true }) => ReactNode
}) => {
  const errorId = useId()
  return (
    <fieldset className={["checks", boxed ? "boxed" : null, error === null ? null : "invalid"].filter(Boolean).join(" ")}>
      <legend>{legend}</legend>
      <div className="check-list">
        {children(error === null ? {} : { "aria-describedby": errorId, "aria-invalid": true })}
      </div>
      {error === null ? null : <small id={errorId} className="field-error">{error}</small>}
    </fieldset>
  )
}

const toggled = <A,>(list: ReadonlyArray<A>, one: A, on: boolean): ReadonlyArray<A> =>
  on ? (list.includes(one) ? list : [...list, one]) : list.filter((item) => item !== one)

/** What a text would become under the form's policy: the text kept as tried, so offsets point into it. */
const TryIt = ({ policy, onFieldError }: { policy: GuardrailPolicy; onFieldError: (failure: Failure) => void }) => {
  const { caller } = useSession()
  const [text, setText] = useState("")
  const [result, setResult] = useState<{ readonly text: string; readonly answer: GuardrailTestResult } | null>(null)
  const [busy, setBusy] = useState(false)
  const [failure, setFailure] = useState<Failure | null>(null)
  // A mistake in the policy is the form's to show, and goes once the form changes.
  const policyKey = JSON.stringify(policy)
  useEffect(() => {
    setFailure((current) => current?.field === null ? current : null)
  }, [policyKey])

  const tryIt = async () => {
    setBusy(true)
    setFailure(null)
    try {
      const tried = text
      setResult({ text: tried, answer: await api("POST /dashboard/guardrails/test", { caller, json: { text: tried, policy } }) })
    } catch (cause) {
      const failed = failureOf(cause)
      setResult(null)
      setFailure(failed)
      if (failed.field !== null) onFieldError(failed)
    } finally {
      setBusy(false)
    }
  }

  const answer = result?.answer
  return (
    <section className="card try-it" aria-labelledby="try-heading">
      <h2 id="try-heading">Try it</h2>
      <p className="note">
        Runs the policy above, as the form stands (saved or not), on a text of yours: every rule that is on, whichever
        direction it applies to. Nothing is kept.
      </p>
      <form noValidate onSubmit={(e) => {
        e.preventDefault()
        void tryIt()
      }}>
        <Field label="Text to try">
          {(props) => <textarea {...props} rows={4} maxLength={131_072} value={text} onChange={(e) => setText(e.target.value)} />}
        </Field>
        <div className="actions">
          <button type="submit" disabled={busy || text === ""} aria-busy={busy}>{busy ? "Trying…" : "Try it"}</button>
        </div>
      </form>
      {failure === null ? null : failure.field === null
        ? <ErrorPanel error={failure.error} />
        : <p className="field-error" role="alert">The policy has a mistake: see the field marked above.</p>}
      {answer === undefined || result === null ? null : (
        <div className="try-result" aria-live="polite">
          <p role="status" className={answer.blocked ? "verdict blocked" : "verdict"}>
            {answer.blocked
              ? <>Blocked: a call with this text would be refused with <code>content_blocked</code>.</>
              : answer.findings.length === 0
              ? "Nothing found: the text would pass as it is."
              : "Not blocked: a call with this text would pass."}
          </p>
          <h3>As the model or the caller would see it</h3>
          <pre className="redacted-text">{answer.redacted_text}</pre>
          {answer.findings.length === 0 ? null : (
            <div className="table-wrap">
              <table className="findings stack">
                <caption>{answer.findings.length === 1 ? "1 finding" : `${answer.findings.length} findings`}</caption>
                <thead>
                  <tr>
                    <th scope="col">Found</th><th scope="col">Action</th><th scope="col" className="num">Characters</th>
                    <th scope="col">In your text</th>
                  </tr>
                </thead>
                <tbody>
                  {answer.findings.map((finding, index) => (
                    <tr key={index}>
                      <td data-label="Found">{finding.label === undefined ? finding.type : <>filter <code>{finding.label}</code></>}</td>
                      <td data-label="Action">{finding.action}</td>
                      <td data-label="Characters" className="num">{finding.start}–{finding.end}</td>
                      <td data-label="In your text"><code>{result.text.slice(finding.start, finding.end)}</code></td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )}
        </div>
      )}
    </section>
  )
}

const PolicyForm = ({ policy, updatedAt: savedAt, editable }: {
  policy: GuardrailPolicy
  updatedAt: string | null
  editable: boolean
}) => {
  const { caller } = useSession()
  const rows = useRef(0)
  const rowId = () => rows.current++
  const [draft, setDraft] = useState(() => draftOf(policy, rowId))
  const [updatedAt, setUpdatedAt] = useState(savedAt)
  const [busy, setBusy] = useState(false)
  const [failure, setFailure] = useState<Failure | null>(null)
  const [saved, setSaved] = useState(false)
  const form = useRef<HTMLFormElement>(null)

  // The field the service refused takes the focus, so its message is read with it.
  useEffect(() => {
    if (failure?.field) form.current?.querySelector<HTMLElement>("[aria-invalid=true]")?.focus()
  }, [failure])

  /** An edit of `field`: not saved any more, and the service's message for that field goes with it. */
  const edit = (field: string | null, change: (current: Draft) => Draft) => {
    setDraft(change)
    setSaved(false)
    if (field !== null && failure?.field === field) setFailure(null)
  }
  const setFilter = <K extends "label" | "pattern" | "action">(index: number, part: K, value: FilterDraft[K]) =>
    edit(`filters[${index}].${part}`, (current) => ({
      ...current,
      filters: current.filters.map((filter, at) => at === index ? { ...filter, [part]: value } : filter)
    }))
  const addFilter = () =>
    edit(null, (current) => ({
      ...current,
      filters: [...current.filters, { row: rowId(), label: "", pattern: "", action: "redact" }]
    }))
  const removeFilter = (index: number) => {
    // The rows after it move up: a message naming a filter by its place no longer points at it.
    if (failure?.field?.startsWith("filters[")) setFailure(null)
    edit(null, (current) => ({ ...current, filters: current.filters.filter((_, at) => at !== index) }))
  }
  const errorFor = (field: string): string | null => failure?.field === field ? failure.message : null
  const hint = (text: string): string | undefined => editable ? text : undefined

  const save = async () => {
    setFailure(null)
    setSaved(false)
    setBusy(true)
    try {
      const answer = await api("PUT /dashboard/guardrails", { caller, json: policyOf(draft) })
      setDraft(draftOf(answer.policy, rowId))
      setUpdatedAt(answer.updated_at)
      setSaved(true)
    } catch (cause) {
      setFailure(failureOf(cause))
    } finally {
      setBusy(false)
    }
  }

  return (
    <>
      <form ref={form} className="card guardrails" aria-labelledby="policy-heading" noValidate onSubmit={(e) => {
        e.preventDefault()
        if (editable) void save()
      }}>
        <h2 id="policy-heading">The account's policy</h2>
        <p className="note">
          {updatedAt === null ? "Not set yet: every rule is off." : <>Last saved <DateTime iso={updatedAt} />.</>}
        </p>
        <p className="note">
          Each rule's action: <strong>flag</strong> logs the match and passes the text as sent; <strong>redact</strong>{" "}
          replaces it with a placeholder; <strong>block</strong> refuses the call with <code>content_blocked</code>.
        </p>
        {failure?.field === null ? <ErrorPanel error={failure.error} /> : null}
        <fieldset>
          <legend>Personal data</legend>
          <div className="form-grid">
            <Field label="PII action" error={errorFor("pii.action")}>
              {(props) => (
                <select {...props} value={draft.piiAction} disabled={!editable} onChange={(e) => {
                  const action = GUARDRAIL_ACTIONS.find((one) => one === e.target.value) ?? "off"
                  edit("pii.action", (current) => ({ ...current, piiAction: action }))
                }}>
                  {GUARDRAIL_ACTIONS.map((one) => <option key={one} value={one}>{ACTION_LABELS[one]}</option>)}
                </select>
              )}
            </Field>
          </div>
          <Checks legend="Detect" error={errorFor("pii.types")}>
            {(props) =>
              PII_TYPES.map((type) => (
                <label key={type} className="check">
                  <input {...props} type="checkbox" checked={draft.piiTypes.includes(type)} disabled={!editable} onChange={(e) => {
                    const on = e.target.checked
                    edit("pii.types", (current) => ({ ...current, piiTypes: toggled(current.piiTypes, type, on) }))
                  }} /> {PII_LABELS[type]}
                </label>
              ))}
          </Checks>
        </fieldset>
        <fieldset>
          <legend>Prompt injection</legend>
          <div className="form-grid">
            <Field label="Injection action" hint={hint("English and Malay phrases such as “ignore previous instructions” or “abaikan semua arahan sebelum ini”.")} error={errorFor("injection.action")}>
              {(props) => (
                <select {...props} value={draft.injectionAction} disabled={!editable} onChange={(e) => {
                  const action = INJECTION_ACTIONS.find((one) => one === e.target.value) ?? "off"
                  edit("injection.action", (current) => ({ ...current, injectionAction: action }))
                }}>
                  {INJECTION_ACTIONS.map((one) => <option key={one} value={one}>{ACTION_LABELS[one]}</option>)}
                </select>
              )}
            </Field>
          </div>
        </fieldset>
        <fieldset>
          <legend>Custom filters</legend>
          <p className="note">
            Your own patterns, in RE2 syntax (<code>(?i)project\s+nenas</code>): at most {MAX_FILTERS}, each at most 200
            characters. A redacted match becomes its label in brackets.
          </p>
          {draft.filters.length === 0 ? <p className="note">No filters.</p> : null}
          {draft.filters.map((filter, index) => (
            <fieldset key={filter.row} className="filter-row">
              <legend>Filter {index + 1}</legend>
              <div className="form-grid">
                <Field label="Label" hint={hint("1 to 32 of A–Z, 0–9 and _.")} error={errorFor(`filters[${index}].label`)}>
                  {(props) => (
                    <input {...props} readOnly={!editable} autoComplete="off" spellCheck="false" maxLength={32} value={filter.label}
                      onChange={(e) => setFilter(index, "label", e.target.value)} />
                  )}
                </Field>
                <Field label="Pattern" error={errorFor(`filters[${index}].pattern`)}>
                  {(props) => (
                    <input {...props} className="mono" readOnly={!editable} autoComplete="off" spellCheck="false" value={filter.pattern}
                      onChange={(e) => setFilter(index, "pattern", e.target.value)} />
                  )}
                </Field>
                <Field label="Filter action" error={errorFor(`filters[${index}].action`)}>
                  {(props) => (
                    <select {...props} value={filter.action} disabled={!editable} onChange={(e) => setFilter(index, "action", GUARDRAIL_ACTIONS.find((one) => one === e.target.value) ?? "off")}>
                      {GUARDRAIL_ACTIONS.map((one) => <option key={one} value={one}>{ACTION_LABELS[one]}</option>)}
                    </select>
                  )}
                </Field>
              </div>
              {editable
                ? <button type="button" className="quiet small" onClick={() => removeFilter(index)}>Remove filter {index + 1}</button>
                : null}
            </fieldset>
          ))}
          {editable
            ? <button type="button" className="quiet" disabled={draft.filters.length >= MAX_FILTERS} onClick={addFilter}>Add a filter</button>
            : null}
        </fieldset>
        <Checks legend="Apply to" boxed error={errorFor("apply_to")}>
          {(props) =>
            GUARDRAIL_DIRECTIONS.map((direction) => (
              <label key={direction} className="check">
                <input {...props} type="checkbox" checked={draft.applyTo.includes(direction)} disabled={!editable} onChange={(e) => {
                  const on = e.target.checked
                  edit("apply_to", (current) => ({ ...current, applyTo: toggled(current.applyTo, direction, on) }))
                }} /> {DIRECTION_LABELS[direction]}
              </label>
            ))}
        </Checks>
        {editable
          ? (
            <div className="actions">
              <button type="submit" disabled={busy} aria-busy={busy}>{busy ? "Saving…" : "Save the policy"}</button>
              {saved ? <p role="status" className="saved">Saved</p> : null}
            </div>
          )
          : null}
      </form>
      <TryIt policy={policyOf(draft)} onFieldError={setFailure} />
    </>
  )
}

/** The account's guardrail policy and a box to try it (docs/api/guardrails.md). */
export const GuardrailsPage = () => {
  const { can } = useAccounts()
  const editable = can("PUT /dashboard/guardrails")
  const [loaded, reload] = useApi("GET /dashboard/guardrails")
  return (
    <>
      <PageHeading title="Guardrails" />
      <p className="note">
        What every key's calls run under, unless the key overrides it (API keys, Edit): personal data, prompt injection
        and your own filters, on what callers send and what the model answers. Logs keep rule names and counts, never
        the text matched.
      </p>
      {editable ? null : <p className="note">Changing these needs the role {neededRoles("PUT /dashboard/guardrails")} in this account.</p>}
      <Load value={loaded} what="the guardrail policy" retry={reload}>
        {(data) => <PolicyForm key={data.updated_at ?? "none"} policy={data.policy} updatedAt={data.updated_at} editable={editable} />}
      </Load>
    </>
  )
}
