import pg from "pg"
import { describe, expect, it } from "vitest"
import { randomBase62 } from "../../../src/Domain/Ids.js"
import { fundedDeveloper } from "../../support/Fetch.js"
import { invariantViolations } from "../../support/Money.js"
import { processBed, sleep } from "../../support/ProcessBed.js"
import { linesOf, stopService } from "../../support/ServiceProcess.js"
import { withClient } from "../../support/TestServer.js"

/**
 * Fencing (docs/money.md, "Faults"), on the service in child processes: an
 * instance whose own heartbeat is blocked (its `instances` row locked by the
 * test, so its beat waits) lends nothing from its grants and declares no peer
 * dead, and does both again once it beats; a second process started with the
 * `INSTANCE_ID` of a live one refuses to start, naming the conflict in one
 * line, while the identity of a killed one can be taken at once.
 */
const bed = processBed({
  name: "fence",
  upstream: { record: false },
  setup: ({ upstream }) => upstream.setBehaviour({ kind: "ok", delayMs: 20 })
})
const { db } = bed
const start = (identity: string) => bed.start({ INSTANCE_ID: identity })

/** The live process of `identity`: its id in `instances`. */
const holderOf = async (identity: string) =>
  (await db<{ id: string }>(
    "SELECT id FROM instances WHERE identity = $1 AND heartbeat_at > '-infinity' ORDER BY started_at DESC LIMIT 1",
    [identity]
  ))[0]?.id ?? ""

interface Called {
  readonly status: number
  readonly requestId: string
  readonly startedAt: number
  readonly endedAt: number
}

