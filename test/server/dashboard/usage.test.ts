import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { randomUUID } from "node:crypto"
import { call, createKey, devToken } from "../../support/Http.js"
import { onDatabase, TestServer, TestServerLive } from "../../support/TestServer.js"

const HOUR = 60 * 60 * 1000
const DAY = 24 * HOUR
/** Kuala Lumpur is UTC+8 all year. */
const KL_OFFSET = 8 * HOUR

/** Nothing writes request logs yet: tests place them directly in the database. */
interface LogSeed {
  readonly accountId: string
  readonly apiKeyId: string
  readonly createdAt: string | number
  readonly requestId?: string
  readonly status?: "pending" | "succeeded" | "failed" | "billed"
  readonly endpoint?: string
  readonly publicModel?: string
  readonly inputTokens?: number
  readonly outputTokens?: number
  readonly reasoningTokens?: number
  readonly cachedTokens?: number
  readonly usageSource?: "provider" | "estimated"
  readonly searchCount?: number
  readonly contentPages?: number
  readonly costMicroMyr?: number
  readonly latencyMs?: number
  readonly stream?: boolean
  readonly routingCategory?: string
  readonly errorCode?: string
}

/** Inserts the logs and returns their request ids, in the order given. */
const insertLogs = (logs: ReadonlyArray<LogSeed>) =>
  onDatabase(async (client) => {
    const ids: Array<string> = []
    for (const log of logs) {
      const requestId = log.requestId ?? `req_${randomUUID()}`
      ids.push(requestId)
      await client.query(
        `INSERT INTO request_logs (request_id, account_id, api_key_id, public_model, endpoint, status,
           input_tokens, output_tokens, reasoning_tokens, cached_tokens, usage_source, search_count,
           content_pages, cost_micro_myr, latency_ms, created_at, stream, routing_category, error_code)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)`,
        [
          requestId,
          log.accountId,
          log.apiKeyId,
          log.publicModel ?? "svc/nenas-flash",
          log.endpoint ?? "/v1/responses",
          log.status ?? "billed",
          log.inputTokens ?? 0,
          log.outputTokens ?? 0,
          log.reasoningTokens ?? 0,
          log.cachedTokens ?? 0,
          log.usageSource ?? "provider",
          log.searchCount ?? 0,
          log.contentPages ?? 0,
          log.costMicroMyr ?? 0,
          log.latencyMs ?? 0,
          new Date(log.createdAt).toISOString(),
          log.stream ?? false,
          log.routingCategory ?? null,
          log.errorCode ?? null
        ]
      )
    }
    return ids
  })

/** A signed-in developer with one key, and the account id behind them. */
const developer = (email: string) =>
  Effect.gen(function*() {
    const token = yield* devToken(email)
    const { key } = yield* createKey(token)
    const accountId = yield* onDatabase(async (client) => {
      const { rows } = await client.query("SELECT account_id FROM api_keys WHERE id = $1", [key.id])
      return rows[0].account_id as string
    })
    return { token, keyId: key.id, accountId }
  })

const get = (path: string, token: string) =>
  Effect.map(call("GET", path, { token }), (reply) => {
    if (reply.status !== 200) throw new Error(`GET ${path}: ${reply.status} ${reply.text}`)
    return reply.body
  })

const ids = (body: { logs: ReadonlyArray<{ requestId: string }> }) => body.logs.map((log) => log.requestId)

interface Point {
  readonly bucket: string
  readonly requests: number
  readonly costMicroMyr: number
  readonly inputTokens: number
  readonly outputTokens: number
  readonly reasoningTokens: number
  readonly cacheHits: number
  readonly cacheSavedMicroMyr: number
  readonly byokCalls: number
  readonly byokFeeMicroMyr: number
}

const point = (bucket: string, values: Partial<Omit<Point, "bucket">> = {}): Point => ({
  bucket,
  requests: 0,
  costMicroMyr: 0,
  inputTokens: 0,
  outputTokens: 0,
  reasoningTokens: 0,
  cacheHits: 0,
  cacheSavedMicroMyr: 0,
  byokCalls: 0,
  byokFeeMicroMyr: 0,
  ...values
})

