import { describe, expect, it } from "vitest"
import { DRAIN_DEADLINE_MS } from "../../../src/Http/Shutdown.js"
import { fundedDeveloper } from "../../support/Fetch.js"
import { invariantViolations } from "../../support/Money.js"
import { processBed } from "../../support/ProcessBed.js"
import { stopService } from "../../support/ServiceProcess.js"

/**
 * SIGTERM while idempotent calls are in flight: they run
 * on fibers of their own, so that a client that gives up can retry and get
 * the answer. Shutdown waits for them (up to its deadline) before the
 * wallet's last flush: each is billed, and its answer kept for the retry —
 * those whose client went away and that outlive the server included. One
 * still running at the deadline is interrupted, and billed for what it sent.
 */
const bed = processBed({ name: "shutidem" })
const { db } = bed

const idempotentCall = (baseUrl: string, apiKey: string, key: string, signal: AbortSignal) =>
  fetch(`${baseUrl}/v1/responses`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}`, "idempotency-key": key },
    body: JSON.stringify({ model: "svc/nenas-flash", input: `Say something about ${key}.`, max_output_tokens: 200 }),
    signal
  }).then(
    async (response) => ({ status: response.status, text: await response.text() }),
    () => ({ status: 0, text: "cut" })
  )

const arrived = async (count: number) => {
  const deadline = Date.now() + 30_000
  while (bed.upstream.requests.length < count) {
    if (Date.now() > deadline) throw new Error(`${bed.upstream.requests.length} of ${count} calls reached the upstream`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

describe("SIGTERM with idempotent calls in flight", () => {
  it(
    "every one is billed and its answer kept, those whose client left and that outlive the server's close included; one still running at the deadline is cut then and billed for what it sent",
    async () => {
      const service = await bed.launch({ env: { ...bed.core(), LOG_FORMAT: "json" } })
      const dev = await fundedDeveloper(service.baseUrl, "shutdown-idempotent@example.com", 1_000, "simulated checkout")
      const [account] = await db<{ id: string }>(
        "SELECT id FROM accounts WHERE lower(email) = 'shutdown-idempotent@example.com'"
      )
      const accountId = account?.id ?? ""

      // One whose upstream never answers: shutdown stops waiting for it at the drain deadline, and it is billed for what it sent.
      bed.upstream.setBehaviour({ kind: "hang" })
      const gaveUp = new AbortController()
      const hanging = idempotentCall(service.baseUrl, dev.apiKey, "hangs", gaveUp.signal)
      await arrived(1)
      // Three calls whose clients give up; they run on, and answer 4 s after the others.
      bed.upstream.setBehaviour({ kind: "ok", text: "Left behind, but answered.", delayMs: 5_000 })
      const leaving = ["left-1", "left-2", "left-3"].map((key) =>
        idempotentCall(service.baseUrl, dev.apiKey, key, gaveUp.signal)
      )
      await arrived(4)
      gaveUp.abort()
      // Three whose clients wait.
      bed.upstream.setBehaviour({ kind: "ok", text: "Waited for, and answered.", delayMs: 1_000 })
      const waiting = ["wait-1", "wait-2", "wait-3"].map((key) =>
        idempotentCall(service.baseUrl, dev.apiKey, key, AbortSignal.timeout(60_000))
      )
      await arrived(7)

      const signalledAt = Date.now()
      process.kill(service.child.pid ?? 0, "SIGTERM")
      const answers = await Promise.all(waiting)
      const { code } = await service.exited
      const stoppedIn = Date.now() - signalledAt
      for (const left of await Promise.all([hanging, ...leaving])) expect(left.status).toBe(0)
      for (const answer of answers) expect(answer.status, answer.text.slice(0, 300)).toBe(200)
      expect(code, service.output().slice(-3_000)).toBe(0)
      // It waited for the hanging call until the deadline, not longer.
      expect(stoppedIn).toBeGreaterThanOrEqual(DRAIN_DEADLINE_MS - 1_000)
      expect(stoppedIn).toBeLessThan(DRAIN_DEADLINE_MS + 10_000)

      const logs = await db<{ status: string; cost: string; source: string; code: string | null }>(
        "SELECT status, cost_micro_myr AS cost, usage_source AS source, error_code AS code FROM request_logs WHERE account_id = $1",
        [accountId]
      )
      expect(logs).toHaveLength(7)
      for (const log of logs) {
        expect(log.status, `${JSON.stringify(log)}; stopped after ${stoppedIn} ms`).toBe("billed")
        expect(Number(log.cost)).toBeGreaterThan(0)
      }
      // The cut call is billed as counted (the prompt it sent); the answered ones as the upstream reported.
      expect(logs.filter((log) => log.source === "estimated")).toHaveLength(1)
      const records = await db<{ key: string; status: string; response_status: number | null }>(
        "SELECT idempotency_key AS key, status, response_status FROM idempotency_records ORDER BY idempotency_key"
      )
      // The cut call was billed for what it sent: its key keeps a non-retryable 504, so a retry never runs it again.
      expect(records.map((record) => [record.key, record.status, record.response_status])).toEqual([
        ["hangs", "completed", 504],
        ...["left-1", "left-2", "left-3", "wait-1", "wait-2", "wait-3"].map((key) => [key, "completed", 200])
      ])
      const [wallet] = await db<{ reserved: string; spent: string }>(
        "SELECT reserved_micro_myr AS reserved, lifetime_spend_micro_myr AS spent FROM wallets WHERE account_id = $1",
        [accountId]
      )
      expect(Number(wallet?.reserved)).toBe(0)
      expect(Number(wallet?.spent)).toBe(logs.reduce((sum, log) => sum + Number(log.cost), 0))
      expect(await invariantViolations(bed.databaseUrl, [accountId])).toEqual([])

      // Started again: a retry of a call whose client left gets its answer, and nothing runs again.
      const again = await bed.launch({ env: bed.core() })
      const before = bed.upstream.requests.length
      const retry = await idempotentCall(again.baseUrl, dev.apiKey, "left-2", AbortSignal.timeout(30_000))
      expect(retry.status, retry.text).toBe(200)
      expect(JSON.parse(retry.text).output_text).toBe("Left behind, but answered.")
      const cutRetry = await idempotentCall(again.baseUrl, dev.apiKey, "hangs", AbortSignal.timeout(30_000))
      expect(cutRetry.status, cutRetry.text).toBe(504)
      expect(JSON.parse(cutRetry.text).error).toMatchObject({ code: "provider_timeout", retryable: false })
      expect(bed.upstream.requests.length).toBe(before)
      expect(await stopService(again)).toBe(0)
    },
    180_000
  )
})
