import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { execFile } from "node:child_process"
import { promisify } from "node:util"
import { call, createKey, devToken } from "../../support/Http.js"
import { modelCall } from "../../support/Models.js"
import { topUp } from "../../support/Stripe.js"
import { query, TestServer, TestServerLive } from "../../support/TestServer.js"
import { ASK, Instances, on, TwoInstancesLive } from "../../support/TwoInstances.js"

/** One seeded call, placed directly in the database (the triggers keep the rollups). */
interface Seed {
  readonly id: string
  readonly keyId: string
  readonly at: string
  readonly status: "pending" | "succeeded" | "failed" | "billed"
  readonly cost: number
  readonly input: number
  readonly output: number
  readonly environment?: "live" | "test"
  readonly endpoint?: string
}

const seed = (accountId: string, rows: ReadonlyArray<Seed>) =>
  Effect.forEach(rows, (row) =>
    query(
      `INSERT INTO request_logs (request_id, account_id, api_key_id, public_model, endpoint, status, input_tokens,
         output_tokens, cost_micro_myr, created_at, environment, error_code)
       VALUES ($1, $2, $3, 'svc/nenas-flash', $4, $5, $6, $7, $8, $9, $10, $11)`,
      [
        row.id,
        accountId,
        row.keyId,
        row.endpoint ?? "/v1/responses",
        row.status,
        row.input,
        row.output,
        row.cost,
        row.at,
        row.environment ?? "live",
        row.status === "failed" ? "upstream_error" : null
      ]
    ))

const get = (path: string, token: string) =>
  Effect.map(call("GET", path, { token }), (reply) => {
    if (reply.status !== 200) throw new Error(`GET ${path}: ${reply.status} ${reply.text}`)
    return reply.body
  })

interface Point {
  readonly bucket: string
  readonly requests: number
  readonly costMicroMyr: number
  readonly inputTokens: number
  readonly outputTokens: number
}

const points = (body: { series: ReadonlyArray<Point> }) =>
  body.series.map(({ bucket, costMicroMyr, inputTokens, outputTokens, requests }) => ({
    bucket,
    requests,
    costMicroMyr,
    inputTokens,
    outputTokens
  }))

const usage = (token: string, params: Record<string, string>) =>
  Effect.map(get(`/dashboard/usage?${new URLSearchParams(params)}`, token), points)

const total = (token: string, params: Record<string, string>) =>
  Effect.map(get(`/dashboard/logs?${new URLSearchParams(params)}`, token), (body) => body.total as number)

/** The rollups, and the same sums aggregated straight from the logs: equal when the rollups are right. */
const rollupsAndLogs = Effect.gen(function*() {
  const key = "account_id, bucket, api_key_id, environment, endpoint"
  const counters = (source: "rollups" | "logs") =>
    source === "rollups"
      ? `requests, pending, succeeded, failed, billed, input_tokens, output_tokens, reasoning_tokens, cached_tokens,
         search_count, content_pages, cost_micro_myr`
      : `count(*) AS requests, count(*) FILTER (WHERE status = 'pending') AS pending,
         count(*) FILTER (WHERE status = 'succeeded') AS succeeded, count(*) FILTER (WHERE status = 'failed') AS failed,
         count(*) FILTER (WHERE status = 'billed') AS billed, sum(input_tokens) AS input_tokens,
         sum(output_tokens) AS output_tokens, sum(reasoning_tokens) AS reasoning_tokens,
         sum(cached_tokens) AS cached_tokens, sum(search_count) AS search_count, sum(content_pages) AS content_pages,
         sum(cost_micro_myr) AS cost_micro_myr`
  const rollups = yield* query(`
    SELECT ${key}, ${counters("rollups")} FROM usage_rollups
    WHERE requests <> 0 OR cost_micro_myr <> 0 OR input_tokens <> 0 ORDER BY ${key}`)
  const logs = yield* query(`
    SELECT account_id, date_bin('30 minutes', created_at, timestamptz '1970-01-01Z') AS bucket, api_key_id,
      environment, endpoint, ${counters("logs")}
    FROM request_logs GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5`)
  const staged = yield* query<{ n: string }>("SELECT count(*) AS n FROM usage_rollup_deltas")
  const text = (rows: ReadonlyArray<Record<string, unknown>>) =>
    rows.map((row) => Object.values(row).map(String).join("|"))
  return { rollups: text(rollups), logs: text(logs), staged: Number(staged[0]?.n) }
})

