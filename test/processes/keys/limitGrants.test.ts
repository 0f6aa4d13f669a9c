import { describe, expect, it } from "vitest"
import { randomBase62 } from "../../../src/Domain/Ids.js"
import { fetchJson, fundedDeveloper } from "../../support/Fetch.js"
import { invariantViolations } from "../../support/Money.js"
import { processBed, sleep } from "../../support/ProcessBed.js"

/**
 * A monthly limit set on a key whose calls run on credit grants, held in
 * memory by two service processes (docs/money.md, "Spend limits and budgets"): the new limit
 * counts what those calls hold of the grants on both instances, so the next
 * call is refused, and none admitted after it runs past the limit.
 */
const bed = processBed({ name: "keylimit", upstream: { record: false } })
const { db } = bed
const start = (identity: string, publicBaseUrl?: string) =>
  bed.start({
    REDIS_URL: "redis://127.0.0.1:6379",
    INSTANCE_ID: identity,
    // Behind one load balancer both have one public address: the development sign-in's tokens serve on both.
    ...(publicBaseUrl === undefined ? {} : { PUBLIC_BASE_URL: publicBaseUrl, DASHBOARD_URL: `${publicBaseUrl}/app` })
  })

const REQUEST = {
  model: "svc/nenas-flash",
  messages: [{ role: "user", content: "Count the grant." }],
  max_tokens: 2_000
}

