import { StrictMode } from "react"
import { createRoot } from "react-dom/client"
import { BrowserRouter, NavLink, Route, Routes } from "react-router"
import { AccountsProvider, AccountSwitcher } from "./accounts"
import { PageHeading } from "./components"
import { ApiKeysPage } from "./pages/ApiKeys"
import { AuditLogPage } from "./pages/AuditLog"
import { BillingPage } from "./pages/Billing"
import { BillingProfilePage } from "./pages/BillingProfile"
import { GuardrailsPage } from "./pages/Guardrails"
import { InvoicesPage } from "./pages/Invoices"
import { InvitationsPage } from "./pages/Invitations"
import { LogsPage } from "./pages/Logs"
import { MembersPage } from "./pages/Members"
import { OverviewPage } from "./pages/Overview"
import { ProviderKeysPage } from "./pages/ProviderKeys"
import { SignInPage } from "./pages/SignIn"
import { UsagePage } from "./pages/Usage"
import { WebhooksPage } from "./pages/Webhooks"
import { Banners } from "./banners"
import { SessionProvider, useSession } from "./session"
import "./styles.css"

const PAGES = [
  { to: "/", label: "Overview" },
  { to: "/api-keys", label: "API keys" },
  { to: "/provider-keys", label: "Provider keys" },
  { to: "/guardrails", label: "Guardrails" },
  { to: "/billing", label: "Billing" },
  { to: "/invoices", label: "Invoices" },
  { to: "/logs", label: "Logs" },
  { to: "/usage", label: "Usage" },
  { to: "/webhooks", label: "Webhooks" },
  { to: "/members", label: "Members" },
  { to: "/audit-log", label: "Audit log" }
] as const

const NotFoundPage = () => (
  <>
    <PageHeading title="Page not found" />
    <p>There is no dashboard page here. Pick one from the menu.</p>
  </>
)

const Shell = () => {
  const { token, caller, signOut } = useSession()
  if (token === null) return <SignInPage />
  // Switching accounts starts every page afresh: its data, filters and open dialogs were the other account's.
  const account = caller.account ?? "personal"
  return (
    <AccountsProvider>
      <a className="skip" href="#main">Skip to content</a>
      <header className="top">
        <span className="brand">nenas</span>
        <nav aria-label="Dashboard">
          <ul>
            {PAGES.map((page) => (
              <li key={page.to}><NavLink to={page.to} end>{page.label}</NavLink></li>
            ))}
          </ul>
        </nav>
        <AccountSwitcher />
        <button type="button" className="quiet" onClick={signOut}>Sign out</button>
      </header>
      <main id="main">
        <Banners key={`banners-${account}`} />
        <Routes key={`pages-${account}`}>
          <Route index element={<OverviewPage />} />
          <Route path="api-keys" element={<ApiKeysPage />} />
          <Route path="provider-keys" element={<ProviderKeysPage />} />
          <Route path="guardrails" element={<GuardrailsPage />} />
          <Route path="billing" element={<BillingPage />} />
          <Route path="billing/profile" element={<BillingProfilePage />} />
          <Route path="invoices" element={<InvoicesPage />} />
          <Route path="logs" element={<LogsPage />} />
          <Route path="usage" element={<UsagePage />} />
          <Route path="webhooks" element={<WebhooksPage />} />
          <Route path="members" element={<MembersPage />} />
          <Route path="audit-log" element={<AuditLogPage />} />
          <Route path="invitations" element={<InvitationsPage />} />
          <Route path="*" element={<NotFoundPage />} />
        </Routes>
      </main>
    </AccountsProvider>
  )
}

const root = document.getElementById("root")
if (root === null) throw new Error("index.html has no #root")
createRoot(root).render(
  <StrictMode>
    <BrowserRouter basename="/app">
      <SessionProvider>
        <Shell />
      </SessionProvider>
    </BrowserRouter>
  </StrictMode>
)
