import { expect, layer } from "@effect/vitest"
import { Effect, Fiber, Ref } from "effect"
import { costOf, DEFAULT_PRICES, withSafetyMargin } from "../../../src/Domain/Prices.js"
import { countMessages, type Message } from "../../../src/Domain/Tokens.js"
import { createKey, type Reply } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream, violations } from "../../support/Models.js"
import { DONE, parseSse, sseJson } from "../../support/Sse.js"
import { query, TestServer } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * Model calls under concurrency, through real HTTP, a real database and the
 * local upstream double (docs/money.md, "The money rules";
 * docs/money.md, "Idempotency"): a wallet raced by more calls than it affords,
 * the same Idempotency-Key raced and replayed, its scope, its freeing after a
 * failure, its retention, and streaming, which ignores it. Amounts are
 * micro-MYR; RM 10 = 10_000_000.
 */

const CHAT = "/v1/chat/completions"
const RESPONSES = "/v1/responses"
type Path = typeof CHAT | typeof RESPONSES
const MODEL = "svc/nenas-flash"
const GENERAL = "gpt-4.1-mini"
const TEN_RM = 10_000_000
/** Rate limits far above anything a test sends, so only the wallet and the keys decide. */
const UNLIMITED = { rateLimitRpm: 100_000, rateLimitConcurrent: 1_000 }
const IDEMPOTENCY_KEY = "Idempotency-Key"

/** `cost_myr` ("0.215046") as micro-MYR. */
const microOf = (myr: string): number => {
  const match = /^(\d+)\.(\d{6})$/.exec(myr)
  if (match === null) throw new Error(`not a 6-decimal MYR string: ${myr}`)
  return Number(match[1]) * 1_000_000 + Number(match[2])
}

/** The reservation of a general-model call, computed as the service does. */
const reservationFor = (messages: ReadonlyArray<Message>, maxTokens: number): number =>
  costOf(DEFAULT_PRICES, GENERAL, {
    inputTokens: withSafetyMargin(countMessages(messages)),
    cachedTokens: 0,
    outputTokens: maxTokens,
    searches: 0,
    pages: 0
  })

/** What a reply reports: its cost and the usage the upstream sent. */
const billedOf = (path: Path, reply: Reply) => {
  const usage = reply.body.usage
  return path === CHAT
    ? {
      cost: microOf(reply.body.cost_myr),
      input: usage.prompt_tokens as number,
      output: usage.completion_tokens as number
    }
    : { cost: microOf(usage.cost_myr), input: usage.input_tokens as number, output: usage.output_tokens as number }
}

/** The general model's price of the usage a reply reports. */
const pricedOf = (billed: { readonly input: number; readonly output: number }): number =>
  costOf(DEFAULT_PRICES, GENERAL, {
    inputTokens: billed.input,
    cachedTokens: 0,
    outputTokens: billed.output,
    searches: 0,
    pages: 0
  })

const requestIdOf = (reply: Reply): string => {
  const id = reply.headers.get("x-request-id")
  if (id === null) throw new Error(`no x-request-id on ${reply.status} ${reply.text}`)
  return id
}

const replayed = (reply: Reply) => reply.headers.get("idempotent-replayed")

const together = <A, E, R>(effects: ReadonlyArray<Effect.Effect<A, E, R>>) =>
  Effect.all(effects, { concurrency: "unbounded" })

interface WalletRow {
  readonly available: number
  readonly reserved: number
  readonly spent: number
  readonly topup: number
}

const walletOf = (accountId: string) =>
  Effect.map(
    query<{ available: number; reserved: number; spent: number; topup: number }>(
      `SELECT (available_micro_myr + granted_micro_myr)::float8 AS available, reserved_micro_myr::float8 AS reserved,
              lifetime_spend_micro_myr::float8 AS spent, lifetime_topup_micro_myr::float8 AS topup
       FROM wallets WHERE account_id = $1`,
      [accountId]
    ),
    (rows): WalletRow => {
      const row = rows[0]
      if (row === undefined) throw new Error(`no wallet for ${accountId}`)
      return row
    }
  )

const usageEntries = (accountId: string) =>
  query<{ request_id: string; api_key_id: string; cost: number }>(
    `SELECT request_id, api_key_id, (-amount_micro_myr)::float8 AS cost
     FROM ledger_entries WHERE account_id = $1 AND type = 'usage' ORDER BY created_at, id`,
    [accountId]
  )

