import { useState } from "react"
import { Link } from "react-router"
import { ApiError, INVOICE_TYPES, download, type EInvoiceStatus, type Invoice, type InvoiceType } from "../api"
import { DateTime, Empty, Field, Load, PageHeading, Pager } from "../components"
import { formatCostMyr } from "../format"
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

/** Where MyInvois has the document: pending, valid (with its validation link), rejected (with its first reason) or cancelled. */
const EInvoiceState = ({ eInvoice }: { eInvoice: Invoice["e_invoice"] }) => {
  const reason = eInvoice.status === "invalid" ? eInvoice.errors[0]?.message : undefined
  return (
    <span className="e-invoice">
      <span className={`badge ${STATUS_BADGES[eInvoice.status]}`}>{STATUS_LABELS[eInvoice.status]}</span>
      {reason === undefined ? null : <span className="e-invoice-reason">{reason}</span>}
      {eInvoice.status === "valid" && eInvoice.validation_url !== null
        ? <a href={eInvoice.validation_url} target="_blank" rel="noreferrer">Check on MyInvois</a>
        : null}
    </span>
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

/** Tax invoices and the notes after them (docs/api/invoices.md, "Documents"), newest first. */
export const InvoicesPage = () => {
  const [type, setType] = useState<InvoiceType | "">("")
  const [page, setPage] = useState(1)
  const [documents, reload] = useApi("GET /dashboard/billing/invoices", {
    query: { page: String(page), limit: String(PAGE_SIZE), type: type === "" ? undefined : type }
  })
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
                        <tr key={invoice.id}>
                          <th scope="row" className="mono">{invoice.number}</th>
                          <td data-label="Type">{TYPE_LABELS[invoice.type]}</td>
                          <td data-label="Date"><DateTime iso={invoice.issued_at} /></td>
                          <td data-label="Net" className="num"><span className="money">{ringgit(invoice.net_myr)}</span></td>
                          <td data-label="Tax" className="num"><span className="money">{ringgit(invoice.tax_myr)}</span></td>
                          <td data-label="Total" className="num"><strong className="money">{ringgit(invoice.total_myr)}</strong></td>
                          <td data-label="e-Invoice"><EInvoiceState eInvoice={invoice.e_invoice} /></td>
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
