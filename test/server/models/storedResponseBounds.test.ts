import { expect, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { randomBytes } from "node:crypto"
import { monitorEventLoopDelay } from "node:perf_hooks"
import { deflateRawSync } from "node:zlib"
import { StoredResponses } from "../../../src/Responses/Store.js"
import { call } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream } from "../../support/Models.js"
import { query, TestServer, TestServerLive } from "../../support/TestServer.js"

/**
 * Stored responses' bounds (docs/api/models.md, "Stored responses"; admission
 * first: docs/security.md, "Security"): a chain is read at most 1,000 responses and
 * 16 MiB deep, without blocking the instance; at most 100 item references a call;
 * the key's rate limit comes before any lookup, and an unknown id is a 400 after a
 * bounded wait; each account's stored bytes are capped, oldest deleted first; test
 * keys' responses are kept 24 hours.
 */

const MODEL = "svc/nenas-flash"

/** Text that compresses little and counts under half a token a character: random lower-case words. */
const noise = (chars: number) =>
  Buffer.from(randomBytes(chars).map((b) => b % 9 === 0 ? 32 : 97 + (b % 26))).toString("latin1")

/** The event loop's longest delay (ms) while `effect` runs. */
const longestBlock = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const histogram = monitorEventLoopDelay({ resolution: 5 })
    histogram.enable()
    const result = yield* Effect.ensuring(effect, Effect.sync(() => histogram.disable()))
    return { result, maxMs: histogram.max / 1e6 }
  })

const badPrevious = (reply: { status: number; body: { error?: { code?: string; param?: string } }; text: string }) => {
  expect(reply.status, reply.text).toBe(400)
  expect(reply.body.error).toMatchObject({ code: "invalid_request", param: "previous_response_id" })
}

