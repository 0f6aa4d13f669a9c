/** Child processes of the benchmark: started with their output in a file, stopped by their own PID. */
import { spawn, spawnSync } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import { closeSync, openSync, readFileSync } from "node:fs"
import { readFile } from "node:fs/promises"
import { join } from "node:path"
import { freePort } from "../src/Database/EmbeddedPostgres.js"

const started = Date.now()

/** A progress line, stamped with the seconds since the benchmark started. */
export const log = (line: string) =>
  process.stdout.write(`[${((Date.now() - started) / 1000).toFixed(1).padStart(6)}s] ${line}\n`)

export const sleep = (ms: number) => new Promise<void>((resolveSleep) => setTimeout(resolveSleep, ms))

export interface Child {
  readonly name: string
  readonly process: ChildProcess
  readonly pid: number
  /** Where its stdout and stderr go (written by the child itself: the benchmark reads nothing during the runs). */
  readonly logFile: string
  readonly exited: Promise<number | null>
}

/** `node ARGS` with stdout and stderr appended to `logFile`. */
export const startNode = (
  name: string,
  args: ReadonlyArray<string>,
  options: { readonly cwd: string; readonly env: NodeJS.ProcessEnv; readonly logFile: string }
): Child => {
  const fd = openSync(options.logFile, "a")
  const child = spawn(process.execPath, args, { cwd: options.cwd, env: options.env, stdio: ["ignore", fd, fd] })
  closeSync(fd)
  if (child.pid === undefined) throw new Error(`could not start ${name}: node ${args.join(" ")}`)
  const exited = new Promise<number | null>((resolveExit) => child.once("exit", (code) => resolveExit(code)))
  return { name, process: child, pid: child.pid, logFile: options.logFile, exited }
}

export const isRunning = (child: Child) => child.process.exitCode === null && child.process.signalCode === null

/** SIGTERM, then SIGKILL after `graceMs`. */
export const stopChild = async (child: Child, graceMs: number) => {
  if (!isRunning(child)) return
  child.process.kill("SIGTERM")
  const timer = new Promise<"timeout">((resolveTimer) => setTimeout(() => resolveTimer("timeout"), graceMs).unref())
  if ((await Promise.race([child.exited, timer])) === "timeout") {
    log(`${child.name} (pid ${child.pid}) did not stop within ${graceMs} ms of SIGTERM; sending SIGKILL`)
    child.process.kill("SIGKILL")
    await child.exited
  }
}

/** The last `chars` characters of what a child wrote. */
export const tail = async (child: Child, chars = 4000) => {
  const text = await readFile(child.logFile, "utf8").catch(() => "")
  return text.slice(-chars)
}

/** Polls `url` until it answers 200, failing early when the child exits. */
export const waitHttp = async (child: Child, url: string, timeoutMs: number) => {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (!isRunning(child)) {
      throw new Error(
        `${child.name} exited (code ${child.process.exitCode}) before it was ready:\n${await tail(child)}`
      )
    }
    try {
      const reply = await fetch(url)
      await reply.arrayBuffer()
      if (reply.status === 200) return
    } catch {
      // not listening yet
    }
    await sleep(200)
  }
  throw new Error(`${child.name} was not ready at ${url} within ${timeoutMs} ms:\n${await tail(child)}`)
}

/** The node flags of `npm run start:prod` (package.json), as production runs the service. */
const productionNodeFlags = (): ReadonlyArray<string> => {
  const manifest = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as {
    readonly scripts: Record<string, string>
  }
  return (manifest.scripts["start:prod"] ?? "").split(" ").filter((word) => word.startsWith("--"))
}

/**
 * The node flags the service runs with: `npm run start:prod`'s, unless BENCH_NODE_ARGS gives others
 * (space-separated; "" for none), to weigh a flag's CPU against its memory.
 */
export const SERVICE_NODE_ARGS: ReadonlyArray<string> = process.env["BENCH_NODE_ARGS"] === undefined
  ? productionNodeFlags()
  : process.env["BENCH_NODE_ARGS"].split(" ").filter((flag) => flag !== "")

/** Compiles the service as production runs it (`npm run build`'s TypeScript half; incremental) into `dist/`. */
export const buildService = (root: string) => {
  const built = spawnSync("npx", ["tsc", "-b", "tsconfig.build.json"], { cwd: root, encoding: "utf8" })
  if (built.status !== 0) throw new Error(`tsc -b tsconfig.build.json failed:\n${built.stdout}${built.stderr}`)
}

/** The shared bench's fake OpenAI-compatible upstream on a free port, answering; its output in `logFile`. */
export const startFakeUpstream = async (peersDir: string, env: NodeJS.ProcessEnv, logFile: string) => {
  const port = await freePort()
  const base = `http://127.0.0.1:${port}`
  const child = startNode("fake upstream", [join(peersDir, "fake-upstream.mjs"), "--port", String(port)], {
    cwd: peersDir,
    env,
    logFile
  })
  try {
    await waitHttp(child, `${base}/healthz`, 30_000)
  } catch (error) {
    await stopChild(child, 5_000)
    throw error
  }
  return { child, port, base }
}
