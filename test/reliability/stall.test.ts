import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { fetchJson } from "../support/Fetch.js"
import { type ServiceProcess, startService, stopService } from "../support/ServiceProcess.js"
import { SMOKE } from "../support/Smoke.js"

/**
 * Stall: while pathological requests are answered — a 1 MB
 * one-word prompt (quadratic to tokenize before the fix: a 100,000-letter
 * word blocked the event loop 10 s) and a JSON body nested 10,000 deep —
 * other requests keep answering. Measured against the real process, with a
 * generous bound; the figures are printed.
 */

const ROUNDS = SMOKE ? 2 : 5
/** Generous: an ordinary request answers in a few milliseconds; a stalled one took seconds. */
const BOUND_MS = 1_500

const percentile = (values: ReadonlyArray<number>, p: number) => {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))] ?? 0
}

describe("no request stalls the service", () => {
  let service: ServiceProcess | undefined
  let dataDir = ""
  afterAll(async () => {
    if (service !== undefined) await stopService(service, "SIGKILL")
    if (dataDir !== "") await rm(dataDir, { recursive: true, force: true })
  })

  it("a 1 MB one-word prompt and a 10,000-deep body are answered quickly, and /healthz keeps answering", async () => {
    dataDir = await mkdtemp(join(tmpdir(), "nenas-stall-"))
    service = await startService({ from: "npm start", env: { DATA_DIR: dataDir, LOG_FORMAT: "json" } })
    const base = service.baseUrl
    const post = async (path: string, json: unknown, token?: string) =>
      (await fetchJson(base, "POST", path, { json, token })).body
    const session = (await post("/dev/session", { email: "stall@example.com" })).token as string
    const testKey = (await post("/dashboard/api-keys", { name: "stall", environment: "test" }, session))
      .full_key as string
    // A live key with an empty wallet: the count runs before the balance is checked.
    const liveKey = (await post("/dashboard/api-keys", { name: "stall live" }, session)).full_key as string

    // Built before probing starts: the probe runs in this process too.
    const oneWord = JSON.stringify({ input: "a".repeat(1024 * 1024), max_output_tokens: 16 })
    const varied = Array.from(
      { length: 1024 * 1024 },
      (_, i) => "qwertyuiopasdfghjklzxcvbnm"[(i * 7919 + (i >> 5)) % 26]
    ).join("")
    const variedWord = JSON.stringify({ input: varied, max_output_tokens: 16 })
    const deepBody = `{"input":${"[".repeat(10_000)}${"]".repeat(10_000)}}`
    const probes: Array<number> = []
    let probing = true
    const probe = (async () => {
      while (probing) {
        const started = performance.now()
        await fetch(`${base}/healthz`)
        probes.push(performance.now() - started)
        await new Promise((resolve) => setTimeout(resolve, 10))
      }
    })()

    const timed = async (key: string, body: string) => {
      const started = performance.now()
      const response = await fetch(`${base}/v1/responses`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
        body,
        signal: AbortSignal.timeout(120_000)
      })
      await response.text()
      return { status: response.status, ms: performance.now() - started }
    }
    const results: Record<string, Array<{ status: number; ms: number }>> = {
      testKey: [],
      emptyWallet: [],
      varied: [],
      deep: []
    }
    for (let round = 0; round < ROUNDS; round++) {
      results["testKey"]?.push(await timed(testKey, oneWord))
      results["emptyWallet"]?.push(await timed(liveKey, oneWord))
      results["varied"]?.push(await timed(testKey, variedWord))
      results["deep"]?.push(await timed(testKey, deepBody))
    }
    probing = false
    await probe

    for (const [name, runs] of Object.entries(results)) {
      console.log(
        `${name}: statuses ${runs.map((r) => r.status).join(",")}; ms ${runs.map((r) => Math.round(r.ms)).join(", ")}`
      )
    }
    console.log(
      `/healthz during: ${probes.length} probes, p50 ${percentile(probes, 0.5).toFixed(1)} ms, p99 ${
        percentile(probes, 0.99).toFixed(1)
      } ms, max ${Math.max(...probes).toFixed(1)} ms`
    )

    for (const run of results["testKey"] ?? []) expect(run.status).toBe(200)
    for (const run of results["emptyWallet"] ?? []) expect(run.status).toBe(402)
    for (const run of results["deep"] ?? []) expect(run.status).toBe(400)
    for (const runs of Object.values(results)) for (const run of runs) expect(run.ms).toBeLessThan(BOUND_MS)
    // /healthz answered again and again while the big bodies ran (they take well under a second each now).
    expect(probes.length).toBeGreaterThanOrEqual(5)
    expect(Math.max(...probes)).toBeLessThan(BOUND_MS)
  }, 300_000)
})
