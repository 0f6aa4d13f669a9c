import { type ChildProcess, execFile, execFileSync, spawn } from "node:child_process"
import { readdir, stat } from "node:fs/promises"
import { promisify } from "node:util"
import { freePort } from "../../src/Database/EmbeddedPostgres.js"

/**
 * The service in a child process, for what needs a process of its own: a
 * start, a kill, a signal, two instances on one database. (`TestServer` runs
 * it inside the test process.) Start two instances one after the other: the
 * second finds the migrations applied.
 */
export interface ServiceProcess {
  readonly child: ChildProcess
  readonly port: number
  readonly baseUrl: string
  /** `npm start` runs in a process group of its own: signals go to the group. */
  readonly group: boolean
  /** Milliseconds since the epoch when it was spawned. */
  readonly spawnedAt: number
  /** Everything it printed so far, stdout and stderr. */
  readonly output: () => string
  /** Resolves when the process has exited: its code (null when a signal ended it) and that signal. */
  readonly exited: Promise<Exit>
  /** Resolves when it has exited and its output is all read. */
  readonly closed: Promise<Exit>
}

export interface Exit {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
}

export interface StartOptions {
  /**
   * What runs: `source` is `node --import tsx src/main.ts` (what `npm start`
   * runs); `compiled` is `node dist/main.js`, built first when stale;
   * `npm start` is npm itself in a process group of its own, as a terminal or
   * a container runtime runs it, so a signal can go to the whole group.
   */
  readonly from?: "source" | "compiled" | "npm start"
  /** Configuration. None is inherited from the test's environment: a bare start is `npm start` with nothing set. */
  readonly env?: Record<string, string>
  /** Default a free port. */
  readonly port?: number
  /** Default the project's root. */
  readonly cwd?: string
  /** A user to run as (when the tests run as root); `HOME` is then `DATA_DIR`. */
  readonly runAs?: RunAs | undefined
  /**
   * Resolve once `/healthz` answers 200 (`healthy`, the default), once
   * `/readyz` does (`ready`), or at once (`spawned`): for a start that is
   * expected to fail, or that is measured while it happens.
   */
  readonly until?: "healthy" | "ready" | "spawned"
  readonly timeoutMs?: number
}

const ROOT = new URL("../../", import.meta.url)

/** What configures the service: removed from the test's environment before a start. */
const CONFIG_VARIABLES = [
  "PORT",
  "HOST",
  "PUBLIC_BASE_URL",
  "DATABASE_URL",
  "DATA_DIR",
  "REDIS_URL",
  "AUTH_JWKS_URL",
  "AUTH_ISSUER",
  "AUTH_AUDIENCE",
  "STRIPE_SECRET_KEY",
  "STRIPE_WEBHOOK_SECRET",
  "STRIPE_API_URL",
  "UPSTREAM_BASE_URL",
  "UPSTREAM_API_KEY",
  "UPSTREAM_MODEL_EMBEDDING",
  "SEARCH_BASE_URL",
  "NODE_ENV",
  "LOG_FORMAT",
  "METRICS_TOKEN",
  "OTEL_EXPORTER_OTLP_ENDPOINT",
  "RATE_LIMIT_RPM",
  "RATE_LIMIT_CONCURRENT",
  "DASHBOARD_URL",
  "PRICE_TABLE",
  "INSTANCE_ID",
  "FETCH_ALLOWED_HOSTS",
  "WEBHOOK_ALLOWED_HOSTS",
  "IP_AUTH_FAILURES_PER_MINUTE",
  "IP_CHECKOUTS_PER_MINUTE",
  "IP_DEV_SESSIONS_PER_MINUTE",
  "TRUSTED_PROXIES",
  "UPSTREAM_IMAGE_URLS",
  "AUTH_AUTHORIZE_URL",
  "DEV_AUTH",
  "SMTP_URL",
  "EMAIL_FROM",
  "WEBHOOK_TIMEOUT_MS",
  "UPSTREAMS",
  "BREAKER_KEY_PREFIX",
  "MYINVOIS_BASE_URL",
  "MYINVOIS_PORTAL_URL",
  "MYINVOIS_CLIENT_ID",
  "MYINVOIS_CLIENT_SECRET",
  "MYINVOIS_SIGNING_KEY",
  "MYINVOIS_SIGNING_CERT",
  "PROVIDER_ALLOWED_HOSTS",
  "PROVIDER_KEYS_SECRET",
  "PROVIDER_KEYS_SECRET_PREVIOUS",
  "BYOK_FEE_BPS"
]

const COMMANDS = {
  source: [process.execPath, ["--import", "tsx", "src/main.ts"]],
  compiled: [process.execPath, ["dist/main.js"]],
  "npm start": ["npm", ["start", "--silent"]]
} as const