layer(TestServerWithUpstream(), { excludeTestServices: true, timeout: 240_000 })("stored response chains", (it) => {
  it.effect("a chain over 1,000 responses answers 400 (previous_response_id); one of 1,000 goes on", () =>
    Effect.gen(function*() {
      const { accountId, keyId, apiKey } = yield* caller("bounds-depth@example.com", { environment: "test" })
      const first = yield* modelCall(apiKey, "/v1/responses", { model: MODEL, input: "Start." })
      expect(first.status).toBe(200)
      yield* (yield* TestServer).settled
      // 1,000 more turns on top of the real one, seeded in SQL: resp_<24 chars> each continuing the one before.
      const body = deflateRawSync(JSON.stringify({ response: { output: [] }, input: [], instructions: null }))
      const idOf = (n: number) => `resp_seed${String(n).padStart(20, "0")}`
      yield* query(
        `INSERT INTO stored_responses (id, account_id, api_key_id, previous_response_id, body, created_at, expires_at)
         SELECT 'resp_seed' || lpad(n::text, 20, '0'), $1, $2,
           CASE WHEN n = 1 THEN $3 ELSE 'resp_seed' || lpad((n - 1)::text, 20, '0') END,
           $4, now(), now() + interval '1 day'
         FROM generate_series(1, 1000) AS n`,
        [accountId, keyId, first.body.id, body]
      )
      // 999 seeded and the real first: 1,000 responses, the most a chain may be read.
      const atLimit = yield* modelCall(apiKey, "/v1/responses", {
        model: MODEL,
        previous_response_id: idOf(999),
        input: "Go on."
      })
      expect(atLimit.status, atLimit.text).toBe(200)
      badPrevious(
        yield* modelCall(apiKey, "/v1/responses", { model: MODEL, previous_response_id: idOf(1000), input: "Go on." })
      )
      // The continuation that was answered made a chain of 1,001: it cannot be continued either.
      badPrevious(
        yield* modelCall(apiKey, "/v1/responses", {
          model: MODEL,
          previous_response_id: atLimit.body.id,
          input: "More."
        })
      )
    }))

  it.effect("a chain of huge instructions: continued without blocking the event loop until 16 MiB, then 400", () =>
    Effect.gen(function*() {
      const { apiKey } = yield* caller("bounds-bytes@example.com", { environment: "test" })
      // 1.6 MB of instructions a turn, stored with each (and counted), never sent again by continuations.
      const instructions = noise(1_600_000)
      const ids: Array<string> = []
      const statuses: Array<number> = []
      for (let turn = 0; turn < 12; turn++) {
        const previous = ids[ids.length - 1]
        const reply = yield* modelCall(apiKey, "/v1/responses", {
          model: MODEL,
          instructions,
          input: `Turn ${turn}.`,
          max_output_tokens: 16,
          ...(previous === undefined ? {} : { previous_response_id: previous })
        })
        statuses.push(reply.status)
        if (reply.status !== 200) {
          badPrevious(reply)
          break
        }
        ids.push(reply.body.id as string)
      }
      // The turns' own work (counting 1.6 MB of instructions each, writing them) is over before measuring.
      yield* (yield* TestServer).settled
      yield* Effect.sleep("2 seconds")
      // A short continuation of ten such turns (16 MB read back) does not hold the event loop.
      const within = yield* longestBlock(
        modelCall(apiKey, "/v1/responses", { model: MODEL, previous_response_id: ids[9], input: "Short." })
      )
      expect(within.result.status, within.result.text).toBe(200)
      expect(within.maxMs).toBeLessThan(200)
      // Ten stored turns of 1.6 MB fit 16 MiB, eleven do not: refused, unread.
      expect(statuses).toEqual([...Array(11).fill(200), 400])
      const beyond = yield* longestBlock(
        modelCall(apiKey, "/v1/responses", { model: MODEL, previous_response_id: ids[10], input: "Short." })
      )
      badPrevious(beyond.result)
      expect(beyond.maxMs).toBeLessThan(200)
    }))

  it.effect("at most 100 item references a call", () =>
    Effect.gen(function*() {
      const { apiKey } = yield* caller("bounds-refs@example.com", { environment: "test" })
      const created = yield* modelCall(apiKey, "/v1/responses", { model: MODEL, input: "Remember this." })
      const messageId = (created.body.output as Array<{ id: string }>)[0]?.id
      const refs = (
        n: number
      ) => [...Array(n).fill({ type: "item_reference", id: messageId }), { role: "user", content: "Go." }]
      const hundred = yield* modelCall(apiKey, "/v1/responses", { model: MODEL, input: refs(100) })
      expect(hundred.status, hundred.text).toBe(200)
      const over = yield* modelCall(apiKey, "/v1/responses", { model: MODEL, input: refs(101) })
      expect(over.status, over.text).toBe(400)
      expect(over.body.error).toMatchObject({ code: "invalid_request", param: "input" })
      expect(over.body.error.message).toContain("100")
    }))

  it.effect("test keys' responses are kept 24 hours, live keys' 30 days", () =>
    Effect.gen(function*() {
      const test = yield* caller("bounds-ttl-test@example.com", { environment: "test" })
      const live = yield* caller("bounds-ttl-live@example.com", { sen: 1000 })
      const { clock } = yield* TestServer
      const fromTest = yield* modelCall(test.apiKey, "/v1/responses", { model: MODEL, input: "Brief." })
      const fromLive = yield* modelCall(live.apiKey, "/v1/responses", { model: MODEL, input: "Kept." })
      expect([fromTest.status, fromLive.status]).toEqual([200, 200])
      const kept = yield* query<{ id: string; hours: number }>(
        "SELECT id, extract(epoch FROM expires_at - created_at) / 3600 AS hours FROM stored_responses WHERE id = ANY($1)",
        [[fromTest.body.id, fromLive.body.id]]
      )
      expect(Object.fromEntries(kept.map((row) => [row.id, Number(row.hours)]))).toEqual({
        [fromTest.body.id]: 24,
        [fromLive.body.id]: 30 * 24
      })
      clock.advance("23 hours")
      expect((yield* call("GET", `/v1/responses/${fromTest.body.id}`, { token: test.apiKey })).status).toBe(200)
      clock.advance("1 hour")
      expect((yield* call("GET", `/v1/responses/${fromTest.body.id}`, { token: test.apiKey })).status).toBe(404)
      badPrevious(
        yield* modelCall(test.apiKey, "/v1/responses", {
          model: MODEL,
          previous_response_id: fromTest.body.id,
          input: "?"
        })
      )
      expect((yield* call("GET", `/v1/responses/${fromLive.body.id}`, { token: live.apiKey })).status).toBe(200)
    }))
})

