import { useEffect, useState } from "react"
import { Link } from "react-router"
import { useAccounts } from "../accounts"
import { ApiError, INVOICE_TYPES, api, download, type EInvoiceStatus, type Invoice, type InvoiceType } from "../api"
import { DateTime, Empty, Field, Load, PageHeading, Pager } from "../components"
import { formatCostMyr } from "../format"
import { neededRoles } from "../roles"
import { useApi, useSession } from "../session"

const PAGE_SIZE = 20

const TYPE_LABELS: Record<InvoiceType, string> = {
  invoice: "Invoice",
  refund_note: "Refund note",
  debit_note: "Debit note",
  credit_note: "Credit note"
}

const STATUS_LABELS: Record<EInvoiceStatus, string> = {
  pending: "Pending validation",
  submitted: "Submitted, pending validation",
  valid: "Valid",
  invalid: "Rejected",
  cancelled: "Cancelled"
}

const STATUS_BADGES: Record<EInvoiceStatus, string> = {
  pending: "badge-pending",
  submitted: "badge-pending",
  valid: "badge-succeeded",
  invalid: "badge-failed",
  cancelled: "badge-cancelled"
}

/** A document's amount in MYR (as the API gives it, to the sen) with two decimals: `RM 10.80`. */
const ringgit = (myr: number): string => formatCostMyr(Math.round(myr * 100) * 10_000)

/** What a document's e-invoice is, as the Invoices page shows it. */
type EInvoice = Invoice["e_invoice"]

/**
 * Whether the page should read the list again soon: an e-invoice made and on its way through MyInvois, which takes
 * seconds (a document waiting for its month's consolidated e-invoice waits for the month to end, and an overdue one
 * for retries hours apart).
 */
const onItsWay = (eInvoice: EInvoice): boolean =>
  (eInvoice.route === "single" || eInvoice.number !== null) && !eInvoice.overdue &&
  (eInvoice.status === "pending" || eInvoice.status === "submitted")

/** How often the list is read again while a document is on its way (docs/api/e-invoices.md, "How submission works"). */
const FOLLOW_MS = 3_000

/**
 * Why an e-invoice is overdue (docs/api/e-invoices.md, "Lifecycle"): not valid 24 hours after its issue, or, still
 * waiting for its month's consolidated e-invoice (none made yet), past the month's deadline.
 */
const overdueText = (eInvoice: EInvoice): string =>
  eInvoice.route === "consolidated" && eInvoice.number === null
    ? "Not reported past its month's deadline"
    : "Not validated 24 hours after issue"

/** Every error MyInvois gave, behind a disclosure: each with its code and where in the document it points. */
const EInvoiceErrors = ({ errors }: { errors: EInvoice["errors"] }) => (
  <details className="e-invoice-errors">
    <summary>{errors.length === 1 ? "1 error" : `${errors.length} errors`} from MyInvois</summary>
    <ul>
      {errors.map((error, index) => (
        <li key={index}>
          <span className="e-invoice-reason">{error.message === "" ? error.code : error.message}</span>
          <span className="e-invoice-error-meta">
            <code>{error.code}</code>
            {error.target === null ? null : <> at <code>{error.target}</code></>}
          </span>
        </li>
      ))}
    </ul>
  </details>
)

/**
 * Resubmits a document whose own e-invoice MyInvois found invalid, with the buyer's current billing profile
 * (docs/api/e-invoices.md, "Lifecycle"); for a role that may not, says who may.
 */
const Resubmit = ({ invoice, onResubmitted }: { invoice: Invoice; onResubmitted: () => void }) => {
  const { caller } = useSession()
  const { can } = useAccounts()
  const [busy, setBusy] = useState(false)
  const [error, setError] = useState<string | null>(null)
  const route = "POST /dashboard/billing/invoices/{id}/resubmit"
  if (!can(route)) {
    return (
      <p className="e-invoice-fix">
        Once the <Link to="/billing/profile">buyer's details</Link> are fixed, a member with the role {neededRoles(route)}{" "}
        resubmits it.
      </p>
    )
  }
  const start = () => {
    setBusy(true)
    setError(null)
    api(route, { caller, path: { id: invoice.id } })
      .then(onResubmitted, (cause: unknown) => setError(cause instanceof ApiError ? cause.message : "The resubmission failed; try again."))
      .finally(() => setBusy(false))
  }
  return (
    <>
      <p className="e-invoice-fix">Fix the <Link to="/billing/profile">buyer's details</Link> first, then resubmit.</p>
      <button type="button" className="small" onClick={start} disabled={busy} aria-busy={busy}>
        {busy ? "Resubmitting…" : "Resubmit"}<span className="visually-hidden"> {invoice.number} to MyInvois</span>
      </button>
      {error === null ? null : <span role="alert" className="field-error">{error}</span>}
    </>
  )
}

