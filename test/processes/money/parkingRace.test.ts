import { execFile } from "node:child_process"
import { resolve } from "node:path"
import { promisify } from "node:util"
import { describe, expect, it } from "vitest"
import { randomBase62 } from "../../../src/Domain/Ids.js"
import { fundedDeveloper } from "../../support/Fetch.js"
import { invariantViolations } from "../../support/Money.js"
import { processBed, sleep } from "../../support/ProcessBed.js"

/**
 * A settlement parked on one instance (the database keeps refusing it) while
 * the other settles the same account's calls (docs/money.md, "Parking and replay"): the parked
 * call's hold goes back to the wallet under the same lock the other instance's
 * flushes take, so the books balance throughout; replayed, it is billed once.
 */
const bed = processBed({ name: "parkrace", upstream: { record: false } })
const { db } = bed

const chat = async (baseUrl: string, apiKey: string, content: string) => {
  const reply = await fetch(`${baseUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({ model: "svc/nenas-flash", messages: [{ role: "user", content }], max_tokens: 500 }),
    signal: AbortSignal.timeout(60_000)
  })
  return { status: reply.status, requestId: reply.headers.get("x-request-id") ?? "" }
}

/** A prompt no other call sends: its token count marks its log row for the refusing rule. */
const MARKED = "Please answer this one marked question about durian season in Penang, kindly and in full detail."
const PLAIN = "Hi."

describe("parking beside another instance's settlements", { timeout: 180_000 }, () => {
  it("a call parked on one instance while the other settles the same account: the books balance, and the replay bills it once", async () => {
    const a = await bed.start({ INSTANCE_ID: "parkrace-a" })
    const b = await bed.start({ INSTANCE_ID: "parkrace-b" })
    const { apiKey } = await fundedDeveloper(
      a.baseUrl,
      `parkrace-${randomBase62(6)}@example.com`,
      50_000,
      "signed webhook"
    )
    bed.upstream.setBehaviour({ kind: "ok", delayMs: 10, usage: { completion_tokens: 200 } })

    // The marked call's input tokens, as its log row records them (the service counts them itself for the estimate).
    const probe = await chat(a.baseUrl, apiKey, MARKED)
    expect(probe.status).toBe(200)
    await sleep(300)
    const [marked] = await db<{ tokens: number; account: string }>(
      "SELECT input_tokens AS tokens, account_id AS account FROM request_logs WHERE request_id = $1",
      [probe.requestId]
    )
    const [plain] = [await chat(a.baseUrl, apiKey, PLAIN)]
    await sleep(300)
    const [plainRow] = await db<{ tokens: number }>(
      "SELECT input_tokens AS tokens FROM request_logs WHERE request_id = $1",
      [plain.requestId]
    )
    expect(marked?.tokens).toBeGreaterThan(0)
    expect(marked?.tokens).not.toBe(plainRow?.tokens)
    const accountId = marked?.account ?? ""

    // From now on, a finished row of the marked prompt breaks a rule of the table: its settlement can only be parked.
    await db(
      `ALTER TABLE request_logs ADD CONSTRAINT refuse_marked CHECK (input_tokens <> ${marked?.tokens} OR request_id = '${probe.requestId}' OR status = 'pending')`
    )
    let busy = true
    const answered: Array<string> = []
    const load = Promise.all([a, b].flatMap((instance) =>
      Array.from({ length: 6 }, async () => {
        while (busy) {
          const reply = await chat(instance.baseUrl, apiKey, PLAIN)
          expect(reply.status).toBe(200)
          answered.push(reply.requestId)
        }
      })
    ))
    await sleep(500)
    const parkedCall = await chat(a.baseUrl, apiKey, MARKED)
    expect(parkedCall.status).toBe(200)

    // Parked (in a second or two on a quiet machine), while both instances go on settling the account's other calls.
    let parked: Array<{ id: string; status: string }> = []
    for (let waited = 0; parked.length === 0 && waited < 600; waited++) {
      await sleep(100)
      parked = await db("SELECT id, status FROM settlement_parked WHERE request_id = $1", [parkedCall.requestId])
    }
    expect(parked).toMatchObject([{ status: "parked" }])
    // The books balance while both instances still settle the account's calls.
    for (let check = 0; check < 3; check++) expect(await invariantViolations(bed.databaseUrl, [accountId])).toEqual([])
    busy = false
    await load
    expect(answered.length).toBeGreaterThan(20)
    await sleep(500)
    expect(await invariantViolations(bed.databaseUrl, [accountId])).toEqual([])
    const [billed] = await db<{ n: number }>(
      "SELECT count(*)::int AS n FROM ledger_entries WHERE type = 'usage' AND request_id = ANY($1)",
      [answered]
    )
    expect(billed?.n, "every other call is billed once").toBe(answered.length)
    expect(await db("SELECT 1 FROM ledger_entries WHERE request_id = $1", [parkedCall.requestId])).toEqual([])

    // The cause fixed, the replay bills the parked call once; a second replay finds nothing.
    await db("ALTER TABLE request_logs DROP CONSTRAINT refuse_marked")
    const replay = () =>
      promisify(execFile)("node", ["--import", "tsx", "src/Wallet/Settlement/ReplayParked.ts"], {
        cwd: resolve(import.meta.dirname, "../../.."),
        env: { ...process.env, DATABASE_URL: bed.databaseUrl, LOG_FORMAT: "json" }
      })
    expect((await replay()).stdout).toContain("1 replayed, 0 still parked")
    expect((await replay()).stdout).toContain("0 replayed, 0 still parked")
    const entries = await db<{ n: number }>("SELECT count(*)::int AS n FROM ledger_entries WHERE request_id = $1", [
      parkedCall.requestId
    ])
    expect(entries[0]?.n).toBe(1)
    expect(await invariantViolations(bed.databaseUrl, [accountId])).toEqual([])
  })
})
