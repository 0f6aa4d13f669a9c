import { mkdtemp, rm, stat } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { DRAIN_DEADLINE_MS } from "../../src/Http/Shutdown.js"
import { fetchJson, fundedDeveloper } from "../support/Fetch.js"
import { type ServiceProcess, startService, stopService } from "../support/ServiceProcess.js"
import { SMOKE } from "../support/Smoke.js"
import { parseSse } from "../support/Sse.js"
import { startUpstream, type UpstreamServer } from "../support/Upstream.js"

/**
 * Graceful shutdown: SIGTERM to the process, SIGTERM to the whole
 * process group (node receives it twice: directly and forwarded by npm), and
 * Ctrl-C (SIGINT to the group, which would also reach the embedded
 * PostgreSQL). In-flight plain and streamed calls finish, are billed, and
 * the service exits 0 within the drain deadline; the embedded database is
 * stopped by the service after the drain.
 */

const CALLS = SMOKE ? 2 : 6
const UPSTREAM_DELAY_MS = 2_000
const TEXT = "Graceful shutdown lets every call in flight finish and bills it. ".repeat(4)

const cases = [
  { name: "SIGTERM to the node process", signal: "SIGTERM", group: false },
  { name: "SIGTERM to the process group (twice to node)", signal: "SIGTERM", group: true },
  { name: "SIGINT to the process group (Ctrl-C), embedded PostgreSQL included", signal: "SIGINT", group: true }
] as const

const plainCall = (base: string, key: string) =>
  fetch(`${base}/v1/responses`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({ input: "Say something about shutdowns.", max_output_tokens: 200 }),
    signal: AbortSignal.timeout(60_000)
  }).then(async (response) => ({ status: response.status, text: await response.text() }))

const streamedCall = (base: string, key: string) =>
  fetch(`${base}/v1/responses`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({ input: "Stream something about shutdowns.", stream: true, max_output_tokens: 200 }),
    signal: AbortSignal.timeout(60_000)
  }).then(async (response) => ({ status: response.status, text: await response.text() }))

/** The node process npm started (its child in the group), found with `ps`. */
const nodePidUnder = async (npmPid: number): Promise<number> => {
  const { execFile } = await import("node:child_process")
  const out = await new Promise<string>((resolve) =>
    execFile("ps", ["-o", "pid=,ppid=,comm=", "-g", String(npmPid)], (_, stdout) => resolve(stdout))
  )
  const node = out.split("\n").map((line) => line.trim().split(/\s+/)).find(([, ppid, comm]) =>
    ppid === String(npmPid) && comm === "node"
  )
  if (node?.[0] === undefined) throw new Error(`no node process under npm ${npmPid}:\n${out}`)
  return Number(node[0])
}

describe("graceful shutdown", () => {
  let upstream: UpstreamServer | undefined
  const services: Array<ServiceProcess> = []
  const dirs: Array<string> = []
  afterAll(async () => {
    for (const service of services) await stopService(service, "SIGKILL")
    await upstream?.close()
    for (const dir of dirs) await rm(dir, { recursive: true, force: true })
  })

  for (const { name, signal, group } of cases) {
    it(`${name}: in-flight calls finish and are billed, exit 0`, async () => {
      upstream ??= await startUpstream()
      upstream.setBehaviour({ kind: "ok", text: TEXT, delayMs: UPSTREAM_DELAY_MS, chunkDelayMs: 40 })
      const dataDir = await mkdtemp(join(tmpdir(), "nenas-shutdown-"))
      dirs.push(dataDir)
      // The embedded database (no DATABASE_URL), as `npm start` runs by default: Ctrl-C must not reach it.
      const env = {
        DATA_DIR: dataDir,
        UPSTREAM_BASE_URL: upstream.baseUrl,
        UPSTREAM_API_KEY: "sk-test",
        LOG_FORMAT: "json"
      }
      const service = await startService({ from: "npm start", env })
      services.push(service)
      const dev = await fundedDeveloper(
        service.baseUrl,
        `shutdown-${signal}-${group}@example.com`,
        10_000,
        "simulated checkout"
      )
      const before = upstream.requests.length
      const calls = [
        ...Array.from({ length: CALLS }, () => plainCall(service.baseUrl, dev.apiKey)),
        ...Array.from({ length: CALLS }, () => streamedCall(service.baseUrl, dev.apiKey))
      ]
      // Every call has reached the upstream (and holds its reservation) before the signal.
      while (upstream.requests.length - before < 2 * CALLS) await new Promise((resolve) => setTimeout(resolve, 20))
      const pid = service.child.pid ?? 0
      const signalledAt = Date.now()
      if (group) process.kill(-pid, signal)
      else process.kill(await nodePidUnder(pid), signal)
      const results = await Promise.all(calls)
      const { code } = await service.exited
      const stoppedIn = Date.now() - signalledAt
      console.log(
        `${name}: ${2 * CALLS} calls answered; exited ${code} after ${stoppedIn} ms (deadline ${DRAIN_DEADLINE_MS} ms)`
      )

      for (const result of results) expect(result.status, result.text.slice(0, 300)).toBe(200)
      for (const result of results.slice(CALLS)) {
        expect(parseSse(result.text).map((e) => e.event)).toContain("response.completed")
      }
      expect(code, service.output().slice(-3_000)).toBe(0)
      expect(stoppedIn).toBeLessThan(DRAIN_DEADLINE_MS + 15_000)
      // PostgreSQL stopped cleanly, by the service: a clean stop removes its pid file.
      await expect(stat(join(dataDir, "pg", "postmaster.pid"))).rejects.toThrow()

      // Started again on the same data: every call is billed, nothing is still held.
      const again = await startService({ from: "npm start", env })
      services.push(again)
      const session = await fetchJson(again.baseUrl, "POST", "/dev/session", {
        json: { email: `shutdown-${signal}-${group}@example.com` }
      })
      const logs = await fetchJson(again.baseUrl, "GET", "/dashboard/logs?limit=200", { token: session.body.token })
      expect(logs.body.logs).toHaveLength(2 * CALLS)
      for (const log of logs.body.logs) {
        expect(log.status).toBe("billed")
        expect(log.costMicroMyr).toBeGreaterThan(0)
      }
      const balance = await fetchJson(again.baseUrl, "GET", "/dashboard/billing/balance", { token: session.body.token })
      expect(balance.body.wallet.reservedMicroMyr).toBe(0)
      expect(balance.body.wallet.lifetimeSpendMicroMyr).toBe(
        logs.body.logs.reduce((sum: number, log: { costMicroMyr: number }) => sum + log.costMicroMyr, 0)
      )
      // SIGTERM to its process group.
      expect(await stopService(again)).toBe(0)
    }, 240_000)
  }
})
