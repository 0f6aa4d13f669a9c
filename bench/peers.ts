/** Runs `peers.mjs` (the shared peer benchmark) with the service as target `nenas`, and reads its results. */
import { spawn, spawnSync } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import { existsSync } from "node:fs"
import { readFile } from "node:fs/promises"
import { join } from "node:path"
import type { WindowTracker } from "./database.js"

export const TARGET = "nenas"

/** Fails with one line when the shared benchmark is not there; installs its packages on first use. */
export const preparePeers = (dir: string) => {
  const script = join(dir, "peers.mjs")
  if (!existsSync(script)) {
    throw new OneLine(`no peer benchmark at ${script}: set BENCH_PEERS_DIR to the folder that holds peers.mjs`)
  }
  if (!existsSync(join(dir, "node_modules"))) {
    process.stdout.write(`installing the peer benchmark's packages (autocannon, Portkey): npm install --prefix ${dir}\n`)
    const result = spawnSync("npm", ["install", "--prefix", dir, "--no-audit", "--no-fund"], { stdio: "inherit" })
    if (result.status !== 0) throw new OneLine(`npm install --prefix ${dir} failed (status ${result.status ?? result.signal})`)
  }
  return script
}

/** An error whose message is the whole story: printed without a stack. */
export class OneLine extends Error {}

/** One target's medians over the rounds, as peers.mjs writes them. */
export interface PeerSummary {
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

export interface PeerResults {
  readonly summary: ReadonlyArray<PeerSummary>
  readonly targets: ReadonlyArray<{ readonly name: string; readonly preflight_notes?: ReadonlyArray<string>; readonly failed?: string }>
}

let running: ChildProcess | undefined

/** Stops a peers.mjs still running (it stops what it started). */
export const stopPeers = () => {
  if (running !== undefined && running.exitCode === null && running.signalCode === null) running.kill("SIGTERM")
}

/**
 * Runs peers.mjs to its end, echoing its progress (stderr) indented, and tells
 * `tracker` when the service's warm-up starts and its measured seconds end.
 */
export const runPeers = async (
  script: string,
  args: ReadonlyArray<string>,
  options: { readonly cwd: string; readonly out: string; readonly tracker: WindowTracker }
): Promise<{ readonly exitCode: number; readonly stderr: string }> => {
  const child = spawn(process.execPath, [script, ...args, "--out", options.out], {
    cwd: options.cwd,
    stdio: ["ignore", "ignore", "pipe"]
  })
  running = child
  let stderr = ""
  let scanned = 0
  let inWindow = false
  let atLineStart = true
  const start = new RegExp(`(^|\\n)(\\[\\d+/\\d+\\] )?${TARGET}: warm-up`, "g")
  const end = /\d+ req\/s, p50 /g
  child.stderr.setEncoding("utf8").on("data", (text: string) => {
    process.stdout.write((atLineStart ? "    " : "") + text.replace(/\n(?=.)/g, "\n    "))
    atLineStart = text.endsWith("\n")
    stderr += text
    for (;;) {
      const pattern = inWindow ? end : start
      pattern.lastIndex = scanned
      const match = pattern.exec(stderr)
      if (match === null) break
      scanned = pattern.lastIndex
      if (inWindow) options.tracker.ended()
      else options.tracker.started()
      inWindow = !inWindow
    }
  })
  const exitCode = await new Promise<number>((resolveExit, reject) => {
    child.once("error", reject)
    child.once("exit", (code, signal) => resolveExit(code ?? (signal === null ? 1 : 128)))
  })
  return { exitCode, stderr }
}

export const readResults = async (out: string): Promise<PeerResults> =>
  JSON.parse(await readFile(out, "utf8")) as PeerResults
