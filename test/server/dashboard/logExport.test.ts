import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { call, createKey, devToken } from "../../support/Http.js"
import { query, TestServerLive } from "../../support/TestServer.js"

/** RFC 4180 records: quoted fields may hold commas, doubled quotes and line breaks. */
const parseCsv = (text: string): Array<Array<string>> => {
  const records: Array<Array<string>> = []
  let record: Array<string> = []
  let field = ""
  let quoted = false
  for (let i = 0; i < text.length; i++) {
    const c = text[i]
    if (quoted) {
      if (c === "\"" && text[i + 1] === "\"") {
        field += "\""
        i++
      } else if (c === "\"") quoted = false
      else field += c
    } else if (c === "\"") quoted = true
    else if (c === ",") {
      record.push(field)
      field = ""
    } else if (c === "\r" && text[i + 1] === "\n") {
      record.push(field)
      records.push(record)
      record = []
      field = ""
      i++
    } else field += c
  }
  if (field !== "" || record.length > 0) throw new Error("the CSV does not end with CRLF")
  return records
}

const ROWS = 2503

describe("exports", () => {
  layer(TestServerLive({ businessTimezone: "Asia/Kolkata" }), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("logs export as CSV across batches, newest first, with the filters of logs, money in MYR and micro-MYR", () =>
      Effect.gen(function*() {
        const token = yield* devToken("export@example.com")
        const keyId = (yield* createKey(token, { name: "live", environment: "live" })).key.id
        const [{ account_id: accountId }] = (yield* query<{ account_id: string }>(
          "SELECT account_id FROM api_keys WHERE id = $1",
          [keyId]
        )) as [{ account_id: string }]
        // Row g: one second apart from 2026-03-01; every 10th failed (cost 0); the others cost g micro-MYR.
        yield* query(
          `
          INSERT INTO request_logs (request_id, account_id, api_key_id, public_model, endpoint, status, input_tokens,
            cost_micro_myr, created_at, error_code, metadata, end_user)
          SELECT 'req_x' || lpad(g::text, 5, '0'), $1, $2, 'svc/nenas-flash', '/v1/responses',
            CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'billed' END, g,
            CASE WHEN g % 10 = 0 THEN 0 ELSE g::bigint * 1000001 END,
            timestamptz '2026-03-01T00:00:00Z' + g * interval '1 second',
            CASE WHEN g % 10 = 0 THEN 'upstream_error' END,
            CASE WHEN g = 7 THEN '{"note": "a, \\"b\\"\\nc", "team": "=x"}'::jsonb END,
            CASE WHEN g = 7 THEN '=HYPERLINK("x")' END
          FROM generate_series(1, ${ROWS}) g`,
          [accountId, keyId]
        )

        const reply = yield* call("GET", "/dashboard/logs/export?format=csv", { token })
        expect(reply.status).toBe(200)
        expect(reply.headers.get("content-type")).toContain("text/csv")
        expect(reply.headers.get("content-disposition")).toContain("attachment")
        const [header, ...rows] = parseCsv(reply.text)
        expect(header).toEqual([
          "request_id",
          "created_at",
          "api_key_id",
          "environment",
          "endpoint",
          "status",
          "routing_category",
          "error_code",
          "public_model",
          "stream",
          "input_tokens",
          "output_tokens",
          "reasoning_tokens",
          "cached_tokens",
          "usage_source",
          "search_count",
          "content_pages",
          "latency_ms",
          "cost_myr",
          "cost_micro_myr",
          "user",
          "metadata"
        ])
        const column = (name: string) => (header ?? []).indexOf(name)
        expect(rows.length).toBe(ROWS)
        const ids = rows.map((row) => row[0])
        expect(new Set(ids).size).toBe(ROWS)
        expect(ids[0]).toBe(`req_x0${ROWS}`)
        expect(ids.at(-1)).toBe("req_x00001")
        const byId = new Map(rows.map((row) => [row[0], row]))
        const r1234 = byId.get("req_x01234") ?? []
        expect([r1234[column("cost_myr")], r1234[column("cost_micro_myr")], r1234[column("created_at")]])
          .toEqual(["1234.001234", "1234001234", "2026-03-01T00:20:34.000Z"])
        const r10 = byId.get("req_x00010") ?? []
        expect([
          r10[column("status")],
          r10[column("error_code")],
          r10[column("cost_myr")],
          r10[column("cost_micro_myr")]
        ])
          .toEqual(["failed", "upstream_error", "0.000000", "0"])
        const r7 = byId.get("req_x00007") ?? []
        // Caller text a spreadsheet would run is defused; commas, quotes and line breaks survive.
        expect(r7[column("user")]).toBe("'=HYPERLINK(\"x\")")
        expect(JSON.parse(r7[column("metadata")] ?? "")).toEqual({ note: "a, \"b\"\nc", team: "=x" })
        expect(rows.reduce((sum, row) => sum + Number(row[column("cost_micro_myr")]), 0))
          .toBe(
            Array.from({ length: ROWS }, (_, i) => i + 1).filter((g) => g % 10 !== 0).reduce(
              (s, g) => s + g * 1000001,
              0
            )
          )

        const failed = parseCsv((yield* call("GET", "/dashboard/logs/export?status=failed", { token })).text)
        expect(failed.length - 1).toBe(Math.floor(ROWS / 10))
        const ranged = parseCsv(
          (yield* call(
            "GET",
            "/dashboard/logs/export?from=2026-03-01T00:00:10Z&to=2026-03-01T00:00:20Z",
            { token }
          )).text
        )
        expect(ranged.slice(1).map((row) => row[0])).toEqual(
          Array.from({ length: 10 }, (_, i) => `req_x${String(19 - i).padStart(5, "0")}`)
        )

        const bad = yield* call("GET", "/dashboard/logs/export?format=xlsx", { token })
        expect(bad.status).toBe(400)
        expect(bad.body.error.code).toBe("invalid_request")
        expect((yield* call("GET", "/dashboard/logs/export")).status).toBe(401)

        // Usage by local day in Kolkata: 1 March 05:30 local holds rows 1..2503 (all within 42 minutes).
        const usage = yield* call(
          "GET",
          "/dashboard/usage/export?format=csv&from=2026-02-28T18:30:00Z&to=2026-03-02T18:30:00Z",
          { token }
        )
        expect(usage.status).toBe(200)
        const [usageHeader, ...days] = parseCsv(usage.text)
        expect(usageHeader).toEqual([
          "bucket",
          "requests",
          "cost_myr",
          "cost_micro_myr",
          "input_tokens",
          "output_tokens",
          "reasoning_tokens"
        ])
        const billed = Array.from({ length: ROWS }, (_, i) => i + 1).filter((g) => g % 10 !== 0).reduce(
          (s, g) => s + g * 1000001,
          0
        )
        expect(days.map((day) => day.slice(0, 4))).toEqual([
          [
            "2026-03-01T00:00:00+05:30",
            String(ROWS),
            `${Math.floor(billed / 1e6)}.${String(billed % 1e6).padStart(6, "0")}`,
            String(billed)
          ],
          ["2026-03-02T00:00:00+05:30", "0", "0.000000", "0"]
        ])
      }))
  })
})