const logsOf = (accountId: string) =>
  query<
    {
      request_id: string
      api_key_id: string
      endpoint: string
      status: string
      error_code: string | null
      cost: number
      stream: boolean
    }
  >(
    `SELECT request_id, api_key_id, endpoint, status, error_code, cost_micro_myr::float8 AS cost, stream
     FROM request_logs WHERE account_id = $1 ORDER BY created_at, request_id`,
    [accountId]
  )

const idempotencyRecords = (apiKeyId: string) =>
  query<
    { idempotency_key: string; endpoint: string; status: string; response_status: number | null; request_id: string }
  >(
    `SELECT idempotency_key, endpoint, status, response_status, request_id
     FROM idempotency_records WHERE api_key_id = $1 ORDER BY created_at`,
    [apiKeyId]
  )

const sum = (values: ReadonlyArray<number>) => values.reduce((total, value) => total + value, 0)

/** The spec's error body; returns `error` for further checks. */
const expectError = (reply: Reply, name: string, status: number, code: string) => {
  expect(reply.status, `${name}: status (${reply.text})`).toBe(status)
  expect(reply.body?.type, `${name}: body.type`).toBe("error")
  const error = reply.body.error
  expect(error.code, `${name}: code`).toBe(code)
  expect(error.request_id, `${name}: request_id`).toBe(reply.headers.get("x-request-id"))
  expect(error.message, `${name}: message`).toBeTypeOf("string")
  return error
}

/** `idempotency_conflict`: 409, retryable only while the first request runs. */
const expectConflict = (reply: Reply, name: string, retryable: boolean) => {
  const error = expectError(reply, name, 409, "idempotency_conflict")
  expect(error.type, `${name}: type`).toBe("invalid_request_error")
  expect(error.param, `${name}: param`).toBe(IDEMPOTENCY_KEY)
  expect(error.retryable, `${name}: retryable`).toBe(retryable)
  if (retryable) {
    expect(error.retry_after_seconds, `${name}: retry_after_seconds`).toBeGreaterThanOrEqual(1)
    expect(Number(reply.headers.get("retry-after")), `${name}: Retry-After`).toBeGreaterThanOrEqual(1)
  }
  expect(replayed(reply), `${name}: not a replay`).toBeNull()
}

/** A 200 that ran (not a replay). */
const expectRan = (reply: Reply, name: string) => {
  expect(reply.status, `${name}: status (${reply.text})`).toBe(200)
  expect(replayed(reply), `${name}: Idempotent-Replayed`).toBeNull()
}

/** A 200 replay of `original`, byte for byte. */
const expectReplayOf = (reply: Reply, original: Reply, name: string) => {
  expect(reply.status, `${name}: status (${reply.text})`).toBe(200)
  expect(replayed(reply), `${name}: Idempotent-Replayed`).toBe("true")
  expect(reply.headers.get("content-type") ?? "", `${name}: content-type`).toContain("application/json")
  expect(reply.text, `${name}: body byte-identical to the first answer`).toBe(original.text)
}

/** Polls `condition` every 10 ms, for up to 5 s. */
const eventually = (condition: () => boolean, what: string) =>
  Effect.gen(function*() {
    for (let i = 0; i < 500; i++) {
      if (condition()) return
      yield* Effect.sleep("10 millis")
    }
    throw new Error(`timed out waiting for ${what}`)
  })

/** The cost a streamed answer reports: chat's usage chunk, or responses' `response.completed`. */
const streamedCost = (path: Path, text: string): number => {
  for (const data of sseJson<Record<string, unknown>>(parseSse(text))) {
    if (data === DONE) continue
    if (path === CHAT && typeof data["cost_myr"] === "string") return microOf(data["cost_myr"])
    if (path === RESPONSES && data["type"] === "response.completed") {
      const response = data["response"] as { usage: { cost_myr: string } }
      return microOf(response.usage.cost_myr)
    }
  }
  throw new Error(`no cost in the ${path} stream: ${text.slice(-500)}`)
}

