import { expect, layer } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { PUBLIC_MODEL } from "../../../src/Models/OpenAi/Api.js"
import { booksOf } from "../../support/Books.js"
import type { Reply } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream, violations, walletOf } from "../../support/Models.js"
import { query } from "../../support/TestServer.js"
import { type Behaviour, Upstream } from "../../support/Upstream.js"

/**
 * An answer marked `retryable: true` that cost nothing (a provider failure, a 429) is not kept under its
 * Idempotency-Key: the key is released, so a retry with the same key, as the flag invites, runs anew and is
 * billed once. A non-retryable answer is still replayed (docs/money.md, "Idempotency").
 */

const FIRST_BYTE_MS = 400

const RESPONSES = "/v1/responses"
const CHAT = "/v1/chat/completions"
const MESSAGES = "/v1/messages"

const bodyFor = (endpoint: string, text: string) =>
  endpoint === RESPONSES
    ? { model: PUBLIC_MODEL, input: text, max_output_tokens: 100 }
    : { model: PUBLIC_MODEL, messages: [{ role: "user", content: text }], max_tokens: 100 }

/** The error object of a reply, whichever endpoint's body it is (both keep nenas's fields inside `error`). */
const errorOf = (reply: Reply) => reply.body?.error as { code: string; retryable: boolean }

const recordsOf = (apiKeyId: string) =>
  query<{ status: string; response_status: number | null }>(
    `SELECT status, response_status FROM idempotency_records WHERE api_key_id = $1`,
    [apiKeyId]
  )

const requestIdOf = (reply: Reply) => reply.headers.get("x-request-id") ?? ""

interface Fault {
  readonly name: string
  readonly endpoint: string
  readonly behaviour: Behaviour
  readonly status: number
  readonly code: string
}

const faults: ReadonlyArray<Fault> = [
  {
    name: "a 504 provider_timeout (no first byte in time)",
    endpoint: RESPONSES,
    behaviour: { kind: "hang" },
    status: 504,
    code: "provider_timeout"
  },
  {
    name: "a 503 provider_unavailable (upstream 500)",
    endpoint: CHAT,
    behaviour: { kind: "status", status: 500 },
    status: 503,
    code: "provider_unavailable"
  },
  {
    name: "a 503 from an upstream 429",
    endpoint: RESPONSES,
    behaviour: { kind: "status", status: 429, retryAfter: "1" },
    status: 503,
    code: "provider_unavailable"
  },
  {
    name: "a 504 on /v1/messages",
    endpoint: MESSAGES,
    behaviour: { kind: "hang" },
    status: 504,
    code: "provider_timeout"
  }
]

