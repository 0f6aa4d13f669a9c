import { useState } from "react"
import { ApiError, download, type Query } from "./api"
import { useSession } from "./session"

/** Downloads the CSV export at `path` with the page's filters; says why when it cannot. */
export const ExportButton = ({ path, query, filename }: { path: string; query: Query; filename: string }) => {
  const { token } = useSession()
  const [busy, setBusy] = useState(false)
  const [error, setError] = useState<string | null>(null)
  const start = () => {
    setBusy(true)
    setError(null)
    download(path, { ...query, format: "csv" }, token, filename)
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