/** Starts the service as a child process; see `StartOptions`. A start that does not get where `until` asks is killed. */
export const startService = async (options: StartOptions = {}): Promise<ServiceProcess> => {
  const from = options.from ?? "source"
  if (from === "compiled") await ensureBuilt()
  const port = options.port ?? await freePort()
  const env: NodeJS.ProcessEnv = { ...process.env }
  for (const name of CONFIG_VARIABLES) delete env[name]
  Object.assign(env, options.env, { PORT: String(port) })
  // Services of one test (one database) share their breakers through Redis; other tests' stay apart.
  if (env["REDIS_URL"] !== undefined && env["BREAKER_KEY_PREFIX"] === undefined) {
    env["BREAKER_KEY_PREFIX"] = `nenas:test:breaker:${
      new URL(env["DATABASE_URL"] ?? "postgres://x/none").pathname.slice(1)
    }:`
  }
  if (options.runAs !== undefined && env["DATA_DIR"] !== undefined) env["HOME"] = env["DATA_DIR"]
  const [command, args] = COMMANDS[from]
  const child = spawn(command, args, {
    cwd: options.cwd ?? ROOT.pathname,
    env,
    ...options.runAs,
    detached: from === "npm start",
    stdio: ["ignore", "pipe", "pipe"]
  })
  const spawnedAt = Date.now()
  let output = ""
  child.stdout?.on("data", (chunk) => (output += chunk))
  child.stderr?.on("data", (chunk) => (output += chunk))
  const ended = (event: "exit" | "close") =>
    new Promise<Exit>((resolve) => child.once(event, (code, signal) => resolve({ code, signal })))
  const service: ServiceProcess = {
    child,
    port,
    baseUrl: `http://127.0.0.1:${port}`,
    group: from === "npm start",
    spawnedAt,
    output: () => output,
    exited: ended("exit"),
    closed: ended("close")
  }
  const until = options.until ?? "healthy"
  if (until === "spawned") return service
  try {
    await answering(service, until, options.timeoutMs)
  } catch (error) {
    await stopService(service, "SIGKILL")
    throw error
  }
  return service
}

/**
 * Waits until `/healthz` (`healthy`) or `/readyz` (`ready`) answers 200;
 * resolves with when it did (ms since the epoch). Fails, with what the
 * service printed, when it exits first or does not answer in time.
 */
export const answering = async (
  service: ServiceProcess,
  what: "healthy" | "ready",
  timeoutMs = 120_000
): Promise<number> => {
  const url = `${service.baseUrl}${what === "healthy" ? "/healthz" : "/readyz"}`
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (service.child.exitCode !== null || service.child.signalCode !== null) {
      throw new Error(`service exited early:\n${service.output()}`)
    }
    const ok = await fetch(url, { signal: AbortSignal.timeout(5_000) }).then((r) => r.status === 200, () => false)
    if (ok) return Date.now()
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  throw new Error(`${url} did not answer 200 within ${timeoutMs} ms:\n${service.output()}`)
}

/**
 * Sends `signal` (to the whole process group for `npm start`) unless the
 * process has exited; resolves with its exit code once it has.
 */
export const stopService = async (
  service: ServiceProcess,
  signal: NodeJS.Signals = "SIGTERM"
): Promise<number | null> => {
  const { child } = service
  if (child.exitCode === null && child.signalCode === null && child.pid !== undefined) {
    try {
      process.kill(service.group ? -child.pid : child.pid, signal)
    } catch {
      // Gone in the meantime.
    }
  }
  return (await service.exited).code
}

const newestSource = async (): Promise<number> => {
  let newest = 0
  for (const dir of ["src", "migrations"]) {
    for (const file of await readdir(new URL(dir, ROOT), { recursive: true })) {
      newest = Math.max(newest, (await stat(new URL(`${dir}/${file}`, ROOT))).mtimeMs)
    }
  }
  return newest
}

/**
 * Compiles the service (`npm run build`'s first half) when `dist/main.js` is missing or older than a source.
 * The dashboard is the global setup's to build, once: rebuilding it here would empty `web/dist` under a
 * browser test running in the other worker.
 */
const ensureBuilt = async () => {
  const built = await stat(new URL("dist/main.js", ROOT)).then((s) => s.mtimeMs, () => 0)
  if (built > 0 && (await newestSource()) <= built) return
  await promisify(execFile)("npx", ["tsc", "-b", "tsconfig.build.json"], { cwd: ROOT, maxBuffer: 16 * 1024 * 1024 })
}

/** A user other than root to run the service as. */
export interface RunAs {
  readonly uid: number
  readonly gid: number
}

export const isRoot = () => process.getuid?.() === 0

/** `nobody`, the unprivileged user every Unix has, to run the service as when the tests run as root; undefined when there is none. */
export const nobody = (): RunAs | undefined => {
  try {
    const id = (flag: string) => Number(execFileSync("id", [flag, "nobody"], { encoding: "utf8" }).trim())
    return { uid: id("-u"), gid: id("-g") }
  } catch {
    return undefined
  }
}

/** What a failed start printed, as its non-empty lines. */
export const linesOf = (output: string) => output.split("\n").filter((line) => line.trim() !== "")