const chat = async (baseUrl: string, apiKey: string) => {
  const reply = await fetch(`${baseUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
    body: JSON.stringify(REQUEST),
    signal: AbortSignal.timeout(60_000)
  })
  const body = await reply.json() as { error?: { code: string; message: string } }
  return { status: reply.status, code: body.error?.code, message: body.error?.message }
}

const one = async <A>(text: string, values: Array<unknown>) => {
  const [row] = await db<A>(text, values)
  if (row === undefined) throw new Error(`no row: ${text}`)
  return row
}

describe("a monthly limit set while the key's calls run on credit grants", { timeout: 180_000 }, () => {
  it("counts their holds on both instances: the next call is refused, none runs past it, and the holds are gone once they end", async () => {
    const a = await start("keylimit-a")
    const b = await start("keylimit-b", a.baseUrl)
    const { apiKey, token } = await fundedDeveloper(
      a.baseUrl,
      `keylimit-${randomBase62(6)}@example.com`,
      50_000,
      "signed webhook"
    )
    const listed = await fetchJson(a.baseUrl, "GET", "/dashboard/api-keys", { token })
    const keyId = (listed.body.keys as Array<{ id: string }>)[0]?.id ?? ""

    // Busy on both instances: the account's calls come often enough for each to hold a grant.
    bed.upstream.setBehaviour({ kind: "ok", delayMs: 20, usage: { prompt_tokens: 20, completion_tokens: 400 } })
    let busy = true
    const load = Promise.all([a, b].flatMap((instance) =>
      Array.from({ length: 8 }, async () => {
        while (busy) expect((await chat(instance.baseUrl, apiKey)).status).toBe(200)
      })
    ))
    let holders = 0
    for (let waited = 0; holders < 2 && waited < 100; waited++) {
      await sleep(100)
      holders = (await one<{ n: number }>(
        "SELECT count(DISTINCT holder)::int AS n FROM credit_grants WHERE account_id = (SELECT account_id FROM api_keys WHERE id = $1)",
        [keyId]
      )).n
    }
    expect(holders, "both instances hold a grant for the account").toBe(2)

    busy = false
    await load
    // Now calls that take seconds, at once (a grant idle for seconds is handed back): they run on the grants.
    bed.upstream.setBehaviour({ kind: "ok", delayMs: 4_000, usage: { prompt_tokens: 20, completion_tokens: 400 } })
    const slow = [a, b].flatMap((instance) => Array.from({ length: 5 }, () => chat(instance.baseUrl, apiKey)))
    await sleep(500)
    const inFlight = await one<{ open: number }>(
      "SELECT count(*)::int AS open FROM reservations WHERE api_key_id = $1 AND status = 'open'",
      [keyId]
    )
    expect(inFlight.open, "the slow calls hold no reservation: they run on the grants").toBe(0)

    // The limit: what the ledger shows, plus room for one call's estimate, and not for what the calls in flight hold.
    const estimate = (await one<{ amount: string }>(
      "SELECT max(amount_micro_myr)::text AS amount FROM reservations WHERE api_key_id = $1",
      [keyId]
    )).amount
    const written = (await one<{ spent: string }>(
      "SELECT COALESCE(-SUM(amount_micro_myr), 0)::text AS spent FROM ledger_entries WHERE api_key_id = $1 AND type = 'usage'",
      [keyId]
    )).spent
    const limitMicro = Number(written) + Number(estimate) + 1_000
    const patched = await fetchJson(b.baseUrl, "PATCH", `/dashboard/api-keys/${keyId}`, {
      json: { monthly_spend_limit_myr: limitMicro / 1_000_000 },
      token
    })
    expect(patched.status).toBe(200)
    const patchedAt = Date.now()

    // Both instances wrote what the key's calls hold of their grants before the PATCH answered.
    const holds = await db<{ holder: string; amount: string }>(
      "SELECT holder, amount_micro_myr::text AS amount FROM key_grant_holds WHERE api_key_id = $1",
      [keyId]
    )
    expect(holds.length).toBe(2)
    const held = holds.reduce((sum, hold) => sum + Number(hold.amount), 0)
    expect(held).toBe(10 * Number(estimate))

    // The next call, on either instance, is refused: the ledger and the holds are past the limit with it.
    for (const instance of [a, b]) {
      const refused = await chat(instance.baseUrl, apiKey)
      expect(refused.status).toBe(402)
      expect(refused.code).toBe("spend_limit_exceeded")
      expect(refused.message).toContain("held for calls in flight")
    }
    expect(Date.now() - patchedAt, "the refusals came while the slow calls still ran").toBeLessThan(3_000)

    // The calls admitted before the limit finish and are billed; nothing admitted after it was billed.
    const finished = await Promise.all(slow)
    expect(finished.map((reply) => reply.status)).toEqual(Array(10).fill(200))
    const after = await one<{ n: number }>(
      "SELECT count(*)::int AS n FROM request_logs WHERE api_key_id = $1 AND status = 'billed' AND created_at > to_timestamp($2 / 1000.0)",
      [keyId, patchedAt]
    )
    expect(after.n).toBe(0)

    // Once the calls in flight are written, so are their holds: none is left.
    let left = -1
    for (let waited = 0; left !== 0 && waited < 50; waited++) {
      await sleep(100)
      left =
        (await one<{ n: number }>("SELECT count(*)::int AS n FROM key_grant_holds WHERE api_key_id = $1", [keyId])).n
    }
    expect(left).toBe(0)
    const account = await one<{ id: string }>("SELECT account_id AS id FROM api_keys WHERE id = $1", [keyId])
    expect(await invariantViolations(bed.databaseUrl, [account.id])).toEqual([])

    // The key list shows the month-to-date spend against the limit.
    const keys = await fetchJson(a.baseUrl, "GET", "/dashboard/api-keys", { token })
    const record = (keys.body.keys as Array<
      { id: string; month_to_date_spend_micro_myr: number; monthly_spend_limit_micro_myr: number }
    >)
      .find((key) => key.id === keyId)
    const spentNow = (await one<{ spent: string }>(
      "SELECT (-SUM(amount_micro_myr))::text AS spent FROM ledger_entries WHERE api_key_id = $1 AND type = 'usage'",
      [keyId]
    )).spent
    expect(record?.month_to_date_spend_micro_myr).toBe(Number(spentNow))
    expect(record?.monthly_spend_limit_micro_myr).toBe(limitMicro)
  })
})
