import { useState } from "react"
import { Link, useSearchParams } from "react-router"
import { ApiError, LEDGER_TYPES, api, type LedgerType, type TopUpSen, type TopupOption } from "../api"
import { DateTime, Empty, ErrorPanel, Field, Load, Money, MoneyStat, PageHeading, Pager } from "../components"
import { useAccounts } from "../accounts"
import { formatCostMyr } from "../format"
import { neededRoles } from "../roles"
import { useApi, useSession } from "../session"
import { BillingSettingsPanel } from "./BillingSettings"

const PAGE_SIZE = 20

const TYPE_LABELS: Record<LedgerType, string> = {
  topup: "Top-up",
  usage: "Usage",
  refund: "Refund",
  chargeback: "Chargeback",
  chargeback_reversal: "Chargeback reversed",
  adjustment: "Adjustment"
}

const MICRO_PER_SEN = 10_000

/** A tax rate in basis points as a percentage: 800 → `8%`, 650 → `6.5%`. */
const percent = (bps: number): string => `${bps / 100}%`

/** What one top-up option charges: the amount alone without service tax; with it, the tax and the total beside it. */
const TopUpAmount = ({ option, taxed }: { option: TopupOption; taxed: boolean }) =>
  taxed
    ? (
      <span className="topup-price">
        <span className="topup-amount">{formatCostMyr(option.amount_sen * MICRO_PER_SEN)}</span>{" "}
        <span className="topup-tax">
          + <span className="money">{formatCostMyr(option.tax_sen * MICRO_PER_SEN)}</span> SST = <strong className="money">{formatCostMyr(option.total_sen * MICRO_PER_SEN)}</strong>
        </span>
      </span>
    )
    : <>{formatCostMyr(option.amount_sen * MICRO_PER_SEN)}</>

const TopUp = ({ options, rateBps }: { options: ReadonlyArray<TopupOption>; rateBps: number }) => {
  const { caller, config } = useSession()
  const [error, setError] = useState<ApiError | null>(null)
  const [pending, setPending] = useState<number | null>(null)
  const start = async (amountSen: number) => {
    setPending(amountSen)
    setError(null)
    try {
      // One of the amounts the balance lists, which are those checkout takes.
      const { url } = await api("POST /dashboard/billing/checkout", { caller, json: { amount_sen: amountSen as TopUpSen } })
      window.location.assign(url)
    } catch (cause) {
      setPending(null)
      if (cause instanceof ApiError) setError(cause)
      else throw cause
    }
  }
  return (
    <section className="card" aria-labelledby="topup-heading">
      <h2 id="topup-heading">Top up</h2>
      <p className="note">
        {config?.checkout === "stripe"
          ? "You pay on Stripe's checkout page and come back here."
          : "This service uses the simulated checkout: its page pays without a card, through the same webhook path as Stripe."}
        {rateBps > 0 ? ` Service tax (SST) of ${percent(rateBps)} is added to each top-up: your balance gets the amount, the invoice shows the tax.` : null}
      </p>
      {error === null ? null : <ErrorPanel error={error} />}
      <div className={rateBps > 0 ? "topups taxed" : "topups"}>
        {options.map((option) => (
          <button key={option.amount_sen} type="button" onClick={() => start(option.amount_sen)} disabled={pending !== null}>
            {pending === option.amount_sen ? "Opening checkout…" : <><span className="visually-hidden">Top up </span><TopUpAmount option={option} taxed={rateBps > 0} /></>}
          </button>
        ))}
      </div>
    </section>
  )
}

const CheckoutNotice = () => {
  const [params, setParams] = useSearchParams()
  const outcome = params.get("checkout")
  if (outcome === null) return null
  const dismiss = () => setParams({}, { replace: true })
  return (
    <div className={outcome === "success" ? "notice success" : "notice"} role="status">
      <p>
        {outcome === "success"
          ? "Payment received. The amount is added to your balance once the payment processor confirms it (shown below)."
          : "Checkout was cancelled; nothing was charged."}
      </p>
      <button type="button" className="quiet small" onClick={dismiss}>Dismiss</button>
    </div>
  )
}

