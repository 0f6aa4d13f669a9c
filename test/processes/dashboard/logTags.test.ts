import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { call } from "../../support/Http.js"
import { caller, modelCall } from "../../support/Models.js"
import { query, TestServerLive } from "../../support/TestServer.js"
import { ASK } from "../../support/TwoInstances.js"

interface Entry {
  readonly requestId: string
  readonly apiKeyId: string
  readonly environment: string
  readonly metadata: Record<string, string> | null
  readonly user: string | null
  readonly endpoint: string
  readonly routingCategory: string | null
  readonly errorCode: string | null
  readonly contentPages: number
}

const logs = (token: string, params: Record<string, string> = {}) =>
  Effect.map(call("GET", `/dashboard/logs?${new URLSearchParams(params)}`, { token }), (reply) => {
    expect(reply.status).toBe(200)
    return reply.body as { logs: ReadonlyArray<Entry>; total: number }
  })

const CHAT = { model: "svc/nenas-flash", messages: [{ role: "user", content: "Say hello in Malay." }], max_tokens: 16 }

describe("tags on calls: metadata and user", () => {
  layer(TestServerLive(), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("both model endpoints take metadata and user; logs show them with the key's environment, and filter by one tag", () =>
      Effect.gen(function*() {
        const dev = yield* caller("tags@example.com", { environment: "test" })
        const calls = [
          modelCall(dev.apiKey, "/v1/responses", { ...ASK, metadata: { team: "search", run: "1" }, user: "u-1" }),
          modelCall(dev.apiKey, "/v1/chat/completions", { ...CHAT, metadata: { team: "search" }, user: "u-2" }),
          modelCall(dev.apiKey, "/v1/chat/completions", { ...CHAT, metadata: { team: "billing" } }),
          modelCall(dev.apiKey, "/v1/responses", ASK)
        ]
        for (const reply of yield* Effect.all(calls)) expect(reply.status).toBe(200)

        const all = yield* logs(dev.token)
        expect(all.total).toBe(4)
        for (const entry of all.logs) {
          expect(entry.apiKeyId).toBe(dev.keyId)
          expect(entry.environment).toBe("test")
          expect(entry.routingCategory).not.toBe(null)
          expect(entry.errorCode).toBe(null)
          expect(entry.contentPages).toBe(0)
        }
        const shown = all.logs.map((entry) => [entry.endpoint, entry.metadata, entry.user]).sort((a, b) =>
          JSON.stringify(a).localeCompare(JSON.stringify(b))
        )
        expect(shown).toEqual([
          ["/v1/chat/completions", { team: "billing" }, null],
          ["/v1/chat/completions", { team: "search" }, "u-2"],
          ["/v1/responses", { team: "search", run: "1" }, "u-1"],
          ["/v1/responses", null, null]
        ])

        const search = yield* logs(dev.token, { tag_key: "team", tag_value: "search" })
        expect(search.total).toBe(2)
        expect(search.logs.map((entry) => entry.user).sort()).toEqual(["u-1", "u-2"])
        expect((yield* logs(dev.token, { tag_key: "run" })).total).toBe(1)
        expect((yield* logs(dev.token, { user: "u-2" })).logs.map((entry) => entry.metadata)).toEqual([{
          team: "search"
        }])
        expect((yield* logs(dev.token, { environment: "live" })).total).toBe(0)

        const usage = yield* call("GET", "/dashboard/usage?group_by_tag=team", { token: dev.token })
        expect(usage.status).toBe(200)
        expect(
          usage.body.groups.map((
            group: { tag_value: string | null; requests: number }
          ) => [group.tag_value, group.requests])
            .sort((a: [string, number], b: [string, number]) => String(a[0]).localeCompare(String(b[0])))
        )
          .toEqual([["billing", 1], [null, 1], ["search", 2]])
        const plain = yield* call("GET", "/dashboard/usage", { token: dev.token })
        expect(plain.body.groups).toBe(undefined)
      }))

    it.effect("tag keys read back as they were sent: snake_case and camelCase keys are not renamed, in the list or the export", () =>
      Effect.gen(function*() {
        const dev = yield* caller("tag-keys@example.com", { environment: "test" })
        const metadata = { cost_center: "ops_team", runId: "r_1", "x-trace": "t" }
        expect((yield* modelCall(dev.apiKey, "/v1/chat/completions", { ...CHAT, metadata })).status).toBe(200)
        expect((yield* logs(dev.token)).logs.map((entry) => entry.metadata)).toEqual([metadata])
        expect((yield* logs(dev.token, { tag: "cost_center:ops_team" })).total).toBe(1)
        const csv = yield* call("GET", "/dashboard/logs/export?format=csv", { token: dev.token })
        for (const [key, value] of Object.entries(metadata)) expect(csv.text).toContain(`""${key}"":""${value}""`)
      }))

    it.effect("a grouping tag's usage is rolled up: backfilled when marked, kept by each flush, equal to the logs' sums", () =>
      Effect.gen(function*() {
        const dev = yield* caller("tags-rolled@example.com", { environment: "test" })
        const tagged = (team: string | undefined) =>
          modelCall(dev.apiKey, "/v1/chat/completions", {
            ...CHAT,
            ...(team === undefined ? {} : { metadata: { team } })
          })
        for (const team of ["search", "search", "billing", undefined]) expect((yield* tagged(team)).status).toBe(200)
        const groups = (range = "") =>
          Effect.map(call("GET", `/dashboard/usage?group_by_tag=team${range}`, { token: dev.token }), (reply) => {
            expect(reply.status).toBe(200)
            return reply.body.groups as ReadonlyArray<
              { tag_value: string | null; requests: number; inputTokens: number }
            >
          })
        /** The same sums straight from the logs, in the order the API gives them (costs are 0: a test key). */
        const direct = Effect.map(
          query<{ tag_value: string | null; requests: number; inputTokens: number }>(
            `SELECT metadata ->> 'team' AS tag_value, count(*)::int AS requests, sum(input_tokens)::int AS "inputTokens"
             FROM request_logs WHERE account_id = $1 GROUP BY 1 ORDER BY count(*) DESC, 1`,
            [dev.accountId]
          ),
          (rows) => rows.map((row) => ({ ...row, inputTokens: Number(row.inputTokens) }))
        )
        const compact = (rows: ReadonlyArray<{ tag_value: string | null; requests: number; inputTokens: number }>) =>
          rows.map(({ inputTokens, requests, tag_value }) => ({ tag_value, requests, inputTokens }))
        const fromLogs = yield* groups()
        expect(compact(fromLogs)).toEqual(yield* direct)
        expect((yield* call("GET", "/dashboard/usage/grouping-tags", { token: dev.token })).body).toEqual({
          tag_keys: []
        })

        // Marked: its rollups are backfilled from the logs, and reads come from them.
        const marked = yield* call("PUT", "/dashboard/usage/grouping-tags", {
          token: dev.token,
          json: { tag_keys: ["team"] }
        })
        expect(marked.body).toEqual({ tag_keys: ["team"] })
        const rolled =
          (yield* query<{ n: number }>("SELECT count(*)::int AS n FROM usage_tag_rollups WHERE account_id = $1", [
            dev.accountId
          ]))[0]
        expect(rolled?.n).toBeGreaterThan(0)
        expect(compact(yield* groups())).toEqual(yield* direct)

        // Calls after the mark reach the rollups through the flush; a range with part-buckets at both ends agrees too.
        for (const team of ["billing", "billing", "ops"]) expect((yield* tagged(team)).status).toBe(200)
        expect(compact(yield* groups())).toEqual(yield* direct)
        const hour = 3_600_000
        const range = `&from=${new Date(Date.now() - hour - 60_000).toISOString()}&to=${
          new Date(Date.now() + hour + 60_000).toISOString()
        }`
        expect(compact(yield* groups(range))).toEqual(yield* direct)
        const inRollups = yield* query<{ requests: string }>(
          "SELECT sum(requests)::text AS requests FROM usage_tag_rollups WHERE account_id = $1 AND tag_key = 'team'",
          [dev.accountId]
        )
        expect(Number(inRollups[0]?.requests)).toBe(7)

        // At most three keys; unmarked, its rollups go.
        const tooMany = yield* call("PUT", "/dashboard/usage/grouping-tags", {
          token: dev.token,
          json: { tag_keys: ["a", "b", "c", "d"] }
        })
        expect(tooMany.status).toBe(400)
        expect(
          (yield* call("PUT", "/dashboard/usage/grouping-tags", { token: dev.token, json: { tag_keys: [] } })).body
        )
          .toEqual({ tag_keys: [] })
        expect(yield* query("SELECT 1 FROM usage_tag_rollups WHERE account_id = $1", [dev.accountId])).toEqual([])
        expect(compact(yield* groups())).toEqual(yield* direct)
      }))

    it.effect("metadata past OpenAI's limits, and a tag value without a key, answer 400 invalid_request", () =>
      Effect.gen(function*() {
        const dev = yield* caller("tags-bad@example.com", { environment: "test" })
        const many = Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, "v"]))
        const bad = [
          { metadata: many },
          { metadata: { ["k".repeat(65)]: "v" } },
          { metadata: { k: "v".repeat(513) } },
          { metadata: { k: 1 } }
        ]
        for (const [path, body] of [["/v1/responses", ASK], ["/v1/chat/completions", CHAT]] as const) {
          for (const extra of bad) {
            const reply = yield* modelCall(dev.apiKey, path, { ...body, ...extra })
            expect([path, Object.keys(extra.metadata).length, reply.status]).toEqual([
              path,
              Object.keys(extra.metadata).length,
              400
            ])
            expect(reply.body.error.code).toBe("invalid_request")
          }
          const ok = yield* modelCall(dev.apiKey, path, { ...body, metadata: { ["k".repeat(64)]: "v".repeat(512) } })
          expect(ok.status).toBe(200)
        }
        const reply = yield* call("GET", "/dashboard/logs?tag_value=x", { token: dev.token })
        expect(reply.status).toBe(400)
        expect(reply.body.error.param).toBe("tag_value")
      }))
  })
})
