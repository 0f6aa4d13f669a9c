import { execFile, spawn } from "node:child_process"
import { readdir, stat } from "node:fs/promises"
import { promisify } from "node:util"
import { Effect } from "effect"

/** The variables of DESIGN.md's table: a child gets only the ones a test gives it. */
export const CONFIG_VARIABLES = [
  "PORT", "HOST", "PUBLIC_BASE_URL", "DATABASE_URL", "DATA_DIR", "REDIS_URL", "AUTH_JWKS_URL", "AUTH_ISSUER",
  "AUTH_AUDIENCE", "STRIPE_SECRET_KEY", "STRIPE_WEBHOOK_SECRET", "STRIPE_API_URL", "UPSTREAM_BASE_URL",
  "UPSTREAM_API_KEY", "SEARCH_BASE_URL", "NODE_ENV", "LOG_FORMAT", "METRICS_TOKEN", "OTEL_EXPORTER_OTLP_ENDPOINT",
  "RATE_LIMIT_RPM", "RATE_LIMIT_CONCURRENT", "DASHBOARD_URL", "PRICE_TABLE"
]

export interface ServiceProcess {
  readonly baseUrl: string
  /** Everything it printed so far, stdout and stderr. */
  readonly output: () => string
  readonly exitCode: () => number | null
}

const ROOT = new URL("../../", import.meta.url)

const newestSource = async (): Promise<number> => {
  let newest = 0
  for (const dir of ["src", "migrations"]) {
    for (const file of await readdir(new URL(dir, ROOT), { recursive: true })) {
      newest = Math.max(newest, (await stat(new URL(`${dir}/${file}`, ROOT))).mtimeMs)
    }
  }
  return newest
}

/** `npm run build` when `dist/main.js` is missing or older than a source it is compiled from. */
export const ensureBuilt = Effect.promise(async () => {
  const built = await stat(new URL("dist/main.js", ROOT)).then((s) => s.mtimeMs, () => 0)
  if (built > 0 && (await newestSource()) <= built) return
  await promisify(execFile)("npm", ["run", "build"], { cwd: ROOT, maxBuffer: 16 * 1024 * 1024 })
})

/**
 * The compiled service (`node dist/main.js`) as a child process with only
 * `env` configured; killed when the scope closes. Resolves once `/healthz`
 * answers.
 */
export const startService = (env: Record<string, string>) =>
  Effect.acquireRelease(
    Effect.promise(async (): Promise<ServiceProcess & { readonly kill: () => void }> => {
      const childEnv: NodeJS.ProcessEnv = { ...process.env }
      for (const name of CONFIG_VARIABLES) delete childEnv[name]
      const child = spawn(process.execPath, ["dist/main.js"], {
        cwd: ROOT,
        env: { ...childEnv, ...env },
        stdio: ["ignore", "pipe", "pipe"]
      })
      let output = ""
      child.stdout.on("data", (chunk) => (output += chunk))
      child.stderr.on("data", (chunk) => (output += chunk))
      const baseUrl = `http://127.0.0.1:${env["PORT"]}`
      const deadline = Date.now() + 90_000
      while (Date.now() < deadline) {
        if (child.exitCode !== null) throw new Error(`service exited early (${child.exitCode}):\n${output}`)
        const up = await fetch(`${baseUrl}/healthz`, { signal: AbortSignal.timeout(5_000) }).then((r) => r.ok, () => false)
        if (up) {
          return { baseUrl, output: () => output, exitCode: () => child.exitCode, kill: () => child.kill("SIGKILL") }
        }
        await new Promise((resolve) => setTimeout(resolve, 200))
      }
      child.kill("SIGKILL")
      throw new Error(`service did not answer /healthz within 90 s:\n${output}`)
    }),
    (service) => Effect.sync(service.kill)
  )
