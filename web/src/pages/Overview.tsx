import { Link } from "react-router"
import { useAccounts } from "../accounts"
import { RequestsAndCostChart, SeriesTable } from "../charts"
import { Load, MoneyStat, PageHeading, Stat } from "../components"
import { formatCount } from "../format"
import { useApi, useSession } from "../session"

export const OverviewPage = () => {
  const { config } = useSession()
  const { can } = useAccounts()
  const [overview, reload] = useApi("GET /dashboard/overview")
  const zone = config?.business_timezone ?? "the business time zone"
  return (
    <>
      <PageHeading title="Overview">
        <button type="button" className="quiet" onClick={reload}>Refresh</button>
      </PageHeading>
      <Load value={overview} what="the overview" retry={reload}>
        {(data) => {
          const requests30 = data.daily_series.reduce((sum, point) => sum + point.requests, 0)
          return (
            <>
              <section aria-labelledby="balance-heading">
                <h2 id="balance-heading">Balance</h2>
                <div className="stats">
                  <MoneyStat label="Available" micro={data.wallet.availableMicroMyr}
                    {...(can("POST /dashboard/billing/checkout") ? { note: <Link to="/billing">Top up</Link> } : {})} />
                  <MoneyStat label="Reserved by calls in flight" micro={data.wallet.reservedMicroMyr} />
                </div>
              </section>
              <section aria-labelledby="usage-heading">
                <h2 id="usage-heading">Usage</h2>
                <p className="note">"Today" and the 30 days are counted in {zone}.</p>
                <div className="stats">
                  <Stat label="Requests today" value={formatCount(data.today_usage.requests)} />
                  <MoneyStat label="Spent today" micro={data.today_usage.costMicroMyr} />
                  <Stat label="Requests, last 30 days" value={formatCount(data.total_usage.requests)}
                    note={`${formatCount(data.total_usage.inputTokens + data.total_usage.outputTokens)} tokens`} />
                  <MoneyStat label="Spent, last 30 days" micro={data.total_usage.costMicroMyr} />
                  <MoneyStat label="Saved by the response cache, last 30 days" micro={data.total_usage.cacheSavedMicroMyr}
                    note={`${formatCount(data.total_usage.cacheHits)} cached answers`} />
                  <MoneyStat label="Fees on your own provider keys, last 30 days" micro={data.total_usage.byokFeeMicroMyr}
                    note={`${formatCount(data.total_usage.byokCalls)} calls answered on your keys`} />
                  <Stat label="API keys" value={`${data.active_api_key_count} active`}
                    note={<Link to="/api-keys">{`${data.api_key_count} in all · manage`}</Link>} />
                </div>
              </section>
              <section aria-labelledby="chart-heading">
                <h2 id="chart-heading">Last 30 days</h2>
                {requests30 === 0
                  ? <p className="empty">No model calls in the last 30 days yet. Create an API key and call <code>POST /v1/responses</code>; they show here.</p>
                  : null}
                <RequestsAndCostChart series={data.daily_series} granularity="day"
                  caption={`Requests and cost per day (days in ${zone})`} />
                <SeriesTable series={data.daily_series} granularity="day" caption={`Requests and cost per day, in ${zone}`} />
              </section>
            </>
          )
        }}
      </Load>
    </>
  )
}
