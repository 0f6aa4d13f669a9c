/** Runs `peers.mjs` (the shared peer benchmark) with the service as target `nenas`, and reads its results. */
import { spawn, spawnSync } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import { existsSync } from "node:fs"
import { readFile } from "node:fs/promises"
import { join } from "node:path"
import type { WindowTracker } from "./database.js"
import type { TargetMemory } from "./memory.js"
import { MemoryWatch } from "./memory.js"

export const TARGET = "nenas"

/** Fails with one line when the shared benchmark is not there; installs its packages on first use. */
export const preparePeers = (dir: string) => {
  const script = join(dir, "peers.mjs")
  if (!existsSync(script)) {
    throw new OneLine(`no peer benchmark at ${script}: set BENCH_PEERS_DIR to the folder that holds peers.mjs`)
  }
  if (!existsSync(join(dir, "node_modules"))) {
    process.stdout.write(
      `installing the peer benchmark's packages (autocannon, Portkey): npm install --prefix ${dir}\n`
    )
    const result = spawnSync("npm", ["install", "--prefix", dir, "--no-audit", "--no-fund"], { stdio: "inherit" })
    if (result.status !== 0) {
      throw new OneLine(`npm install --prefix ${dir} failed (status ${result.status ?? result.signal})`)
    }
  }
  return script
}

/** An error whose message is the whole story: printed without a stack. */
export class OneLine extends Error {}

/** One target's medians over the rounds, as peers.mjs writes them. */
interface PeersMjsSummary {
  readonly name: string
  readonly failed?: string
  readonly rps: number
  readonly rpsMin: number
  readonly rpsMax: number
  /** Milliseconds, client side, 2xx responses. */
  readonly p50: number
  readonly p99: number
  readonly errs: number
  /** CPU µs per 2xx response of the process (or, for the service, process tree) behind the target. */
  readonly cpu: number
  readonly hostBusy: number
  readonly rounds: number
  readonly cpuTreeProcs?: ReadonlyArray<string>
}

/** A target's figures: peers.mjs's, and the memory of the node process behind it (see TargetMemory). */
export interface PeerSummary extends PeersMjsSummary, TargetMemory {}

type PeerTargets = ReadonlyArray<
  { readonly name: string; readonly preflight_notes?: ReadonlyArray<string>; readonly failed?: string }
>

/** The results JSON of peers.mjs, as far as it is read here. */
interface PeersMjsResults {
  readonly summary: ReadonlyArray<PeersMjsSummary>
  readonly targets: PeerTargets
}

export interface PeerResults {
  readonly summary: ReadonlyArray<PeerSummary>
  readonly targets: PeerTargets
}

let running: ChildProcess | undefined

/** Stops a peers.mjs still running (it stops what it started). */
export const stopPeers = () => {
  if (running !== undefined && running.exitCode === null && running.signalCode === null) running.kill("SIGTERM")
}

/** Lines of peers.mjs's progress that say the same every time: echoed on its first run only. */
const ROUTINE = /^(node v|plan: |note: only|started \S+ pid|stopped |results: |preflight \S+: HTTP 2\d\d ok)/

/** What runPeers follows in peers.mjs's progress: a process it started, a target's load beginning, a measured window's end. */
const EVENTS =
  /(?<=^|\n)(?:started (?<started>\S+) pid (?<pid>\d+)\n|(?<warmUp>\S+): warm-up)|(?<measured>\d+ req\/s, p50 )/g

/** The target a process peers.mjs starts is behind: its own name, but the fake upstream is `direct`'s. */
const targetOf = (name: string) => name === "upstream" ? "direct" : name

/**
 * Runs peers.mjs to its end, echoing its progress (stderr) indented; tells
 * `tracker` when the service's warm-up starts and when its measured seconds
 * end, and reads each target's memory (`pids`: the processes behind targets
 * that peers.mjs does not start, by target name; it names those it starts).
 * The service must be its last target, so that nothing runs after its window.
 */
export const runPeers = async (
  script: string,
  args: ReadonlyArray<string>,
  options: {
    readonly cwd: string
    readonly out: string
    readonly tracker: WindowTracker
    readonly quiet: boolean
    readonly pids: Readonly<Record<string, number>>
  }
): Promise<
  { readonly exitCode: number; readonly stderr: string; readonly memory: ReadonlyMap<string, TargetMemory> }