/**
 * Where MyInvois has the document: pending, valid (with its validation link), rejected (every error, and the
 * resubmission) or cancelled; a consolidated one's e-invoice named; a warning when overdue.
 */
const EInvoiceState = ({ invoice, onResubmitted }: { invoice: Invoice; onResubmitted: () => void }) => {
  const eInvoice = invoice.e_invoice
  const consolidated = eInvoice.route === "consolidated"
  return (
    <div className="e-invoice">
      <span className={`badge ${STATUS_BADGES[eInvoice.status]}`}>
        {/* Not validated yet, nor sent: its month's consolidated e-invoice is made once the month ends. */}
        {consolidated && eInvoice.number === null && eInvoice.status === "pending" ? "Pending" : STATUS_LABELS[eInvoice.status]}
      </span>
      {eInvoice.overdue ? <span className="e-invoice-overdue">{overdueText(eInvoice)}</span> : null}
      {consolidated && eInvoice.status !== "cancelled"
        ? (
          <span className="e-invoice-route">
            In the month's consolidated e-invoice{eInvoice.number === null ? null : <> <span className="mono">{eInvoice.number}</span></>}
          </span>
        )
        : null}
      {eInvoice.status === "invalid" && eInvoice.errors.length > 0 ? <EInvoiceErrors errors={eInvoice.errors} /> : null}
      {eInvoice.status === "invalid"
        ? consolidated
          ? <p className="e-invoice-fix">nenas' operator mends a consolidated e-invoice; nothing to do here.</p>
          : <Resubmit invoice={invoice} onResubmitted={onResubmitted} />
        : null}
      {eInvoice.status === "valid" && eInvoice.validation_url !== null
        ? <a href={eInvoice.validation_url} target="_blank" rel="noreferrer">Check on MyInvois</a>
        : null}
    </div>
  )
}

/** Saves the document's PDF as `<number>.pdf`, fetched with the session (a link could not carry its token). */
const PdfButton = ({ invoice }: { invoice: Invoice }) => {
  const { caller } = useSession()
  const [busy, setBusy] = useState(false)
  const [error, setError] = useState<string | null>(null)
  const start = () => {
    setBusy(true)
    setError(null)
    download("GET /dashboard/billing/invoices/{id}/pdf", { caller, path: { id: invoice.id } }, `${invoice.number}.pdf`)
      .catch((cause: unknown) => setError(cause instanceof ApiError ? cause.message : "The download failed; try again."))
      .finally(() => setBusy(false))
  }
  return (
    <>
      <button type="button" className="quiet small" onClick={start} disabled={busy} aria-busy={busy}>
        <span className="visually-hidden">Download </span>{busy ? "PDF…" : "PDF"}<span className="visually-hidden"> of {invoice.number}</span>
      </button>
      {error === null ? null : <span role="alert" className="field-error">{error}</span>}
    </>
  )
}

/**
 * Above the table when documents on the page are overdue at MyInvois (docs/api/e-invoices.md, "Lifecycle"): how
 * many, and what to do: a rejected one of its own is mended by its buyer's details and resubmitted; nenas keeps
 * submitting the others.
 */
const OverdueNotice = ({ invoices }: { invoices: ReadonlyArray<Invoice> }) => {
  const overdue = invoices.filter((invoice) => invoice.e_invoice.overdue)
  if (overdue.length === 0) return null
  const mendable = overdue.filter((invoice) => invoice.e_invoice.status === "invalid" && invoice.e_invoice.route === "single")
  const waiting = overdue.length - mendable.length
  const many = (n: number) => n === 1 ? "1 document" : `${n} documents`
  return (
    <div className="warning e-invoice-notice" role="status">
      <p>
        <strong>{many(overdue.length)} below {overdue.length === 1 ? "is" : "are"} not validated by MyInvois in time.</strong>
        {mendable.length === 0 ? null : (
          <>
            {" "}MyInvois rejected {mendable.length === overdue.length ? (mendable.length === 1 ? "it" : "them") : many(mendable.length)}:
            fix the <Link to="/billing/profile">buyer's details</Link>, then resubmit.
          </>
        )}
        {waiting === 0 ? null : ` nenas keeps submitting ${mendable.length === 0 ? (waiting === 1 ? "it" : "them") : "the others"}.`}
      </p>
    </div>
  )
}