layer(TestServerWithUpstream({ upstreamFirstByteTimeoutMs: FIRST_BYTE_MS }), {
  excludeTestServices: true,
  timeout: 60_000
})(
  "retryable answers release their Idempotency-Key",
  (it) => {
    for (const [index, fault] of faults.entries()) {
      it.effect(`${fault.name}: not kept; a retry with the same key runs anew, succeeds and is billed once, then replays`, () =>
        Effect.gen(function*() {
          const upstream = yield* Upstream
          upstream.reset()
          upstream.setBehaviour(fault.behaviour)
          const { accountId, apiKey, keyId } = yield* caller(`idem-release-${index}@example.com`, { sen: 1000 })
          const body = bodyFor(fault.endpoint, "Name a river in Johor.")
          const headers = { "Idempotency-Key": `release-${index}` }

          const failed = yield* modelCall(apiKey, fault.endpoint, body, headers)
          expect(failed.status, failed.text).toBe(fault.status)
          expect(errorOf(failed)).toMatchObject({ code: fault.code, retryable: true })
          expect(yield* recordsOf(keyId), "the key was released").toEqual([])
          const failedBooks = yield* booksOf(requestIdOf(failed))
          expect(failedBooks.log).toMatchObject({ status: "failed", error_code: fault.code, cost_micro_myr: "0" })
          expect(failedBooks.ledger).toEqual([])
          for (const hold of failedBooks.hold) expect(hold.status).not.toBe("open")

          upstream.setBehaviour({ kind: "ok", text: "The Johor River." })
          const retried = yield* modelCall(apiKey, fault.endpoint, body, headers)
          expect(retried.status, retried.text).toBe(200)
          expect(retried.headers.get("idempotent-replayed"), "it ran anew").toBeNull()
          expect(requestIdOf(retried)).not.toBe(requestIdOf(failed))
          expect(upstream.requests.length, "the upstream was asked again").toBeGreaterThanOrEqual(2)
          const asked = upstream.requests.length
          const books = yield* booksOf(requestIdOf(retried))
          const cost = Number(books.log.cost_micro_myr)
          expect(books.log.status).toBe("billed")
          expect(cost).toBeGreaterThan(0)
          expect(books.ledger).toEqual([-cost])
          for (const hold of books.hold) expect(hold.status).not.toBe("open")

          const replay = yield* modelCall(apiKey, fault.endpoint, body, headers)
          expect(replay.status).toBe(200)
          expect(replay.headers.get("idempotent-replayed")).toBe("true")
          expect(replay.text).toBe(retried.text)
          expect(upstream.requests.length, "the replay ran nothing").toBe(asked)
          expect(yield* walletOf(accountId)).toMatchObject({ reserved: 0, spent: cost })
          expect(yield* violations(accountId)).toEqual([])
        }))
    }

    it.effect("a 429 of the key's own concurrency limit: not kept; the same key runs once a slot is free", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({ kind: "hang" })
        const { accountId, apiKey, keyId } = yield* caller("idem-release-429@example.com", {
          sen: 1000,
          key: { rate_limit_concurrent: 1 }
        })
        const busy = yield* Effect.fork(modelCall(apiKey, CHAT, bodyFor(CHAT, "Take your time.")))
        while (upstream.requests.length === 0) yield* Effect.sleep("20 millis")
        const body = bodyFor(CHAT, "Name a river in Kedah.")
        const headers = { "Idempotency-Key": "release-429" }
        const refused = yield* modelCall(apiKey, CHAT, body, headers)
        expect(refused.status, refused.text).toBe(429)
        expect(errorOf(refused)).toMatchObject({ code: "rate_limit_exceeded", retryable: true })
        // The busy call ends (a 504 past the first-byte deadline), giving its slot back.
        yield* Fiber.join(busy)
        expect(yield* recordsOf(keyId), "the refusal kept nothing").toEqual([])

        upstream.setBehaviour({ kind: "ok", text: "The Muda River." })
        const retried = yield* modelCall(apiKey, CHAT, body, headers)
        expect(retried.status, retried.text).toBe(200)
        expect(retried.headers.get("idempotent-replayed")).toBeNull()
        const books = yield* booksOf(requestIdOf(retried))
        expect(books.log.status).toBe("billed")
        expect(books.ledger).toEqual([-Number(books.log.cost_micro_myr)])
        expect(yield* violations(accountId)).toEqual([])
      }))

    it.effect("a non-retryable error is still kept and replayed: a 402, then a top-up, replays the 402 and runs nothing", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { accountId, apiKey, keyId } = yield* caller("idem-keep-402@example.com")
        const body = bodyFor(CHAT, "Name a river in Perlis.")
        const headers = { "Idempotency-Key": "keep-402" }
        const first = yield* modelCall(apiKey, CHAT, body, headers)
        expect(first.status, first.text).toBe(402)
        expect(errorOf(first)).toMatchObject({ code: "insufficient_balance", retryable: false })
        expect(yield* recordsOf(keyId)).toEqual([{ status: "completed", response_status: 402 }])
        yield* query(`UPDATE wallets SET available_micro_myr = available_micro_myr + 10000000 WHERE account_id = $1`, [
          accountId
        ])
        const again = yield* modelCall(apiKey, CHAT, body, headers)
        expect(again.status).toBe(402)
        expect(again.headers.get("idempotent-replayed")).toBe("true")
        expect(again.text).toBe(first.text)
        expect(upstream.requests).toHaveLength(0)
      }))

    it.effect("a provider error on a call with web search on is kept: its search may have been billed", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({ kind: "status", status: 500 })
        const { apiKey, keyId } = yield* caller("idem-keep-search@example.com", { sen: 1000 })
        const body = {
          model: PUBLIC_MODEL,
          input: "Latest news on the Klang River?",
          max_output_tokens: 100,
          web_search: { mode: "on" }
        }
        const headers = { "Idempotency-Key": "keep-search" }
        const first = yield* modelCall(apiKey, RESPONSES, body, headers)
        expect(first.status, first.text).toBeGreaterThanOrEqual(500)
        expect(yield* recordsOf(keyId)).toEqual([{ status: "completed", response_status: first.status }])
        const again = yield* modelCall(apiKey, RESPONSES, body, headers)
        expect(again.headers.get("idempotent-replayed")).toBe("true")
        expect(again.text).toBe(first.text)
      }))
  }
)