const rebuild = Effect.flatMap(
  TestServer,
  ({ databaseUrl }) =>
    Effect.promise(() =>
      promisify(execFile)("node", ["--import", "tsx", "src/Logs/RebuildRollups.ts"], {
        env: { ...process.env, DATABASE_URL: databaseUrl }
      })
    )
)

/**
 * A seeded month end in Asia/Kolkata (UTC+05:30, a half-hour zone): its local
 * midnight of 1 February is 2026-01-31T18:30Z. Every expectation is worked out
 * by hand from the seed.
 */
describe("usage rollups in a half-hour time zone", () => {
  layer(TestServerLive({ businessTimezone: "Asia/Kolkata" }), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("days, hours, edges, environments, a deleted key and log totals agree with the hand-worked sums", () =>
      Effect.gen(function*() {
        const token = yield* devToken("rollups-kolkata@example.com")
        const live = (yield* createKey(token, { name: "live", environment: "live" })).key.id
        const test = (yield* createKey(token, { name: "test", environment: "test" })).key.id
        const doomed = (yield* createKey(token, { name: "doomed", environment: "live" })).key.id
        const [{ account_id: accountId }] = yield* query<{ account_id: string }>(
          "SELECT account_id FROM api_keys WHERE id = $1",
          [live]
        ) as unknown as Effect.Effect<[{ account_id: string }]>
        yield* seed(accountId, [
          // Local 31 January.
          { id: "r7", keyId: live, at: "2026-01-30T20:00:00Z", status: "billed", cost: 300, input: 1, output: 1 },
          { id: "r5", keyId: doomed, at: "2026-01-31T17:45:00Z", status: "billed", cost: 500, input: 2, output: 2 },
          { id: "r1", keyId: live, at: "2026-01-31T18:10:00Z", status: "billed", cost: 1000, input: 10, output: 20 },
          { id: "r2", keyId: live, at: "2026-01-31T18:20:00Z", status: "failed", cost: 0, input: 5, output: 0 },
          // Local 1 February, from its midnight.
          { id: "r3", keyId: live, at: "2026-01-31T18:40:00Z", status: "billed", cost: 2000, input: 7, output: 3 },
          {
            id: "r4",
            keyId: test,
            at: "2026-01-31T19:05:00Z",
            status: "succeeded",
            cost: 0,
            input: 4,
            output: 4,
            environment: "test",
            endpoint: "/v1/chat/completions"
          },
          { id: "r6", keyId: doomed, at: "2026-02-01T03:00:00Z", status: "billed", cost: 700, input: 3, output: 3 },
          { id: "r8", keyId: live, at: "2026-02-01T18:29:59Z", status: "billed", cost: 50, input: 1, output: 1 },
          // Local 2 February, at its midnight.
          { id: "r9", keyId: live, at: "2026-02-01T18:30:00Z", status: "billed", cost: 60, input: 1, output: 1 }
        ])
        // The key is deleted with its logs in the range: they stay in every sum.
        expect((yield* call("DELETE", `/dashboard/api-keys/${doomed}`, { token })).status).toBe(200)

        const days = { from: "2026-01-30T18:30:00Z", to: "2026-02-02T18:30:00Z", granularity: "day" }
        expect(yield* usage(token, days)).toEqual([
          { bucket: "2026-01-31T00:00:00+05:30", requests: 4, costMicroMyr: 1800, inputTokens: 18, outputTokens: 23 },
          { bucket: "2026-02-01T00:00:00+05:30", requests: 4, costMicroMyr: 2750, inputTokens: 15, outputTokens: 11 },
          { bucket: "2026-02-02T00:00:00+05:30", requests: 1, costMicroMyr: 60, inputTokens: 1, outputTokens: 1 }
        ])
        expect((yield* usage(token, { ...days, environment: "test" })).map((p) => [p.requests, p.costMicroMyr]))
          .toEqual([[0, 0], [1, 0], [0, 0]])
        expect((yield* usage(token, { ...days, environment: "live" })).map((p) => [p.requests, p.costMicroMyr]))
          .toEqual([[4, 1800], [3, 2750], [1, 60]])
        expect((yield* usage(token, { ...days, api_key_id: doomed })).map((p) => [p.requests, p.costMicroMyr]))
          .toEqual([[1, 500], [1, 700], [0, 0]])

        // Local hours on half hours of UTC: 23:00 holds r1 and r2 (r5 is before `from`), 00:00 holds r3 and r4.
        expect(yield* usage(token, { from: "2026-01-31T18:00:00Z", to: "2026-01-31T19:30:00Z", granularity: "hour" }))
          .toEqual([
            { bucket: "2026-01-31T23:00:00+05:30", requests: 2, costMicroMyr: 1000, inputTokens: 15, outputTokens: 20 },
            { bucket: "2026-02-01T00:00:00+05:30", requests: 2, costMicroMyr: 2000, inputTokens: 11, outputTokens: 7 }
          ])
        // Ends inside buckets: within one bucket, and with a whole bucket between two part-buckets.
        expect((yield* usage(token, { from: "2026-01-31T18:15:00Z", to: "2026-01-31T18:45:00Z" }))
          .map((p) => [p.bucket, p.requests, p.costMicroMyr]))
          .toEqual([["2026-01-31T00:00:00+05:30", 1, 0], ["2026-02-01T00:00:00+05:30", 1, 2000]])
        expect((yield* usage(token, { from: "2026-01-31T18:15:00Z", to: "2026-01-31T19:10:00Z" }))
          .map((p) => [p.bucket, p.requests, p.costMicroMyr]))
          .toEqual([["2026-01-31T00:00:00+05:30", 1, 0], ["2026-02-01T00:00:00+05:30", 2, 2000]])

        // Log totals come from the rollups, with the same filters as the rows.
        const range = { from: days.from, to: days.to }
        expect(yield* total(token, range)).toBe(9)
        expect(yield* total(token, { ...range, status: "billed" })).toBe(7)
        expect(yield* total(token, { ...range, status: "failed" })).toBe(1)
        expect(yield* total(token, { ...range, environment: "test" })).toBe(1)
        expect(yield* total(token, { ...range, endpoint: "/v1/chat/completions" })).toBe(1)
        expect(yield* total(token, { ...range, api_key_id: doomed })).toBe(2)
        expect(yield* total(token, { from: "2026-01-31T18:15:00Z", to: "2026-01-31T19:10:00Z" })).toBe(3)
        expect(yield* total(token, {})).toBe(9)

        // A failed call turned billed late, and a row deleted, move the rollups with them.
        yield* query(
          "UPDATE request_logs SET status = 'billed', cost_micro_myr = 40, error_code = NULL WHERE request_id = 'r2'"
        )
        yield* query("DELETE FROM request_logs WHERE request_id = 'r9'")
        expect((yield* usage(token, days)).map((p) => [p.requests, p.costMicroMyr]))
          .toEqual([[4, 1840], [4, 2750], [0, 0]])
        const after = yield* rollupsAndLogs
        expect(after.rollups).toEqual(after.logs)
        expect(after.staged).toBe(0)
      }))
  })
})

