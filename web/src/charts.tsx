import { Bar, CartesianGrid, ComposedChart, Legend, Line, ResponsiveContainer, Tooltip, XAxis, YAxis } from "recharts"
import type { Granularity, SeriesPoint } from "./api"
import { formatBucket, formatCostMyr, formatCount, formatMicroMyrExact, formatMyrTick } from "./format"

export const COLORS = { requests: "#1d4ed8", cost: "#b45309", input: "#0f766e", output: "#7c3aed", reasoning: "#be185d" }

/** A cost in a tooltip: its digits, and the exact micro-MYR it stands for. */
const costTooltip = (value: unknown): string => `${formatCostMyr(Number(value))} (${formatCount(Number(value))} micro-MYR)`

const rows = (series: ReadonlyArray<SeriesPoint>, granularity: Granularity) =>
  series.map((point) => ({ ...point, label: formatBucket(point.bucket, granularity) }))

/** A chart with a text alternative: the figure is described, and the numbers are in a table beside it. */
const Figure = ({ caption, children }: { caption: string; children: React.ReactNode }) => (
  <figure className="chart">
    <figcaption>{caption}</figcaption>
    <div className="chart-box" role="img" aria-label={caption}>{children}</div>
  </figure>
)

/** Requests as bars and cost as a line, on two axes. */
export const RequestsAndCostChart = ({ series, granularity, caption }: {
  series: ReadonlyArray<SeriesPoint>
  granularity: Granularity
  caption: string
}) => (
  <Figure caption={caption}>
    <ResponsiveContainer width="100%" height={260}>
      <ComposedChart data={rows(series, granularity)} margin={{ top: 8, right: 8, bottom: 0, left: 0 }}>
        <CartesianGrid stroke="#e5e7eb" vertical={false} />
        <XAxis dataKey="label" tick={{ fontSize: 12, fill: "#374151" }} minTickGap={16} />
        <YAxis yAxisId="requests" allowDecimals={false} tick={{ fontSize: 12, fill: "#374151" }} width={40} />
        <YAxis yAxisId="cost" orientation="right" tick={{ fontSize: 12, fill: "#374151" }} width={64}
          tickFormatter={formatMyrTick} />
        <Tooltip formatter={(value, name) =>
          name === "Cost (RM)" ? [costTooltip(value), name] : [formatCount(Number(value)), name]} />
        <Legend />
        <Bar yAxisId="requests" dataKey="requests" name="Requests" fill={COLORS.requests} isAnimationActive={false} />
        <Line yAxisId="cost" dataKey="costMicroMyr" name="Cost (RM)" stroke={COLORS.cost} strokeWidth={2} dot={false} isAnimationActive={false} />
      </ComposedChart>
    </ResponsiveContainer>
  </Figure>
)

export const RequestsChart = ({ series, granularity, caption }: { series: ReadonlyArray<SeriesPoint>; granularity: Granularity; caption: string }) => (
  <Figure caption={caption}>
    <ResponsiveContainer width="100%" height={220}>
      <ComposedChart data={rows(series, granularity)} margin={{ top: 8, right: 8, bottom: 0, left: 0 }}>
        <CartesianGrid stroke="#e5e7eb" vertical={false} />
        <XAxis dataKey="label" tick={{ fontSize: 12, fill: "#374151" }} minTickGap={16} />
        <YAxis allowDecimals={false} tick={{ fontSize: 12, fill: "#374151" }} width={40} />
        <Tooltip formatter={(value) => formatCount(Number(value))} />
        <Bar dataKey="requests" name="Requests" fill={COLORS.requests} isAnimationActive={false} />
      </ComposedChart>
    </ResponsiveContainer>
  </Figure>
)

export const TokensChart = ({ series, granularity, caption }: { series: ReadonlyArray<SeriesPoint>; granularity: Granularity; caption: string }) => (
  <Figure caption={caption}>
    <ResponsiveContainer width="100%" height={220}>
      <ComposedChart data={rows(series, granularity)} margin={{ top: 8, right: 8, bottom: 0, left: 0 }}>
        <CartesianGrid stroke="#e5e7eb" vertical={false} />
        <XAxis dataKey="label" tick={{ fontSize: 12, fill: "#374151" }} minTickGap={16} />
        <YAxis allowDecimals={false} tick={{ fontSize: 12, fill: "#374151" }} width={56} tickFormatter={(n: number) => formatCount(n)} />
        <Tooltip formatter={(value) => formatCount(Number(value))} />
        <Legend />
        <Bar dataKey="inputTokens" name="Input" stackId="tokens" fill={COLORS.input} isAnimationActive={false} />
        <Bar dataKey="outputTokens" name="Output" stackId="tokens" fill={COLORS.output} isAnimationActive={false} />
        <Bar dataKey="reasoningTokens" name="Reasoning" stackId="tokens" fill={COLORS.reasoning} isAnimationActive={false} />
      </ComposedChart>
    </ResponsiveContainer>
  </Figure>
)

export const CostChart = ({ series, granularity, caption }: { series: ReadonlyArray<SeriesPoint>; granularity: Granularity; caption: string }) => (
  <Figure caption={caption}>
    <ResponsiveContainer width="100%" height={220}>
      <ComposedChart data={rows(series, granularity)} margin={{ top: 8, right: 8, bottom: 0, left: 0 }}>
        <CartesianGrid stroke="#e5e7eb" vertical={false} />
        <XAxis dataKey="label" tick={{ fontSize: 12, fill: "#374151" }} minTickGap={16} />
        <YAxis tick={{ fontSize: 12, fill: "#374151" }} width={64} tickFormatter={formatMyrTick} />
        <Tooltip formatter={costTooltip} />
        <Legend />
        <Bar dataKey="costMicroMyr" name="Cost (RM)" fill={COLORS.cost} isAnimationActive={false} />
      </ComposedChart>
    </ResponsiveContainer>
  </Figure>
)

/** The numbers behind a chart, for screen readers and for reading exact values. */
export const SeriesTable = ({ series, granularity, caption }: { series: ReadonlyArray<SeriesPoint>; granularity: Granularity; caption: string }) => (
  <details className="series-table">
    <summary>Show the numbers</summary>
    <div className="table-wrap">
      <table>
        <caption>{caption}</caption>
        <thead>
          <tr><th scope="col">{granularity === "day" ? "Day" : "Hour"}</th><th scope="col">Requests</th><th scope="col">Input tokens</th><th scope="col">Output tokens</th><th scope="col">Reasoning tokens</th><th scope="col">Cache hits</th><th scope="col">Saved by the cache</th><th scope="col">Cost</th></tr>
        </thead>
        <tbody>
          {series.map((point) => (
            <tr key={point.bucket}>
              <th scope="row">{formatBucket(point.bucket, granularity)}</th>
              <td>{formatCount(point.requests)}</td>
              <td>{formatCount(point.inputTokens)}</td>
              <td>{formatCount(point.outputTokens)}</td>
              <td>{formatCount(point.reasoningTokens)}</td>
              <td>{formatCount(point.cacheHits)}</td>
              <td title={formatMicroMyrExact(point.cacheSavedMicroMyr)}>{formatCostMyr(point.cacheSavedMicroMyr)}</td>
              <td title={formatMicroMyrExact(point.costMicroMyr)}>{formatCostMyr(point.costMicroMyr)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  </details>
)
