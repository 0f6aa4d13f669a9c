import { Link, useLocation } from "react-router"
import { useAccounts } from "./accounts"
import type { Banner } from "./api"
import type { MemberRoute } from "./roles"
import { useApi } from "./session"

/** What the dashboard shows at its top on every page: a low balance, a failed auto top-up, a disabled endpoint. */
export const Banners = () => {
  const location = useLocation()
  const { can } = useAccounts()
  // Read again on every page change: a top-up or a saved card changes them.
  const [banners] = useApi("GET /dashboard/alerts", { refresh: location.key })
  if (banners.state !== "ready" || banners.data.banners.length === 0) return null
  return (
    <div className="banners">
      {banners.data.banners.map((banner) => (
        <div key={banner.kind} className="warning banner" role="alert" data-kind={banner.kind}>
          <p>{banner.message}</p>
          {!can(ACTION_ROUTES[banner.kind]) ? null : banner.action_url.startsWith("http")
            ? <a href={banner.action_url}>{labelOf(banner)}</a>
            : <Link to={banner.action_url}>{labelOf(banner)}</Link>}
        </div>
      ))}
    </div>
  )
}

/** What the banner's link leads to doing: offered only to a role that may. */
const ACTION_ROUTES: Record<Banner["kind"], MemberRoute> = {
  balance_low: "POST /dashboard/billing/checkout",
  auto_topup_failed: "POST /dashboard/billing/card",
  webhook_endpoint_disabled: "PATCH /dashboard/webhooks/{id}"
}

const labelOf = (banner: Banner) =>
  banner.kind === "balance_low" ? "Top up" : banner.kind === "auto_topup_failed" ? "Save the card again" : "Open webhooks"
