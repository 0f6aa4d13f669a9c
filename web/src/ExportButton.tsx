import { useState } from "react"
import { ApiError, type Caller } from "./api"
import { useSession } from "./session"

/** Starts a CSV export (`save`: `download` of an export route with the page's filters); says why when it cannot. */
export const ExportButton = ({ save }: { save: (caller: Caller) => Promise<void> }) => {
  const { caller } = useSession()
  const [busy, setBusy] = useState(false)
  const [error, setError] = useState<string | null>(null)
  const start = () => {
    setBusy(true)
    setError(null)
    save(caller)
      .catch((cause: unknown) => setError(cause instanceof ApiError ? cause.message : "The export failed; try again."))
      .finally(() => setBusy(false))
  }
  return (
    <>
      <button type="button" className="quiet" onClick={start} disabled={busy} aria-busy={busy}>
        {busy ? "Exporting…" : "Export CSV"}
      </button>
      {error === null ? null : <span role="alert" className="error">{error}</span>}
    </>
  )
}
