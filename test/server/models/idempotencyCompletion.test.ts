import { expect, layer } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { COMPLETION_TRIES } from "../../../src/Models/Admission/Idempotency.js"
import { PUBLIC_MODEL } from "../../../src/Models/OpenAi/Api.js"
import type { Reply } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream, violations, walletOf } from "../../support/Models.js"
import { query } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * A billed idempotent call whose record cannot be written at once
 * (docs/money.md, "Idempotency"): the client gets its answer, never a 500; the
 * write is retried, the record's lease renewed meanwhile; a retry with the same
 * key answers 409 (retryable) until the record is written, then replays it; the
 * call runs, and is billed, once.
 */

const RESPONSES = "/v1/responses"

/** Refuses the first `failures` completion writes of `idempotency_records` (a sequence counts them: it survives the rollback). */
const refuseCompletions = (failures: number) =>
  query(`
    DROP TRIGGER IF EXISTS test_refuse_completion ON idempotency_records;
    DROP SEQUENCE IF EXISTS test_completion_writes;
    CREATE SEQUENCE test_completion_writes;
    CREATE OR REPLACE FUNCTION test_refuse_completion() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF nextval('test_completion_writes') <= ${Math.trunc(failures)} THEN
        RAISE EXCEPTION 'test: the completion write is refused';
      END IF;
      RETURN NEW;
    END $$;
    CREATE TRIGGER test_refuse_completion BEFORE UPDATE ON idempotency_records
      FOR EACH ROW WHEN (NEW.status = 'completed') EXECUTE FUNCTION test_refuse_completion();
  `)

const completionWritesTried = Effect.map(
  query<{ tried: string }>(`SELECT last_value AS tried FROM test_completion_writes`),
  (rows) => Number(rows[0]?.tried)
)

const recordOf = (apiKeyId: string) =>
  Effect.map(
    query<{ status: string; lease_ms: string | null }>(
      `SELECT status, (extract(epoch FROM lease_expires_at) * 1000)::bigint AS lease_ms FROM idempotency_records WHERE api_key_id = $1`,
      [apiKeyId]
    ),
    (rows) => rows[0]
  )

const billedRows = (accountId: string) =>
  query<{ request_id: string; status: string; cost_micro_myr: string }>(
    `SELECT request_id, status, cost_micro_myr FROM request_logs WHERE account_id = $1`,
    [accountId]
  )

const expectReplayOf = (reply: Reply, original: Reply) => {
  expect(reply.status, reply.text).toBe(200)
  expect(reply.headers.get("idempotent-replayed")).toBe("true")
  expect(reply.text).toBe(original.text)
}

/** One call, one upstream request, one billed row, and the wallet charged exactly its cost. */
const expectBilledOnce = (accountId: string, first: Reply) =>
  Effect.gen(function*() {
    const upstream = yield* Upstream
    expect(upstream.requests, "the call ran once").toHaveLength(1)
    const rows = yield* billedRows(accountId)
    expect(rows).toHaveLength(1)
    expect(rows[0]).toMatchObject({ request_id: first.body.request_id, status: "billed" })
    const cost = Number(rows[0]?.cost_micro_myr)
    expect(cost).toBeGreaterThan(0)
    expect((yield* walletOf(accountId)).spent).toBe(cost)
    expect(yield* violations(accountId)).toEqual([])
  })

layer(TestServerWithUpstream(), { excludeTestServices: true })(
  "an idempotent call whose record's completion fails to write",
  (it) => {
    it.effect("the first write refused: the call answers its answer (not 500), is billed once, and a retry with the key replays it", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { accountId, apiKey } = yield* caller("idem-write-once@example.com", { sen: 1000 })
        yield* refuseCompletions(1)
        const body = { model: PUBLIC_MODEL, input: "Name a river in Selangor." }
        const headers = { "Idempotency-Key": "write-refused-once" }
        const first = yield* modelCall(apiKey, RESPONSES, body, headers)
        expect(first.status, first.text).toBe(200)
        expect(first.body.object).toBe("response")
        expect(yield* completionWritesTried).toBe(2)
        expectReplayOf(yield* modelCall(apiKey, RESPONSES, body, headers), first)
        yield* expectBilledOnce(accountId, first)
      }))

    it.effect("every write on the call's path refused: answered anyway; meanwhile a retry is a retryable 409, the lease is renewed, then the write lands and the retry replays", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { accountId, apiKey, keyId } = yield* caller("idem-write-late@example.com", { sen: 1000 })
        // The path's tries, then the background's first four (at about 0, 0.5, 1.5 and 3.5 s) fail.
        yield* refuseCompletions(COMPLETION_TRIES + 4)
        const body = { model: PUBLIC_MODEL, input: "Name a river in Perak." }
        const headers = { "Idempotency-Key": "write-refused-long" }
        const first = yield* modelCall(apiKey, RESPONSES, body, headers)
        expect(first.status, first.text).toBe(200)
        expect(first.body.object).toBe("response")

        const early = yield* recordOf(keyId)
        expect(early?.status).toBe("running")
        const conflict = yield* modelCall(apiKey, RESPONSES, body, headers)
        expect(conflict.status, conflict.text).toBe(409)
        expect(conflict.body.error).toMatchObject({ code: "idempotency_conflict", retryable: true })

        // Until the write lands the record stays running and its lease moves forward: no other call may take the key over.
        let renewed = false
        const deadline = Date.now() + 30_000
        let replay: Reply | undefined
        while (Date.now() < deadline) {
          const record = yield* recordOf(keyId)
          if (record?.status === "running") {
            renewed ||= Number(record.lease_ms) > Number(early?.lease_ms) + 1_000
          } else {
            replay = yield* modelCall(apiKey, RESPONSES, body, headers)
            break
          }
          yield* Effect.sleep("100 millis")
        }
        expect(replay, "the record was written").toBeDefined()
        if (replay !== undefined) expectReplayOf(replay, first)
        expect(renewed, "the lease was renewed while the write was retried").toBe(true)
        expect(yield* completionWritesTried).toBe(COMPLETION_TRIES + 5)
        yield* expectBilledOnce(accountId, first)
        yield* query(`DROP TRIGGER test_refuse_completion ON idempotency_records`)
      }))

    it.effect("a key taken over while its call ran (its process looked dead): the call is not billed; it answers a retryable 409", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({ kind: "ok", text: "Late, and taken over.", delayMs: 1_500 })
        const { accountId, apiKey, keyId } = yield* caller("idem-taken-over@example.com", { sen: 1000 })
        const body = { model: PUBLIC_MODEL, input: "Name a river in Pahang." }
        const running = yield* Effect.fork(modelCall(apiKey, RESPONSES, body, { "Idempotency-Key": "taken-over" }))
        while (upstream.requests.length === 0) yield* Effect.sleep("20 millis")
        // What a retry on a live instance does once the holder's beat is stale: the record becomes the retry's.
        yield* query(`UPDATE idempotency_records SET request_id = 'req_the_retry' WHERE api_key_id = $1`, [keyId])
        const late = yield* Fiber.join(running)
        expect(late.status, late.text).toBe(409)
        expect(late.body.error).toMatchObject({ code: "idempotency_conflict", retryable: true })
        const rows = yield* billedRows(accountId)
        expect(rows.map((row) => [row.status, Number(row.cost_micro_myr)])).toEqual([["failed", 0]])
        expect(yield* walletOf(accountId)).toMatchObject({ reserved: 0, spent: 0 })
        expect(yield* recordOf(keyId), "the retry's record is left as it is").toMatchObject({ status: "running" })
        expect(yield* violations(accountId)).toEqual([])
      }))
  }
)