/** Each lookup of the stored-response store, counted around the real one. */
const lookups = { count: 0 }
const CountedStore = Layer.effect(
  StoredResponses,
  Effect.map(StoredResponses, (store) => {
    const counted = <A extends ReadonlyArray<unknown>, B>(f: (...args: A) => B) => (...args: A): B => {
      lookups.count++
      return f(...args)
    }
    return StoredResponses.of({
      ...store,
      find: counted(store.find),
      chain: counted(store.chain),
      present: counted(store.present)
    })
  })
).pipe(Layer.provideMerge(StoredResponses.layer))

layer(TestServerLive({ storedResponsesMaxBytes: 20_000 }, { storedResponses: CountedStore }), {
  excludeTestServices: true,
  timeout: 120_000
})(
  "admission and quota",
  (it) => {
    it.effect("an unknown previous_response_id: the rate limit first, then 400 after a few lookups", () =>
      Effect.gen(function*() {
        const { apiKey } = yield* caller("bounds-admit@example.com", {
          environment: "test",
          key: { rate_limit_rpm: 5 }
        })
        lookups.count = 0
        const replies = []
        for (let i = 0; i < 12; i++) {
          replies.push(
            yield* modelCall(apiKey, "/v1/responses", {
              model: MODEL,
              previous_response_id: `resp_${"x".repeat(20)}${String(i).padStart(4, "0")}`,
              input: "Hello?"
            })
          )
        }
        expect(replies.map((reply) => reply.status)).toEqual([...Array(5).fill(400), ...Array(7).fill(429)])
        for (const reply of replies.slice(0, 5)) badPrevious(reply)
        // Refused calls looked nothing up; each admitted one a handful of times, never a poll.
        expect(lookups.count).toBeLessThanOrEqual(5 * 6)
        expect(lookups.count).toBeGreaterThanOrEqual(5)
      }))

    it.effect("past STORED_RESPONSES_MAX_BYTES an account's oldest responses are deleted first", () =>
      Effect.gen(function*() {
        const { accountId, apiKey } = yield* caller("bounds-quota@example.com", { environment: "test" })
        const other = yield* caller("bounds-quota-other@example.com", { environment: "test" })
        const mine = []
        for (let i = 0; i < 5; i++) {
          const reply = yield* modelCall(apiKey, "/v1/responses", { model: MODEL, input: noise(6_000) })
          expect(reply.status, reply.text).toBe(200)
          mine.push(reply.body.id as string)
          yield* (yield* TestServer).settled
        }
        const theirs = yield* modelCall(other.apiKey, "/v1/responses", { model: MODEL, input: noise(6_000) })
        yield* (yield* TestServer).settled
        const rows = yield* query<{ id: string; bytes: string }>(
          "SELECT id, bytes FROM stored_responses WHERE account_id = $1 ORDER BY created_at",
          [accountId]
        )
        // The newest that fit 20,000 bytes are kept (turns of over 6,000 bytes: at most three); the oldest went.
        const kept = rows.reduce((sum, row) => sum + Number(row.bytes), 0)
        expect(rows.length).toBeGreaterThan(0)
        expect(rows.length).toBeLessThanOrEqual(3)
        expect(rows.map((row) => row.id)).toEqual(mine.slice(mine.length - rows.length))
        expect(kept).toBeLessThanOrEqual(20_000)
        // Only as many went as had to: one more of the same size would not fit.
        expect(kept + kept / rows.length).toBeGreaterThan(20_000)
        const statuses = []
        for (const id of mine) statuses.push((yield* call("GET", `/v1/responses/${id}`, { token: apiKey })).status)
        expect(statuses).toEqual(mine.map((_, i) => i < mine.length - rows.length ? 404 : 200))
        // Another account's quota is its own.
        expect((yield* call("GET", `/v1/responses/${theirs.body.id}`, { token: other.apiKey })).status).toBe(200)
      }))
  }
)
