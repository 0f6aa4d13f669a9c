import { describe, expect, it } from "vitest"
import { randomBase62 } from "../../../src/Domain/Ids.js"
import { fundedDeveloper } from "../../support/Fetch.js"
import { invariantViolations } from "../../support/Money.js"
import { processBed } from "../../support/ProcessBed.js"
import { stopService } from "../../support/ServiceProcess.js"

/**
 * Credit grants and batched settlement across two service processes on one
 * PostgreSQL database and one Redis (docs/money.md, "Credit grants"): no wallet is ever
 * overdrawn, a call refused on one instance while the other holds an unused
 * grant is decided again after the grant comes back, and a stopped instance
 * writes everything and hands its grants back.
 */
const bed = processBed({ name: "grants", upstream: { record: false } })
const { db } = bed
const start = (identity: string) => bed.start({ REDIS_URL: "redis://127.0.0.1:6379", INSTANCE_ID: identity })

const chat = async (baseUrl: string, apiKey: string) => {
  const reply = await fetch(`${baseUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({
      model: "svc/nenas-flash",
      messages: [{ role: "user", content: "Say hello to the grant." }],
      max_tokens: 30_000
    }),
    signal: AbortSignal.timeout(60_000)
  })
  const body = await reply.json() as { cost_myr?: string; error?: { code: string } }
  return { status: reply.status, requestId: reply.headers.get("x-request-id"), body }
}

const micro = (myr: string) => Math.round(Number(myr) * 1_000_000)

describe("credit grants on two instances", { timeout: 300_000 }, () => {
  it("200 concurrent calls across both on a wallet that affords K: exactly K billed, never an overdraft, the invariant holds throughout", async () => {
    // Usage above what each call reserves (input past it: output stops at the cap): every success is billed exactly its hold, so exactly K fit.
    const [a, b] = [await start("grants-a"), await start("grants-b")]
    const email = `grants-race-${randomBase62(6)}@example.com`
    const dev = await fundedDeveloper(a.baseUrl, email, 2_500, "signed webhook")
    const accountId =
      (await db<{ id: string }>("SELECT id FROM accounts WHERE lower(email) = lower($1)", [email]))[0]?.id ?? ""
    // A warm-up on both instances: the account calls often, so each instance takes a grant for it.
    bed.upstream.setBehaviour({ kind: "ok", delayMs: 20, usage: { prompt_tokens: 1_000_000 } })
    const warm = await Promise.all(
      Array.from({ length: 40 }, (_, i) => chat(i % 2 === 0 ? a.baseUrl : b.baseUrl, dev.apiKey))
    )
    for (const reply of warm) expect(reply.status).toBe(200)
    const hold = micro(warm[0]!.body.cost_myr!)
    const held = await db<{ n: number }>("SELECT count(*)::int AS n FROM credit_grants WHERE account_id = $1", [
      accountId
    ])
    expect(held[0]?.n, "both instances hold a grant for the account").toBe(2)
    const balance = 25_000_000 - warm.length * hold
    const k = Math.floor(balance / hold)
    expect(k, `K for a hold of ${hold}`).toBeGreaterThanOrEqual(40)
    expect(k).toBeLessThan(180)
    bed.upstream.setBehaviour({ kind: "ok", delayMs: 300, usage: { prompt_tokens: 1_000_000 } })

    // The invariant, sampled from a third connection all through the race.
    let sampling = true
    const sampled: Array<ReadonlyArray<string>> = []
    const sampler = (async () => {
      while (sampling) {
        sampled.push(await invariantViolations(bed.databaseUrl, [accountId]))
        const [wallet] = await db<{ available: string }>(
          "SELECT available_micro_myr AS available FROM wallets WHERE account_id = $1",
          [accountId]
        )
        if (Number(wallet?.available) < 0) sampled.push([`available ${wallet?.available} < 0`])
        await new Promise((resolve) => setTimeout(resolve, 20))
      }
    })()
    const replies = await Promise.all(
      Array.from({ length: 200 }, (_, i) => chat(i % 2 === 0 ? a.baseUrl : b.baseUrl, dev.apiKey))
    )
    sampling = false
    await sampler

    const ok = replies.filter((r) => r.status === 200)
    const refused = replies.filter((r) => r.status !== 200)
    for (const r of refused) expect(r.body.error?.code).toBe("insufficient_balance")
    for (const r of ok) expect(micro(r.body.cost_myr!)).toBe(hold)
    expect(ok.length, "exactly K: no call refused while money sat in a grant").toBe(k)
    expect(sampled.length).toBeGreaterThan(0)
    expect(sampled.flat(), "the invariant at every sample").toEqual([])

    // Calls of the race reserved from the grants (no reservation row) as well as one by one.
    const raced = await db<{ fromGrant: number; total: number }>(
      `SELECT count(*) FILTER (WHERE reservation_id IS NULL)::int AS "fromGrant", count(*)::int AS total
       FROM request_logs WHERE request_id = ANY($1) AND status = 'billed'`,
      [ok.map((r) => r.requestId)]
    )
    expect(raced[0]?.total).toBe(k)
    expect(raced[0]?.fromGrant, "some calls of the race were reserved from a credit grant").toBeGreaterThan(0)
    const [books] = await db<{ usage: number; spent: string; available: string; reserved: string }>(
      `SELECT (SELECT count(*)::int FROM ledger_entries WHERE account_id = $1 AND type = 'usage') AS usage,
              w.lifetime_spend_micro_myr AS spent, w.available_micro_myr + w.granted_micro_myr AS available,
              w.reserved_micro_myr AS reserved
       FROM wallets w WHERE w.account_id = $1`,
      [accountId]
    )
    expect(books?.usage).toBe(k + warm.length)
    expect(Number(books?.spent)).toBe((k + warm.length) * hold)
    expect(Number(books?.available)).toBe(balance - k * hold)
    expect(Number(books?.available)).toBeLessThan(hold)
    expect(Number(books?.reserved)).toBe(0)
    expect(await invariantViolations(bed.databaseUrl, [accountId])).toEqual([])

    // SIGTERM on one instance: it exits 0, every call it answered is written, and it holds no grant any more.
    bed.upstream.setBehaviour({ kind: "ok", delayMs: 20 })
    const busyEmail = `grants-term-${randomBase62(6)}@example.com`
    const busy = await fundedDeveloper(a.baseUrl, busyEmail, 10_000, "signed webhook")
    let running = true
    const answered: Array<string> = []
    const workers = Promise.all(Array.from({ length: 12 }, async () => {
      while (running) {
        const reply = await chat(a.baseUrl, busy.apiKey).catch(() => undefined)
        if (reply === undefined) return
        if (reply.status === 200 && reply.requestId !== null) answered.push(reply.requestId)
      }
    }))
    await new Promise((resolve) => setTimeout(resolve, 1_500))
    const grantsBefore = await db<{ n: number }>(
      "SELECT count(*)::int AS n FROM credit_grants WHERE holder IN (SELECT id FROM instances WHERE identity = 'grants-a')"
    )
    expect(grantsBefore[0]?.n, "under load, instance a holds a grant").toBeGreaterThan(0)
    expect(await stopService(a)).toBe(0)
    running = false
    await workers
    expect(answered.length).toBeGreaterThan(10)
    const written = await db<{ n: number }>(
      "SELECT count(*)::int AS n FROM request_logs WHERE request_id = ANY($1) AND status = 'billed'",
      [answered]
    )
    expect(written[0]?.n, "every call answered before the stop is billed").toBe(answered.length)
    const left = await db<{ grants: number; open: number }>(
      `SELECT (SELECT count(*)::int FROM credit_grants WHERE holder IN (SELECT id FROM instances WHERE identity = 'grants-a')) AS grants,
              (SELECT count(*)::int FROM reservations WHERE status = 'open') AS open`
    )
    expect(left[0]).toEqual({ grants: 0, open: 0 })
    const busyAccount = await db<{ id: string }>("SELECT id FROM accounts WHERE lower(email) = lower($1)", [busyEmail])
    expect(await invariantViolations(bed.databaseUrl, busyAccount.map((r) => r.id))).toEqual([])
    await stopService(b)
  })
})
