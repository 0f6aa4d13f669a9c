import { describe, expect, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import { grantGrowth } from "../../../src/Wallet/Grants/Grants.js"
import { call } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream, violations } from "../../support/Models.js"
import { TestServer, withClient } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * The wallet's side of a call through the whole service
 * (docs/money.md, "Credit grants"): credit grants stay invisible to developers,
 * every read after a call includes it without waiting, and a settlement the
 * database refused is written by a later flush — billed once, its hold never
 * left for the sweeper.
 */
const UNLIMITED = { rateLimitRpm: 100_000, rateLimitConcurrent: 1_000 }
const CHAT = "/v1/chat/completions"
const body = { model: "svc/nenas-flash", messages: [{ role: "user", content: "Hello, wallet." }], max_tokens: 300 }

/** The server's database through a client of the test's own: no flush first (unlike `query`). */
const raw = <A>(text: string, values: Array<unknown> = []) =>
  Effect.flatMap(
    TestServer,
    ({ databaseUrl }) =>
      Effect.promise(() =>
        withClient(databaseUrl, async (client) => (await client.query(text, values)).rows as Array<A>)
      )
  )

const micro = (myr: string) => Math.round(Number(myr) * 1_000_000)

describe("grant sizing", () => {
  const cases = [
    {
      name: "about two seconds of recent spend",
      input: { spendPerSecond: 100_000, estimate: 1_000, remaining: 0, heldMicroMyr: 0, availableMicroMyr: 10_000_000 },
      growth: 200_000
    },
    {
      name: "at least 16 calls like the last",
      input: { spendPerSecond: 1_000, estimate: 1_000, remaining: 0, heldMicroMyr: 0, availableMicroMyr: 10_000_000 },
      growth: 16_000
    },
    {
      name: "only what is missing from the target",
      input: {
        spendPerSecond: 100_000,
        estimate: 1_000,
        remaining: 150_000,
        heldMicroMyr: 150_000,
        availableMicroMyr: 10_000_000
      },
      growth: 50_000
    },
    {
      name: "never above a third of the wallet",
      input: {
        spendPerSecond: 10_000_000,
        estimate: 1_000,
        remaining: 0,
        heldMicroMyr: 0,
        availableMicroMyr: 3_000_000
      },
      growth: 1_000_000
    },
    {
      name: "what it already holds counts toward the third",
      input: {
        spendPerSecond: 10_000_000,
        estimate: 1_000,
        remaining: 0,
        heldMicroMyr: 900_000,
        availableMicroMyr: 2_100_000
      },
      growth: 100_000
    },
    {
      name: "none when it would cover fewer than 4 calls (a low wallet)",
      input: {
        spendPerSecond: 100_000,
        estimate: 100_000,
        remaining: 0,
        heldMicroMyr: 0,
        availableMicroMyr: 1_000_000
      },
      growth: 0
    },
    {
      name: "none for an empty wallet",
      input: { spendPerSecond: 100_000, estimate: 1_000, remaining: 0, heldMicroMyr: 0, availableMicroMyr: 0 },
      growth: 0
    }
  ]
  for (const c of cases) {
    it(c.name, () => expect(grantGrowth(c.input)).toBe(c.growth))
  }
})