/** The Kuala Lumpur calendar date of an instant, `YYYY-MM-DD`. */
const klDate = (ms: number) => new Date(ms + KL_OFFSET).toISOString().slice(0, 10)
/** The instant of the Kuala Lumpur midnight that starts the day holding `ms`. */
const klMidnight = (ms: number) => Math.floor((ms + KL_OFFSET) / DAY) * DAY - KL_OFFSET

const expectInvalid = (reply: { status: number; body: any }, param: string) => {
  expect(reply.status).toBe(400)
  expect(reply.body.error.code).toBe("invalid_request")
  expect(reply.body.error.param).toBe(param)
}

// The logs these tests write by hand include a `pending` row weeks old with no reservation: the sweeper (every 2 s by
// default) would close it as an orphan mid-test. These tests are about reads; the sweeper's own tests are elsewhere.
layer(TestServerLive({ reservationSweepIntervalMs: 3_600_000 }), { excludeTestServices: true })(
  "usage (Asia/Kuala_Lumpur)",
  (it) => {
    describe("GET /dashboard/logs", () => {
      it.effect("lists newest first, one page at a time, with every field of the log", () =>
        Effect.gen(function*() {
          const { token, keyId, accountId } = yield* developer("logs-pages@example.com")
          const base = Date.parse("2026-11-10T00:00:00Z")
          // Two logs share a timestamp: the later request id comes first.
          const seeded = yield* insertLogs([
            { accountId, apiKeyId: keyId, createdAt: base, requestId: "req_page_a" },
            { accountId, apiKeyId: keyId, createdAt: base + 60_000, requestId: "req_page_b" },
            { accountId, apiKeyId: keyId, createdAt: base + 120_000, requestId: "req_page_c1" },
            { accountId, apiKeyId: keyId, createdAt: base + 120_000, requestId: "req_page_c2" },
            {
              accountId,
              apiKeyId: keyId,
              createdAt: base + 180_000,
              requestId: "req_page_d",
              publicModel: "svc/nenas-flash",
              endpoint: "/v1/chat/completions",
              status: "billed",
              inputTokens: 120,
              outputTokens: 45,
              reasoningTokens: 7,
              cachedTokens: 30,
              usageSource: "estimated",
              searchCount: 2,
              contentPages: 3,
              costMicroMyr: 1234,
              latencyMs: 812,
              stream: true,
              routingCategory: "search"
            }
          ])
          expect(seeded).toHaveLength(5)

          const page1 = yield* get("/dashboard/logs?limit=2", token)
          expect(ids(page1)).toEqual(["req_page_d", "req_page_c2"])
          expect(page1.total).toBe(5)
          expect(page1.has_more).toBe(true)
          expect(page1.logs[0]).toEqual({
            requestId: "req_page_d",
            apiKeyId: keyId,
            publicModel: "svc/nenas-flash",
            endpoint: "/v1/chat/completions",
            stream: true,
            status: "billed",
            routingCategory: "search",
            errorCode: null,
            environment: "live",
            metadata: null,
            user: null,
            inputTokens: 120,
            outputTokens: 45,
            reasoningTokens: 7,
            cachedTokens: 30,
            usageSource: "estimated",
            searchCount: 2,
            contentPages: 3,
            costMicroMyr: 1234,
            latencyMs: 812,
            // A row written without upstream attempts (a call before fallbacks, or a test key's).
            attempts: [],
            // A call with no guardrail policy.
            guardrails: null,
            createdAt: "2026-11-10T00:03:00.000Z",
            // A log row written without its call's stored response (test/storedResponses*.test.ts link them).
            storedResponseId: null,
            // A call that did not ask the response cache.
            cache: null,
            cacheSourceRequestId: null,
            cacheSavedMicroMyr: 0,
            // A call nenas's own upstream answered.
            providerKeyId: null,
            byokFeeMicroMyr: 0
          })

          const page2 = yield* get("/dashboard/logs?limit=2&page=2", token)
          expect(ids(page2)).toEqual(["req_page_c1", "req_page_b"])
          expect(page2.total).toBe(5)
          expect(page2.has_more).toBe(true)

          const page3 = yield* get("/dashboard/logs?limit=2&page=3", token)
          expect(ids(page3)).toEqual(["req_page_a"])
          expect(page3.has_more).toBe(false)

          const beyond = yield* get("/dashboard/logs?limit=2&page=4", token)
          expect(beyond).toEqual({ logs: [], total: 5, has_more: false, next_cursor: null })

          const exact = yield* get("/dashboard/logs?limit=5", token)
          expect(exact.has_more).toBe(false)
          const all = yield* get("/dashboard/logs", token)
          expect(ids(all)).toEqual(["req_page_d", "req_page_c2", "req_page_c1", "req_page_b", "req_page_a"])
          expect(all.has_more).toBe(false)
        }))

      it.effect("filters by status, key, endpoint and time range, together or alone", () =>
        Effect.gen(function*() {
          const { token, keyId, accountId } = yield* developer("logs-filters@example.com")
          const { key: other } = yield* createKey(token, { name: "second" })
          const t = (iso: string) => Date.parse(iso)
          const [early, failed, chat, pending, late] = yield* insertLogs([
            { accountId, apiKeyId: keyId, createdAt: t("2026-11-01T00:00:00Z"), status: "billed" },
            { accountId, apiKeyId: keyId, createdAt: t("2026-11-02T00:00:00Z"), status: "failed" },
            {
              accountId,
              apiKeyId: other.id,
              createdAt: t("2026-11-03T00:00:00Z"),
              endpoint: "/v1/chat/completions",
              status: "succeeded"
            },
            { accountId, apiKeyId: other.id, createdAt: t("2026-11-04T00:00:00Z"), status: "pending" },
            {
              accountId,
              apiKeyId: keyId,
              createdAt: t("2026-11-05T00:00:00Z"),
              endpoint: "/v1/chat/completions",
              status: "billed"
            }
          ])

          const byStatus = yield* get("/dashboard/logs?status=billed", token)
          expect(ids(byStatus)).toEqual([late, early])
          expect(byStatus.total).toBe(2)
          expect(ids(yield* get("/dashboard/logs?status=failed", token))).toEqual([failed])
          expect(ids(yield* get("/dashboard/logs?status=pending", token))).toEqual([pending])

          const byKey = yield* get(`/dashboard/logs?api_key_id=${other.id}`, token)
          expect(ids(byKey)).toEqual([pending, chat])
          expect(byKey.total).toBe(2)
          expect(ids(yield* get(`/dashboard/logs?api_key_id=${keyId}`, token))).toEqual([late, failed, early])

          const byEndpoint = yield* get(`/dashboard/logs?endpoint=${encodeURIComponent("/v1/chat/completions")}`, token)
          expect(ids(byEndpoint)).toEqual([late, chat])

          // `from` is inclusive, `to` exclusive.
          const range = yield* get("/dashboard/logs?from=2026-11-02T00:00:00Z&to=2026-11-04T00:00:00Z", token)
          expect(ids(range)).toEqual([chat, failed])
          expect(range.total).toBe(2)
          expect(ids(yield* get("/dashboard/logs?from=2026-11-04T00:00:00.001Z", token))).toEqual([late])
          expect(ids(yield* get("/dashboard/logs?to=2026-11-02T00:00:00.001Z", token))).toEqual([failed, early])

          const combined = yield* get(
            `/dashboard/logs?api_key_id=${keyId}&endpoint=${
              encodeURIComponent("/v1/chat/completions")
            }&status=billed&from=2026-11-05T00:00:00Z`,
            token
          )
          expect(ids(combined)).toEqual([late])
          const none = yield* get(`/dashboard/logs?api_key_id=${other.id}&status=failed`, token)
          expect(none).toEqual({ logs: [], total: 0, has_more: false, next_cursor: null })
        }))

      it.effect("logs of a deleted key stay visible under its id; an unknown key id answers 404", () =>
        Effect.gen(function*() {
          const { token, accountId } = yield* developer("logs-deleted-key@example.com")
          const { key: doomed } = yield* createKey(token, { name: "doomed" })
          const [logged] = yield* insertLogs([{ accountId, apiKeyId: doomed.id, createdAt: "2026-11-06T00:00:00Z" }])
          expect((yield* call("DELETE", `/dashboard/api-keys/${doomed.id}`, { token })).status).toBe(200)

          const kept = yield* get(`/dashboard/logs?api_key_id=${doomed.id}`, token)
          expect(ids(kept)).toEqual([logged])
          const usage = yield* get(
            `/dashboard/usage?api_key_id=${doomed.id}&from=2026-11-05T16:00:00Z&to=2026-11-06T16:00:00Z`,
            token
          )
          expect(usage.series).toEqual([point("2026-11-06T00:00:00+08:00", { requests: 1 })])

          for (const path of ["/dashboard/logs?api_key_id=key_nope", "/dashboard/usage?api_key_id=key_nope"]) {
            const unknown = yield* call("GET", path, { token })
            expect(unknown.status).toBe(404)
            expect(unknown.body.error.code).toBe("not_found")
            expect(unknown.body.error.param).toBe("api_key_id")
          }
        }))

      it.effect("from at or after to, or an instant out of range, answers 400 on logs and usage", () =>
        Effect.gen(function*() {
          const token = yield* devToken("logs-range@example.com")
          for (const endpoint of ["/dashboard/logs", "/dashboard/usage"]) {
            const equal = yield* call("GET", `${endpoint}?from=2026-11-02T00:00:00Z&to=2026-11-02T00:00:00Z`, { token })
            expectInvalid(equal, "from")
            const reversed = yield* call("GET", `${endpoint}?from=2026-11-03T00:00:00Z&to=2026-11-02T00:00:00Z`, {
              token
            })
            expectInvalid(reversed, "from")
          }
          // Usage's default `to` is now: a `from` in the future is after it.
          const future = yield* call("GET", "/dashboard/usage?from=2999-01-01T00:00:00Z", { token })
          expectInvalid(future, "from")
          // Instants PostgreSQL cannot hold are refused, not a server error.
          expectInvalid(yield* call("GET", "/dashboard/logs?from=-200000-01-01T00:00:00Z", { token }), "from")
          expectInvalid(
            yield* call("GET", `/dashboard/usage?to=${encodeURIComponent("+275000-01-01T00:00:00Z")}`, { token }),
            "to"
          )
        }))
    })

    describe("isolation between accounts", () => {
      it.effect("account B sees none of A's logs or usage and cannot name A's key", () =>
        Effect.gen(function*() {
          const alice = yield* developer("usage-alice@example.com")
          const bob = yield* developer("usage-bob@example.com")
          const [alicesLog] = yield* insertLogs([
            {
              accountId: alice.accountId,
              apiKeyId: alice.keyId,
              createdAt: "2026-11-07T01:00:00Z",
              inputTokens: 10,
              costMicroMyr: 500
            }
          ])
          const range = "from=2026-11-06T16:00:00Z&to=2026-11-07T16:00:00Z"

          expect(yield* get("/dashboard/logs", bob.token)).toEqual({
            logs: [],
            total: 0,
            has_more: false,
            next_cursor: null
          })
          const bobsUsage = yield* get(`/dashboard/usage?${range}`, bob.token)
          expect(bobsUsage.series).toEqual([point("2026-11-07T00:00:00+08:00")])
          for (
            const path of [`/dashboard/logs?api_key_id=${alice.keyId}`, `/dashboard/usage?api_key_id=${alice.keyId}`]
          ) {
            const reply = yield* call("GET", path, { token: bob.token })
            expect(reply.status).toBe(404)
            expect(reply.body.error.code).toBe("not_found")
            expect(reply.body.error.param).toBe("api_key_id")
          }

          expect(ids(yield* get("/dashboard/logs", alice.token))).toEqual([alicesLog])
          const alicesUsage = yield* get(`/dashboard/usage?${range}`, alice.token)
          expect(alicesUsage.series).toEqual([
            point("2026-11-07T00:00:00+08:00", { requests: 1, inputTokens: 10, costMicroMyr: 500 })
          ])
          const bobsOverview = yield* get("/dashboard/overview", bob.token)
          expect(bobsOverview.total_usage.requests).toBe(0)
        }))
    })

    describe("GET /dashboard/usage", () => {
      it.effect("day buckets start at Kuala Lumpur midnight; the series is dense and sums every request", () =>
        Effect.gen(function*() {
          const { token, keyId, accountId } = yield* developer("usage-days@example.com")
          const { key: other } = yield* createKey(token, { name: "second" })
          yield* insertLogs([
            // 23:59 on the 20th in Kuala Lumpur.
            {
              accountId,
              apiKeyId: keyId,
              createdAt: "2026-11-20T15:59:00Z",
              inputTokens: 100,
              outputTokens: 20,
              reasoningTokens: 5,
              costMicroMyr: 1000
            },
            // A failed request on the same local day: counted, at no cost.
            { accountId, apiKeyId: other.id, createdAt: "2026-11-20T03:00:00Z", status: "failed", inputTokens: 7 },
            // 00:01 on the 21st in Kuala Lumpur.
            {
              accountId,
              apiKeyId: keyId,
              createdAt: "2026-11-20T16:01:00Z",
              inputTokens: 50,
              outputTokens: 10,
              costMicroMyr: 400
            },
            {
              accountId,
              apiKeyId: other.id,
              createdAt: "2026-11-21T08:00:00Z",
              inputTokens: 1,
              outputTokens: 2,
              reasoningTokens: 3,
              costMicroMyr: 4
            },
            // Outside the range: just before `from`, and exactly at `to` (exclusive).
            { accountId, apiKeyId: keyId, createdAt: "2026-11-19T15:59:59Z", inputTokens: 999, costMicroMyr: 999 },
            { accountId, apiKeyId: keyId, createdAt: "2026-11-22T16:00:00Z", inputTokens: 999, costMicroMyr: 999 }
          ])

          const usage = yield* get(
            "/dashboard/usage?from=2026-11-19T16:00:00Z&to=2026-11-22T16:00:00Z&granularity=day",
            token
          )
          expect(usage.from).toBe("2026-11-19T16:00:00.000Z")
          expect(usage.to).toBe("2026-11-22T16:00:00.000Z")
          expect(usage.granularity).toBe("day")
          expect(usage.series).toEqual([
            point("2026-11-20T00:00:00+08:00", {
              requests: 2,
              inputTokens: 107,
              outputTokens: 20,
              reasoningTokens: 5,
              costMicroMyr: 1000
            }),
            point("2026-11-21T00:00:00+08:00", {
              requests: 2,
              inputTokens: 51,
              outputTokens: 12,
              reasoningTokens: 3,
              costMicroMyr: 404
            }),
            point("2026-11-22T00:00:00+08:00")
          ])

          const oneKey = yield* get(
            `/dashboard/usage?from=2026-11-19T16:00:00Z&to=2026-11-22T16:00:00Z&api_key_id=${other.id}`,
            token
          )
          expect(oneKey.granularity).toBe("day")
          expect(oneKey.series).toEqual([
            point("2026-11-20T00:00:00+08:00", { requests: 1, inputTokens: 7 }),
            point("2026-11-21T00:00:00+08:00", {
              requests: 1,
              inputTokens: 1,
              outputTokens: 2,
              reasoningTokens: 3,
              costMicroMyr: 4
            }),
            point("2026-11-22T00:00:00+08:00")
          ])

          // A range that starts and ends inside days: partial first and last buckets, only the range's logs.
          const partial = yield* get("/dashboard/usage?from=2026-11-20T15:00:00Z&to=2026-11-21T01:00:00Z", token)
          expect(partial.series).toEqual([
            point("2026-11-20T00:00:00+08:00", {
              requests: 1,
              inputTokens: 100,
              outputTokens: 20,
              reasoningTokens: 5,
              costMicroMyr: 1000
            }),
            point("2026-11-21T00:00:00+08:00", { requests: 1, inputTokens: 50, outputTokens: 10, costMicroMyr: 400 })
          ])
        }))

      it.effect("hour buckets start at the local hour", () =>
        Effect.gen(function*() {
          const { token, keyId, accountId } = yield* developer("usage-hours@example.com")
          yield* insertLogs([
            // 22:00 local, before `from` (22:30): outside the range although its bucket is shown.
            { accountId, apiKeyId: keyId, createdAt: "2026-11-20T14:00:00Z", inputTokens: 999 },
            { accountId, apiKeyId: keyId, createdAt: "2026-11-20T14:45:00Z", inputTokens: 1 },
            { accountId, apiKeyId: keyId, createdAt: "2026-11-20T15:59:00Z", inputTokens: 2 },
            { accountId, apiKeyId: keyId, createdAt: "2026-11-20T16:01:00Z", inputTokens: 3 },
            { accountId, apiKeyId: keyId, createdAt: "2026-11-20T16:59:59Z", inputTokens: 4 }
          ])
          const usage = yield* get(
            "/dashboard/usage?from=2026-11-20T14:30:00Z&to=2026-11-20T17:30:00Z&granularity=hour",
            token
          )
          expect(usage.granularity).toBe("hour")
          expect(usage.series).toEqual([
            point("2026-11-20T22:00:00+08:00", { requests: 1, inputTokens: 1 }),
            point("2026-11-20T23:00:00+08:00", { requests: 1, inputTokens: 2 }),
            point("2026-11-21T00:00:00+08:00", { requests: 2, inputTokens: 7 }),
            point("2026-11-21T01:00:00+08:00")
          ])
        }))

      it.effect("at most 744 hourly or 366 daily buckets", () =>
        Effect.gen(function*() {
          const token = yield* devToken("usage-limits@example.com")
          // 31 local days from a Kuala Lumpur midnight: exactly 744 hours.
          const month = yield* get(
            "/dashboard/usage?from=2026-10-31T16:00:00Z&to=2026-12-01T16:00:00Z&granularity=hour",
            token
          )
          expect(month.series).toHaveLength(744)
          expect(month.series[0].bucket).toBe("2026-11-01T00:00:00+08:00")
          expect(month.series[743].bucket).toBe("2026-12-01T23:00:00+08:00")
          const oneMore = yield* call(
            "GET",
            "/dashboard/usage?from=2026-10-31T16:00:00Z&to=2026-12-01T16:00:00.001Z&granularity=hour",
            { token }
          )
          expectInvalid(oneMore, "from")
          expect(oneMore.body.error.message).toContain("744")
          const fortyDays = yield* call(
            "GET",
            "/dashboard/usage?from=2026-10-01T00:00:00Z&to=2026-11-10T00:00:00Z&granularity=hour",
            { token }
          )
          expectInvalid(fortyDays, "from")

          const year = yield* get("/dashboard/usage?from=2026-12-31T16:00:00Z&to=2028-01-01T16:00:00Z", token)
          expect(year.series).toHaveLength(366)
          expect(year.series[0].bucket).toBe("2027-01-01T00:00:00+08:00")
          expect(year.series[365].bucket).toBe("2028-01-01T00:00:00+08:00")
          const tooLong = yield* call(
            "GET",
            "/dashboard/usage?from=2026-12-31T16:00:00Z&to=2028-01-02T16:00:00Z&granularity=day",
            { token }
          )
          expectInvalid(tooLong, "from")
          expect(tooLong.body.error.message).toContain("366")
        }))

      it.effect("defaults to the last 7 days by day, ending now", () =>
        Effect.gen(function*() {
          const { clock } = yield* TestServer
          const { token, keyId, accountId } = yield* developer("usage-defaults@example.com")
          const before = clock.unsafeCurrentTimeMillis()
          const [recent, old] = [before - 2 * HOUR, before - 8 * DAY]
          yield* insertLogs([
            { accountId, apiKeyId: keyId, createdAt: recent, inputTokens: 11, costMicroMyr: 22 },
            { accountId, apiKeyId: keyId, createdAt: old, inputTokens: 999, costMicroMyr: 999 }
          ])
          const usage = yield* get("/dashboard/usage", token)
          const after = clock.unsafeCurrentTimeMillis()

          const to = Date.parse(usage.to)
          expect(to).toBeGreaterThanOrEqual(before)
          expect(to).toBeLessThanOrEqual(after)
          expect(Date.parse(usage.from)).toBe(to - 7 * DAY)
          expect(usage.granularity).toBe("day")

          const days = Math.round((klMidnight(to - 1) - klMidnight(to - 7 * DAY)) / DAY) + 1
          expect(days === 7 || days === 8).toBe(true)
          expect(usage.series).toHaveLength(days)
          expect(usage.series[0].bucket).toBe(`${klDate(to - 7 * DAY)}T00:00:00+08:00`)
          expect(usage.series.at(-1).bucket).toBe(`${klDate(to - 1)}T00:00:00+08:00`)
          const withRequests = usage.series.filter((p: Point) => p.requests > 0)
          expect(withRequests).toEqual([
            point(`${klDate(recent)}T00:00:00+08:00`, { requests: 1, inputTokens: 11, costMicroMyr: 22 })
          ])
        }))
    })

    describe("GET /dashboard/overview", () => {
      it.effect("a new account: an empty wallet, no keys, 30 empty days ending today", () =>
        Effect.gen(function*() {
          const { clock } = yield* TestServer
          const token = yield* devToken("overview-new@example.com")
          const overview = yield* get("/dashboard/overview", token)
          const now = clock.unsafeCurrentTimeMillis()
          const zero = {
            requests: 0,
            inputTokens: 0,
            outputTokens: 0,
            reasoningTokens: 0,
            searchCount: 0,
            contentPages: 0,
            costMicroMyr: 0,
            cacheHits: 0,
            cacheSavedMicroMyr: 0,
            byokCalls: 0,
            byokFeeMicroMyr: 0
          }
          expect(overview.wallet).toEqual({
            availableMicroMyr: 0,
            reservedMicroMyr: 0,
            lifetimeTopupMicroMyr: 0,
            lifetimeSpendMicroMyr: 0
          })
          expect(overview.today_usage).toEqual(zero)
          expect(overview.total_usage).toEqual(zero)
          expect(overview.api_key_count).toBe(0)
          expect(overview.active_api_key_count).toBe(0)
          expect(overview.daily_series).toHaveLength(30)
          expect(overview.daily_series.at(-1)).toEqual(point(`${klDate(now)}T00:00:00+08:00`))
          expect(overview.daily_series[0]).toEqual(point(`${klDate(now - 29 * DAY)}T00:00:00+08:00`))
          expect(overview.daily_series.every((p: Point) => p.requests === 0)).toBe(true)
        }))

      it.effect("today's and the last 30 days' usage, the daily series and the wallet", () =>
        Effect.gen(function*() {
          const { clock } = yield* TestServer
          const { token, keyId, accountId } = yield* developer("overview-usage@example.com")
          const today = klMidnight(clock.unsafeCurrentTimeMillis())
          const windowStart = today - 29 * DAY
          yield* insertLogs([
            {
              accountId,
              apiKeyId: keyId,
              createdAt: today + 1000,
              inputTokens: 100,
              outputTokens: 40,
              reasoningTokens: 8,
              searchCount: 2,
              contentPages: 3,
              costMicroMyr: 5000
            },
            { accountId, apiKeyId: keyId, createdAt: today + 2000, status: "failed", inputTokens: 10 },
            {
              accountId,
              apiKeyId: keyId,
              createdAt: today - 1000,
              inputTokens: 1,
              outputTokens: 2,
              reasoningTokens: 3,
              searchCount: 4,
              contentPages: 5,
              costMicroMyr: 6
            },
            { accountId, apiKeyId: keyId, createdAt: windowStart, inputTokens: 7, costMicroMyr: 70 },
            // The day before the window.
            { accountId, apiKeyId: keyId, createdAt: windowStart - 1000, inputTokens: 999, costMicroMyr: 999 }
          ])
          yield* onDatabase((client) =>
            client.query(
              `UPDATE wallets SET available_micro_myr = 9000000, reserved_micro_myr = 250000,
               lifetime_topup_micro_myr = 10000000, lifetime_spend_micro_myr = 750000 WHERE account_id = $1`,
              [accountId]
            )
          )

          const overview = yield* get("/dashboard/overview", token)
          expect(overview.wallet).toEqual({
            availableMicroMyr: 9_000_000,
            reservedMicroMyr: 250_000,
            lifetimeTopupMicroMyr: 10_000_000,
            lifetimeSpendMicroMyr: 750_000
          })
          expect(overview.today_usage).toEqual({
            requests: 2,
            inputTokens: 110,
            outputTokens: 40,
            reasoningTokens: 8,
            searchCount: 2,
            contentPages: 3,
            costMicroMyr: 5000,
            cacheHits: 0,
            cacheSavedMicroMyr: 0,
            byokCalls: 0,
            byokFeeMicroMyr: 0
          })
          expect(overview.total_usage).toEqual({
            requests: 4,
            inputTokens: 118,
            outputTokens: 42,
            reasoningTokens: 11,
            searchCount: 6,
            contentPages: 8,
            costMicroMyr: 5076,
            cacheHits: 0,
            cacheSavedMicroMyr: 0,
            byokCalls: 0,
            byokFeeMicroMyr: 0
          })
          const series: ReadonlyArray<Point> = overview.daily_series
          expect(series).toHaveLength(30)
          expect(series[29]).toEqual(point(`${klDate(today)}T00:00:00+08:00`, {
            requests: 2,
            inputTokens: 110,
            outputTokens: 40,
            reasoningTokens: 8,
            costMicroMyr: 5000
          }))
          expect(series[28]).toEqual(point(`${klDate(today - DAY)}T00:00:00+08:00`, {
            requests: 1,
            inputTokens: 1,
            outputTokens: 2,
            reasoningTokens: 3,
            costMicroMyr: 6
          }))
          expect(series[0]).toEqual(
            point(`${klDate(windowStart)}T00:00:00+08:00`, { requests: 1, inputTokens: 7, costMicroMyr: 70 })
          )
          expect(series.slice(1, 28).every((p) => p.requests === 0)).toBe(true)
          expect(overview.api_key_count).toBe(1)
          expect(overview.active_api_key_count).toBe(1)
        }))

      // Last: it moves the server's clock forward for the rest of the file.
      it.effect("counts keys, and as active only those that work now: not disabled, not past expires_at, not deleted", () =>
        Effect.gen(function*() {
          const { clock } = yield* TestServer
          const { token } = yield* developer("overview-keys@example.com")
          const expiresAt = new Date(clock.unsafeCurrentTimeMillis() + HOUR).toISOString()
          yield* createKey(token, { name: "short-lived", expires_at: expiresAt })
          const { key: deleted } = yield* createKey(token, { name: "deleted" })
          expect((yield* call("DELETE", `/dashboard/api-keys/${deleted.id}`, { token })).status).toBe(200)
          const { key: disabled } = yield* createKey(token, { name: "disabled" })
          const disabling = yield* call("PATCH", `/dashboard/api-keys/${disabled.id}`, {
            token,
            json: { disabled: true }
          })
          expect(disabling.status, disabling.text).toBe(200)

          const before = yield* get("/dashboard/overview", token)
          expect(before.api_key_count).toBe(3)
          expect(before.active_api_key_count).toBe(2)
          clock.advance("61 minutes")
          const after = yield* get("/dashboard/overview", token)
          expect(after.api_key_count).toBe(3)
          expect(after.active_api_key_count).toBe(1)
        }))
    })
  }
)

layer(TestServerLive({ businessTimezone: "America/New_York" }), { excludeTestServices: true })(
  "usage (America/New_York)",
  (it) => {
    it.effect("buckets carry the offset of their own start across a DST change", () =>
      Effect.gen(function*() {
        const { token, keyId, accountId } = yield* developer("usage-new-york@example.com")
        // 23:30 on 1 November in New York (EST, UTC-5): 04:30 UTC on the 2nd.
        yield* insertLogs([{ accountId, apiKeyId: keyId, createdAt: "2026-11-02T04:30:00Z", inputTokens: 5 }])
        // DST ends at 02:00 on 1 November 2026: midnight that day is still EDT.
        const usage = yield* get("/dashboard/usage?from=2026-10-31T04:00:00Z&to=2026-11-03T05:00:00Z", token)
        expect(usage.series).toEqual([
          point("2026-10-31T00:00:00-04:00"),
          point("2026-11-01T00:00:00-04:00", { requests: 1, inputTokens: 5 }),
          point("2026-11-02T00:00:00-05:00")
        ])
      }))
  }
)
