import { type ChildProcess, spawn } from "node:child_process"
import { freePort } from "../../src/Database/EmbeddedPostgres.js"

/** `RELIABILITY_SMOKE=1`: the smaller variant CI runs. */
export const SMOKE = process.env["RELIABILITY_SMOKE"] === "1"

const CONFIG_VARIABLES = [
  "PORT", "HOST", "PUBLIC_BASE_URL", "DATABASE_URL", "DATA_DIR", "REDIS_URL", "AUTH_JWKS_URL", "AUTH_ISSUER",
  "AUTH_AUDIENCE", "STRIPE_SECRET_KEY", "STRIPE_WEBHOOK_SECRET", "UPSTREAM_BASE_URL", "UPSTREAM_API_KEY",
  "SEARCH_BASE_URL", "NODE_ENV"
]

export interface Service {
  readonly child: ChildProcess
  readonly base: string
  readonly output: () => string
  /** Resolves with the exit code (null when killed by a signal) and the signal. */
  readonly exited: Promise<{ readonly code: number | null; readonly signal: NodeJS.Signals | null }>
}

/**
 * `npm start` in a process group of its own (as a terminal or a container
 * runtime runs it), so that a signal can be sent to the whole group.
 */
export const startService = async (env: Record<string, string>): Promise<Service> => {
  const port = await freePort()
  const base = `http://127.0.0.1:${port}`
  const full: NodeJS.ProcessEnv = { ...process.env }
  for (const name of CONFIG_VARIABLES) delete full[name]
  Object.assign(full, { PORT: String(port), LOG_FORMAT: "json", ...env })
  const child = spawn("npm", ["start", "--silent"], { env: full, detached: true, stdio: ["ignore", "pipe", "pipe"] })
  let output = ""
  child.stdout?.on("data", (chunk) => (output += chunk))
  child.stderr?.on("data", (chunk) => (output += chunk))
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once("exit", (code, signal) => resolve({ code, signal }))
  )
  const deadline = Date.now() + 120_000
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`service exited early:\n${output}`)
    const ok = await fetch(`${base}/healthz`, { signal: AbortSignal.timeout(5_000) }).then((r) => r.status === 200, () => false)
    if (ok) return { child, base, output: () => output, exited }
    await new Promise((resolve) => setTimeout(resolve, 250))
  }
  child.kill("SIGKILL")
  throw new Error(`service did not become healthy:\n${output}`)
}

/** Kills what is left of a service's process group (after a failed test). */
export const killGroup = (service: Service | undefined) => {
  if (service?.child.pid === undefined || service.child.exitCode !== null) return
  try {
    process.kill(-service.child.pid, "SIGKILL")
  } catch {
    // already gone
  }
}

// arbitrary JSON: each scenario asserts the fields it reads
export type Json = any

export const post = async (base: string, path: string, json: unknown, token?: string): Promise<{ status: number; body: Json }> => {
  const response = await fetch(`${base}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(token === undefined ? {} : { authorization: `Bearer ${token}` }) },
    body: JSON.stringify(json),
    signal: AbortSignal.timeout(60_000)
  })
  const text = await response.text()
  return { status: response.status, body: text === "" ? undefined : JSON.parse(text) }
}

export const get = async (base: string, path: string, token?: string): Promise<{ status: number; body: Json }> => {
  const response = await fetch(`${base}${path}`, {
    headers: token === undefined ? {} : { authorization: `Bearer ${token}` },
    signal: AbortSignal.timeout(60_000)
  })
  return { status: response.status, body: await response.json() }
}

/** A developer with a live key and a wallet topped up through the simulated checkout. */
export const fundedDeveloper = async (base: string, email: string, amountSen = 10_000) => {
  const session = await post(base, "/dev/session", { email })
  const token = session.body.token as string
  const key = await post(base, "/dashboard/api-keys", { name: "reliability" }, token)
  const checkout = await post(base, "/dashboard/billing/checkout", { amount_sen: amountSen }, token)
  if (checkout.status !== 200) throw new Error(`checkout failed: ${checkout.status} ${JSON.stringify(checkout.body)}`)
  const paid = await fetch(`${base}/dev/checkout/${checkout.body.session_id}/pay`, { method: "POST" })
  if (paid.status !== 200) throw new Error(`top-up failed: ${paid.status} ${await paid.text()}`)
  return { token, key: key.body.full_key as string }
}
