import { useState, type FormEvent } from "react"
import { ApiError, request } from "../api"
import { ErrorPanel, Field, Loading, PageHeading } from "../components"
import { useSession } from "../session"

/**
 * Locally, the development identity provider signs anyone in by email. With
 * a real provider (AUTH_JWKS_URL), its redirect hands the token over in the
 * URL fragment (read by the session), or the developer pastes it here.
 */
export const SignInPage = () => {
  const { config, signIn } = useSession()
  const [email, setEmail] = useState("")
  const [pasted, setPasted] = useState("")
  const [error, setError] = useState<ApiError | null>(null)
  const [busy, setBusy] = useState(false)

  const devSignIn = async (event: FormEvent) => {
    event.preventDefault()
    setBusy(true)
    setError(null)
    try {
      const { token } = await request<{ token: string }>("/dev/session", { method: "POST", json: { email } })
      signIn(token)
    } catch (cause) {
      if (cause instanceof ApiError) setError(cause)
      else throw cause
    } finally {
      setBusy(false)
    }
  }

  const pasteSignIn = (event: FormEvent) => {
    event.preventDefault()
    const token = pasted.trim()
    if (token !== "") signIn(token)
  }

  return (
    <main id="main" className="signin">
      <PageHeading title="Sign in to nenas" />
      {error === null ? null : <ErrorPanel error={error} />}
      {config === null ? <Loading what="the sign-in options" /> : config.identity === "external" ? null : (
        <form onSubmit={devSignIn} className="card">
          <h2>Development sign-in</h2>
          <p>This service runs the built-in development identity provider: any email address signs in, and its account is created on first use.</p>
          <Field label="Email">
            {(props) => (
              <input {...props} type="email" autoComplete="email" required value={email} onChange={(e) => setEmail(e.target.value)} />
            )}
          </Field>
          <button type="submit" disabled={busy}>{busy ? "Signing in…" : "Sign in"}</button>
        </form>
      )}
      <form onSubmit={pasteSignIn} className="card">
        <h2>{config?.identity === "external" ? "Sign in with your identity provider" : "Use a session token"}</h2>
        <p>
          {config?.identity === "external"
            ? "Sign in at your identity provider; it sends you back here with the token in the address (#id_token=…), which signs you in. Or paste a session token it issued:"
            : "Paste a session token (a JWT) issued by the identity provider:"}
        </p>
        <Field label="Session token" hint="Kept in this tab only (memory and sessionStorage), never in a cookie.">
          {(props) => (
            <textarea {...props} rows={3} spellCheck={false} autoComplete="off" value={pasted} onChange={(e) => setPasted(e.target.value)} />
          )}
        </Field>
        <button type="submit" disabled={pasted.trim() === ""}>Use this token</button>
      </form>
    </main>
  )
}