/** Ledger, request logs and wallet agree with the costs the successful replies reported. */
const expectBooks = (
  accountId: string,
  successes: ReadonlyArray<{ readonly requestId: string; readonly cost: number }>
) =>
  Effect.gen(function*() {
    const entries = yield* usageEntries(accountId)
    expect(entries.length, "one usage ledger entry per success").toBe(successes.length)
    expect(new Set(entries.map((e) => e.request_id)), "usage entries are the successes' requests").toEqual(
      new Set(successes.map((s) => s.requestId))
    )
    const costById = new Map(successes.map((s) => [s.requestId, s.cost]))
    for (const entry of entries) {
      expect(entry.cost, `ledger amount of ${entry.request_id}`).toBe(costById.get(entry.request_id))
    }
    const total = sum(successes.map((s) => s.cost))
    const wallet = yield* walletOf(accountId)
    expect(wallet.reserved, "nothing stays reserved").toBe(0)
    expect(wallet.spent, "lifetime spend = sum of charged costs").toBe(total)
    expect(wallet.available, "available = top-ups - spend").toBe(wallet.topup - total)
    expect(wallet.available, "available never negative").toBeGreaterThanOrEqual(0)
    const billed = (yield* logsOf(accountId)).filter((log) => log.status === "billed")
    expect(new Set(billed.map((log) => log.request_id)), "billed request logs are the successes").toEqual(
      new Set(costById.keys())
    )
    for (const log of billed) expect(log.cost, `logged cost of ${log.request_id}`).toBe(costById.get(log.request_id))
    expect(yield* violations(accountId)).toEqual([])
  })

const MAX_TOKENS = 32_000
const WALLET_MESSAGES: ReadonlyArray<Message> = [{ role: "user", content: "Say hello to the wallet." }]

/** 100 concurrent chat calls on RM 10; returns the replies and K. */
const walletRace = (accountId: string, apiKey: string) =>
  Effect.gen(function*() {
    const reservation = reservationFor(WALLET_MESSAGES, MAX_TOKENS)
    const k = Math.floor(TEN_RM / reservation)
    expect(k, `K for a reservation of ${reservation}`).toBeGreaterThanOrEqual(20)
    expect(k, `K for a reservation of ${reservation}`).toBeLessThan(50)
    // The wallet sampled all along the race: never below 0, always balanced.
    const samples = yield* Ref.make<ReadonlyArray<WalletRow>>([])
    const sampler = yield* Effect.fork(Effect.forever(
      Effect.flatMap(walletOf(accountId), (row) => Ref.update(samples, (all) => [...all, row])).pipe(
        Effect.zipRight(Effect.sleep("5 millis"))
      )
    ))
    const replies = yield* together(Array.from({ length: 100 }, () =>
      modelCall(apiKey, CHAT, { model: MODEL, messages: WALLET_MESSAGES, max_tokens: MAX_TOKENS })))
    yield* Fiber.interrupt(sampler)
    const sampled = yield* Ref.get(samples)
    expect(sampled.length, "the wallet was sampled during the race").toBeGreaterThan(0)
    for (const row of sampled) {
      expect(row.available, "available never negative").toBeGreaterThanOrEqual(0)
      expect(row.available + row.reserved + row.spent, "available + reserved + spent = top-ups").toBe(TEN_RM)
    }
    const ok = replies.filter((r) =>
      r.status === 200
    )
    const refused = replies.filter((r) => r.status !== 200)
    for (const reply of refused) {
      const error = expectError(reply, "refused call", 402, "insufficient_balance")
      expect(error.type).toBe("billing_error")
      expect(error.retryable).toBe(false)
    }
    return { reservation, k, ok, refused }
  })