export const BillingPage = () => {
  const { can } = useAccounts()
  const [balance, reloadBalance] = useApi("GET /dashboard/billing/balance")
  const [type, setType] = useState<LedgerType | "">("")
  const [page, setPage] = useState(1)
  const [ledger, reloadLedger] = useApi("GET /dashboard/billing/transactions", {
    query: { page: String(page), limit: String(PAGE_SIZE), type: type === "" ? undefined : type }
  })
  return (
    <>
      <PageHeading title="Billing">
        <button type="button" className="quiet" onClick={() => {
          reloadBalance()
          reloadLedger()
        }}>Refresh</button>
      </PageHeading>
      <CheckoutNotice />
      <Load value={balance} what="your balance" retry={reloadBalance}>
        {(data) => (
          <>
            {data.account_suspended
              ? (
                <div className="error suspended" role="alert">
                  <p className="error-message"><strong>Your account is suspended while a payment dispute is open.</strong></p>
                  <p className="error-guidance">
                    Model calls answer <code>permission_denied</code> until the dispute closes; this dashboard still works.
                    The disputed amount is debited below as a chargeback, and credited back if the dispute is decided for you.
                  </p>
                </div>
              )
              : null}
            <section aria-labelledby="balance-heading">
              <h2 id="balance-heading">Balance</h2>
              {data.wallet.availableMicroMyr < 0
                ? <p className="warning" role="note">Your balance is negative (a refund or chargeback); live calls are refused until you top up.</p>
                : null}
              <div className="stats">
                <MoneyStat label="Available" micro={data.wallet.availableMicroMyr} />
                <MoneyStat label="Reserved by calls in flight" micro={data.wallet.reservedMicroMyr} />
                <MoneyStat label="Topped up in all" micro={data.wallet.lifetimeTopupMicroMyr} />
                <MoneyStat label="Spent in all" micro={data.wallet.lifetimeSpendMicroMyr} />
              </div>
            </section>
            {can("POST /dashboard/billing/checkout")
              ? <TopUp options={data.topup_options} rateBps={data.sst_rate_bps} />
              : <p className="note">Topping up needs the role {neededRoles("POST /dashboard/billing/checkout")} in this account.</p>}
          </>
        )}
      </Load>
      <section className="card" aria-labelledby="invoices-heading">
        <h2 id="invoices-heading">Invoices</h2>
        <p className="note">Each paid top-up issues a tax invoice, and each refund a refund note; a document names the buyer with the details saved when it is issued.</p>
        <div className="actions">
          <Link className="button quiet" to="/invoices">See the invoices</Link>
          <Link className="button quiet" to="/billing/profile">{can("PUT /dashboard/billing/profile") ? "Edit the buyer's details" : "The buyer's details"}</Link>
        </div>
      </section>
      <BillingSettingsPanel />
      <section aria-labelledby="ledger-heading">
        <h2 id="ledger-heading">Ledger</h2>
        <div className="filters">
          <Field label="Type">
            {(props) => (
              <select {...props} value={type} onChange={(e) => {
                setType(e.target.value as LedgerType | "")
                setPage(1)
              }}>
                <option value="">All types</option>
                {LEDGER_TYPES.map((t) => <option key={t} value={t}>{TYPE_LABELS[t]}</option>)}
              </select>
            )}
          </Field>
        </div>
        <Load value={ledger} what="the ledger" retry={reloadLedger}>
          {(data) => (
            <>
              {data.ledger.length === 0
                ? <Empty>{page > 1 ? "No more entries." : type === "" ? `No ledger entries yet.${can("POST /dashboard/billing/checkout") ? " Top up to add the first." : ""}` : "No entries of this type."}</Empty>
                : (
                  <div className="table-wrap">
                    <table className="stack">
                      <thead>
                        <tr><th scope="col">When</th><th scope="col">Type</th><th scope="col">Description</th><th scope="col" className="num">Amount</th><th scope="col" className="num">Balance after</th></tr>
                      </thead>
                      <tbody>
                        {data.ledger.map((entry) => (
                          <tr key={entry.id}>
                            <td data-label="When"><DateTime iso={entry.createdAt} /></td>
                            <td data-label="Type">{TYPE_LABELS[entry.type]}</td>
                            <td data-label="Description">{entry.description}</td>
                            <td data-label="Amount" className={entry.amountMicroMyr < 0 ? "num debit" : "num credit"}><Money micro={entry.amountMicroMyr} /></td>
                            <td data-label="Balance after" className="num"><Money micro={entry.balanceAfterMicroMyr} /></td>
                          </tr>
                        ))}
                      </tbody>
                    </table>
                  </div>
                )}
              <Pager page={page} hasMore={data.ledger.length === PAGE_SIZE} onPage={setPage} />
            </>
          )}
        </Load>
      </section>
    </>
  )
}