layer(TestServerWithUpstream(UNLIMITED), { excludeTestServices: true })("spending", (it) => {
  it.effect("an account calling often runs on a credit grant it never sees: reserved 0 when idle, every read includes every call at once", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.setBehaviour({ kind: "ok", delayMs: 5 })
      const dev = yield* caller("spending-grant@example.com", { sen: 10_000 })
      const costs: Array<number> = []
      // 60 calls, 6 at a time: the account's pace asks for a grant after its first few.
      for (let round = 0; round < 10; round++) {
        const replies = yield* Effect.all(Array.from({ length: 6 }, () => modelCall(dev.apiKey, CHAT, body)), {
          concurrency: "unbounded"
        })
        for (const reply of replies) {
          expect(reply.status).toBe(200)
          costs.push(micro(reply.body.cost_myr))
        }
      }
      const spent = costs.reduce((a, b) => a + b, 0)
      // Read at once, through the instance that answered: no sleep.
      const balance = yield* call("GET", "/dashboard/billing/balance", { token: dev.token })
      expect(balance.body.wallet).toEqual({
        availableMicroMyr: 100_000_000 - spent,
        reservedMicroMyr: 0,
        lifetimeTopupMicroMyr: 100_000_000,
        lifetimeSpendMicroMyr: spent
      })
      const ledger = yield* call("GET", "/dashboard/billing/transactions?type=usage&limit=100", { token: dev.token })
      expect(ledger.body.ledger).toHaveLength(60)
      const logs = yield* call("GET", "/dashboard/logs?limit=100", { token: dev.token })
      expect(logs.body.logs.filter((log: { status: string }) => log.status === "billed")).toHaveLength(60)
      // The machinery is there all the same: a grant held by this instance, and calls that used it.
      const grants = yield* raw<{ amount: string }>(
        "SELECT amount_micro_myr AS amount FROM credit_grants WHERE account_id = $1",
        [dev.accountId]
      )
      expect(grants.length).toBe(1)
      expect(Number(grants[0]?.amount)).toBeGreaterThan(0)
      const fromGrant = yield* raw<{ n: number }>(
        "SELECT count(*)::int AS n FROM request_logs WHERE account_id = $1 AND reservation_id IS NULL AND status = 'billed'",
        [dev.accountId]
      )
      expect(fromGrant[0]?.n).toBeGreaterThan(0)
      expect(yield* violations(dev.accountId)).toEqual([])
    }))

  it.effect("a settlement the database refuses is retried by the next flush: the call answered at once, is billed once, and its hold does not wait for the sweeper", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.setBehaviour({ kind: "ok", delayMs: 5 })
      const dev = yield* caller("spending-retry@example.com", { sen: 1_000 })
      // The ledger refuses usage entries of this account, as a database failing mid-flush would.
      yield* raw(`
        CREATE FUNCTION refuse_usage() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'the ledger is down'; END $$
      `)
      yield* raw(`
        CREATE TRIGGER refuse_usage BEFORE INSERT ON ledger_entries
        FOR EACH ROW WHEN (NEW.type = 'usage' AND NEW.account_id = '${dev.accountId}') EXECUTE FUNCTION refuse_usage()
      `)
      const replies = yield* Effect.all(Array.from({ length: 3 }, () => modelCall(dev.apiKey, CHAT, body)), {
        concurrency: "unbounded"
      })
      for (const reply of replies) expect(reply.status, "the answer does not wait for the settlement").toBe(200)
      const costs = replies.map((reply) => micro(reply.body.cost_myr))
      // Several flushes fail meanwhile; nothing of these calls is written, their holds stay held.
      yield* Effect.sleep("300 millis")
      const during = yield* raw<{ entries: number; logs: number; held: string }>(
        `SELECT (SELECT count(*)::int FROM ledger_entries WHERE account_id = $1 AND type = 'usage') AS entries,
                (SELECT count(*)::int FROM request_logs WHERE account_id = $1 AND status = 'billed') AS logs,
                (SELECT reserved_micro_myr FROM wallets WHERE account_id = $1) AS held`,
        [dev.accountId]
      )
      expect(during[0]).toMatchObject({ entries: 0, logs: 0 })
      expect(Number(during[0]?.held)).toBeGreaterThan(0)

      yield* raw("DROP TRIGGER refuse_usage ON ledger_entries")
      // The next flush (at most a second of back-off away) writes them.
      const deadline = Date.now() + 3_000
      let entries: Array<{ amount: string }> = []
      while (Date.now() < deadline) {
        entries = yield* raw<{ amount: string }>(
          "SELECT -amount_micro_myr AS amount FROM ledger_entries WHERE account_id = $1 AND type = 'usage'",
          [dev.accountId]
        )
        if (entries.length === 3) break
        yield* Effect.sleep("50 millis")
      }
      expect(entries.map((e) => Number(e.amount)).sort()).toEqual([...costs].sort())
      const after = yield* raw<{ reserved: string; open: number }>(
        `SELECT reserved_micro_myr AS reserved,
                (SELECT count(*)::int FROM reservations WHERE account_id = $1 AND status = 'open') AS open
         FROM wallets WHERE account_id = $1`,
        [dev.accountId]
      )
      expect(after[0]).toEqual({ reserved: "0", open: 0 })
      const balance = yield* call("GET", "/dashboard/billing/balance", { token: dev.token })
      expect(balance.body.wallet.lifetimeSpendMicroMyr).toBe(costs.reduce((a, b) => a + b, 0))
      expect(yield* violations(dev.accountId)).toEqual([])
    }))
})
