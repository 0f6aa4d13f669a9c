import { describe, expect, it, layer } from "@effect/vitest"
import { Context, Effect, Fiber, Layer, Option } from "effect"
import { newId } from "../../../src/Domain/Ids.js"
import { microMyr } from "../../../src/Domain/Money.js"
import { KeyCache } from "../../../src/Keys/KeyCache.js"
import type { ReserveInput } from "../../../src/Wallet/Reserve.js"
import { Spending } from "../../../src/Wallet/Spending.js"
import {
  isLimited,
  keyLimitRefusal,
  MEMBER_BUDGET_GUIDANCE,
  memberBudgetRefusal
} from "../../../src/Wallet/SpendLimits.js"
import { call, createKey, type Reply } from "../../support/Http.js"
import { modelCall, violations } from "../../support/Models.js"
import { topUp } from "../../support/Stripe.js"
import { query, TestServer } from "../../support/TestServer.js"
import {
  bothListening,
  DEADLINE_MS,
  Instances,
  on,
  outcome,
  seenWithin,
  twoInstances
} from "../../support/TwoInstances.js"
import { Upstream } from "../../support/Upstream.js"
import { developer, walletInstance } from "../../support/Wallet.js"

/**
 * Member budgets (docs/api/teams.md, "Teams"): a member's
 * `monthly_spend_limit_micro_myr` caps what all its keys spend this month
 * together, checked as a key's own limit is (holds in flight and grants
 * counted, on every instance within a second), deleted keys' spend included.
 * Members are made here in SQL: the members endpoints are tested with them.
 */

describe("member budget decisions", () => {
  const month = { spent: 3_000_000, held: 1_000_000 }
  const cases = [
    { name: "room for the call", budget: 5_000_000, amount: 1_000_000, refused: false },
    { name: "exactly the budget", budget: 5_000_000, amount: 1_000_000, refused: false },
    { name: "one micro-MYR over", budget: 4_999_999, amount: 1_000_000, refused: true },
    { name: "a budget of 0", budget: 0, amount: 1, refused: true }
  ]
  for (const c of cases) {
    it(`${c.name}: ${c.refused ? "refused" : "admitted"}, by the member's wording and the key's`, () => {
      const member = memberBudgetRefusal(c.budget, month, microMyr(c.amount))
      const key = keyLimitRefusal(c.budget, month, microMyr(c.amount))
      expect(member !== undefined).toBe(c.refused)
      expect(key !== undefined).toBe(c.refused)
    })
  }

  it("the member's refusal names the budget, what the keys spent and hold, and who can raise it", () => {
    const refused = memberBudgetRefusal(4_000_000, month, microMyr(250_000))
    expect(refused?.message).toBe(
      "Your monthly budget in this account is RM 4.000000; your keys have spent RM 3.000000 this month, RM 1.000000 is held for calls in flight, and this request may cost up to RM 0.250000."
    )
    expect(refused?.guidance).toBe(MEMBER_BUDGET_GUIDANCE)
    expect(refused?.guidance).toContain("PATCH /dashboard/members/{id}")
    // The key's own limit keeps its own wording and its code's guidance (raise the key's limit).
    expect(keyLimitRefusal(4_000_000, month, microMyr(250_000))?.message).toMatch(
      /^This key's monthly spend limit is RM 4\.000000/
    )
  })

  it("a call under its key's limit or its member's budget is limited: it never lends from a grant", () => {
    const input = (monthly: number | null, member: number | null): ReserveInput => ({
      accountId: "acc_1",
      apiKeyId: "key_1",
      requestId: "req_1",
      amountMicroMyr: microMyr(1),
      monthlySpendLimitMicroMyr: monthly,
      memberId: "mem_1",
      memberMonthlySpendLimitMicroMyr: member
    })
    expect([input(null, null), input(5, null), input(null, 5), input(0, 0)].map(isLimited)).toEqual([
      false,
      true,
      true,
      true
    ])
  })
})

