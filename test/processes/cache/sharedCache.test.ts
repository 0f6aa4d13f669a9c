import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { call } from "../../support/Http.js"
import { caller, modelCall, walletOf } from "../../support/Models.js"
import { realSleep } from "../../support/RealTime.js"
import { query, TestServer } from "../../support/TestServer.js"
import { bothListening, DEADLINE_MS, Instances, on, seenWithin, TwoInstancesLive } from "../../support/TwoInstances.js"

/**
 * The response cache across instances (docs/api/cache.md, "What is stored" and "Emptying it"): an answer
 * stored by one is a hit on the other after the next flush, an emptied cache is emptied on both, and the
 * per-account bound drops the least recently used answers.
 */

/** Each account's bound: a handful of short answers. */
const MAX_BYTES = 4096
/** Longer than one flush (100 ms), with room for a busy machine. */
const FLUSHED_MS = 400

const ask = (input: string) => ({ model: "svc/nenas-flash", input, max_output_tokens: 16 })
const CACHED = { "Nenas-Cache": "on" }

/** The account's stored answers, by the request that made each. */
const storedOf = (accountId: string) =>
  query<{ source_request_id: string; bytes: number }>(
    "SELECT source_request_id, bytes FROM response_cache WHERE account_id = $1",
    [accountId]
  )

layer(TwoInstancesLive("cache", { cacheMaxBytes: MAX_BYTES }), { excludeTestServices: true, timeout: 120_000 })(
  (it) => {
    it.effect("an answer stored by one instance is a hit on the other, unbilled; emptied through one, both miss", () =>
      Effect.gen(function*() {
        yield* bothListening
        const { a, b } = yield* Instances
        const { accountId, apiKey, token } = yield* on(a)(caller("cache-shared@example.com", { sen: 1000 }))
        const first = yield* on(a)(modelCall(apiKey, "/v1/responses", ask("Shared between instances?"), CACHED))
        expect(first.status, first.text).toBe(200)
        expect(first.headers.get("nenas-cache")).toBe("MISS")
        const spent = (yield* walletOf(accountId)).spent
        expect(spent).toBeGreaterThan(0)
        yield* realSleep(FLUSHED_MS)

        const second = yield* on(b)(modelCall(apiKey, "/v1/responses", ask("Shared between instances?"), CACHED))
        expect(second.headers.get("nenas-cache")).toBe("HIT")
        expect((second.body as any).output_text).toBe((first.body as any).output_text)
        expect((yield* walletOf(accountId)).spent, "a hit bills nothing").toBe(spent)
        const logs = (yield* on(b)(call("GET", "/dashboard/logs?limit=5", { token }))).body.logs
        expect(logs[0]).toMatchObject({
          requestId: second.headers.get("x-request-id"),
          cache: "hit",
          costMicroMyr: 0,
          cacheSourceRequestId: first.headers.get("x-request-id")
        })

        const emptiedAt = Date.now()
        const emptied = yield* on(b)(call("DELETE", "/dashboard/cache", { token }))
        expect(emptied.status, emptied.text).toBe(200)
        expect(emptied.body).toEqual({ deleted: 1 })
        // The instance that answered first held the answer in its front: it drops it when it hears of it.
        const missedAfter = yield* seenWithin(
          emptiedAt,
          on(a)(modelCall(apiKey, "/v1/responses", ask("Shared between instances?"), CACHED)),
          (reply) => reply.headers.get("nenas-cache") === "MISS"
        )
        expect(missedAfter).toBeLessThanOrEqual(DEADLINE_MS)
      }))

    it.effect("past CACHE_MAX_BYTES an account's least recently used answers are dropped, its recent ones kept", () =>
      Effect.gen(function*() {
        const { clock } = yield* TestServer
        const { a } = yield* Instances
        const { accountId, apiKey } = yield* on(a)(caller("cache-bound@example.com", { sen: 1000 }))
        const store = (input: string) =>
          Effect.gen(function*() {
            const reply = yield* on(a)(modelCall(apiKey, "/v1/responses", ask(input), CACHED))
            expect(reply.headers.get("nenas-cache"), reply.text).toBe("MISS")
            yield* realSleep(FLUSHED_MS)
            return reply.headers.get("x-request-id")!
          })
        const total = Effect.map(storedOf(accountId), (rows) => rows.reduce((sum, row) => sum + row.bytes, 0))

        // Filled to within one answer of the bound: nothing is dropped yet.
        const filled: Array<string> = []
        while (filled.length < 20) {
          filled.push(yield* store(`Answer number ${filled.length + 1}?`))
          const rows = yield* storedOf(accountId)
          expect(rows).toHaveLength(filled.length)
          expect(Math.max(...rows.map((row) => row.bytes))).toBeLessThan(MAX_BYTES / 4)
          if ((yield* total) > MAX_BYTES - MAX_BYTES / 4) break
        }
        expect(filled.length).toBeGreaterThanOrEqual(3)
        const [oldest, leastRecent] = filled as [string, string]

        // The oldest is used again; the second oldest is now the least recently used.
        clock.advance("1 second")
        expect((yield* on(a)(modelCall(apiKey, "/v1/responses", ask("Answer number 1?"), CACHED))).headers
          .get("nenas-cache")).toBe("HIT")
        yield* realSleep(FLUSHED_MS)

        const later: Array<string> = []
        while ((yield* storedOf(accountId)).some((row) => row.source_request_id === leastRecent)) {
          expect(later.length, "the bound never dropped anything").toBeLessThan(5)
          // The bound is checked at most once a second per account.
          clock.advance("2 seconds")
          later.push(yield* store(`A later answer ${later.length + 1}?`))
        }
        const kept = (yield* storedOf(accountId)).map((row) => row.source_request_id)
        expect(yield* total).toBeLessThanOrEqual(MAX_BYTES)
        expect(kept, "used again, so kept").toContain(oldest)
        expect(kept, "the newest is kept").toContain(later.at(-1))
        expect(kept).not.toContain(leastRecent)
      }))
  }
)