layer(TestServerWithUpstream(UNLIMITED), { excludeTestServices: true })("model calls racing", (it) => {
  it.effect("100 concurrent calls on a wallet that affords K: at most K run, the rest are 402 insufficient_balance, the books hold exactly what was charged", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      // Slow enough that, normally, every reservation is made before the first call ends and gives back its unused part.
      upstream.setBehaviour({ kind: "ok", delayMs: 2_000 })
      const { accountId, apiKey } = yield* caller("race-wallet@example.com", { sen: 1000 })
      const { k, ok, refused, reservation } = yield* walletRace(accountId, apiKey)

      const reservations = yield* query<{ created: number; settled: number; amount: number; status: string }>(
        `SELECT extract(epoch FROM created_at)::float8 * 1000 AS created, extract(epoch FROM settled_at)::float8 * 1000 AS settled,
                amount_micro_myr::float8 AS amount, status
         FROM reservations WHERE account_id = $1`,
        [accountId]
      )
      // A reservation made after a call gave money back may rightly exceed K; on a loaded machine a few may come late.
      const firstSettled = Math.min(...reservations.map((r) => r.settled))
      const late = reservations.filter((r) => r.created > firstSettled).length
      expect(ok.length, `successes (K = ${k})`).toBeGreaterThanOrEqual(1)
      expect(ok.length, `successes (K = ${k}, ${late} reserved after money came back)`).toBeLessThanOrEqual(k + late)
      expect(refused.length).toBe(100 - ok.length)
      // A success holds a reservation of its own, or (the account calling often) part of the instance's credit grant.
      const fromGrants = yield* query<{ n: number }>(
        `SELECT count(*)::int AS n FROM request_logs WHERE account_id = $1 AND status = 'billed' AND reservation_id IS NULL`,
        [accountId]
      )
      expect(reservations.length + (fromGrants[0]?.n ?? 0), "one hold per success; refusals hold nothing").toBe(
        ok.length
      )
      for (const r of reservations) {
        expect(r.amount).toBe(reservation)
        expect(r.status).toBe("captured")
      }

      const successes = ok.map((reply) => {
        const billed = billedOf(CHAT, reply)
        expect(billed.cost, "cost = the reported usage, priced").toBe(pricedOf(billed))
        expect(billed.cost).toBeLessThanOrEqual(reservation)
        return { requestId: requestIdOf(reply), cost: billed.cost }
      })
      expect(upstream.requests.length, "only the successes reached the upstream").toBe(ok.length)
      for (const request of upstream.requests) {
        expect(request.body).toMatchObject({ model: GENERAL, max_tokens: MAX_TOKENS })
      }
      const logs = yield* logsOf(accountId)
      const failed = logs.filter((log) => log.status === "failed")
      expect(failed.length, "each refusal is logged as failed").toBe(refused.length)
      for (const log of failed) {
        expect(log.error_code).toBe("insufficient_balance")
        expect(log.cost).toBe(0)
      }
      expect(new Set(failed.map((log) => log.request_id))).toEqual(new Set(refused.map(requestIdOf)))
      expect(logs.length).toBe(100)
      yield* expectBooks(accountId, successes)
    }))

  it.effect("100 concurrent calls whose upstream reports more usage than reserved: exactly K run, each billed exactly its reservation, never more", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({
        kind: "ok",
        delayMs: 200,
        usage: { prompt_tokens: 200_000, completion_tokens: MAX_TOKENS }
      })
      const { accountId, apiKey } = yield* caller("race-capped@example.com", { sen: 1000 })
      const { k, ok, refused, reservation } = yield* walletRace(accountId, apiKey)

      // Every success spends its whole reservation, so money only leaves: K runs, whatever the timing.
      expect(ok.length, `successes (K = ${k})`).toBe(k)
      expect(refused.length).toBe(100 - k)
      const successes = ok.map((reply) => {
        expect(reply.body.usage.prompt_tokens, "the upstream's usage is reported as is").toBe(200_000)
        const billed = billedOf(CHAT, reply)
        expect(pricedOf(billed), "the usage is worth more than the reservation").toBeGreaterThan(reservation)
        expect(billed.cost, "billed = the reservation, capped").toBe(reservation)
        return { requestId: requestIdOf(reply), cost: billed.cost }
      })
      expect(upstream.requests.length).toBe(k)
      yield* expectBooks(accountId, successes)
      const wallet = yield* walletOf(accountId)
      expect(wallet.spent).toBe(k * reservation)
      expect(wallet.available).toBe(TEN_RM - k * reservation)
      expect(wallet.available, "what is left cannot pay for one more call").toBeLessThan(reservation)
    }))

  it.effect("the same Idempotency-Key sent 20 times at once runs once: one upstream call, one charge; the rest conflict (retryable) or replay, and later calls replay byte for byte", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({ kind: "ok", delayMs: 300 })
      const { accountId, apiKey, keyId } = yield* caller("race-idem@example.com", { sen: 1000 })
      const body = { model: MODEL, input: "Name one colour of the Malaysian flag." }
      const key = "order-7f3a-concurrent"
      const replies = yield* together(
        Array.from({ length: 20 }, () => modelCall(apiKey, RESPONSES, body, { [IDEMPOTENCY_KEY]: key }))
      )

      const ran = replies.filter((r) => r.status === 200 && replayed(r) === null)
      expect(ran.length, `exactly one ran: ${replies.map((r) => `${r.status}/${replayed(r)}`).join(" ")}`).toBe(1)
      const first = ran[0]
      if (first === undefined) throw new Error("unreachable: one ran")
      expect(first.body.object).toBe("response")
      for (const reply of replies) {
        if (reply === first) continue
        if (reply.status === 200) expectReplayOf(reply, first, "concurrent replay")
        else expectConflict(reply, "concurrent duplicate", true)
      }
      expect(upstream.requests.length, "one upstream request").toBe(1)
      const cost = billedOf(RESPONSES, first).cost
      expect(cost).toBe(pricedOf(billedOf(RESPONSES, first)))
      expect((yield* logsOf(accountId)).length, "conflicts log no call").toBe(1)
      expect(yield* idempotencyRecords(keyId)).toMatchObject([{
        idempotency_key: key,
        endpoint: RESPONSES,
        status: "completed",
        response_status: 200,
        request_id: first.body.request_id
      }])

      const again = yield* modelCall(apiKey, RESPONSES, body, { [IDEMPOTENCY_KEY]: key })
      expectReplayOf(again, first, "replay after completion")
      expect(requestIdOf(again), "the replay answers as the first request did: X-Request-Id is its body's request_id")
        .toBe(first.body.request_id)
      // The same request in another spelling: keys reordered, defaults spelled out.
      const respelled = yield* modelCall(apiKey, RESPONSES, { stream: false, input: body.input, model: MODEL }, {
        [IDEMPOTENCY_KEY]: key
      })
      expectReplayOf(respelled, first, "replay of the same request spelled differently")
      expect(upstream.requests.length, "replays never reach the upstream").toBe(1)
      yield* expectBooks(accountId, [{ requestId: first.body.request_id, cost }])
    }))

  it.effect("same Idempotency-Key with a different body, or on the other endpoint, is a 409 that is not retryable, while the first runs and after it finished", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({ kind: "ok", delayMs: 300 })
      const { accountId, apiKey } = yield* caller("race-idem-body@example.com", { sen: 1000 })
      const key = "idem-different-body"
      const headers = { [IDEMPOTENCY_KEY]: key }
      const body = { model: MODEL, messages: [{ role: "user", content: "Say hi." }], max_tokens: 100 }
      const different = { ...body, max_tokens: 101 }
      const otherEndpoint = { model: MODEL, input: "Say hi.", max_output_tokens: 100 }

      const running = yield* Effect.fork(modelCall(apiKey, CHAT, body, headers))
      yield* eventually(() => upstream.requests.length === 1, "the first call to reach the upstream")
      expectConflict(yield* modelCall(apiKey, CHAT, different, headers), "different body while running", false)
      expectConflict(yield* modelCall(apiKey, RESPONSES, otherEndpoint, headers), "other endpoint while running", false)
      const first = yield* Fiber.join(running)
      expectRan(first, "first")

      expectConflict(yield* modelCall(apiKey, CHAT, different, headers), "different body after", false)
      expectConflict(yield* modelCall(apiKey, RESPONSES, otherEndpoint, headers), "other endpoint after", false)
      expectReplayOf(yield* modelCall(apiKey, CHAT, body, headers), first, "same body after")
      expect(upstream.requests.length).toBe(1)
      expect((yield* logsOf(accountId)).length).toBe(1)
      yield* expectBooks(accountId, [{ requestId: requestIdOf(first), cost: billedOf(CHAT, first).cost }])
    }))

  it.effect("an Idempotency-Key longer than 255 characters is 400 invalid_request naming the header; 255 characters are accepted", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const { accountId, apiKey, keyId } = yield* caller("race-idem-long@example.com", { sen: 1000 })
      const body = { model: MODEL, input: "Say hi." }
      for (const path of [RESPONSES, CHAT] as const) {
        const json = path === CHAT ? { model: MODEL, messages: [{ role: "user", content: "Say hi." }] } : body
        const reply = yield* modelCall(apiKey, path, json, { [IDEMPOTENCY_KEY]: "k".repeat(256) })
        const error = expectError(reply, `${path} 256-character key`, 400, "invalid_request")
        expect(error.type).toBe("invalid_request_error")
        expect(error.retryable).toBe(false)
        expect(error.param, "param names the header").not.toBeNull()
        expect(String(error.param).toLowerCase(), "param names the header").toContain("idempotency-key")
      }
      expect(upstream.requests.length).toBe(0)
      expect(yield* logsOf(accountId)).toEqual([])
      expect(yield* idempotencyRecords(keyId)).toEqual([])

      const longest = "k".repeat(255)
      const accepted = yield* modelCall(apiKey, RESPONSES, body, { [IDEMPOTENCY_KEY]: longest })
      expectRan(accepted, "255-character key")
      expectReplayOf(
        yield* modelCall(apiKey, RESPONSES, body, { [IDEMPOTENCY_KEY]: longest }),
        accepted,
        "255-character key again"
      )
      expect(yield* idempotencyRecords(keyId)).toMatchObject([{ idempotency_key: longest, status: "completed" }])
      yield* expectBooks(accountId, [{ requestId: requestIdOf(accepted), cost: billedOf(RESPONSES, accepted).cost }])
    }))

  it.effect("Idempotency-Keys are scoped per API key: the same key value from another account's key, or another key of the same account, runs its own call", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const a = yield* caller("race-scope-a@example.com", { sen: 1000 })
      const b = yield* caller("race-scope-b@example.com", { sen: 1000 })
      const aSecond = yield* createKey(a.token, { name: "second live key", environment: "live" })
      const body = { model: MODEL, messages: [{ role: "user", content: "Say hi." }], max_tokens: 100 }
      const headers = { [IDEMPOTENCY_KEY]: "shared-key-value" }

      const fromA = yield* modelCall(a.apiKey, CHAT, body, headers)
      expectRan(fromA, "account A")
      const fromB = yield* modelCall(b.apiKey, CHAT, body, headers)
      expectRan(fromB, "account B, same key value")
      const fromASecond = yield* modelCall(aSecond.full_key, CHAT, body, headers)
      expectRan(fromASecond, "account A's second key, same key value")
      expect(upstream.requests.length).toBe(3)
      expectReplayOf(yield* modelCall(a.apiKey, CHAT, body, headers), fromA, "account A again")
      expectReplayOf(yield* modelCall(b.apiKey, CHAT, body, headers), fromB, "account B again")
      expect(upstream.requests.length).toBe(3)

      const aEntries = yield* usageEntries(a.accountId)
      expect(aEntries.map((e) => e.api_key_id).sort()).toEqual([a.keyId, aSecond.key.id].sort())
      yield* expectBooks(a.accountId, [
        { requestId: requestIdOf(fromA), cost: billedOf(CHAT, fromA).cost },
        { requestId: requestIdOf(fromASecond), cost: billedOf(CHAT, fromASecond).cost }
      ])
      yield* expectBooks(b.accountId, [{ requestId: requestIdOf(fromB), cost: billedOf(CHAT, fromB).cost }])
    }))

  it.effect("a call that fails (upstream 500) answers a retryable 503 that is not kept under its Idempotency-Key: the same key and body run anew once the upstream recovers, then replay; billed once", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({ kind: "status", status: 500 })
      const { accountId, apiKey, keyId } = yield* caller("race-idem-fail@example.com", { sen: 1000 })
      const body = { model: MODEL, input: "Say hi.", max_output_tokens: 100 }
      const headers = { [IDEMPOTENCY_KEY]: "retry-after-failure" }

      const failed = yield* modelCall(apiKey, RESPONSES, body, headers)
      const error = expectError(failed, "upstream 500", 503, "provider_unavailable")
      expect(error.retryable).toBe(true)
      expect(replayed(failed)).toBeNull()
      expect(yield* idempotencyRecords(keyId), "the failure is not kept: the key is released").toEqual([])
      expect(yield* walletOf(accountId)).toMatchObject({ available: TEN_RM, reserved: 0, spent: 0 })

      upstream.setBehaviour({ kind: "ok" })
      const retried = yield* modelCall(apiKey, RESPONSES, body, headers)
      expectRan(retried, "the same key after the upstream recovered")
      const replay = yield* modelCall(apiKey, RESPONSES, body, headers)
      expectReplayOf(replay, retried, "replay of the retry")
      expect(replay.headers.get("x-request-id"), "a 200 replay's X-Request-Id is the first request's").toBe(
        requestIdOf(retried)
      )
      expect(replay.body.request_id).toBe(requestIdOf(retried))
      expect(upstream.requests.length, "the failure and the retry's call").toBe(2)

      const logs = yield* logsOf(accountId)
      expect(logs.map((log) => [log.request_id, log.status, log.error_code, log.cost])).toEqual([
        [requestIdOf(failed), "failed", "provider_unavailable", 0],
        [requestIdOf(retried), "billed", null, billedOf(RESPONSES, retried).cost]
      ])
      yield* expectBooks(accountId, [{ requestId: requestIdOf(retried), cost: billedOf(RESPONSES, retried).cost }])
    }))

  it.effect("a client that gives up on a call with an Idempotency-Key after it reached the upstream, then retries the same key and body, is billed once", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({ kind: "ok", delayMs: 800 })
      const { baseUrl } = yield* TestServer
      const { accountId, apiKey } = yield* caller("race-idem-gave-up@example.com", { sen: 1000 })
      const body = { model: MODEL, input: "Say hi.", max_output_tokens: 100 }
      const headers = { [IDEMPOTENCY_KEY]: "client-gave-up" }

      // The client's timeout fires while the upstream is working on the call.
      const abort = new AbortController()
      const attempt = yield* Effect.fork(Effect.promise(() =>
        fetch(`${baseUrl}${RESPONSES}`, {
          method: "POST",
          headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json", ...headers },
          body: JSON.stringify(body),
          signal: abort.signal
        }).then((response) => `answered ${response.status}`, () => "gave up")
      ))
      yield* eventually(() => upstream.requests.length === 1, "the call to reach the upstream")
      abort.abort()
      expect(yield* Fiber.join(attempt)).toBe("gave up")
      // Whatever the service does with the abandoned call, it settles (its one row is written with the settlement): wait for it.
      const settled = yield* Effect.gen(function*() {
        for (let i = 0; i < 100; i++) {
          const rows = yield* logsOf(accountId)
          if (rows.length > 0 && rows.every((row) => row.status !== "pending" && row.status !== "succeeded")) {
            return rows
          }
          yield* Effect.sleep("50 millis")
        }
        return yield* logsOf(accountId)
      })
      expect(settled.length).toBe(1)

      // The retry: a 409 while the first still runs is fine; in the end, one answer and one charge.
      let retry = yield* modelCall(apiKey, RESPONSES, body, headers)
      for (let i = 0; i < 50 && retry.status === 409 && retry.body.error.retryable === true; i++) {
        yield* Effect.sleep("100 millis")
        retry = yield* modelCall(apiKey, RESPONSES, body, headers)
      }
      expect(retry.status, retry.text).toBe(200)
      const entries = yield* usageEntries(accountId)
      expect(
        entries.map((e) => e.cost),
        "one idempotent request, one charge (nothing is billed twice)"
      ).toEqual([billedOf(RESPONSES, retry).cost])
      expect(upstream.requests.length, "the retry did not call the upstream again").toBe(1)
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.effect("streaming requests ignore Idempotency-Key: two streamed calls with the same key both run and both bill, on both endpoints", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const { accountId, apiKey, keyId } = yield* caller("race-idem-stream@example.com", { sen: 1000 })
      const headers = { [IDEMPOTENCY_KEY]: "streamed-key" }
      const bodies: ReadonlyArray<readonly [Path, Record<string, unknown>]> = [
        [CHAT, { model: MODEL, messages: [{ role: "user", content: "Say hi." }], max_tokens: 100, stream: true }],
        [RESPONSES, { model: MODEL, input: "Say hi.", max_output_tokens: 100, stream: true }]
      ]
      const successes: Array<{ requestId: string; cost: number }> = []
      for (const [path, body] of bodies) {
        for (const attempt of ["first", "second"]) {
          const reply = yield* modelCall(apiKey, path, body, headers)
          expect(reply.status, `${path} ${attempt}: ${reply.text.slice(0, 300)}`).toBe(200)
          expect(reply.headers.get("content-type") ?? "").toContain("text/event-stream")
          expect(replayed(reply), `${path} ${attempt}: not a replay`).toBeNull()
          successes.push({ requestId: requestIdOf(reply), cost: streamedCost(path, reply.text) })
        }
      }
      expect(upstream.requests.length, "every streamed call reached the upstream").toBe(4)
      expect(yield* idempotencyRecords(keyId), "streamed calls claim no key").toEqual([])
      const logs = yield* logsOf(accountId)
      expect(logs.map((log) => [log.endpoint, log.status, log.stream])).toEqual([
        [CHAT, "billed", true],
        [CHAT, "billed", true],
        [RESPONSES, "billed", true],
        [RESPONSES, "billed", true]
      ])
      yield* expectBooks(accountId, successes)
    }))

  it.effect("30 concurrent calls on two live keys of one account, half chat and half responses: every cost is priced from usage and the ledger matches per key", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({ kind: "ok", delayMs: 100 })
      const first = yield* caller("race-mixed@example.com", { sen: 1000 })
      const second = yield* createKey(first.token, { name: "second live key", environment: "live" })
      const keys = [
        { apiKey: first.apiKey, keyId: first.keyId },
        { apiKey: second.full_key, keyId: second.key.id }
      ] as const
      const plan = Array.from({ length: 30 }, (_, i) => ({
        path: (i % 2 === 0 ? CHAT : RESPONSES) satisfies Path as Path,
        key: keys[Math.floor(i / 2) % 2] ?? keys[0],
        prompt: `Greet caller number ${i} politely.`
      }))
      const replies = yield* together(plan.map(({ key, path, prompt }) =>
        path === CHAT
          ? modelCall(key.apiKey, CHAT, {
            model: MODEL,
            messages: [{ role: "user", content: prompt }],
            max_tokens: 200
          })
          : modelCall(key.apiKey, RESPONSES, { model: MODEL, input: prompt, max_output_tokens: 200 })
      ))

      const successes = replies.map((reply, i) => {
        const step = plan[i]
        if (step === undefined) throw new Error("unreachable: one reply per step")
        expect(reply.status, reply.text).toBe(200)
        const billed = billedOf(step.path, reply)
        expect(billed.cost, "cost = the reported usage, priced").toBe(pricedOf(billed))
        return { requestId: requestIdOf(reply), cost: billed.cost, keyId: step.key.keyId, path: step.path }
      })
      expect(upstream.requests.length).toBe(30)
      const entries = yield* usageEntries(first.accountId)
      for (const { keyId } of keys) {
        const mine = successes.filter((s) => s.keyId === keyId)
        const theirs = entries.filter((e) => e.api_key_id === keyId)
        expect(theirs.length, `usage entries of ${keyId}`).toBe(mine.length)
        expect(sum(theirs.map((e) => e.cost)), `spend of ${keyId}`).toBe(sum(mine.map((s) => s.cost)))
      }
      const logs = yield* logsOf(first.accountId)
      expect(logs.filter((log) => log.endpoint === CHAT && log.status === "billed").length).toBe(15)
      expect(logs.filter((log) => log.endpoint === RESPONSES && log.status === "billed").length).toBe(15)
      yield* expectBooks(first.accountId, successes)
    }))
})

