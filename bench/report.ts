/** The tables and the goals (docs/performance.md, "Benchmark") of `npm run bench`. */
import type { WindowTotals } from "./database.js"
import type { PeerResults, PeerSummary } from "./peers.js"
import { TARGET } from "./peers.js"

/**
 * The goals judged (docs/performance.md, "Benchmark"), at 32 connections unless
 * said, plain and streamed. Besides these: CPU µs/req (service + PostgreSQL) no
 * more than Portkey's, the streamed p99 no more than Portkey's, the added p50 at
 * 1 connection no more than Portkey's plain one, and the peak RSS of the
 * service's node process no more than the Effect floor's in the same run.
 */
export const GOALS = {
  /** nenas req/s ÷ Portkey req/s, at least. */
  rpsOverPortkey: { plain: 1.5, stream: 1.3 },
  /** nenas CPU µs/req ÷ the Effect floor's, at most. */
  cpuOverEffect: 1.5,
  /** RSS of the service's node process when the first run's load begins (after start-up and preflight), below. */
  idleRssMb: 150,
  /** PostgreSQL transactions per call, at most. */
  transactionsPerCall: 0.1
} as const

const kind = (spec: RunSpec) => spec.stream ? "stream" as const : "plain" as const

export interface RunSpec {
  readonly connections: number
  readonly stream: boolean
  /** A 4 kB prompt holding personal data, and (`guarded`) a key whose policy redacts it (docs/api/guardrails.md). */
  readonly prompt?: "4kB" | "4kB guarded" | undefined
  /** Calls the response cache answers (`hit`), or billed calls that store their answer (`refresh`) (docs/api/cache.md). */
  readonly cache?: "hit" | "refresh" | undefined
  /** Calls of an account whose own provider key (mode `first`) answers them (docs/api/provider-keys.md). */
  readonly ownKey?: boolean | undefined
}

/** What a PII redaction policy may add to a call on a 4 kB prompt, in CPU µs (docs/api/guardrails.md, "Cost"). */
const GUARDRAIL_BUDGET_US = 100
/** A cache hit's CPU, at most this share of a billed call's (docs/performance.md, "Benchmark"). */
const CACHE_HIT_SHARE = 0.5
/** A call on a team's own provider key, at most this many times a plain call's CPU: the machine's noise, no more. */
const OWN_KEY_SHARE = 1.05

export interface RunOutcome {
  readonly spec: RunSpec
  readonly results: PeerResults
  readonly database: WindowTotals | undefined
}

