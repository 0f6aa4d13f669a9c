/** The tables and the goals of `npm run bench`. */
import type { WindowTotals } from "./database.js"
import type { PeerResults, PeerSummary } from "./peers.js"
import { TARGET } from "./peers.js"

/** The goals (issue 22), plain and streamed. */
export const GOALS = {
  /** nenas req/s ÷ Portkey req/s at 32 connections, at least (streamed: and its p99 no worse than Portkey's). */
  rpsOverPortkey: { plain: 1.5, stream: 1.2 },
  /** nenas added p50 (− direct) at 1 connection, at most the Effect floor's added p50 plus this, ms. */
  addedP50OverEffectMs: 0.4,
  /** nenas CPU µs/req (service + PostgreSQL) ÷ the Effect floor's, at most. */
  cpuOverEffect: { plain: 1.4, stream: 2 },
  /** PostgreSQL transactions per call at 32 connections, at most. */
  transactionsPerCall: 0.1
} as const

const kind = (spec: RunSpec) => spec.stream ? "stream" as const : "plain" as const

export interface RunSpec {
  readonly connections: number
  readonly stream: boolean
}

export interface RunOutcome {
  readonly spec: RunSpec
  readonly results: PeerResults
  readonly database: WindowTotals | undefined
}

export const label = (spec: RunSpec) => `${spec.connections} conn${spec.connections === 1 ? "" : "s"}, ${spec.stream ? "stream" : "plain"}`

const fmt = (value: number | undefined, digits: number) =>
  value === undefined || !Number.isFinite(value) ? "-" : value.toFixed(digits)

const table = (rows: ReadonlyArray<ReadonlyArray<string>>) => {
  const widths = (rows[0] ?? []).map((_, i) => Math.max(...rows.map((row) => (row[i] ?? "").length)))
  const line = (row: ReadonlyArray<string>) =>
    row.map((cell, i) => i === 0 ? cell.padEnd(widths[i] ?? 0) : cell.padStart(widths[i] ?? 0)).join("  ")
  const [head, ...body] = rows
  return [line(head ?? []), widths.map((w) => "-".repeat(w)).join("  "), ...body.map(line)].join("\n")
}

const find = (results: PeerResults, name: string): PeerSummary | undefined => {
  const found = results.summary.find((s) => s.name === name)
  return found === undefined || found.failed !== undefined ? undefined : found
}

export const perCall = (database: WindowTotals | undefined) => ({
  transactions: database === undefined || database.calls === 0 ? NaN : database.transactions / database.calls,
  walBytes: database === undefined || database.calls === 0 ? NaN : database.walBytes / database.calls
})

/** One run's table: every target, medians over the rounds. */
export const runTable = (outcome: RunOutcome) => {
  const { results, database } = outcome
  const direct = find(results, "direct")
  const rows: Array<Array<string>> = [[
    "target",
    "req/s (min-max)",
    "p50 ms",
    "p99 ms",
    "Δp50 ms",
    "req/s ÷ direct",
    "CPU µs/req",
    "host CPU %",
    "errors"
  ]]
  for (const s of results.summary) {
    if (s.failed !== undefined) {
      rows.push([s.name, "FAILED", "-", "-", "-", "-", "-", "-", "-"])
      continue
    }
    rows.push([
      s.name,
      s.rounds > 1 ? `${fmt(s.rps, 0)} (${fmt(s.rpsMin, 0)}-${fmt(s.rpsMax, 0)})` : fmt(s.rps, 0),
      fmt(s.p50, 3),
      fmt(s.p99, 3),
      fmt(direct === undefined ? NaN : s.p50 - direct.p50, 3),
      fmt(direct === undefined ? NaN : s.rps / direct.rps, 2),
      fmt(s.cpu, 0),
      fmt(s.hostBusy, 0),
      String(s.errs)
    ])
  }
  const lines = [table(rows)]
  const nenas = results.summary.find((s) => s.name === TARGET)
  if (nenas?.cpuTreeProcs !== undefined) lines.push(`${TARGET} CPU = its process tree: ${summarize(nenas.cpuTreeProcs)}`)
  for (const t of results.targets) {
    if (t.failed !== undefined) lines.push(`${t.name}: ${t.failed}`)
    else if ((t.preflight_notes ?? []).length > 0) lines.push(`${t.name} preflight: ${(t.preflight_notes ?? []).join("; ")}`)
  }
  if (database !== undefined) {
    const per = perCall(database)
    const calls = database.calls === 0 ? NaN : database.calls
    lines.push(
      `PostgreSQL per ${TARGET} call: ${fmt(per.transactions, 3)} transactions, ${fmt(per.walBytes, 0)} WAL bytes ` +
        `(${database.calls} calls in ${database.windows} window${database.windows === 1 ? "" : "s"} of warm-up + measurement; ` +
        `transactions net of the service's idle ${fmt(database.background.transactionsPerSecond, 2)}/s: ` +
        `${fmt(database.rawTransactions / calls, 3)}/call with them, ${fmt(database.transactionsSeenEarly / calls, 3)} of these visible 200 ms after)`
    )
  }
  return lines.join("\n")
}