/** Tax invoices and the notes after them (docs/api/invoices.md, "Documents"), newest first. */
export const InvoicesPage = () => {
  const [type, setType] = useState<InvoiceType | "">("")
  const [page, setPage] = useState(1)
  const [documents, reload] = useApi("GET /dashboard/billing/invoices", {
    query: { page: String(page), limit: String(PAGE_SIZE), type: type === "" ? undefined : type }
  })
  // Read again while a document is on its way through MyInvois: its validation takes seconds.
  const following = documents.data?.data.some((invoice) => onItsWay(invoice.e_invoice)) ?? false
  useEffect(() => {
    if (!following) return
    const timer = window.setInterval(reload, FOLLOW_MS)
    return () => window.clearInterval(timer)
  }, [following, reload])
  return (
    <>
      <PageHeading title="Invoices">
        <button type="button" className="quiet" onClick={reload}>Refresh</button>
      </PageHeading>
      <p className="note">
        A tax invoice for each paid top-up, a refund note for each refund or dispute debit, and a debit note for money won back.
        They name the buyer as the <Link to="/billing/profile">buyer's details</Link> were when each was issued.
      </p>
      <form className="filters" aria-label="Filter the invoices" onSubmit={(e) => e.preventDefault()}>
        <Field label="Type">
          {(props) => (
            <select {...props} value={type} onChange={(e) => {
              setType(INVOICE_TYPES.find((one) => one === e.target.value) ?? "")
              setPage(1)
            }}>
              <option value="">All types</option>
              {INVOICE_TYPES.map((one) => <option key={one} value={one}>{TYPE_LABELS[one]}</option>)}
            </select>
          )}
        </Field>
      </form>
      <Load value={documents} what="the invoices" retry={reload}>
        {(data) => (
          <>
            <OverdueNotice invoices={data.data} />
            {data.data.length === 0
              ? <Empty>{page > 1 ? "No more documents." : type === "" ? "No invoices yet: each paid top-up issues one." : "No documents of this type."}</Empty>
              : (
                <div className="table-wrap">
                  <table className="invoices stack">
                    <thead>
                      <tr>
                        <th scope="col">Number</th><th scope="col">Type</th><th scope="col">Date</th>
                        <th scope="col" className="num">Net</th><th scope="col" className="num">Tax</th><th scope="col" className="num">Total</th>
                        <th scope="col">e-Invoice</th><th scope="col"><span className="visually-hidden">Download</span></th>
                      </tr>
                    </thead>
                    <tbody>
                      {data.data.map((invoice) => (
                        <tr key={invoice.id} className={invoice.e_invoice.overdue ? "overdue" : undefined}>
                          <th scope="row" className="mono">{invoice.number}</th>
                          <td data-label="Type">{TYPE_LABELS[invoice.type]}</td>
                          <td data-label="Date"><DateTime iso={invoice.issued_at} /></td>
                          <td data-label="Net" className="num"><span className="money">{ringgit(invoice.net_myr)}</span></td>
                          <td data-label="Tax" className="num"><span className="money">{ringgit(invoice.tax_myr)}</span></td>
                          <td data-label="Total" className="num"><strong className="money">{ringgit(invoice.total_myr)}</strong></td>
                          <td data-label="e-Invoice" className={invoice.e_invoice.status === "invalid" ? "e-invoice-cell long" : "e-invoice-cell"}>
                            <EInvoiceState invoice={invoice} onResubmitted={reload} />
                          </td>
                          <td className="row-actions"><PdfButton invoice={invoice} /></td>
                        </tr>
                      ))}
                    </tbody>
                  </table>
                </div>
              )}
            <Pager page={page} hasMore={data.data.length === PAGE_SIZE} onPage={setPage} />
          </>
        )}
      </Load>
    </>
  )
}