/** The two instances' `Spending`, as the members handler reaches it. */
class Spendings extends Context.Tag("test/Spendings")<Spendings, {
  readonly a: Spending["Type"]
  readonly b: Spending["Type"]
}>() {}

/** Two whole services in this process on one database, their live calls answered by the upstream double. */
const MemberInstancesLive = Layer.scopedContext(Effect.gen(function*() {
  const upstream = yield* Upstream
  const { a, b, clock, database, first, second, settled } = yield* twoInstances("members", {
    upstreamBaseUrl: Option.some(upstream.baseUrl),
    rateLimitRpm: 100_000,
    rateLimitConcurrent: 1_000,
    ipDevSessionsPerMinute: 1_000_000
  })
  const spendings = { a: Context.get(first, Spending), b: Context.get(second, Spending) }
  const listening = Effect.map(
    Effect.all([Context.get(first, KeyCache).listening, Context.get(second, KeyCache).listening]),
    (both) => both.every(Boolean)
  )
  return Context.make(Spendings, spendings).pipe(
    Context.add(Instances, { a, b, listening }),
    Context.add(TestServer, { baseUrl: a, databaseUrl: database.url, clock, settled })
  )
})).pipe(Layer.provideMerge(Upstream.layer))

const CHAT = "/v1/chat/completions"
const MAX_TOKENS = 2_000
const BODY = {
  model: "svc/nenas-flash",
  messages: [{ role: "user", content: "Count the budget." }],
  max_tokens: MAX_TOKENS
}
/** Usage near the estimate: each call costs about what it holds, so the budget, not the estimate's margin, decides. */
const NEAR_ESTIMATE = { prompt_tokens: 20, completion_tokens: MAX_TOKENS }

const chat = (apiKey: string) => modelCall(apiKey, CHAT, BODY)
const micro = (myr: string) => Math.round(Number(myr) * 1_000_000)

/** An account's owner, its wallet topped up with `sen`, and a second member (a developer) with `budget`. */
const team = (email: string, sen: number, budget: number | null) =>
  Effect.gen(function*() {
    const { accountId, token } = yield* developer(email)
    yield* topUp(token, sen)
    const memberId = newId("mem")
    yield* query(
      `INSERT INTO members (id, account_id, issuer, subject, email, role, monthly_spend_limit_micro_myr)
       VALUES ($1, $2, 'test', $3, $4, 'developer', $5)`,
      [memberId, accountId, newId("sub"), `dev-${email}`, budget]
    )
    return { accountId, token, memberId }
  })

/** A live key of the account made by its owner, then given to `memberId` (as if that member had made it). */
const keyOf = (token: string, memberId: string | null, name: string) =>
  Effect.gen(function*() {
    const created = yield* createKey(token, { name, environment: "live" })
    if (memberId !== null) yield* query("UPDATE api_keys SET member_id = $1 WHERE id = $2", [memberId, created.key.id])
    return { id: created.key.id, apiKey: created.full_key }
  })

const setBudget = (memberId: string, budget: number | null) =>
  query("UPDATE members SET monthly_spend_limit_micro_myr = $1 WHERE id = $2", [budget, memberId])

/** The budget set, and heard: the change's announcement (within milliseconds) made every instance forget the member's keys. */
const budgetHeard = (memberId: string, budget: number | null) =>
  Effect.zipRight(setBudget(memberId, budget), Effect.sleep("200 millis"))

/** What the keys spent this month, as written in the ledger. */
const spentBy = (keyIds: ReadonlyArray<string>) =>
  Effect.map(
    query<{ spent: string }>(
      "SELECT COALESCE(-SUM(amount_micro_myr), 0)::text AS spent FROM ledger_entries WHERE api_key_id = ANY($1) AND type = 'usage'",
      [keyIds]
    ),
    (rows) => Number(rows[0]?.spent ?? 0)
  )