const summarize = (comms: ReadonlyArray<string>) => {
  const counts = new Map<string, number>()
  for (const c of comms) counts.set(c, (counts.get(c) ?? 0) + 1)
  return [...counts].map(([c, n]) => n > 1 ? `${c} x${n}` : c).join(", ")
}

interface Figures {
  readonly nenasRps: number
  readonly rpsOverPortkey: number
  readonly addedP50: number
  readonly effectAddedP50: number
  readonly p99: number
  readonly portkeyP99: number
  readonly cpuOverEffect: number
  readonly transactionsPerCall: number
  readonly walBytesPerCall: number
}

const figures = (outcome: RunOutcome): Figures => {
  const nenas = find(outcome.results, TARGET)
  const portkey = find(outcome.results, "portkey")
  const direct = find(outcome.results, "direct")
  const effect = find(outcome.results, "effect")
  const per = perCall(outcome.database)
  return {
    nenasRps: nenas?.rps ?? NaN,
    rpsOverPortkey: (nenas?.rps ?? NaN) / (portkey?.rps ?? NaN),
    addedP50: (nenas?.p50 ?? NaN) - (direct?.p50 ?? NaN),
    effectAddedP50: (effect?.p50 ?? NaN) - (direct?.p50 ?? NaN),
    p99: nenas?.p99 ?? NaN,
    portkeyP99: portkey?.p99 ?? NaN,
    cpuOverEffect: (nenas?.cpu ?? NaN) / (effect?.cpu ?? NaN),
    transactionsPerCall: per.transactions,
    walBytesPerCall: per.walBytes
  }
}

/** The figures the goals are stated in, one row per run. */
export const summaryTable = (outcomes: ReadonlyArray<RunOutcome>) =>
  table([
    ["run", "nenas req/s", "÷ portkey", "added p50 ms", "CPU ÷ effect", "PG xacts/call", "WAL B/call"],
    ...outcomes.map((outcome) => {
      const f = figures(outcome)
      return [
        label(outcome.spec),
        fmt(f.nenasRps, 0),
        fmt(f.rpsOverPortkey, 2),
        fmt(f.addedP50, 3),
        fmt(f.cpuOverEffect, 2),
        fmt(f.transactionsPerCall, 3),
        fmt(f.walBytesPerCall, 0)
      ]
    })
  ])

/** PASS or MISS per goal, for the runs the goal is stated for. */
export const goalLines = (outcomes: ReadonlyArray<RunOutcome>) => {
  const lines: Array<string> = []
  const verdict = (value: number, ok: boolean) => Number.isFinite(value) ? ok ? "PASS" : "MISS" : "n/a "
  const at = (connections: number) => outcomes.filter((o) => o.spec.connections === connections)
  for (const outcome of at(32)) {
    const f = figures(outcome)
    const goal = GOALS.rpsOverPortkey[kind(outcome.spec)]
    lines.push(
      `${verdict(f.rpsOverPortkey, f.rpsOverPortkey >= goal)}  req/s nenas ÷ portkey, ${label(outcome.spec)}: ` +
        `${fmt(f.rpsOverPortkey, 2)} (goal ≥ ${goal})`
    )
    if (outcome.spec.stream) {
      lines.push(
        `${verdict(f.p99, f.p99 <= f.portkeyP99)}  p99 nenas, ${label(outcome.spec)}: ${fmt(f.p99, 1)} ms (goal ≤ portkey's ${fmt(f.portkeyP99, 1)} ms)`
      )
    }
  }
  for (const outcome of at(1)) {
    const f = figures(outcome)
    const limit = f.effectAddedP50 + GOALS.addedP50OverEffectMs
    lines.push(
      `${verdict(f.addedP50, f.addedP50 <= limit)}  added p50 (− direct), ${label(outcome.spec)}: ` +
        `${fmt(f.addedP50, 3)} ms (goal ≤ effect's ${fmt(f.effectAddedP50, 3)} + ${GOALS.addedP50OverEffectMs} ms)`
    )
  }
  for (const outcome of at(32)) {
    const f = figures(outcome)
    const goal = GOALS.cpuOverEffect[kind(outcome.spec)]
    lines.push(
      `${verdict(f.cpuOverEffect, f.cpuOverEffect <= goal)}  CPU µs/req nenas (service + PostgreSQL) ÷ effect, ${
        label(outcome.spec)
      }: ${fmt(f.cpuOverEffect, 2)} (goal ≤ ${goal})`
    )
  }
  for (const outcome of at(32)) {
    const f = figures(outcome)
    lines.push(
      `${verdict(f.transactionsPerCall, f.transactionsPerCall <= GOALS.transactionsPerCall)}  PostgreSQL transactions per call, ${
        label(outcome.spec)
      }: ${fmt(f.transactionsPerCall, 3)} (goal ≤ ${GOALS.transactionsPerCall})`
    )
  }
  return lines
}