export const label = (spec: RunSpec) =>
  `${spec.connections} conn${spec.connections === 1 ? "" : "s"}, ${spec.stream ? "stream" : "plain"}` +
  (spec.prompt === undefined
    ? ""
    : spec.prompt === "4kB"
    ? ", 4 kB prompt"
    : ", 4 kB prompt under PII redaction") +
  (spec.cache === undefined ? "" : spec.cache === "hit" ? ", cache hits" : ", cache refreshes") +
  (spec.ownKey === true ? ", own provider key" : "")

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
    "idle MB",
    "peak MB",
    "errors"
  ]]
  for (const s of results.summary) {
    if (s.failed !== undefined) {
      rows.push([s.name, "FAILED", "-", "-", "-", "-", "-", "-", "-", "-", "-"])
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
      fmt(s.idleRssMb, 0),
      fmt(s.peakRssMb, 0),
      String(s.errs)
    ])
  }
  const lines = [table(rows)]
  const nenas = results.summary.find((s) => s.name === TARGET)
  if (nenas?.cpuTreeProcs !== undefined) {
    lines.push(`${TARGET} CPU = its process tree: ${summarize(nenas.cpuTreeProcs)}`)
  }
  lines.push(
    "idle MB = RSS when a target's load began; peak MB = its process's peak RSS (VmHWM) in this round (the service's and the upstream's restarted at its start); node processes only"
  )
  for (const t of results.targets) {
    if (t.failed !== undefined) lines.push(`${t.name}: ${t.failed}`)
    else if ((t.preflight_notes ?? []).length > 0) {
      lines.push(`${t.name} preflight: ${(t.preflight_notes ?? []).join("; ")}`)
    }
  }
  if (database !== undefined) {
    const per = perCall(database)
    const calls = database.calls === 0 ? NaN : database.calls
    lines.push(
      `PostgreSQL per ${TARGET} call: ${fmt(per.transactions, 3)} transactions, ${fmt(per.walBytes, 0)} WAL bytes ` +
        `(${database.calls} calls in ${database.windows} window${
          database.windows === 1 ? "" : "s"
        } of warm-up + measurement; ` +
        `transactions net of the service's idle ${fmt(database.background.transactionsPerSecond, 2)}/s: ` +
        `${fmt(database.rawTransactions / calls, 3)}/call with them, ${
          fmt(database.transactionsSeenEarly / calls, 3)
        } of these visible 200 ms after)`
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
  readonly portkeyAddedP50: number
  readonly p99: number
  readonly portkeyP99: number
  readonly cpu: number
  readonly portkeyCpu: number
  readonly cpuOverEffect: number
  readonly peakRssMb: number
  readonly portkeyPeakRssMb: number
  readonly effectPeakRssMb: number
  readonly idleRssMb: number
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
    portkeyAddedP50: (portkey?.p50 ?? NaN) - (direct?.p50 ?? NaN),
    p99: nenas?.p99 ?? NaN,
    portkeyP99: portkey?.p99 ?? NaN,
    cpu: nenas?.cpu ?? NaN,
    portkeyCpu: portkey?.cpu ?? NaN,
    cpuOverEffect: (nenas?.cpu ?? NaN) / (effect?.cpu ?? NaN),
    peakRssMb: nenas?.peakRssMb ?? NaN,
    portkeyPeakRssMb: portkey?.peakRssMb ?? NaN,
    effectPeakRssMb: effect?.peakRssMb ?? NaN,
    idleRssMb: nenas?.idleRssMb ?? NaN,
    transactionsPerCall: per.transactions,
    walBytesPerCall: per.walBytes
  }
}

/** The figures the goals are stated in, one row per run. */
export const summaryTable = (outcomes: ReadonlyArray<RunOutcome>) =>
  table([
    [
      "run",
      "nenas req/s",
      "÷ portkey",
      "added p50 ms",
      "CPU ÷ portkey",
      "CPU ÷ effect",
      "peak MB",
      "portkey peak MB",
      "PG xacts/call",
      "WAL B/call"
    ],
    ...outcomes.map((outcome) => {
      const f = figures(outcome)
      return [
        label(outcome.spec),
        fmt(f.nenasRps, 0),
        fmt(f.rpsOverPortkey, 2),
        fmt(f.addedP50, 3),
        fmt(f.cpu / f.portkeyCpu, 2),
        fmt(f.cpuOverEffect, 2),
        fmt(f.peakRssMb, 0),
        fmt(f.portkeyPeakRssMb, 0),
        // Per call that reached the upstream: a run of cache hits has none.
        outcome.spec.cache === "hit" ? "-" : fmt(f.transactionsPerCall, 3),
        outcome.spec.cache === "hit" ? "-" : fmt(f.walBytesPerCall, 0)
      ]
    })
  ])

/** PASS or MISS when every figure is known, else n/a. */
const verdict = (ok: boolean, ...values: ReadonlyArray<number>) =>
  values.every(Number.isFinite) ? ok ? "PASS" : "MISS" : "n/a "

const rpsLines = (outcome: RunOutcome) => {
  const f = figures(outcome)
  const goal = GOALS.rpsOverPortkey[kind(outcome.spec)]
  return `${verdict(f.rpsOverPortkey >= goal, f.rpsOverPortkey)}  req/s nenas ÷ portkey, ${label(outcome.spec)}: ` +
    `${fmt(f.rpsOverPortkey, 2)} (goal ≥ ${goal.toFixed(1)})`
}

const cpuLines = (outcome: RunOutcome) => {
  const f = figures(outcome)
  const run = label(outcome.spec)
  return [
    `${verdict(f.cpu <= f.portkeyCpu, f.cpu, f.portkeyCpu)}  CPU µs/req nenas (service + PostgreSQL), ${run}: ` +
    `${fmt(f.cpu, 0)} (goal ≤ portkey's ${fmt(f.portkeyCpu, 0)})`,
    `${
      verdict(f.cpuOverEffect <= GOALS.cpuOverEffect, f.cpuOverEffect)
    }  CPU µs/req nenas ÷ the Effect floor's, ${run}: ` +
    `${fmt(f.cpuOverEffect, 2)} (goal ≤ ${GOALS.cpuOverEffect})`
  ]
}