const chat = async (baseUrl: string, apiKey: string): Promise<Called> => {
  const startedAt = Date.now()
  const reply = await fetch(`${baseUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({
      model: "svc/nenas-flash",
      messages: [{ role: "user", content: "Say hello to the fence." }],
      max_tokens: 200
    }),
    signal: AbortSignal.timeout(60_000)
  })
  await reply.text()
  return { status: reply.status, requestId: reply.headers.get("x-request-id") ?? "", startedAt, endedAt: Date.now() }
}

/** Calls on `baseUrl` from a few workers, about 20 a second together, until `stop.done`: an account that calls often. */
const trickle = (baseUrl: string, apiKey: string, stop: { done: boolean }) =>
  Promise.all(Array.from({ length: 3 }, async () => {
    const calls: Array<Called> = []
    while (!stop.done) {
      calls.push(await chat(baseUrl, apiKey))
      await sleep(100)
    }
    return calls
  })).then((all) => all.flat())

/** The calls among `ids` that held their money in a reservation row of their own (not lent from a grant). */
const reserved = async (ids: ReadonlyArray<string>) =>
  new Set(
    (await db<{ request_id: string }>("SELECT request_id FROM reservations WHERE request_id = ANY($1)", [ids])).map((
      r
    ) => r.request_id)
  )

const waitFor = async (what: string, check: () => Promise<boolean>, timeoutMs: number) => {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (await check()) return
    await sleep(100)
  }
  throw new Error(`${what}: not within ${timeoutMs} ms`)
}

describe("fencing", { timeout: 180_000 }, () => {
  it("a paused heartbeat: no lending from grants and no peer declared dead; both again once it beats", async () => {
    const a = await start("fence-a")
    const email = `fence-pause-${randomBase62(6)}@example.com`
    const dev = await fundedDeveloper(a.baseUrl, email, 10_000, "signed webhook")
    const accountId =
      (await db<{ id: string }>("SELECT id FROM accounts WHERE lower(email) = lower($1)", [email]))[0]?.id ?? ""
    const holder = await holderOf("fence-a")

    const stop = { done: false }
    const running = trickle(a.baseUrl, dev.apiKey, stop)
    await waitFor(
      "the instance takes a credit grant for an account that calls often",
      async () => (await db("SELECT 1 FROM credit_grants WHERE holder = $1", [holder])).length > 0,
      20_000
    )
    const grantAt = Date.now()
    await sleep(1_000)

    // The beat waits for this lock: to the instance, the database stopped taking its beats.
    const blocker = new pg.Client({ connectionString: bed.databaseUrl })
    await blocker.connect()
    await blocker.query("BEGIN")
    await blocker.query("SELECT 1 FROM instances WHERE id = $1 FOR UPDATE", [holder])
    const pausedAt = Date.now()
    let peerReservation = ""
    try {
      // Its last beat was sent before the lock: 3 s later it is stale, whatever its timers say.
      await sleep(3_500)
      // A peer dead for a minute, still holding a reservation (the wallet's columns moved as a reservation moves them).
      const peer = `ins_deadpeer${randomBase62(6)}`
      peerReservation = `rsv_deadpeer${randomBase62(6)}`
      await db(
        "INSERT INTO instances (id, identity, started_at, heartbeat_at) VALUES ($1, $1, now() - interval '2 minutes', now() - interval '1 minute')",
        [peer]
      )
      await withClient(bed.databaseUrl, async (client) => {
        await client.query("BEGIN")
        await client.query(
          "UPDATE wallets SET available_micro_myr = available_micro_myr - 1000, reserved_micro_myr = reserved_micro_myr + 1000 WHERE account_id = $1",
          [accountId]
        )
        await client.query(
          `INSERT INTO reservations (id, account_id, api_key_id, request_id, amount_micro_myr, status, expires_at, holder)
           SELECT $1, $2, id, 'req_deadpeer', 1000, 'open', now() + interval '1 hour', $3 FROM api_keys WHERE account_id = $2 LIMIT 1`,
          [peerReservation, accountId, peer]
        )
        await client.query("COMMIT")
      })
      const checkFrom = Date.now()
      // Three of the instance's sweeps (2 s apart) while it is stale.
      await sleep(6_000)
      const status = await db<{ status: string }>("SELECT status FROM reservations WHERE id = $1", [peerReservation])
      expect.soft(status[0]?.status, "a sweeper whose own beat is stale declares nobody dead").toBe("open")
      stop.done = true
      const calls = await running
      const whileStale = calls.filter((c) => c.startedAt >= checkFrom && c.endedAt < Date.now())
      expect(whileStale.length, "calls made while the beat was paused").toBeGreaterThan(10)
      for (const c of whileStale) expect(c.status).toBe(200)
      const heldInRows = await reserved(whileStale.map((c) => c.requestId))
      const lent = whileStale.filter((c) => !heldInRows.has(c.requestId))
      expect(
        lent.map((c) => `${c.requestId} at +${c.startedAt - pausedAt} ms`),
        "calls lent from a grant while the beat was stale"
      ).toEqual([])
      const before = calls.filter((c) => c.startedAt > grantAt && c.endedAt < pausedAt)
      expect((await reserved(before.map((c) => c.requestId))).size, "before the pause, calls were lent from the grant")
        .toBeLessThan(before.length)
    } finally {
      stop.done = true
      await blocker.query("ROLLBACK").catch(() => undefined)
      await blocker.end()
    }
    await running

    // Beating again: the dead peer's reservation is released (the sweeper first waits out a dead mark of fresh beats)...
    await waitFor(
      "the dead peer's reservation released once the sweeper beats again",
      async () =>
        (await db<{ status: string }>("SELECT status FROM reservations WHERE id = $1", [peerReservation]))[0]
          ?.status === "released",
      20_000
    )
    // ... and calls are lent from a grant again.
    const again = { done: false }
    const resumed = trickle(a.baseUrl, dev.apiKey, again)
    await sleep(4_000)
    again.done = true
    const after = (await resumed).filter((c) => c.status === 200)
    expect((await reserved(after.map((c) => c.requestId))).size, "lending from grants resumed").toBeLessThan(
      after.length
    )
    await sleep(500)
    expect(await invariantViolations(bed.databaseUrl, [accountId])).toEqual([])
  })

  it("a second process with the INSTANCE_ID of a live one refuses to start and names it; a killed one's identity is free", async () => {
    const a = bed.services.find((s) => s.child.exitCode === null) ?? await start("fence-a")
    const holder = await holderOf("fence-a")
    const twin = await bed.launch({ env: bed.env({ INSTANCE_ID: "fence-a" }), until: "spawned" })
    const exit = await Promise.race([twin.closed, sleep(30_000).then(() => ({ code: "still running after 30 s" }))])
    expect(exit.code, twin.output()).not.toBe(0)
    expect(exit.code, twin.output()).not.toBeNull()
    const named = linesOf(twin.output()).filter((line) => line.includes("INSTANCE_ID"))
    expect(named, twin.output()).toEqual([
      expect.stringMatching(/^nenas: INSTANCE_ID "fence-a" is in use by a live process \(ins_\w+/)
    ])
    // The live one was left alone: still registered, alive, and serving.
    const row = await db<{ alive: boolean }>(
      "SELECT heartbeat_at > now() - interval '3 seconds' AS alive FROM instances WHERE id = $1",
      [holder]
    )
    expect(row[0]?.alive).toBe(true)
    expect((await fetch(`${a.baseUrl}/readyz`)).status).toBe(200)

    // A SIGKILL'd process stops beating: its identity is taken by the next start, and what it held released at once.
    await stopService(a, "SIGKILL")
    const successor = await start("fence-a")
    expect((await fetch(`${successor.baseUrl}/readyz`)).status).toBe(200)
    expect(await holderOf("fence-a")).not.toBe(holder)
  })
})
