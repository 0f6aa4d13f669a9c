/** Money and time as a person reads them; no DOM, so the unit tests run in Node. */

const MICRO_PER_MYR = 1_000_000
const MICRO_PER_SEN = 10_000

const grouped = new Intl.NumberFormat("en-MY", { maximumFractionDigits: 0 })

/**
 * Every amount the dashboard shows (costs, balances, ledger entries, limits):
 * exact to the micro-MYR with the trailing zeros cut, never fewer than two
 * decimals, so nothing under a sen reads as `RM 0.00`: `RM 0.000139`,
 * `RM 0.0012`, `RM 1.50`, `RM 1.234567`; computed on integers.
 */
export const formatCostMyr = (micro: number): string => {
  const magnitude = Math.abs(micro)
  const whole = Math.floor(magnitude / MICRO_PER_MYR)
  const fraction = String(magnitude % MICRO_PER_MYR).padStart(6, "0").replace(/0+$/, "").padEnd(2, "0")
  return `${micro < 0 ? "−" : ""}RM ${grouped.format(whole)}.${fraction}`
}

/** The exact amount, for a tooltip: `1,234,567 micro-MYR (RM 1.234567)`, computed on integers. */
export const formatMicroMyrExact = (micro: number): string => {
  const magnitude = Math.abs(micro)
  const whole = Math.floor(magnitude / MICRO_PER_MYR)
  const fraction = String(magnitude % MICRO_PER_MYR).padStart(6, "0")
  const sign = micro < 0 ? "−" : ""
  return `${sign}${grouped.format(magnitude)} micro-MYR (${sign}RM ${grouped.format(whole)}.${fraction})`
}

/**
 * A chart axis tick in MYR without the `RM` (the axis is named): two decimals
 * from one sen up, and enough significant digits below it that ticks differ.
 */
export const formatMyrTick = (micro: number): string => {
  if (micro === 0) return "0"
  // A tick marks a place on the scale, not an amount: rounding it to the sen is honest.
  if (Math.abs(micro) >= MICRO_PER_SEN) {
    return formatCostMyr(Math.sign(micro) * Math.round(Math.abs(micro) / MICRO_PER_SEN) * MICRO_PER_SEN).replace(
      "RM ",
      ""
    )
  }
  return String(Number((micro / MICRO_PER_MYR).toPrecision(2)))
}

/** Whole numbers with thousands separators. */
export const formatCount = (n: number): string => grouped.format(n)

/** An instant in the reader's own time zone (the browser's, unless one is given). */
export const formatDateTime = (iso: string, timeZone?: string): string =>
  new Intl.DateTimeFormat("en-MY", {
    dateStyle: "medium",
    timeStyle: "short",
    ...(timeZone === undefined ? {} : { timeZone })
  }).format(new Date(iso))

/**
 * A usage bucket (`2026-11-22T00:00:00+08:00`, local time in the business
 * zone) labelled as it is counted there: the day or the hour it stands for,
 * never shifted into the browser's zone, where it would name another day.
 */
export const formatBucket = (bucket: string, granularity: "day" | "hour"): string => {
  const match = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})/.exec(bucket)
  if (match === null) return bucket
  const [, year, month, day, hour, minute] = match
  const monthName = MONTHS[Number(month) - 1] ?? month
  const date = `${Number(day)} ${monthName}`
  return granularity === "day" ? `${date} ${year}` : `${date}, ${hour}:${minute}`
}

const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

/** `<input type="datetime-local">`'s value for an instant, in the browser's zone. */
export const toLocalInput = (date: Date): string => {
  const pad = (n: number) => String(n).padStart(2, "0")
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${
    pad(date.getMinutes())
  }`
}

/** The instant a `datetime-local` value names in the browser's zone, as ISO UTC; undefined when empty or invalid. */
export const fromLocalInput = (value: string): string | undefined => {
  if (value === "") return undefined
  const date = new Date(value)
  return Number.isNaN(date.getTime()) ? undefined : date.toISOString()
}

const HOUR_MS = 3_600_000

/**
 * Whether the API serves a range by hour: it counts the hours between the
 * first and last bucket's start, plus one, and caps that at 744 (MAX_BUCKETS
 * in src/Logs/Reads.ts), so a span of at most 743 hours always fits.
 */
export const hourlyAllowed = (from: string | undefined, to: string | undefined): boolean => {
  if (from === undefined || to === undefined) return true
  return Date.parse(to) - Date.parse(from) <= 743 * HOUR_MS
}