/** On a 1-connection run: no more than Portkey's added p50 on the plain 1-connection run. */
const addedP50Line = (outcome: RunOutcome, portkeyPlainAddedP50: number) => {
  const f = figures(outcome)
  return `${verdict(f.addedP50 <= portkeyPlainAddedP50, f.addedP50, portkeyPlainAddedP50)}  added p50 (− direct), ${
    label(outcome.spec)
  }: ` +
    `${fmt(f.addedP50, 3)} ms (goal ≤ portkey's ${fmt(portkeyPlainAddedP50, 3)} ms, 1 conn, plain)`
}

const p99Line = (outcome: RunOutcome) => {
  const f = figures(outcome)
  return `${verdict(f.p99 <= f.portkeyP99, f.p99, f.portkeyP99)}  p99 nenas, ${label(outcome.spec)}: ` +
    `${fmt(f.p99, 1)} ms (goal ≤ portkey's ${fmt(f.portkeyP99, 1)} ms)`
}

const peakRssLine = (outcome: RunOutcome) => {
  const f = figures(outcome)
  return `${
    verdict(f.peakRssMb <= f.effectPeakRssMb, f.peakRssMb, f.effectPeakRssMb)
  }  peak RSS of nenas's node process, ${label(outcome.spec)}: ${fmt(f.peakRssMb, 1)} MB (goal ≤ the Effect floor's ${
    fmt(f.effectPeakRssMb, 1)
  } MB; portkey's ${fmt(f.portkeyPeakRssMb, 1)})`
}

/** The first run's idle figure: the service as start-up and the preflight left it. */
const idleRssLine = (first: RunOutcome | undefined): ReadonlyArray<string> => {
  if (first === undefined) return []
  const f = figures(first)
  return [
    `${verdict(f.idleRssMb < GOALS.idleRssMb, f.idleRssMb)}  idle RSS of nenas's node process, before ${
      label(first.spec)
    }: ${fmt(f.idleRssMb, 1)} MB (goal < ${GOALS.idleRssMb} MB)`
  ]
}

const transactionsLine = (outcome: RunOutcome) => {
  const f = figures(outcome)
  return `${
    verdict(f.transactionsPerCall <= GOALS.transactionsPerCall, f.transactionsPerCall)
  }  PostgreSQL transactions per call, ${label(outcome.spec)}: ${
    fmt(f.transactionsPerCall, 3)
  } (goal ≤ ${GOALS.transactionsPerCall})`
}

/** billingCheck's lines as one goal: PASS when each of its PASS/MISS lines passed. */
const billingLine = (billing: ReadonlyArray<string>) => {
  const judged = billing.filter((line) => /^(PASS|MISS) /.test(line))
  const passed = judged.filter((line) => line.startsWith("PASS")).length
  const result = judged.length === 0 ? "n/a " : passed === judged.length ? "PASS" : "MISS"
  return `${result}  billing checks (below): ${passed} of ${judged.length} passed`
}

/** PASS or MISS per goal, for the runs the goal is stated for; `billing` is billingCheck's lines. */
/** The service's CPU per call on the 4 kB prompt with its key's PII redaction, beyond the same prompt without. */
const guardrailLine = (outcomes: ReadonlyArray<RunOutcome>): ReadonlyArray<string> => {
  const cpuOf = (prompt: RunSpec["prompt"]) => {
    const outcome = outcomes.find((o) => o.spec.prompt === prompt && !o.spec.stream)
    return outcome === undefined ? undefined : find(outcome.results, TARGET)?.cpu
  }
  const plain = cpuOf("4kB")
  const guarded = cpuOf("4kB guarded")
  if (plain === undefined || guarded === undefined) return []
  const added = guarded - plain
  return [
    `${added < GUARDRAIL_BUDGET_US ? "PASS" : "MISS"} PII redaction on a 4 kB prompt adds ${
      fmt(added, 0)
    } CPU µs a call ` +
    `(${fmt(guarded, 0)} against ${fmt(plain, 0)}; goal < ${GUARDRAIL_BUDGET_US})`
  ]
}

