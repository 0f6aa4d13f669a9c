import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { expectClientError } from "../../support/ErrorBody.js"
import { caller, modelCall, TestServerWithUpstream, walletOf } from "../../support/Models.js"
import { query } from "../../support/TestServer.js"
import { ASK } from "../../support/TwoInstances.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * Hostile text (docs/security.md, "Security"): text PostgreSQL cannot store
 * (U+0000, an unpaired surrogate) in a kept field of a model call answers 400
 * naming the param, before anything is held or run. Before, such a call
 * answered 200 and its settlement looped, unwritten: no usage entry, no log
 * row, the hold swept later (the call was free).
 */

const CHAT = { model: "svc/nenas-flash", messages: [{ role: "user", content: "Say hello in Malay." }], max_tokens: 16 }
const ENDPOINTS = [["/v1/responses", ASK], ["/v1/chat/completions", CHAT]] as const
const BAD = { nul: "a\u0000b", high: "a\ud800b", low: "\udc00", reversed: "\udc00\ud800" } as const

/** Each kept field with the bad text in it, and the param the answer names. */
const placements = (bad: string) =>
  [
    { field: "user", param: "user", body: { user: bad } },
    { field: "metadata value", param: "metadata.team", body: { metadata: { team: bad } } },
    { field: "metadata key", param: "metadata", body: { metadata: { [`t${bad}`]: "search" } } }
  ] as const

describe("hostile text in a model call's kept fields", () => {
  layer(TestServerWithUpstream(), { timeout: 120_000 })((it) => {
    it.effect("U+0000 or a lone surrogate in user or metadata → 400 naming the param; nothing held, run, billed or logged", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const dev = yield* caller("hostile-text@example.com", { sen: 1000 })
        const before = yield* walletOf(dev.accountId)
        let sent = 0
        for (const [path, base] of ENDPOINTS) {
          for (const stream of [false, true]) {
            for (const [name, bad] of Object.entries(BAD)) {
              for (const { field, param, body } of placements(bad)) {
                const reply = yield* modelCall(dev.apiKey, path, { ...base, ...body, stream })
                const label = `${path} stream=${stream} ${field} ${name}`
                expectClientError(reply, { status: 400, code: "invalid_request", param }, label)
                sent++
              }
            }
          }
        }
        expect(sent).toBe(2 * 2 * Object.keys(BAD).length * 3)
        expect(upstream.requests).toHaveLength(0)
        const after = yield* walletOf(dev.accountId)
        expect(after).toEqual(before)
        expect(after.reserved).toBe(0)
        const usage = yield* query("SELECT 1 FROM ledger_entries WHERE account_id = $1 AND type = 'usage'", [
          dev.accountId
        ])
        expect(usage).toEqual([])
        expect(yield* query("SELECT 1 FROM reservations WHERE account_id = $1", [dev.accountId])).toEqual([])
        expect(yield* query("SELECT 1 FROM request_logs WHERE account_id = $1", [dev.accountId])).toEqual([])
        expect(yield* query("SELECT 1 FROM settlement_parked")).toEqual([])
      }))

    it.effect("the same call with storable text (a surrogate pair, U+FFFD) answers 200, billed and logged with its tags", () =>
      Effect.gen(function*() {
        const dev = yield* caller("hostile-text-ok@example.com", { sen: 1000 })
        const good = "emoji 😀 and \uFFFD"
        for (const [path, base] of ENDPOINTS) {
          const reply = yield* modelCall(dev.apiKey, path, { ...base, user: good, metadata: { [`k😀`]: good } })
          expect(reply.status, reply.text.slice(0, 300)).toBe(200)
        }
        const rows = yield* query<{ metadata: Record<string, string>; endUser: string; status: string }>(
          "SELECT metadata, end_user AS \"endUser\", status FROM request_logs WHERE account_id = $1",
          [dev.accountId]
        )
        expect(rows).toHaveLength(2)
        for (const row of rows) {
          expect(row.status).toBe("billed")
          expect(row.endUser).toBe(good)
          expect(row.metadata).toEqual({ "k😀": good })
        }
        const usage = yield* query("SELECT 1 FROM ledger_entries WHERE account_id = $1 AND type = 'usage'", [
          dev.accountId
        ])
        expect(usage).toHaveLength(2)
        expect((yield* walletOf(dev.accountId)).reserved).toBe(0)
      }))
  })
})
