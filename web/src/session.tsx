import { createContext, useCallback, useContext, useEffect, useMemo, useRef, useState, type ReactNode } from "react"
import { ApiError, api, loadClientConfig, type Caller, type ClientConfig, type ReadRoute, type RequestOptions, type Success, type Target } from "./api"

/**
 * The session token lives in memory and in this tab's sessionStorage (it
 * survives a reload and the checkout's round trip, and dies with the tab),
 * never in a cookie: the API trusts only the Authorization header.
 */
const STORAGE_KEY = "nenas.session"

const readStored = (): string | null => {
  try {
    return window.sessionStorage.getItem(STORAGE_KEY)
  } catch {
    return null
  }
}

/** The nonce of a sign-in this tab started, kept until the provider's redirect comes back. */
const NONCE_KEY = "nenas.signin.nonce"

const base64url = (bytes: Uint8Array): string =>
  btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "")

/** A JWT's claims, unverified (the service verifies it): what the page may show before using it. */
export const tokenClaims = (token: string): Record<string, unknown> | null => {
  const payload = token.split(".")[1]
  if (payload === undefined) return null
  try {
    const json = atob(payload.replace(/-/g, "+").replace(/_/g, "/"))
    const bytes = Uint8Array.from(json, (char) => char.charCodeAt(0))
    const claims: unknown = JSON.parse(new TextDecoder().decode(bytes))
    return typeof claims === "object" && claims !== null ? claims as Record<string, unknown> : null
  } catch {
    return null
  }
}

/**
 * Sends the browser to the identity provider's sign-in with a fresh nonce as both
 * `state` and `nonce`; only a redirect carrying it back is accepted (`takeTokenFromFragment`).
 */
export const startProviderSignIn = (authorize: NonNullable<ClientConfig["authorize"]>): void => {
  const nonce = base64url(crypto.getRandomValues(new Uint8Array(32)))
  window.sessionStorage.setItem(NONCE_KEY, nonce)
  const url = new URL(authorize.url)
  for (const [name, value] of Object.entries({
    response_type: "id_token",
    response_mode: "fragment",
    client_id: authorize.client_id,
    redirect_uri: authorize.redirect_uri,
    scope: "openid email profile",
    state: nonce,
    nonce
  })) url.searchParams.set(name, value)
  window.location.assign(url.toString())
}

export type FragmentToken =
  | { readonly kind: "none" }
  | { readonly kind: "accepted"; readonly token: string }
  | { readonly kind: "ignored"; readonly reason: string }

/**
 * A token handed over in the URL fragment by the provider's redirect (`#id_token=…&state=…`).
 * Accepted only when `state` is the nonce this tab stored before the redirect and the token's
 * `nonce` claim is the same: a link someone else made would sign this browser into their account.
 */