/**
 * The service's CPU per call at 32 connections when the cache answers (and when it refreshes: a billed call that
 * stores its answer) against the same call uncached, plain and streamed.
 */
const cacheLines = (outcomes: ReadonlyArray<RunOutcome>): ReadonlyArray<string> =>
  [false, true].flatMap((stream) => {
    const cpuOf = (cache: RunSpec["cache"]) => {
      const outcome = outcomes.find((o) =>
        o.spec.connections === 32 && o.spec.prompt === undefined && o.spec.stream === stream &&
        o.spec.cache === cache && o.spec.ownKey !== true
      )
      return outcome === undefined ? undefined : find(outcome.results, TARGET)?.cpu
    }
    const billed = cpuOf(undefined)
    const hit = cpuOf("hit")
    const refresh = cpuOf("refresh")
    if (billed === undefined) return []
    const mode = stream ? "stream" : "plain"
    return [
      ...(hit === undefined ? [] : [
        `${hit < CACHE_HIT_SHARE * billed ? "PASS" : "MISS"} a cache hit, ${mode}: ${fmt(hit, 0)} CPU µs a call, ${
          fmt(hit / billed, 2)
        } of a billed call's ${fmt(billed, 0)} (goal < ${CACHE_HIT_SHARE})`
      ]),
      ...(refresh === undefined ? [] : [
        `info  a call that stores its answer (refresh), ${mode}: ${fmt(refresh, 0)} CPU µs, ${
          fmt(refresh / billed, 2)
        }× an uncached call's`
      ])
    ]
  })

/** The service's CPU per call at 32 connections on a team's own provider key against nenas's own upstream. */
const ownKeyLines = (outcomes: ReadonlyArray<RunOutcome>): ReadonlyArray<string> =>
  [false, true].flatMap((stream) => {
    const cpuOf = (ownKey: boolean) => {
      const outcome = outcomes.find((o) =>
        o.spec.connections === 32 && o.spec.prompt === undefined && o.spec.stream === stream &&
        o.spec.cache === undefined && (o.spec.ownKey === true) === ownKey
      )
      return outcome === undefined ? undefined : find(outcome.results, TARGET)?.cpu
    }
    const plain = cpuOf(false)
    const own = cpuOf(true)
    if (plain === undefined || own === undefined) return []
    return [
      `${own <= OWN_KEY_SHARE * plain ? "PASS" : "MISS"} a call on a team's own key, ${stream ? "stream" : "plain"}: ${
        fmt(own, 0)
      } CPU µs a call, ${fmt(own / plain, 2)}× a call on nenas's upstream (${fmt(plain, 0)}; goal ≤ ${OWN_KEY_SHARE})`
    ]
  })

export const goalLines = (all: ReadonlyArray<RunOutcome>, billing: ReadonlyArray<string>) => {
  // The 4 kB prompt's runs measure the guardrails only, the cache's runs the cache, the own key's runs the routing
  // over it; the goals against the peers are the short prompt's, uncached, on nenas's upstream.
  const outcomes = all.filter((o) =>
    o.spec.prompt === undefined && o.spec.cache === undefined && o.spec.ownKey !== true
  )
  const at = (connections: number) => outcomes.filter((o) => o.spec.connections === connections)
  const plainSingle = at(1).find((o) => !o.spec.stream)
  const portkeyPlainAddedP50 = plainSingle === undefined ? NaN : figures(plainSingle).portkeyAddedP50
  return [
    ...at(32).map(rpsLines),
    ...at(32).flatMap(cpuLines),
    ...at(1).map((outcome) => addedP50Line(outcome, portkeyPlainAddedP50)),
    ...at(32).filter((o) => o.spec.stream).map(p99Line),
    ...at(32).map(peakRssLine),
    ...idleRssLine(all[0]),
    ...at(32).map(transactionsLine),
    ...guardrailLine(all),
    ...cacheLines(all),
    ...ownKeyLines(all),
    billingLine(billing)
  ]
}