layer(TestServerWithUpstream(UNLIMITED), { excludeTestServices: true })("model call idempotency retention", (it) => {
  it.effect("an Idempotency-Key is kept 24 hours: a different body still conflicts at 23 h 59 min and runs as a new request at 24 h 1 min", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const { clock } = yield* TestServer
      const { accountId, apiKey, keyId } = yield* caller("race-idem-retention@example.com", { sen: 1000 })
      const headers = { [IDEMPOTENCY_KEY]: "kept-for-a-day" }
      const body = { model: MODEL, input: "Say hi.", max_output_tokens: 100 }
      const different = { model: MODEL, input: "Say bye.", max_output_tokens: 100 }

      const first = yield* modelCall(apiKey, RESPONSES, body, headers)
      expectRan(first, "first")
      clock.advance("1439 minutes")
      expectConflict(yield* modelCall(apiKey, RESPONSES, different, headers), "different body at 23 h 59 min", false)
      expectReplayOf(yield* modelCall(apiKey, RESPONSES, body, headers), first, "same body at 23 h 59 min")
      clock.advance("2 minutes")
      const fresh = yield* modelCall(apiKey, RESPONSES, different, headers)
      expectRan(fresh, "different body at 24 h 1 min")
      expect(fresh.body.output_text).toContain("Say bye.")
      expectReplayOf(yield* modelCall(apiKey, RESPONSES, different, headers), fresh, "the new request replays")
      expectConflict(yield* modelCall(apiKey, RESPONSES, body, headers), "the expired body now conflicts", false)
      expect(upstream.requests.length).toBe(2)
      expect(yield* idempotencyRecords(keyId)).toMatchObject([{
        status: "completed",
        request_id: fresh.body.request_id
      }])
      yield* expectBooks(accountId, [
        { requestId: requestIdOf(first), cost: billedOf(RESPONSES, first).cost },
        { requestId: requestIdOf(fresh), cost: billedOf(RESPONSES, fresh).cost }
      ])
    }))
})
