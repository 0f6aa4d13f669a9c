import { createOpenAI } from "@ai-sdk/openai"
import Anthropic from "@anthropic-ai/sdk"
import { expect, layer } from "@effect/vitest"
import { embed, embedMany } from "ai"
import { Effect } from "effect"
import OpenAI from "openai"
import { call } from "../../support/Http.js"
import { caller, TestServerWithUpstream, walletOf } from "../../support/Models.js"
import { TestServer } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * Embeddings and cached answers as the SDKs the suite drives read them (docs/api/embeddings.md, "Clients";
 * docs/api/cache.md, "Hits"): OpenAI's `embeddings.create` (base64, as it asks by default) and the AI SDK's
 * `embed`/`embedMany`, billed; a cached answer replayed as a stream to the openai SDK's stream helper and to
 * the Anthropic SDK's.
 */

const CACHE_ON = { "Nenas-Cache": "on" }

layer(TestServerWithUpstream(), { excludeTestServices: true })("embeddings and cache hits in the clients", (it) => {
  it.effect("openai's embeddings.create and the AI SDK's embed and embedMany, each billed", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      const who = yield* caller("sdk-embed@example.com", { sen: 1000 })
      const client = new OpenAI({ apiKey: who.apiKey, baseURL: `${baseUrl}/v1`, maxRetries: 0 })
      const created = yield* Effect.promise(() =>
        client.embeddings.create({ model: "svc/nenas-embed", input: ["Pulau Pinang", "Melaka"] })
      )
      expect(created.data).toHaveLength(2)
      expect(created.data[0]!.embedding).toHaveLength(1536)
      const norm = Math.hypot(...created.data[0]!.embedding)
      expect(norm).toBeCloseTo(1, 4)
      expect(created.usage.prompt_tokens).toBeGreaterThan(0)
      const spentBefore = (yield* walletOf(who.accountId)).spent
      expect(spentBefore).toBeGreaterThan(0)

      const provider = createOpenAI({ apiKey: who.apiKey, baseURL: `${baseUrl}/v1` })
      const model = provider.embedding("svc/nenas-embed")
      const one = yield* Effect.promise(() => embed({ model, value: "Pulau Pinang", maxRetries: 0 }))
      // The same text, the same vector, whichever client asked and however it was encoded.
      expect(one.embedding).toHaveLength(1536)
      one.embedding.forEach((value, i) => expect(value).toBeCloseTo(created.data[0]!.embedding[i]!, 6))
      const many = yield* Effect.promise(() =>
        embedMany({ model, values: ["Ipoh", "Kuching", "Kota Kinabalu"], maxRetries: 0 })
      )
      expect(many.embeddings).toHaveLength(3)
      expect(many.usage.tokens).toBeGreaterThan(0)
      expect((yield* walletOf(who.accountId)).spent).toBeGreaterThan(spentBefore)
      const logs = yield* call("GET", "/dashboard/logs?endpoint=/v1/embeddings", { token: who.token })
      expect((logs.body as { logs: Array<{ status: string; routingCategory: string }> }).logs).toHaveLength(3)
    }))

  it.effect("a cached chat answer replayed to the openai SDK's stream helper, and a Messages answer to the Anthropic SDK's", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      const upstream = yield* Upstream
      upstream.reset()
      const who = yield* caller("sdk-cache-stream@example.com", { sen: 1000 })
      const openai = new OpenAI({
        apiKey: who.apiKey,
        baseURL: `${baseUrl}/v1`,
        maxRetries: 0,
        defaultHeaders: CACHE_ON
      })
      const request = {
        model: "svc/nenas-flash",
        messages: [{ role: "user" as const, content: "Name a river in Pahang." }],
        max_tokens: 64
      }
      const whole = yield* Effect.promise(() => openai.chat.completions.create(request))
      const stream = openai.chat.completions.stream(request)
      const chunks: Array<string> = []
      stream.on("content", (delta) => chunks.push(delta))
      const final = yield* Effect.promise(() => stream.finalChatCompletion())
      expect(chunks.length).toBeGreaterThan(1)
      expect(chunks.join("")).toBe(whole.choices[0]!.message.content)
      expect(final.choices[0]!.message.content).toBe(whole.choices[0]!.message.content)

      const anthropic = new Anthropic({ apiKey: who.apiKey, baseURL: baseUrl, maxRetries: 0, defaultHeaders: CACHE_ON })
      const message = {
        model: "svc/nenas-flash",
        max_tokens: 64,
        messages: [{ role: "user" as const, content: "Name a hill in Perak." }]
      }
      const first = yield* Effect.promise(() => anthropic.messages.create(message))
      const texts: Array<string> = []
      const replay = anthropic.messages.stream(message)
      replay.on("text", (text) => texts.push(text))
      const replayed = yield* Effect.promise(() => replay.finalMessage())
      expect(texts.length).toBeGreaterThan(1)
      const firstText = first.content.map((block) => block.type === "text" ? block.text : "").join("")
      expect(texts.join("")).toBe(firstText)
      expect(replayed.usage.output_tokens).toBe(first.usage.output_tokens)
      // Two answers from the upstream; the two replays came from the cache.
      expect(upstream.requests.filter((r) => r.path.endsWith("/chat/completions"))).toHaveLength(2)
    }))
})
