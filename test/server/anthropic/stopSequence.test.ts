import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { booksOf } from "../../support/Books.js"
import { call } from "../../support/Http.js"
import type { Reply } from "../../support/Http.js"
import { caller, TestServerWithUpstream } from "../../support/Models.js"
import { parseSse } from "../../support/Sse.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * `stop_sequences` on `/v1/messages`: an answer that reached one of them ends just before it, with
 * `stop_reason: "stop_sequence"` and `stop_sequence` naming it, plain and streamed (`message_delta`).
 * docs/api/anthropic.md, "Claude Code and Anthropic's SDKs".
 */

const MODEL = "svc/nenas-flash"

const messages = (apiKey: string, json: Record<string, unknown>) =>
  call("POST", "/v1/messages", {
    headers: { "x-api-key": apiKey, "anthropic-version": "2023-06-01" },
    json: { model: MODEL, max_tokens: 200, messages: [{ role: "user", content: "Count in Spanish." }], ...json }
  })

/** A streamed answer as a client reads it: its text, and the `message_delta`'s delta. */
const streamed = (reply: Reply) => {
  const events = parseSse(reply.text).map((event) => JSON.parse(event.data) as Record<string, any>)
  const text = events
    .filter((event) => event["type"] === "content_block_delta" && event["delta"]?.type === "text_delta")
    .map((event) => event["delta"].text as string)
    .join("")
  const delta = events.find((event) => event["type"] === "message_delta")?.["delta"]
  return { text, delta, types: events.map((event) => event["type"] as string) }
}

const ANSWER = "Uno, dos, tres. END Cuatro, cinco. STOP Seis."

layer(TestServerWithUpstream(), { excludeTestServices: true, timeout: 60_000 })(
  "stop_sequence on /v1/messages",
  (it) => {
    it.effect("plain: the answer ends before the first sequence it reached, which stop_sequence names; billed once", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({ kind: "ok", text: ANSWER, usage: { prompt_tokens: 12, completion_tokens: 14 } })
        const who = yield* caller("stop-plain@example.com", { sen: 1000 })
        const reply = yield* messages(who.apiKey, { stop_sequences: ["STOP", "END"] })
        expect(reply.status, reply.text).toBe(200)
        expect(reply.body).toMatchObject({
          content: [{ type: "text", text: "Uno, dos, tres. " }],
          stop_reason: "stop_sequence",
          stop_sequence: "END"
        })
        expect(upstream.requests[0]?.body).toMatchObject({ stop: ["STOP", "END"] })
        const books = yield* booksOf(reply.headers.get("x-request-id") ?? "")
        expect(books.log).toMatchObject({ status: "billed", output_tokens: 14 })
        expect(books.ledger).toEqual([-Number(books.log.cost_micro_myr)])
        for (const hold of books.hold) expect(hold.status).not.toBe("open")
      }))

    it.effect("streamed: no text past the sequence is sent, even split across chunks; message_delta names it", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({ kind: "ok", text: ANSWER })
        const who = yield* caller("stop-stream@example.com", { sen: 1000 })
        // "Cuatro, " straddles the double's 8-character chunks.
        const reply = yield* messages(who.apiKey, { stream: true, stop_sequences: ["Cuatro, c"] })
        expect(reply.status, reply.text).toBe(200)
        const { delta, text, types } = streamed(reply)
        expect(text).toBe("Uno, dos, tres. END ")
        expect(delta).toEqual({ stop_reason: "stop_sequence", stop_sequence: "Cuatro, c" })
        expect(types.at(-1)).toBe("message_stop")
        const books = yield* booksOf(reply.headers.get("x-request-id") ?? "")
        expect(books.log.status).toBe("billed")
        expect(books.ledger).toEqual([-Number(books.log.cost_micro_myr)])
      }))

    it.effect("no sequence reached: end_turn and stop_sequence null, plain and streamed; a prefix held back is sent at the end", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({ kind: "ok", text: "Uno, dos. ST" })
        const who = yield* caller("stop-none@example.com", { sen: 1000 })
        const plain = yield* messages(who.apiKey, { stop_sequences: ["STOP"] })
        expect(plain.body).toMatchObject({
          content: [{ type: "text", text: "Uno, dos. ST" }],
          stop_reason: "end_turn",
          stop_sequence: null
        })
        const reply = yield* messages(who.apiKey, { stream: true, stop_sequences: ["STOP"] })
        const { delta, text } = streamed(reply)
        expect(text).toBe("Uno, dos. ST")
        expect(delta).toEqual({ stop_reason: "end_turn", stop_sequence: null })
      }))

    it.effect("a test key: the simulated model honours stop sequences too", () =>
      Effect.gen(function*() {
        const who = yield* caller("stop-testkey@example.com", { environment: "test" })
        const ask = {
          messages: [{ role: "user", content: "Say alpha, then HALT, then omega." }],
          stop_sequences: ["HALT"]
        }
        const plain = yield* messages(who.apiKey, ask)
        expect(plain.status, plain.text).toBe(200)
        expect(plain.body.stop_reason).toBe("stop_sequence")
        expect(plain.body.stop_sequence).toBe("HALT")
        expect(plain.body.content[0].text).not.toContain("HALT")
        expect(plain.body.content[0].text).toMatch(/Say alpha, then $/)
        const { delta, text } = streamed(yield* messages(who.apiKey, { ...ask, stream: true }))
        expect(delta).toEqual({ stop_reason: "stop_sequence", stop_sequence: "HALT" })
        expect(text).toBe(plain.body.content[0].text)
      }))
  }
)
