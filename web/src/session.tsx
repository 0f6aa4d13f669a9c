import { createContext, useCallback, useContext, useEffect, useMemo, useRef, useState, type ReactNode } from "react"
import { ApiError, request, type ClientConfig, type Query } from "./api"

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

/** A token handed over in the URL fragment by an identity provider's redirect (`#id_token=…`). */
export const takeTokenFromFragment = (): string | null => {
  const params = new URLSearchParams(window.location.hash.replace(/^#/, ""))
  const token = params.get("id_token") ?? params.get("access_token") ?? params.get("token")
  if (token === null || token === "") return null
  // The fragment must not stay in the address bar or the history.
  window.history.replaceState(window.history.state, "", window.location.pathname + window.location.search)
  return token
}

interface Session {
  readonly token: string | null
  readonly config: ClientConfig | null
  readonly signIn: (token: string) => void
  readonly signOut: () => void
}

const SessionContext = createContext<Session | null>(null)

export const SessionProvider = ({ children }: { children: ReactNode }) => {
  const [token, setToken] = useState<string | null>(() => {
    const handed = takeTokenFromFragment()
    if (handed !== null) window.sessionStorage.setItem(STORAGE_KEY, handed)
    return handed ?? readStored()
  })
  const [config, setConfig] = useState<ClientConfig | null>(null)
  useEffect(() => {
    request<ClientConfig>("/app/config.json").then(setConfig, () =>
      setConfig({ identity: "development", checkout: "simulated", business_timezone: "Asia/Kuala_Lumpur" })
    )
  }, [])
  const signIn = useCallback((next: string) => {
    window.sessionStorage.setItem(STORAGE_KEY, next)
    setToken(next)
  }, [])
  const signOut = useCallback(() => {
    window.sessionStorage.removeItem(STORAGE_KEY)
    setToken(null)
  }, [])
  const value = useMemo(() => ({ token, config, signIn, signOut }), [token, config, signIn, signOut])
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

/** GET a dashboard resource; refetches when the path or query changes, or on `reload()`. */
export const useApi = <A,>(path: string, query?: Query): [Loadable<A>, () => void] => {
  const { token } = useSession()
  const [result, setResult] = useState<Loadable<A>>({ state: "loading" })
  const [generation, setGeneration] = useState(0)
  const key = JSON.stringify(query ?? {})
  const last = useRef<A | undefined>(undefined)
  useEffect(() => {
    const controller = new AbortController()
    setResult(last.current === undefined ? { state: "loading" } : { state: "loading", data: last.current })
    request<A>(path, { token, query: JSON.parse(key) as Query, signal: controller.signal }).then(
      (data) => {
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
  }, [path, key, token, generation])
  return [result, useCallback(() => setGeneration((n) => n + 1), [])]
}
