import { type ChildProcess, execFileSync, spawn } from "node:child_process"

/**
 * The service started as `npm start` starts it (`node --import tsx src/main.ts`),
 * with no configuration at all: embedded PostgreSQL, development sign-in.
 */
export const CONFIG_VARIABLES = [
  "PORT", "HOST", "PUBLIC_BASE_URL", "DATABASE_URL", "DATA_DIR", "REDIS_URL", "AUTH_JWKS_URL", "AUTH_ISSUER",
  "AUTH_AUDIENCE", "STRIPE_SECRET_KEY", "STRIPE_WEBHOOK_SECRET", "STRIPE_API_URL", "UPSTREAM_BASE_URL",
  "UPSTREAM_API_KEY", "SEARCH_BASE_URL", "NODE_ENV", "LOG_FORMAT", "METRICS_TOKEN", "OTEL_EXPORTER_OTLP_ENDPOINT",
  "RATE_LIMIT_RPM", "RATE_LIMIT_CONCURRENT", "DASHBOARD_URL", "PRICE_TABLE", "INSTANCE_ID", "FETCH_ALLOWED_HOSTS"
]

/** A user other than root to run the service as, or undefined when there is none. */
export interface RunAs {
  readonly uid: number
  readonly gid: number
}

export const isRoot = () => process.getuid?.() === 0

/** `nobody`, the unprivileged user every Unix has, to run the service as when the tests run as root. */
export const nobody = (): RunAs | undefined => {
  try {
    const id = (flag: string) => Number(execFileSync("id", [flag, "nobody"], { encoding: "utf8" }).trim())
    return { uid: id("-u"), gid: id("-g") }
  } catch {
    return undefined
  }
}

export interface Started {
  readonly child: ChildProcess
  readonly output: () => string
  /** Resolves with the exit code once the process has exited and its output is all read. */
  readonly closed: Promise<number | null>
}

/** Only the port and data folder (and working folder) differ from a bare `npm start`, so runs never collide. */
export const startService = (
  options: { readonly port: number; readonly dataDir?: string; readonly cwd?: string; readonly runAs?: RunAs | undefined }
): Started => {
  const env: NodeJS.ProcessEnv = { ...process.env }
  for (const name of CONFIG_VARIABLES) delete env[name]
  env["PORT"] = String(options.port)
  if (options.dataDir !== undefined) env["DATA_DIR"] = options.dataDir
  if (options.runAs !== undefined && options.dataDir !== undefined) env["HOME"] = options.dataDir
  const child = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], {
    env,
    cwd: options.cwd,
    ...options.runAs,
    stdio: ["ignore", "pipe", "pipe"]
  })
  let output = ""
  child.stdout.on("data", (chunk) => (output += chunk))
  child.stderr.on("data", (chunk) => (output += chunk))
  const closed = new Promise<number | null>((resolve) => child.once("close", (code) => resolve(code)))
  return { child, output: () => output, closed }
}

export const waitForHealth = async (base: string, started: Started) => {
  const deadline = Date.now() + 90_000
  while (Date.now() < deadline) {
    if (started.child.exitCode !== null) throw new Error(`service exited early:\n${started.output()}`)
    const ok = await fetch(`${base}/healthz`, { signal: AbortSignal.timeout(5_000) }).then((r) => r.status === 200, () => false)
    if (ok) return
    await new Promise((resolve) => setTimeout(resolve, 250))
  }
  throw new Error(`service did not become healthy:\n${started.output()}`)
}

/** SIGTERM, resolved with the exit code. */
export const stopService = (child: ChildProcess) =>
  new Promise<number | null>((resolve) => {
    if (child.exitCode !== null) return resolve(child.exitCode)
    child.once("exit", (code) => resolve(code))
    child.kill("SIGTERM")
  })

/** What a failed start printed, as its non-empty lines. */
export const linesOf = (output: string) => output.split("\n").filter((line) => line.trim() !== "")