> => {
  const child = spawn(process.execPath, [script, ...args, "--rounds", "1", "--out", options.out], {
    cwd: options.cwd,
    stdio: ["ignore", "ignore", "pipe"]
  })
  running = child
  const memory = new MemoryWatch(options.pids)
  let stderr = ""
  let scanned = 0
  let echoed = 0
  let loaded: string | undefined
  child.stderr.setEncoding("utf8").on("data", (text: string) => {
    stderr += text
    for (;;) {
      EVENTS.lastIndex = scanned
      const groups = EVENTS.exec(stderr)?.groups
      if (groups === undefined) break
      scanned = EVENTS.lastIndex
      if (groups["started"] !== undefined) memory.started(targetOf(groups["started"]), Number(groups["pid"]))
      else if (groups["warmUp"] !== undefined) {
        loaded = groups["warmUp"]
        memory.loadBegins(loaded)
        if (loaded === TARGET) options.tracker.started()
      } else if (groups["measured"] !== undefined && loaded !== undefined) {
        memory.windowEnds(loaded)
        if (loaded === TARGET) options.tracker.ended()
        loaded = undefined
      }
    }
    const complete = stderr.lastIndexOf("\n") + 1
    for (const line of stderr.slice(echoed, complete).split("\n")) {
      if (line.trim() !== "" && !(options.quiet && ROUTINE.test(line))) process.stdout.write(`    ${line}\n`)
    }
    echoed = Math.max(echoed, complete)
  })
  const exitCode = await new Promise<number>((resolveExit, reject) => {
    child.once("error", reject)
    child.once("exit", (code, signal) => resolveExit(code ?? (signal === null ? 1 : 128)))
  }).finally(() => memory.stop())
  return { exitCode, stderr, memory: memory.figures() }
}

/** peers.mjs's results, each target's summary with the memory runPeers read (NaN where it read none). */
export const readResults = async (out: string, memory: ReadonlyMap<string, TargetMemory>): Promise<PeerResults> => {
  const results = JSON.parse(await readFile(out, "utf8")) as PeersMjsResults
  const summary = results.summary.map((s): PeerSummary => ({
    ...s,
    idleRssMb: memory.get(s.name)?.idleRssMb ?? NaN,
    peakRssMb: memory.get(s.name)?.peakRssMb ?? NaN
  }))
  return { ...results, summary }
}

const median = (values: ReadonlyArray<number>) => {
  const sorted = values.filter(Number.isFinite).sort((a, b) => a - b)
  if (sorted.length === 0) return NaN
  const mid = sorted.length >> 1
  return sorted.length % 2 === 1 ? sorted[mid] ?? NaN : ((sorted[mid - 1] ?? NaN) + (sorted[mid] ?? NaN)) / 2
}

/** Several one-round results as one: per target the medians of the rounds it ran in (as peers.mjs's own --rounds). */
export const combineRounds = (rounds: ReadonlyArray<PeerResults>): PeerResults => {
  const names = [...new Set(rounds.flatMap((r) => r.summary.map((s) => s.name)))]
  const summary = names.map((name): PeerSummary => {
    const ran = rounds.flatMap((r) => r.summary.filter((s) => s.name === name && s.failed === undefined))
    const failed = rounds.flatMap((r) => r.summary.filter((s) => s.name === name && s.failed !== undefined))
    const pick = (key: "rps" | "p50" | "p99" | "cpu" | "hostBusy" | "idleRssMb" | "peakRssMb") =>
      median(ran.map((s) => s[key]))
    const last = ran.at(-1)
    return {
      name,
      ...(ran.length === 0 ? { failed: failed[0]?.failed ?? "no runs" } : {}),
      rps: pick("rps"),
      rpsMin: Math.min(...ran.map((s) => s.rps)),
      rpsMax: Math.max(...ran.map((s) => s.rps)),
      p50: pick("p50"),
      p99: pick("p99"),
      errs: ran.reduce((total, s) => total + s.errs, 0),
      cpu: pick("cpu"),
      hostBusy: pick("hostBusy"),
      idleRssMb: pick("idleRssMb"),
      peakRssMb: pick("peakRssMb"),
      rounds: ran.length,
      ...(last?.cpuTreeProcs === undefined ? {} : { cpuTreeProcs: last.cpuTreeProcs })
    }
  })
  const targets = names.map((name) => {
    const all = rounds.flatMap((r) => r.targets.filter((t) => t.name === name))
    const notes = [...new Set(all.flatMap((t) => t.preflight_notes ?? []))]
    const failed = all.find((t) => t.failed !== undefined)?.failed
    return { name, preflight_notes: notes, ...(failed === undefined ? {} : { failed }) }
  })
  return { summary, targets }
}