/** The largest reservation a key's calls took: one call's estimate of `BODY`. */
const estimateOf = (keyId: string) =>
  Effect.map(
    query<{ amount: string | null }>(
      "SELECT max(amount_micro_myr)::text AS amount FROM reservations WHERE api_key_id = $1",
      [keyId]
    ),
    (rows) => Number(rows[0]?.amount ?? 0)
  )

/** How many instances hold a grant for the account, once `wanted` do (or after 10 s). */
const grantHolders = (accountId: string, wanted: number) =>
  Effect.gen(function*() {
    let holders = 0
    for (let waited = 0; holders < wanted && waited < 100; waited++) {
      yield* Effect.sleep("100 millis")
      const rows = yield* query<{ n: number }>(
        "SELECT count(DISTINCT holder)::int AS n FROM credit_grants WHERE account_id = $1",
        [accountId]
      )
      holders = rows[0]?.n ?? 0
    }
    return holders
  })

const expectMemberRefusal = (reply: Reply) => {
  expect(reply.status).toBe(402)
  expect(reply.body.error.code).toBe("spend_limit_exceeded")
  expect(reply.body.error.message).toMatch(
    /^Your monthly budget in this account is RM \d+\.\d{6}; your keys have spent RM/
  )
  expect(reply.body.error.guidance).toBe(MEMBER_BUDGET_GUIDANCE)
  return reply.body.error.message as string
}