describe("logs paged by cursor", () => {
  layer(TestServerLive(), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("a cursor walks the same rows as pages, in order, with next_cursor null at the end; bad cursors answer 400", () =>
      Effect.gen(function*() {
        const token = yield* devToken("rollups-paging@example.com")
        const keyId = (yield* createKey(token, { name: "live", environment: "live" })).key.id
        const [{ account_id: accountId }] = (yield* query<{ account_id: string }>(
          "SELECT account_id FROM api_keys WHERE id = $1",
          [keyId]
        )) as [{ account_id: string }]
        // Two calls in one microsecond: the id orders them.
        const at = (i: number) => new Date(Date.UTC(2026, 0, 1) + Math.floor(i / 2) * 1000).toISOString()
        yield* seed(
          accountId,
          Array.from({ length: 7 }, (_, i) => ({
            id: `p${i}`,
            keyId,
            at: at(i),
            status: i === 3 ? "failed" as const : "billed" as const,
            cost: i === 3 ? 0 : 10,
            input: 1,
            output: 1
          }))
        )
        const newestFirst = ["p6", "p5", "p4", "p3", "p2", "p1", "p0"]
        const walked: Array<string> = []
        let cursor: string | null = null
        let pages = 0
        do {
          const body: {
            logs: Array<{ requestId: string }>
            total: number
            has_more: boolean
            next_cursor: string | null
          } = yield* get(`/dashboard/logs?limit=2${cursor === null ? "" : `&cursor=${cursor}`}`, token)
          walked.push(...body.logs.map((log) => log.requestId))
          expect(body.total).toBe(7)
          expect(body.has_more).toBe(body.next_cursor !== null)
          cursor = body.next_cursor
          pages++
        } while (cursor !== null && pages < 10)
        expect(walked).toEqual(newestFirst)
        expect(pages).toBe(4)
        // Deep pages by number: the same rows.
        const page3 = yield* get("/dashboard/logs?limit=2&page=3", token)
        expect(page3.logs.map((log: { requestId: string }) => log.requestId)).toEqual(["p2", "p1"])
        expect(page3.has_more).toBe(true)
        const page5 = yield* get("/dashboard/logs?limit=2&page=5", token)
        expect(page5.logs).toEqual([])
        expect(page5.has_more).toBe(false)
        expect(page5.next_cursor).toBe(null)
        const billed = yield* get("/dashboard/logs?limit=5&status=billed", token)
        expect(billed.logs.map((log: { requestId: string }) => log.requestId)).toEqual(["p6", "p5", "p4", "p2", "p1"])
        expect(billed.total).toBe(6)
        const rest = yield* get(`/dashboard/logs?limit=5&status=billed&cursor=${billed.next_cursor}`, token)
        expect(rest.logs.map((log: { requestId: string }) => log.requestId)).toEqual(["p0"])

        for (const bad of ["cursor=notacursor", `cursor=${Buffer.from("12.x").toString("base64url")}&page=2`]) {
          const reply = yield* call("GET", `/dashboard/logs?${bad}`, { token })
          expect(reply.status).toBe(400)
          expect(reply.body.error.code).toBe("invalid_request")
          expect(reply.body.error.param).toBe("cursor")
        }
        const env = yield* call("GET", "/dashboard/logs?environment=staging", { token })
        expect(env.status).toBe(400)
        expect(env.body.error.code).toBe("invalid_request")
      }))
  })
})

