import { type ChildProcess, spawn } from "node:child_process"
import { mkdtemp, readFile, rm, stat } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { freePort } from "../src/Database/EmbeddedPostgres.js"

/**
 * The service started as `npm start` starts it (`node --import tsx src/main.ts`),
 * with no configuration at all: embedded PostgreSQL, development sign-in.
 */
const CONFIG_VARIABLES = [
  "PORT", "HOST", "PUBLIC_BASE_URL", "DATABASE_URL", "DATA_DIR", "REDIS_URL", "AUTH_JWKS_URL", "AUTH_ISSUER",
  "AUTH_AUDIENCE", "STRIPE_SECRET_KEY", "STRIPE_WEBHOOK_SECRET", "UPSTREAM_BASE_URL", "SEARCH_BASE_URL", "NODE_ENV"
]

const start = (dataDir: string, port: number) => {
  const env: NodeJS.ProcessEnv = { ...process.env }
  for (const name of CONFIG_VARIABLES) delete env[name]
  // Only the port and data folder differ from a bare `npm start`, so runs never collide.
  env["PORT"] = String(port)
  env["DATA_DIR"] = dataDir
  const child = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], { env, stdio: ["ignore", "pipe", "pipe"] })
  let output = ""
  child.stdout.on("data", (chunk) => (output += chunk))
  child.stderr.on("data", (chunk) => (output += chunk))
  return { child, output: () => output }
}

const waitForHealth = async (base: string, process: ReturnType<typeof start>) => {
  const deadline = Date.now() + 90_000
  while (Date.now() < deadline) {
    if (process.child.exitCode !== null) throw new Error(`service exited early:\n${process.output()}`)
    const ok = await fetch(`${base}/healthz`, { signal: AbortSignal.timeout(5_000) }).then((r) => r.status === 200, () => false)
    if (ok) return
    await new Promise((resolve) => setTimeout(resolve, 250))
  }
  throw new Error(`service did not become healthy:\n${process.output()}`)
}

const stop = (child: ChildProcess) =>
  new Promise<number | null>((resolve) => {
    if (child.exitCode !== null) return resolve(child.exitCode)
    child.once("exit", (code) => resolve(code))
    child.kill("SIGTERM")
  })

// arbitrary JSON: each check below names the fields it expects
const json = async (response: Response): Promise<{ status: number; body: any }> => ({
  status: response.status,
  body: await response.json()
})

describe("npm start with nothing configured", () => {
  const children: Array<ChildProcess> = []
  let dataDir = ""
  afterAll(async () => {
    for (const child of children) if (child.exitCode === null) child.kill("SIGKILL")
    if (dataDir !== "") await rm(dataDir, { recursive: true, force: true })
  })

  it("serves, keeps its data across restarts, stops its database on shutdown, and recovers from a kill", async () => {
    dataDir = await mkdtemp(join(tmpdir(), "nenas-start-"))
    const port = await freePort()
    const base = `http://127.0.0.1:${port}`

    const first = start(dataDir, port)
    children.push(first.child)
    await waitForHealth(base, first)
    expect((await json(await fetch(`${base}/readyz`))).body).toEqual({ status: "ok" })
    const pid = await readFile(join(dataDir, "pg", "postmaster.pid"), "utf8")
    const pgPort = Number(pid.split("\n")[3])
    expect(pgPort).toBeGreaterThan(0)
    expect(pgPort).not.toBe(5432)

    const session = await json(await fetch(`${base}/dev/session`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ email: "start@example.com" })
    }))
    expect(session.status).toBe(200)
    const auth = { authorization: `Bearer ${session.body.token}` }
    const created = await json(await fetch(`${base}/dashboard/api-keys`, {
      method: "POST",
      headers: { ...auth, "content-type": "application/json" },
      body: JSON.stringify({ name: "survives restarts" })
    }))
    expect(created.status).toBe(201)
    const models = await json(await fetch(`${base}/v1/models`, { headers: { authorization: `Bearer ${created.body.full_key}` } }))
    expect(models.body.data[0].id).toBe("svc/nenas-flash")

    expect(await stop(first.child)).toBe(0)
    // The embedded server removes its pid file when it has shut down.
    await expect(stat(join(dataDir, "pg", "postmaster.pid"))).rejects.toThrow()

    const second = start(dataDir, port)
    children.push(second.child)
    await waitForHealth(base, second)
    const listed = await json(await fetch(`${base}/dashboard/api-keys`, { headers: auth }))
    expect(listed.status).toBe(200)
    expect(listed.body.keys.map((k: { id: string }) => k.id)).toEqual([created.body.key.id])
    // Last use from before the restart was written at shutdown.
    expect(listed.body.keys[0].last_used_at).not.toBeNull()

    // Killed outright, the service leaves its PostgreSQL orphaned; the next start reclaims it.
    const killed = new Promise((resolve) => second.child.once("exit", resolve))
    second.child.kill("SIGKILL")
    await killed
    const third = start(dataDir, port)
    children.push(third.child)
    await waitForHealth(base, third)
    const relisted = await json(await fetch(`${base}/dashboard/api-keys`, { headers: auth }))
    expect(relisted.body.keys.map((k: { id: string }) => k.id)).toEqual([created.body.key.id])
    expect(await stop(third.child)).toBe(0)
    await expect(stat(join(dataDir, "pg", "postmaster.pid"))).rejects.toThrow()
  }, 240_000)
})