export const takeTokenFromFragment = (): FragmentToken => {
  const params = new URLSearchParams(window.location.hash.replace(/^#/, ""))
  const token = params.get("id_token") ?? params.get("access_token") ?? params.get("token")
  if (token === null || token === "") return { kind: "none" }
  // The fragment must not stay in the address bar or the history.
  window.history.replaceState(window.history.state, "", window.location.pathname + window.location.search)
  const expected = window.sessionStorage.getItem(NONCE_KEY)
  if (expected === null || params.get("state") !== expected) {
    return { kind: "ignored", reason: "A sign-in link was ignored: it was not started from this browser. Sign in again." }
  }
  // The state is spent either way: a nonce signs in once.
  window.sessionStorage.removeItem(NONCE_KEY)
  if (tokenClaims(token)?.["nonce"] !== expected) {
    return { kind: "ignored", reason: "A sign-in link was ignored: its token was not issued for this sign-in. Sign in again." }
  }
  return { kind: "accepted", token }
}

/**
 * The account a person last chose, per person (the token's `sub`): kept in
 * localStorage, so it survives tabs and sign-ins; null is their personal account.
 */
const accountKey = (token: string): string | null => {
  const sub = tokenClaims(token)?.["sub"]
  return typeof sub === "string" && sub !== "" ? `nenas.account.${sub}` : null
}

const readChosenAccount = (token: string | null): string | null => {
  const key = token === null ? null : accountKey(token)
  try {
    return key === null ? null : window.localStorage.getItem(key)
  } catch {
    return null
  }
}

const storeChosenAccount = (token: string | null, account: string | null): void => {
  const key = token === null ? null : accountKey(token)
  if (key === null) return
  try {
    if (account === null) window.localStorage.removeItem(key)
    else window.localStorage.setItem(key, account)
  } catch {
    // Storage refused (private mode): the choice lasts as long as the page.
  }
}

// Read once per page load: React may call a state initialiser twice, and reading spends the fragment.
let fragmentRead: FragmentToken | undefined
const handedToken = (): FragmentToken => (fragmentRead ??= takeTokenFromFragment())

interface Session {
  readonly token: string | null
  /** The token and the account chosen: what every dashboard call sends. */
  readonly caller: Caller
  /** Acts on `account` from now on (null: the personal account); remembered for this person. */
  readonly chooseAccount: (account: string | null) => void
  /** Why a token in the address was not used, to show on the sign-in page. */
  readonly notice: string | null
  readonly config: ClientConfig | null
  readonly signIn: (token: string) => void
  readonly signOut: () => void
}

const SessionContext = createContext<Session | null>(null)

export const SessionProvider = ({ children }: { children: ReactNode }) => {
  const [handed] = useState(handedToken)
  const [token, setToken] = useState<string | null>(() => {
    if (handed.kind !== "accepted") return readStored()
    window.sessionStorage.setItem(STORAGE_KEY, handed.token)
    return handed.token
  })
  const [account, setAccount] = useState<string | null>(() => readChosenAccount(token))
  const [config, setConfig] = useState<ClientConfig | null>(null)
  useEffect(() => {
    loadClientConfig().then(setConfig, () =>
      setConfig({ identity: "development", authorize: null, checkout: "simulated", business_timezone: "Asia/Kuala_Lumpur" })
    )
  }, [])
  const signIn = useCallback((next: string) => {
    window.sessionStorage.setItem(STORAGE_KEY, next)
    setToken(next)
    setAccount(readChosenAccount(next))
  }, [])
  const signOut = useCallback(() => {
    window.sessionStorage.removeItem(STORAGE_KEY)
    setToken(null)
    setAccount(null)
  }, [])
  const chooseAccount = useCallback((next: string | null) => {
    storeChosenAccount(token, next)
    setAccount(next)
  }, [token])
  const caller = useMemo(() => ({ token, account }), [token, account])
  const notice = handed.kind === "ignored" ? handed.reason : null
  const value = useMemo(
    () => ({ token, caller, chooseAccount, notice, config, signIn, signOut }),
    [token, caller, chooseAccount, notice, config, signIn, signOut]
  )
  return <SessionContext.Provider value={value}>{children}</SessionContext.Provider>
}

export const useSession = (): Session => {
  const session = useContext(SessionContext)
  if (session === null) throw new Error("useSession outside SessionProvider")
  return session
}

export type Loadable<A> =
  | { readonly state: "loading"; readonly data?: A }
  | { readonly state: "failed"; readonly error: ApiError; readonly data?: undefined }
  | { readonly state: "ready"; readonly data: A }

/**
 * How a page reads route `K`: where (its path parameters and query), `refresh`, a value whose change reads it again,
 * and `caller` when it is not the session's (the person's own things, read from their personal account).
 */
export type ReadOptions<K extends ReadRoute> = Target<K> & { readonly refresh?: string; readonly caller?: Caller }

/** GET a dashboard resource; refetches when the route, its parameters or `refresh` change, or on `reload()`. */
export const useApi = <K extends ReadRoute>(
  route: K,
  // The options may be left out when the route needs none (no path parameter).
  ...[options]: {} extends ReadOptions<K> ? [options?: ReadOptions<K>] : [options: ReadOptions<K>]
): [Loadable<Success<K>>, () => void] => {
  const session = useSession()
  const { token, account } = options?.caller ?? session.caller
  const [result, setResult] = useState<Loadable<Success<K>>>({ state: "loading" })
  const [generation, setGeneration] = useState(0)
  const key = JSON.stringify({ path: options?.path, query: options?.query })
  const refresh = options?.refresh
  const last = useRef<Success<K> | undefined>(undefined)
  useEffect(() => {
    const controller = new AbortController()
    setResult(last.current === undefined ? { state: "loading" } : { state: "loading", data: last.current })
    const target = JSON.parse(key) as Target<K>
    // A read route's options are its target and the caller: no payload, no headers of its own.
    api(route, { ...target, caller: { token, account }, signal: controller.signal } as unknown as RequestOptions<K>).then(
      (data) => {
        // A superseded request's answer is not this query's answer.
        if (controller.signal.aborted) return
        last.current = data
        setResult({ state: "ready", data })
      },
      (error: unknown) => {
        if (controller.signal.aborted) return
        const failure = error instanceof ApiError ? error : new ApiError(0, {
          message: String(error), type: "api_error", code: "client_error", param: null, request_id: "",
          guidance: "Reload the page.", action_url: null, retryable: true
        })
        // Data of an earlier query is not shown beside the error: it would look like the answer to this one.
        last.current = undefined
        setResult({ state: "failed", error: failure })
      }
    )
    return () => controller.abort()
  }, [route, key, refresh, token, account, generation])
  return [result, useCallback(() => setGeneration((n) => n + 1), [])]
}