/** The service's own calls on two instances at once: the flushes of both keep one set of rollups. */
describe("usage rollups under concurrent calls on two instances", () => {
  layer(TwoInstancesLive("rollups"), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect("equal a direct aggregation of the logs after the race, and after rollups:rebuild", () =>
      Effect.gen(function*() {
        const { a, b } = yield* Instances
        const token = yield* devToken("rollups-race@example.com")
        yield* topUp(token, 5000)
        const live = (yield* createKey(token, { name: "live", environment: "live" })).full_key
        const test = (yield* createKey(token, { name: "test", environment: "test" })).full_key
        const calls = Array.from({ length: 40 }, (_, i) => {
          const apiKey = i % 3 === 0 ? test : live
          const body = i % 5 === 0
            ? { ...ASK, model: "svc/no-such-model" }
            : i % 2 === 0
            ? { ...ASK, stream: true }
            : ASK
          return on(i % 2 === 0 ? a : b)(modelCall(apiKey, "/v1/responses", body))
        })
        const replies = yield* Effect.all(calls, { concurrency: 16 })
        expect(replies.filter((reply) => reply.status === 200).length).toBeGreaterThan(20)
        const [{ n }] = (yield* query<{ n: string }>("SELECT count(*) AS n FROM request_logs")) as [{ n: string }]
        expect(Number(n)).toBeGreaterThanOrEqual(replies.filter((reply) => reply.status === 200).length)

        const raced = yield* rollupsAndLogs
        expect(raced.rollups.length).toBeGreaterThan(0)
        expect(raced.rollups).toEqual(raced.logs)
        expect(raced.staged).toBe(0)

        // Rollups gone wrong (as after a restore of logs) are rebuilt; twice gives the same.
        yield* query("UPDATE usage_rollups SET requests = requests + 7, cost_micro_myr = 1")
        yield* rebuild
        yield* rebuild
        const rebuilt = yield* rollupsAndLogs
        expect(rebuilt.rollups).toEqual(raced.logs)
      }))
  })
})
