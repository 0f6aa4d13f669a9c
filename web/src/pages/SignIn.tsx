import { useState, type FormEvent } from "react"
import { api } from "../api"
import { ErrorPanel, Field, Loading, PageHeading, useSubmission } from "../components"
import { startProviderSignIn, tokenClaims, useSession } from "../session"

/** Whom a pasted token signs in as, read from its claims before the developer confirms. */
interface PastedAccount {
  readonly token: string
  readonly who: string
  readonly issuer: string
}

const readPasted = (token: string): PastedAccount | null => {
  const claims = tokenClaims(token)
  if (claims === null) return null
  const text = (name: string) => typeof claims[name] === "string" && claims[name] !== "" ? claims[name] as string : null
  const who = text("email") ?? text("sub")
  return who === null ? null : { token, who, issuer: text("iss") ?? "an unnamed issuer" }
}

/**
 * Locally, the development identity provider signs anyone in by email. With
 * a real provider (AUTH_JWKS_URL), the sign-in button redirects there and the
 * redirect hands the token back in the URL fragment (read by the session, with
 * its state checked), or the developer pastes a token here and confirms the
 * account it signs into.
 */
export const SignInPage = () => {
  const { config, notice, signIn } = useSession()
  const [email, setEmail] = useState("")
  const [pasted, setPasted] = useState("")
  const [confirming, setConfirming] = useState<PastedAccount | null>(null)
  const [unreadable, setUnreadable] = useState(false)
  const { busy, error, submit } = useSubmission()

  const devSignIn = (event: FormEvent) => {
    event.preventDefault()
    void submit(async () => {
      const { token } = await api("POST /dev/session", { json: { email } })
      signIn(token)
    })
  }

  // A pasted token is never used at once: someone else's token would sign this browser into their account.
  const pasteSignIn = (event: FormEvent) => {
    event.preventDefault()
    const account = readPasted(pasted.trim())
    setUnreadable(account === null)
    setConfirming(account)
  }

  return (
    <main id="main" className="signin">
      <PageHeading title="Sign in to nenas" />
      {notice === null ? null : <p role="alert" className="card notice">{notice}</p>}
      {error === null ? null : <ErrorPanel error={error} />}
      {config?.identity === "off"
        ? (
          <p className="card">
            Sign-in is off: no identity provider is configured (AUTH_JWKS_URL), and the development sign-in
            runs only when the service listens on a loopback address (or with DEV_AUTH=1).
          </p>
        )
        : null}
      {config?.identity === "external" && config.authorize !== null
        ? (
          <div className="card">
            <h2>Sign in with your identity provider</h2>
            <button type="button" onClick={() => config.authorize === null ? undefined : startProviderSignIn(config.authorize)}>
              Continue to sign-in
            </button>
          </div>
        )
        : null}
      {config === null ? <Loading what="the sign-in options" /> : config.identity !== "development" ? null : (
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
        <h2>Use a session token</h2>
        <p>Paste a session token (a JWT) issued by the identity provider. You confirm the account it signs into before it is used.</p>
        <Field label="Session token" hint="Kept in this tab only (memory and sessionStorage), never in a cookie.">
          {(props) => (
            <textarea {...props} rows={3} spellCheck={false} autoComplete="off" value={pasted} onChange={(e) => {
              setPasted(e.target.value)
              setConfirming(null)
              setUnreadable(false)
            }} />
          )}
        </Field>
        {unreadable ? <p role="alert">This is not a session token: a JWT naming an account (email or sub).</p> : null}
        {confirming === null
          ? <button type="submit" disabled={pasted.trim() === ""}>Use this token</button>
          : (
            <div role="group" aria-label="Confirm the account">
              <p>
                This token signs you in as <strong>{confirming.who}</strong> (issued by {confirming.issuer}).
                Continue only if this is your own account: a token someone else gave you signs you into theirs,
                and what you pay or create there is theirs.
              </p>
              <button type="button" onClick={() => signIn(confirming.token)}>Sign in as {confirming.who}</button>
              {" "}
              <button type="button" className="quiet" onClick={() => setConfirming(null)}>Cancel</button>
            </div>
          )}
      </form>
    </main>
  )
}
