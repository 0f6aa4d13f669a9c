import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { caller, modelCall, TestServerWithUpstream } from "../../support/Models.js"
import { Upstream } from "../../support/Upstream.js"

interface Sent {
  readonly [field: string]: unknown
}

layer(TestServerWithUpstream(), { excludeTestServices: true })("OpenAI's usual chat and responses fields", (it) => {
  it.effect("chat: temperature, top_p, stop, user and seed go upstream; store, metadata and n: 1 are accepted and not sent", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({ kind: "ok", text: "cut", finishReason: "length" })
      const { apiKey } = yield* caller("fields-chat@example.com", { sen: 1000 })
      const reply = yield* modelCall(apiKey, "/v1/chat/completions", {
        model: "svc/nenas-flash",
        messages: [{ role: "developer", content: "Be brief." }, { role: "user", content: "Hello", name: "ana" }],
        temperature: 0.5,
        top_p: 0.9,
        stop: ["\n\n"],
        user: "end-user-7",
        seed: 42,
        store: false,
        metadata: { team: "a" },
        service_tier: "auto",
        n: 1,
        max_completion_tokens: 64
      })
      expect(reply.status, reply.text).toBe(200)
      expect(reply.body.choices[0].finish_reason).toBe("length")
      const sent = upstream.requests[0]?.body as Sent
      expect(sent).toMatchObject({
        model: "gpt-4.1-mini",
        max_tokens: 64,
        temperature: 0.5,
        top_p: 0.9,
        stop: ["\n\n"],
        user: "end-user-7",
        seed: 42,
        messages: [{ role: "developer", content: "Be brief." }, { role: "user", content: "Hello" }]
      })
      for (const field of ["store", "metadata", "service_tier", "n", "max_completion_tokens", "stream"]) {
        expect(sent, `${field} is not sent upstream`).not.toHaveProperty(field)
      }
    }))

  it.effect("responses: temperature, top_p and user go upstream; an incomplete answer says why", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({ kind: "ok", text: "cut", finishReason: "length" })
      const { apiKey } = yield* caller("fields-responses@example.com", { sen: 1000 })
      const reply = yield* modelCall(apiKey, "/v1/responses", {
        input: "Hello",
        temperature: 0.2,
        top_p: 0.5,
        user: "end-user-8",
        max_output_tokens: 32
      })
      expect(reply.status, reply.text).toBe(200)
      expect(reply.body.incomplete_details).toEqual({ reason: "max_output_tokens" })
      expect(upstream.requests[0]?.body as Sent).toMatchObject({
        temperature: 0.2,
        top_p: 0.5,
        user: "end-user-8",
        max_tokens: 32
      })
    }))
})
