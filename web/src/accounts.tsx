import { createContext, useCallback, useContext, useEffect, useId, useMemo, type ReactNode } from "react"
import { Link } from "react-router"
import type { AccountSummary, Caller } from "./api"
import { ErrorPanel, Loading } from "./components"
import { allows, type MemberRoute, type Role } from "./roles"
import { useApi, useSession } from "./session"

interface Accounts {
  /** The accounts the person belongs to, their personal one first. */
  readonly accounts: ReadonlyArray<AccountSummary>
  /** The account the dashboard acts on. */
  readonly current: AccountSummary
  readonly role: Role
  /** Whether the current role may call `route` (the contract's roles). */
  readonly can: (route: MemberRoute) => boolean
  readonly choose: (id: string) => void
  /** Reads the accounts again (after joining one). */
  readonly reload: () => void
  /** Invitations to the person's email still open, from any account. */
  readonly openInvitations: number
  readonly reloadInvitations: () => void
}

const AccountsContext = createContext<Accounts | null>(null)

/** The person's own things (their accounts, their invitations) are read and accepted from their personal account. */
export const personally = (caller: Caller): Caller => ({ token: caller.token, account: null })

export const accountLabel = (account: AccountSummary): string =>
  account.personal ? `${account.name ?? "Personal"} (personal)` : account.name ?? account.id

/**
 * Loads the person's accounts before any page: a page's calls name the chosen
 * account, and a remembered one the person has left falls back to the personal one.
 */
export const AccountsProvider = ({ children }: { children: ReactNode }) => {
  const { caller, chooseAccount } = useSession()
  // By token only: switching accounts does not read the list of them again (an older answer could land last).
  const own = useMemo(() => personally(caller), [caller.token])
  const [list, reload] = useApi("GET /dashboard/accounts", { caller: own })
  const [invitations, reloadInvitations] = useApi("GET /dashboard/invitations", { caller: own })
  const accounts = list.data?.accounts
  const chosen = accounts?.find((account) => account.id === caller.account && !account.personal)
  const personal = accounts?.find((account) => account.personal) ?? accounts?.[0]
  const stale = accounts !== undefined && caller.account !== null && chosen === undefined
  useEffect(() => {
    if (stale) chooseAccount(null)
  }, [stale, chooseAccount])
  const choose = useCallback((id: string) => {
    const next = accounts?.find((account) => account.id === id)
    chooseAccount(next === undefined || next.personal ? null : next.id)
  }, [accounts, chooseAccount])
  const current = chosen ?? personal
  const value = useMemo((): Accounts | null => current === undefined || accounts === undefined ? null : {
    accounts,
    current,
    role: current.role,
    can: (route) => allows(current.role, route),
    choose,
    reload,
    openInvitations: invitations.data?.invitations.length ?? 0,
    reloadInvitations
  }, [accounts, current, choose, reload, invitations.data, reloadInvitations])
  if (value === null || stale) {
    return list.state === "failed" ? <main id="main"><ErrorPanel error={list.error} onRetry={reload} /></main> : <Loading what="your accounts" />
  }
  return <AccountsContext.Provider value={value}>{children}</AccountsContext.Provider>
}

export const useAccounts = (): Accounts => {
  const accounts = useContext(AccountsContext)
  if (accounts === null) throw new Error("useAccounts outside AccountsProvider")
  return accounts
}

/** The current account, its switcher (when there is more than one), the person's role in it, and open invitations. */
export const AccountSwitcher = () => {
  const { accounts, current, role, choose, openInvitations } = useAccounts()
  const id = useId()
  return (
    <div className="account">
      {accounts.length > 1
        ? (
          <>
            <label htmlFor={id} className="visually-hidden">Account</label>
            <select id={id} value={current.id} onChange={(e) => choose(e.target.value)}>
              {accounts.map((account) => <option key={account.id} value={account.id}>{accountLabel(account)}</option>)}
            </select>
          </>
        )
        : <span className="account-name" title={current.id}>{accountLabel(current)}</span>}
      <span className={`badge role role-${role}`} title="Your role in this account"><span className="visually-hidden">Your role: </span>{role}</span>
      {openInvitations === 0 ? null : (
        <Link to="/invitations" className="invitations-link">
          {openInvitations === 1 ? "1 invitation" : `${openInvitations} invitations`}
        </Link>
      )}
    </div>
  )
}
