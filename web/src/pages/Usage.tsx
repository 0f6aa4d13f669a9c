import { useMemo, useState } from "react"
import { download, type Granularity } from "../api"
import { CostChart, RequestsChart, SeriesTable, TokensChart } from "../charts"
import { Field, Load, MoneyStat, PageHeading, Stat } from "../components"
import { formatCount, fromLocalInput, hourlyAllowed, toLocalInput } from "../format"
import { ExportButton } from "../ExportButton"
import { useApi, useSession } from "../session"

const RANGES = [
  { value: "1", label: "Last 24 hours" },
  { value: "7", label: "Last 7 days" },
  { value: "30", label: "Last 30 days" },
  { value: "90", label: "Last 90 days" },
  { value: "custom", label: "Custom" }
] as const
type Range = typeof RANGES[number]["value"]

const DAY_MS = 86_400_000

export const UsagePage = () => {
  const { config } = useSession()
  const zone = config?.business_timezone ?? "the business time zone"
  const [range, setRange] = useState<Range>("7")
  const [chosenGranularity, setGranularity] = useState<Granularity>("day")
  const [keyId, setKeyId] = useState("")
  const [customFrom, setCustomFrom] = useState(() => toLocalInput(new Date(Date.now() - 7 * DAY_MS)))
  const [customTo, setCustomTo] = useState(() => toLocalInput(new Date()))
  const [keys] = useApi("GET /dashboard/api-keys")
  // A preset range is fixed when picked, so that re-renders do not refetch a moving window.
  const [now, setNow] = useState(() => Date.now())
  const { from, to } = useMemo(() => range === "custom"
    ? { from: fromLocalInput(customFrom), to: fromLocalInput(customTo) }
    : { from: new Date(now - Number(range) * DAY_MS).toISOString(), to: new Date(now).toISOString() }, [range, customFrom, customTo, now])
  // A range too long for hourly buckets is shown by day, rather than asked of the API and refused.
  const byHourAllowed = hourlyAllowed(from, to)
  const granularity: Granularity = byHourAllowed ? chosenGranularity : "day"
  const usageQuery = { granularity, from, to, api_key_id: keyId === "" ? undefined : keyId }
  const [usage, reload] = useApi("GET /dashboard/usage", { query: usageQuery })
  const keyName = keys.data?.keys.find((key) => key.id === keyId)?.name
  const scope = keyName === undefined ? "all keys" : `key “${keyName}”`
  const unit = granularity === "day" ? `days in ${zone}` : `hours in ${zone}`

  return (
    <>
      <PageHeading title="Usage">
        <button type="button" className="quiet" onClick={() => {
          setNow(Date.now())
          reload()
        }}>Refresh</button>
        <ExportButton save={(caller) => download("GET /dashboard/usage/export", { caller, query: { ...usageQuery, format: "csv" } }, "nenas-usage.csv")} />
      </PageHeading>
      <form className="filters" aria-label="Choose the usage to show" onSubmit={(e) => e.preventDefault()}>
        <Field label="Range">
          {(props) => (
            <select {...props} value={range} onChange={(e) => {
              setRange(e.target.value as Range)
              setNow(Date.now())
            }}>
              {RANGES.map((r) => <option key={r.value} value={r.value}>{r.label}</option>)}
            </select>
          )}
        </Field>
        {range === "custom"
          ? (
            <>
              <Field label="From" hint="Your time zone">
                {(props) => <input {...props} type="datetime-local" value={customFrom} onChange={(e) => setCustomFrom(e.target.value)} />}
              </Field>
              <Field label="To" hint="Your time zone">
                {(props) => <input {...props} type="datetime-local" value={customTo} onChange={(e) => setCustomTo(e.target.value)} />}
              </Field>
            </>
          )
          : null}
        <Field label="Granularity" {...(byHourAllowed ? {} : { hint: "By hour is offered for ranges up to 30 days." })}>
          {(props) => (
            <select {...props} value={granularity} onChange={(e) => setGranularity(e.target.value === "hour" ? "hour" : "day")}>
              <option value="day">By day</option>
              <option value="hour" disabled={!byHourAllowed}>By hour</option>
            </select>
          )}
        </Field>
        <Field label="API key">
          {(props) => (
            <select {...props} value={keyId} onChange={(e) => setKeyId(e.target.value)}>
              <option value="">All keys</option>
              {(keys.data?.keys ?? []).map((key) => <option key={key.id} value={key.id}>{key.name} ({key.prefix}…)</option>)}
            </select>
          )}
        </Field>
      </form>
      <p className="note">Buckets are {unit}; the labels are that zone's dates and hours.</p>
      <Load value={usage} what="usage" retry={reload}>
        {(data) => {
          const total = data.series.reduce((sum, p) => ({
            requests: sum.requests + p.requests,
            tokens: sum.tokens + p.inputTokens + p.outputTokens,
            cost: sum.cost + p.costMicroMyr,
            cacheHits: sum.cacheHits + p.cacheHits,
            cacheSaved: sum.cacheSaved + p.cacheSavedMicroMyr,
            byokCalls: sum.byokCalls + p.byokCalls,
            byokFee: sum.byokFee + p.byokFeeMicroMyr
          }), { requests: 0, tokens: 0, cost: 0, cacheHits: 0, cacheSaved: 0, byokCalls: 0, byokFee: 0 })
          return (
            <>
              <div className="stats">
                <Stat label={`Requests, ${scope}`} value={formatCount(total.requests)} />
                <Stat label="Tokens (input + output)" value={formatCount(total.tokens)} />
                <MoneyStat label="Cost" micro={total.cost} />
                <Stat label="Cache hits" value={formatCount(total.cacheHits)}
                  note={total.requests === 0 ? "answered from the response cache" : `${Math.round(total.cacheHits / total.requests * 100)}% of the requests, answered from the response cache`} />
                <MoneyStat label="Saved by the response cache" micro={total.cacheSaved} note="what those answers cost when the model first gave them" />
                <MoneyStat label="Fees on your own provider keys" micro={total.byokFee}
                  note={`${formatCount(total.byokCalls)} calls answered on your keys, within the cost`} />
              </div>
              {total.requests === 0 ? <p className="empty">No calls in this range for {scope}.</p> : null}
              <div className="charts">
                <RequestsChart series={data.series} granularity={data.granularity} caption={`Requests per ${data.granularity}, ${scope}`} />
                <TokensChart series={data.series} granularity={data.granularity} caption={`Tokens per ${data.granularity}, ${scope}`} />
                <CostChart series={data.series} granularity={data.granularity} caption={`Cost per ${data.granularity}, ${scope}`} />
              </div>
              <SeriesTable series={data.series} granularity={data.granularity} caption={`Usage per ${data.granularity} (${unit}), ${scope}`} />
            </>
          )
        }}
      </Load>
    </>
  )
}
