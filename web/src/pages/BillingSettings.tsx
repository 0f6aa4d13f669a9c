import { useState } from "react"
import { AUTO_TOPUP_AMOUNTS_MYR, ApiError, api, type AutoTopupAmount, type BillingSettings as Settings, type UpdateBillingSettings } from "../api"
import { useAccounts } from "../accounts"
import { ErrorPanel, Field, Load } from "../components"
import { neededRoles } from "../roles"
import { useApi, useSession } from "../session"

/** Saves one change to the settings; the form shows the settings the service answers. */
const useSave = (onSaved: (settings: Settings) => void) => {
  const { caller } = useSession()
  const [error, setError] = useState<ApiError | null>(null)
  const [saved, setSaved] = useState<string | null>(null)
  const save = async (json: UpdateBillingSettings, what: string) => {
    setError(null)
    setSaved(null)
    try {
      onSaved(await api("PUT /dashboard/billing/settings", { caller, json }))
      setSaved(what)
    } catch (cause) {
      if (cause instanceof ApiError) setError(cause)
      else throw cause
    }
  }
  return { error, saved, save }
}

const LowBalance = ({ settings, onSaved, editable }: { settings: Settings; onSaved: (s: Settings) => void; editable: boolean }) => {
  const [threshold, setThreshold] = useState(settings.low_balance_threshold_myr?.toString() ?? "")
  const { error, saved, save } = useSave(onSaved)
  return (
    <form className="card" aria-labelledby="alert-heading" onSubmit={(e) => {
      e.preventDefault()
      if (editable) void save({ low_balance_threshold_myr: threshold.trim() === "" ? null : Number(threshold) }, "Alert saved.")
    }}>
      <h2 id="alert-heading">Low-balance alert</h2>
      <p className="note">When usage takes your balance below this, you are told once: a banner here, an email and a <code>balance.low</code> webhook.</p>
      {error === null ? null : <ErrorPanel error={error} />}
      <Field label="Alert below (RM)" hint="Empty: no alert.">
        {(props) => <input {...props} inputMode="decimal" readOnly={!editable} value={threshold} onChange={(e) => setThreshold(e.target.value)} />}
      </Field>
      {editable ? <button type="submit">Save alert</button> : null}
      {saved === null ? null : <p role="status" className="note">{saved}</p>}
    </form>
  )
}

const AutoTopup = ({ settings, onSaved, editable, cardChangeable }: {
  settings: Settings
  onSaved: (s: Settings) => void
  editable: boolean
  cardChangeable: boolean
}) => {
  const { caller } = useSession()
  const auto = settings.auto_topup
  const [enabled, setEnabled] = useState(auto.enabled)
  const [threshold, setThreshold] = useState(auto.threshold_myr?.toString() ?? "5")
  const [amount, setAmount] = useState(String(auto.amount_myr ?? 25))
  const [cardError, setCardError] = useState<ApiError | null>(null)
  const { error, saved, save } = useSave(onSaved)
  const saveCard = async () => {
    try {
      const { url } = await api("POST /dashboard/billing/card", { caller })
      window.location.assign(url)
    } catch (cause) {
      if (cause instanceof ApiError) setCardError(cause)
      else throw cause
    }
  }
  return (
    <form className="card" aria-labelledby="auto-heading" onSubmit={(e) => {
      e.preventDefault()
      if (editable) void save({
        auto_topup: { enabled, threshold_myr: Number(threshold), amount_myr: Number(amount) as AutoTopupAmount }
      }, enabled ? "Auto top-up is on." : "Auto top-up is off.")
    }}>
      <h2 id="auto-heading">Auto top-up</h2>
      {auto.disabled_reason === null || auto.enabled ? null : (
        <p className="warning" role="note">Auto top-up turned itself off: {auto.disabled_reason}</p>
      )}
      <p>
        {settings.card === null
          ? "No card saved."
          : <>Card: <strong>{settings.card.brand} ending {settings.card.last4}</strong> (expires {settings.card.exp_month}/{settings.card.exp_year})</>}
        {" "}
        {cardChangeable
          ? <button type="button" className="quiet" onClick={() => void saveCard()}>{settings.card === null ? "Save a card" : "Replace the card"}</button>
          : null}
      </p>
      {cardError === null ? null : <ErrorPanel error={cardError} />}
      {error === null ? null : <ErrorPanel error={error} />}
      <label className="check"><input type="checkbox" checked={enabled} disabled={!editable} onChange={(e) => setEnabled(e.target.checked)} /> Top up automatically</label>
      <Field label="When the balance is below (RM)">
        {(props) => <input {...props} inputMode="decimal" readOnly={!editable} value={threshold} onChange={(e) => setThreshold(e.target.value)} />}
      </Field>
      <Field label="Add (RM)" hint={`At most ${auto.max_per_day} times in 24 hours.`}>
        {(props) => (
          <select {...props} value={amount} disabled={!editable} onChange={(e) => setAmount(e.target.value)}>
            {AUTO_TOPUP_AMOUNTS_MYR.map((myr) => <option key={myr} value={myr}>RM {myr}</option>)}
          </select>
        )}
      </Field>
      {editable ? <button type="submit">Save auto top-up</button> : null}
      {saved === null ? null : <p role="status" className="note">{saved}</p>}
    </form>
  )
}

/** The Billing page's alert and auto top-up settings. */
export const BillingSettingsPanel = () => {
  const { can } = useAccounts()
  const editable = can("PUT /dashboard/billing/settings")
  const [loaded, reload] = useApi("GET /dashboard/billing/settings")
  const [current, setCurrent] = useState<Settings | null>(null)
  return (
    <Load value={loaded} what="your alert settings" retry={reload}>
      {(data) => {
        const settings = current ?? data
        return (
          <div className="settings-grid">
            {editable ? null : <p className="note">Changing these needs the role {neededRoles("PUT /dashboard/billing/settings")} in this account.</p>}
            <LowBalance settings={settings} onSaved={setCurrent} editable={editable} />
            <AutoTopup settings={settings} onSaved={setCurrent} editable={editable} cardChangeable={can("POST /dashboard/billing/card")} />
          </div>
        )
      }}
    </Load>
  )
}