layer(MemberInstancesLive, { excludeTestServices: true, timeout: 180_000 })("member budgets", (it) => {
  it.scoped("the wallet counts all the member's keys, spent and held, and not another member's", () =>
    Effect.gen(function*() {
      const { a } = yield* Instances
      // The repository apart from the instances' calls: holds taken and captured by hand.
      const { invariant, wallet: repo } = yield* walletInstance(yield* Effect.scope)
      const { accountId, memberId, token } = yield* on(a)(team("mb-wallet@example.com", 1_000, 10_000))
      const devOne = yield* on(a)(keyOf(token, memberId, "dev one"))
      const devTwo = yield* on(a)(keyOf(token, memberId, "dev two"))
      const owners = yield* on(a)(keyOf(token, null, "owner's"))
      const [owner] = yield* query<{ memberId: string }>(`SELECT member_id AS "memberId" FROM api_keys WHERE id = $1`, [
        owners.id
      ])
      expect(owner?.memberId).not.toBe(memberId)
      const hold = (apiKeyId: string, member: string, amount: number) =>
        repo.reserve({
          accountId,
          apiKeyId,
          requestId: newId("req"),
          amountMicroMyr: microMyr(amount),
          monthlySpendLimitMicroMyr: null,
          memberId: member,
          memberMonthlySpendLimitMicroMyr: member === memberId ? 10_000 : null
        })
      const first = yield* hold(devOne.id, memberId, 4_000)
      yield* repo.capture(first.id, microMyr(3_000), "call")
      yield* hold(devTwo.id, memberId, 4_000)
      // Spent 3000 by one key, 4000 held by the other: 3000 more fits, 3001 does not.
      const over = yield* Effect.flip(hold(devTwo.id, memberId, 3_001))
      expect(over._tag).toBe("SpendLimitExceeded")
      expect(over.message).toContain("your keys have spent RM 0.003000 this month, RM 0.004000 is held")
      yield* hold(devOne.id, memberId, 3_000)
      // Another member's key is not under this budget, nor counted in it.
      yield* hold(owners.id, owner?.memberId ?? "", 20_000)
      const full = yield* Effect.flip(hold(devTwo.id, memberId, 1))
      expect(full.message).toContain("your keys have spent RM 0.003000 this month, RM 0.007000 is held")
      expect(yield* repo.spentThisMonthByMember(accountId)).toEqual(new Map([[memberId, 3_000]]))
      expect((yield* invariant(accountId)).violations).toEqual([])
    }))

  it.effect("two keys' spend reaching the member's budget refuses both keys; another member's key in the account still works", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.setBehaviour({ kind: "ok", delayMs: 5, usage: NEAR_ESTIMATE })
      const { a } = yield* Instances
      const { memberId, token } = yield* on(a)(team("mb-reach@example.com", 1_000, null))
      const first = yield* on(a)(keyOf(token, memberId, "dev one"))
      const second = yield* on(a)(keyOf(token, memberId, "dev two"))
      const owners = yield* on(a)(keyOf(token, null, "owner's"))
      expect((yield* on(a)(chat(first.apiKey))).status).toBe(200)
      expect((yield* on(a)(chat(second.apiKey))).status).toBe(200)
      const spent = yield* spentBy([first.id, second.id])
      const estimate = yield* estimateOf(first.id)
      expect(spent).toBeGreaterThan(0)
      expect(estimate).toBeGreaterThan(0)

      // One micro-MYR short of another call, for either key.
      yield* budgetHeard(memberId, spent + estimate - 1)
      expectMemberRefusal(yield* on(a)(chat(first.apiKey)))
      const refused = yield* on(a)(chat(second.apiKey))
      const message = expectMemberRefusal(refused)
      expect(message).toContain(`your keys have spent RM ${(spent / 1e6).toFixed(6)} this month, RM 0.000000 is held`)
      expect(refused.body.error.action_url).toBe(`${a}/app/members`)
      expect((yield* on(a)(chat(owners.apiKey))).status, "the owner's key is under no budget").toBe(200)

      // Exactly one more call's room: one call of either key, then neither.
      yield* budgetHeard(memberId, spent + estimate)
      expect((yield* on(a)(chat(second.apiKey))).status).toBe(200)
      expectMemberRefusal(yield* on(a)(chat(first.apiKey)))
      expectMemberRefusal(yield* on(a)(chat(second.apiKey)))
      expect(yield* spentBy([first.id, second.id])).toBeLessThanOrEqual(spent + estimate)

      // A member's budget is not the key's limit: no key.limit_reached for it.
      const announced = yield* query<{ n: number }>(
        "SELECT count(*)::int AS n FROM api_keys WHERE id = ANY($1) AND limit_announced_month IS NOT NULL",
        [[first.id, second.id]]
      )
      expect(announced[0]?.n).toBe(0)
      const logged = yield* query<{ n: number }>(
        "SELECT count(*)::int AS n FROM request_logs WHERE api_key_id = ANY($1) AND status = 'failed' AND error_code = 'spend_limit_exceeded'",
        [[first.id, second.id]]
      )
      expect(logged[0]?.n).toBe(4)
    }))

  it.effect("concurrent calls of the member's keys on two instances never spend past its budget; the owner's key runs on grants", () =>
    Effect.gen(function*() {
      yield* bothListening
      const upstream = yield* Upstream
      upstream.setBehaviour({ kind: "ok", delayMs: 30, usage: NEAR_ESTIMATE })
      const { a, b } = yield* Instances
      const { accountId, memberId, token } = yield* on(a)(team("mb-race@example.com", 50_000, null))
      const owners = yield* on(a)(keyOf(token, null, "owner's"))
      // One call of the owner's key, alone: its reservation is one call's estimate.
      expect((yield* on(a)(chat(owners.apiKey))).status).toBe(200)
      const estimate = yield* estimateOf(owners.id)
      const budget = Math.floor(6.5 * estimate)
      yield* setBudget(memberId, budget)
      const keys = [yield* on(a)(keyOf(token, memberId, "dev a")), yield* on(b)(keyOf(token, memberId, "dev b"))]
      const memberKeyIds = keys.map((key) => key.id)

      // The owner's key keeps both instances busy: each holds a grant for the account while the member's keys race on both.
      let busy = true
      const ownerLoad = yield* Effect.all(
        [a, b].flatMap((base) =>
          Array.from({ length: 6 }, () =>
            Effect.gen(function*() {
              while (busy) expect((yield* on(base)(chat(owners.apiKey))).status).toBe(200)
            }))
        ),
        { concurrency: "unbounded" }
      ).pipe(Effect.fork)
      expect(yield* grantHolders(accountId, 2), "both instances hold a grant for the account").toBe(2)
      const replies = yield* Effect.all(
        [a, b].flatMap((base) =>
          keys.flatMap((key) =>
            Array.from({ length: 4 }, () => Effect.forEach(Array.from({ length: 4 }), () => on(base)(chat(key.apiKey))))
          )
        ),
        { concurrency: "unbounded" }
      ).pipe(Effect.ensuring(Effect.sync(() => void (busy = false))))
      yield* Fiber.join(ownerLoad)

      const outcomes = replies.flat().map(outcome)
      expect(new Set(outcomes)).toEqual(new Set(["200", "spend_limit_exceeded"]))
      const admitted = outcomes.filter((o) => o === "200").length
      expect(admitted).toBeGreaterThanOrEqual(5)
      expect(admitted).toBeLessThanOrEqual(6)
      const spent = yield* spentBy(memberKeyIds)
      expect(spent, "the member's keys together never pass the budget").toBeLessThanOrEqual(budget)
      const charged = replies.flat().filter((reply) => reply.status === 200).reduce(
        (sum, reply) => sum + micro(reply.body.cost_myr),
        0
      )
      expect(charged).toBe(spent)
      // The member's calls never ran on a grant; the owner's did.
      const onGrants = yield* query<{ member: number; owner: number }>(
        `SELECT count(*) FILTER (WHERE api_key_id = ANY($1))::int AS member, count(*) FILTER (WHERE api_key_id = $2)::int AS owner
         FROM request_logs WHERE account_id = $3 AND status = 'billed' AND reservation_id IS NULL`,
        [memberKeyIds, owners.id, accountId]
      )
      expect(onGrants[0]?.member).toBe(0)
      expect(onGrants[0]?.owner).toBeGreaterThan(0)
      expect((yield* (yield* Spendings).b.spentThisMonthByMember(accountId)).get(memberId)).toBe(spent)
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.effect("a budget lowered below what the member's calls on grants hold refuses its keys on both instances at once; those calls finish and are billed", () =>
    Effect.gen(function*() {
      yield* bothListening
      const upstream = yield* Upstream
      const { a, b } = yield* Instances
      const spendings = yield* Spendings
      const { accountId, memberId, token } = yield* on(a)(team("mb-lower@example.com", 50_000, null))
      const busyKey = yield* on(a)(keyOf(token, memberId, "dev busy"))
      const idleKey = yield* on(a)(keyOf(token, memberId, "dev idle"))
      const memberKeyIds = [busyKey.id, idleKey.id]

      // No budget yet: busy on both instances, the member's calls run on grants each instance holds.
      upstream.setBehaviour({ kind: "ok", delayMs: 20, usage: NEAR_ESTIMATE })
      for (const base of [a, b]) expect(outcome(yield* on(base)(chat(idleKey.apiKey)))).toBe("200")
      let busy = true
      const load = yield* Effect.all(
        [a, b].flatMap((base) =>
          Array.from({ length: 8 }, () =>
            Effect.gen(function*() {
              while (busy) expect(outcome(yield* on(base)(chat(busyKey.apiKey)))).toBe("200")
            }))
        ),
        { concurrency: "unbounded" }
      ).pipe(Effect.fork)
      const holders = yield* grantHolders(accountId, 2)
      busy = false
      yield* Fiber.join(load)
      expect(holders, "both instances hold a grant for the account").toBe(2)

      // Calls that take seconds, at once, on the grants.
      upstream.setBehaviour({ kind: "ok", delayMs: 4_000, usage: NEAR_ESTIMATE })
      const slow = yield* Effect.all(
        [a, b].flatMap((base) => Array.from({ length: 5 }, () => on(base)(chat(busyKey.apiKey)))),
        { concurrency: "unbounded" }
      ).pipe(Effect.fork)
      yield* Effect.sleep("500 millis")
      const open = yield* query<{ n: number }>(
        "SELECT count(*)::int AS n FROM reservations WHERE api_key_id = ANY($1) AND status = 'open'",
        [memberKeyIds]
      )
      expect(open[0]?.n, "the slow calls hold no reservation: they run on the grants").toBe(0)

      // Room for one call's estimate over what is written, and not for what the slow calls hold.
      const estimate = yield* estimateOf(idleKey.id)
      const written = yield* spentBy(memberKeyIds)
      const loweredAt = Date.now()
      yield* setBudget(memberId, written + estimate + 1_000)
      yield* spendings.b.memberLimitSet(accountId, memberId)
      const holds = yield* query<{ holder: string; amount: string }>(
        "SELECT holder, amount_micro_myr::text AS amount FROM key_grant_holds WHERE api_key_id = $1",
        [busyKey.id]
      )
      expect(holds.length, "both instances wrote what the calls hold of their grants").toBe(2)
      expect(holds.reduce((sum, hold) => sum + Number(hold.amount), 0)).toBe(10 * estimate)

      // Both keys, cached on both instances without a budget, are refused within a second.
      for (const base of [a, b]) {
        for (const key of [busyKey, idleKey]) {
          const ms = yield* seenWithin(
            loweredAt,
            on(base)(chat(key.apiKey)),
            (reply) => outcome(reply) === "spend_limit_exceeded"
          )
          expect(ms).toBeLessThanOrEqual(DEADLINE_MS)
          expect(expectMemberRefusal(yield* on(base)(chat(key.apiKey)))).toContain("held for calls in flight")
        }
      }
      expect(Date.now() - loweredAt, "the refusals came while the slow calls still ran").toBeLessThan(3_000)

      // The calls admitted before the change finish and are billed; none admitted after it.
      const finished = yield* Fiber.join(slow)
      expect(finished.map(outcome)).toEqual(Array(10).fill("200"))
      const after = yield* query<{ n: number }>(
        "SELECT count(*)::int AS n FROM request_logs WHERE api_key_id = ANY($1) AND status = 'billed' AND created_at > to_timestamp($2 / 1000.0)",
        [memberKeyIds, loweredAt]
      )
      expect(after[0]?.n).toBe(0)
      let left = -1
      for (let waited = 0; left !== 0 && waited < 50; waited++) {
        yield* Effect.sleep("100 millis")
        const rows = yield* query<{ n: number }>(
          "SELECT count(*)::int AS n FROM key_grant_holds WHERE api_key_id = ANY($1)",
          [memberKeyIds]
        )
        left = rows[0]?.n ?? -1
      }
      expect(left, "once written, the calls' holds are gone").toBe(0)
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.effect("a deleted key's spend this month still counts toward its member's budget", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.setBehaviour({ kind: "ok", delayMs: 5, usage: NEAR_ESTIMATE })
      const { a } = yield* Instances
      const spendings = yield* Spendings
      const { accountId, memberId, token } = yield* on(a)(team("mb-deleted@example.com", 1_000, null))
      const gone = yield* on(a)(keyOf(token, memberId, "to delete"))
      const kept = yield* on(a)(keyOf(token, memberId, "kept"))
      expect((yield* on(a)(chat(gone.apiKey))).status).toBe(200)
      const spent = yield* spentBy([gone.id])
      const estimate = yield* estimateOf(gone.id)
      expect((yield* on(a)(call("DELETE", `/dashboard/api-keys/${gone.id}`, { token }))).status).toBe(200)
      expect(yield* spendings.a.spentThisMonthByMember(accountId)).toEqual(new Map([[memberId, spent]]))

      yield* budgetHeard(memberId, spent + estimate - 1)
      const message = expectMemberRefusal(yield* on(a)(chat(kept.apiKey)))
      expect(message).toContain(`your keys have spent RM ${(spent / 1e6).toFixed(6)} this month`)
      yield* budgetHeard(memberId, spent + estimate)
      expect((yield* on(a)(chat(kept.apiKey))).status).toBe(200)
      expect(yield* spentBy([gone.id, kept.id])).toBeLessThanOrEqual(spent + estimate)
      expect(yield* violations(accountId)).toEqual([])
    }))
})
