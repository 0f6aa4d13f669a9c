import { useEffect, useId, useRef, useState, type ReactNode } from "react"
import { Link } from "react-router"
import { ApiError } from "./api"
import { formatCostMyr, formatDateTime, formatMicroMyrExact } from "./format"
import { useSession, type Loadable } from "./session"

/** An amount with the digits that matter (`RM 0.000139`, `RM 10.00`); the exact micro-MYR in the tooltip. */
export const Money = ({ micro }: { micro: number }) => (
  <span className="money" title={formatMicroMyrExact(micro)} data-micro-myr={micro}>{formatCostMyr(micro)}</span>
)

/** A big figure with its exact amount written out beneath (a tooltip alone is out of reach of keyboards and touch). */
export const MoneyStat = ({ label, micro, note }: { label: string; micro: number; note?: ReactNode }) => (
  <div className="stat">
    <div className="stat-label">{label}</div>
    <div className="stat-value"><Money micro={micro} /></div>
    <div className="stat-note">{formatMicroMyrExact(micro)}</div>
    {note === undefined ? null : <div className="stat-note">{note}</div>}
  </div>
)

export const Stat = ({ label, value, note }: { label: string; value: ReactNode; note?: ReactNode }) => (
  <div className="stat">
    <div className="stat-label">{label}</div>
    <div className="stat-value">{value}</div>
    {note === undefined ? null : <div className="stat-note">{note}</div>}
  </div>
)

/** What was spent this month against a monthly limit (null: none), with a meter when there is one. */
export const SpendOfLimit = ({ spent, limit, what }: { spent: number; limit: number | null; what: string }) => {
  if (limit === null) return <><Money micro={spent} /> <span className="muted">(no limit)</span></>
  const share = limit === 0 ? 1 : Math.min(spent / limit, 1)
  return (
    <span className="month-to-date">
      <Money micro={spent} /> of <Money micro={limit} />
      <meter min={0} max={1} value={share} high={0.8} optimum={0} aria-label={`${Math.round(share * 100)}% of the ${what}`} />
    </span>
  )
}

export const DateTime = ({ iso }: { iso: string }) => (
  <time dateTime={iso} title={iso}>{formatDateTime(iso)}</time>
)

/** Same-origin action URLs stay in the app (no reload, the session kept); others open as plain links. */
const ActionLink = ({ url }: { url: string }) => {
  const target = new URL(url, window.location.href)
  const inApp = target.origin === window.location.origin && target.pathname.startsWith("/app/")
  const label = `Go to ${target.pathname.replace(/^\/app\//, "").replace(/-/g, " ") || "the dashboard"}`
  return inApp
    ? <Link className="button" to={target.pathname.slice("/app".length) + target.search}>{label}</Link>
    : <a className="button" href={url}>{label}</a>
}

/** An API error as the API words it: message, guidance, the action to take and the request id to quote. */
export const ErrorPanel = ({ error, onRetry }: { error: ApiError; onRetry?: () => void }) => {
  const { signOut } = useSession()
  const body = error.body
  return (
    <div className="error" role="alert">
      <p className="error-message"><strong>{body.message}</strong></p>
      {body.guidance === null ? null : <p className="error-guidance">{body.guidance}</p>}
      <div className="actions">
        {body.action_url === null ? null : <ActionLink url={body.action_url} />}
        {body.code === "authentication_error"
          ? <button type="button" onClick={signOut}>Sign in again</button>
          : onRetry === undefined || !body.retryable ? null : <button type="button" onClick={onRetry}>Try again</button>}
      </div>
      <p className="error-meta">
        <code>{body.code}</code>
        {body.request_id === "" ? null : <> · request <code>{body.request_id}</code></>}
      </p>
    </div>
  )
}

export const Loading = ({ what }: { what: string }) => <p className="loading" role="status">Loading {what}…</p>

export const Empty = ({ children }: { children: ReactNode }) => <div className="empty">{children}</div>

/** Renders a Loadable: the error, the loading note, or the data (kept on screen while it reloads). */
export const Load = <A,>({ value, what, retry, children }: {
  value: Loadable<A>
  what: string
  retry?: () => void
  children: (data: A) => ReactNode
}) => (
  <>
    {value.state === "failed" ? <ErrorPanel error={value.error} {...(retry === undefined ? {} : { onRetry: retry })} /> : null}
    {value.data !== undefined ? children(value.data) : value.state === "loading" ? <Loading what={what} /> : null}
  </>
)

/** Sets the document title and moves focus to the page heading on navigation, for screen readers and keyboards. */
export const PageHeading = ({ title, children }: { title: string; children?: ReactNode }) => {
  const ref = useRef<HTMLHeadingElement>(null)
  useEffect(() => {
    document.title = `${title} · nenas`
    ref.current?.focus({ preventScroll: true })
  }, [title])
  return (
    <div className="page-heading">
      <h1 ref={ref} tabIndex={-1}>{title}</h1>
      {children}
    </div>
  )
}

/**
 * A labelled form field: the label names the control, the hint describes it, and `error` (the service's
 * message for this field) stands beneath it, marks the control invalid and is read with it.
 */
export const Field = ({ label, hint, error, children }: {
  label: string
  hint?: string
  error?: string | null
  children: (props: { id: string; "aria-describedby"?: string; "aria-invalid"?: true }) => ReactNode
}) => {
  const id = useId()
  const hintId = `${id}-hint`
  const errorId = `${id}-error`
  const invalid = error !== undefined && error !== null
  const describedBy = [invalid ? errorId : null, hint === undefined ? null : hintId].filter((one) => one !== null).join(" ")
  return (
    <div className={invalid ? "field invalid" : "field"}>
      <label htmlFor={id}>{label}</label>
      {children({ id, ...(describedBy === "" ? {} : { "aria-describedby": describedBy }), ...(invalid ? { "aria-invalid": true } : {}) })}
      {invalid ? <small id={errorId} className="field-error">{error}</small> : null}
      {hint === undefined ? null : <small id={hintId}>{hint}</small>}
    </div>
  )
}

export const Pager = ({ page, hasMore, onPage, summary }: {
  page: number
  hasMore: boolean
  onPage: (page: number) => void
  summary?: string
}) => (
  <nav className="pager" aria-label="Pages">
    <button type="button" disabled={page <= 1} onClick={() => onPage(page - 1)}>Previous</button>
    <span aria-live="polite">Page {page}{summary === undefined ? "" : ` · ${summary}`}</span>
    <button type="button" disabled={!hasMore} onClick={() => onPage(page + 1)}>Next</button>
  </nav>
)

/**
 * A form's submission: `busy` while its action runs, and the service's
 * refusal (an `ApiError`) kept for the form to show; anything else is thrown.
 */
export const useSubmission = () => {
  const [busy, setBusy] = useState(false)
  const [error, setError] = useState<ApiError | null>(null)
  const submit = async (action: () => Promise<void>) => {
    setBusy(true)
    setError(null)
    try {
      await action()
    } catch (cause) {
      if (cause instanceof ApiError) setError(cause)
      else throw cause
    } finally {
      setBusy(false)
    }
  }
  return { busy, error, submit }
}
