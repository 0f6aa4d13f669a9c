import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { call } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream, walletOf } from "../../support/Models.js"
import { realSleep } from "../../support/RealTime.js"
import { TestServer } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/** A raw body: the same request as `{"model":…,"messages":[…]}`, keys in another order, other whitespace, `1.0`. */
const CHAT = JSON.stringify({
  model: "svc/nenas-flash",
  messages: [{ role: "user", content: "Classify: the parcel arrived late." }],
  max_tokens: 64,
  temperature: 1
})
const CHAT_REORDERED = `{ "temperature" : 1.0,
  "max_tokens": 64, "messages": [ { "content": "Classify: the parcel arrived late.", "role": "user" } ],
  "model": "svc/nenas-flash", "user": "someone-else" }`

const raw = (apiKey: string, path: string, body: string, headers: Record<string, string> = {}) =>
  call("POST", path, {
    token: apiKey,
    body,
    headers: Object.assign({ "content-type": "application/json" }, headers)
  })

/** The account's logs, newest first, as the dashboard lists them. */
const logsOf = (token: string) =>
  Effect.map(
    call("GET", "/dashboard/logs?limit=20", { token }),
    (reply) => (reply.body as { logs: Array<Record<string, unknown>> }).logs
  )

layer(TestServerWithUpstream(), { excludeTestServices: true })("the response cache", (it) => {
  it.effect("a repeated chat call, written differently, is a HIT: the original's answer and tokens, costing 0", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const { accountId, apiKey, token } = yield* caller("cache-chat@example.com", { sen: 1000 })
      const first = yield* raw(apiKey, "/v1/chat/completions", CHAT, { "Nenas-Cache": "on" })
      expect(first.status, first.text).toBe(200)
      expect(first.headers.get("nenas-cache")).toBe("MISS")
      const firstBody = first.body as { id: string; usage: Record<string, number>; cost_myr: string; choices: any }
      expect(Number(firstBody.cost_myr)).toBeGreaterThan(0)
      const spentAfterFirst = (yield* walletOf(accountId)).spent

      const second = yield* raw(apiKey, "/v1/chat/completions", CHAT_REORDERED, { "nenas-cache": "ON" })
      expect(second.status, second.text).toBe(200)
      expect(second.headers.get("nenas-cache")).toBe("HIT")
      expect(Number(second.headers.get("age"))).toBeGreaterThanOrEqual(0)
      const secondBody = second.body as typeof firstBody
      expect(secondBody.id).not.toBe(firstBody.id)
      expect(secondBody.choices[0].message.content).toBe(firstBody.choices[0].message.content)
      expect(secondBody.usage).toEqual(firstBody.usage)
      expect(secondBody.cost_myr).toBe("0.000000")
      // The upstream was asked once; the wallet paid once.
      expect(upstream.requests.length).toBe(1)
      expect((yield* walletOf(accountId)).spent).toBe(spentAfterFirst)

      const logs = yield* logsOf(token)
      const hit = logs.find((log) => log["cache"] === "hit")
      expect(hit).toMatchObject({
        status: "billed",
        costMicroMyr: 0,
        cacheSourceRequestId: first.headers.get("x-request-id")
      })
      expect(hit?.["cacheSavedMicroMyr"]).toBe(Math.round(Number(firstBody.cost_myr) * 1_000_000))

      const overview = yield* call("GET", "/dashboard/overview", { token })
      expect((overview.body as any).today_usage).toMatchObject({
        cacheHits: 1,
        cacheSavedMicroMyr: hit?.["cacheSavedMicroMyr"]
      })
    }))

  it.effect("a streamed request replays a stored answer word by word; off neither reads nor answers the header", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      const { apiKey } = yield* caller("cache-stream@example.com", { sen: 1000 })
      const body = {
        model: "svc/nenas-flash",
        messages: [{ role: "user", content: "Say hello to Ipoh." }],
        max_tokens: 64
      }
      const first = yield* modelCall(apiKey, "/v1/chat/completions", body, { "Nenas-Cache": "on" })
      expect(first.status, first.text).toBe(200)
      const streamed = yield* modelCall(apiKey, "/v1/chat/completions", { ...body, stream: true }, {
        "Nenas-Cache": "on"
      })
      expect(streamed.headers.get("nenas-cache")).toBe("HIT")
      const deltas = streamed.text.split("\n\n").filter((line) => line.includes("\"content\""))
      expect(deltas.length).toBeGreaterThan(3)
      const text = deltas.map((line) => JSON.parse(line.slice(6)).choices[0]?.delta?.content ?? "").join("")
      expect(text).toBe((first.body as any).choices[0].message.content)
      expect(streamed.text).toContain("data: [DONE]")
      const off = yield* modelCall(apiKey, "/v1/chat/completions", body, { "Nenas-Cache": "off" })
      expect(off.headers.get("nenas-cache")).toBeNull()
      expect(upstream.requests.length).toBe(2)
    }))

  it.effect("a bad Nenas-Cache or TTL is a 400 naming the header; a stored turn bypasses", () =>
    Effect.gen(function*() {
      const { apiKey } = yield* caller("cache-bad@example.com", { sen: 1000 })
      const body = { model: "svc/nenas-flash", input: "Hi", max_output_tokens: 32 }
      const bad = yield* modelCall(apiKey, "/v1/responses", body, { "Nenas-Cache": "maybe" })
      expect(bad.status).toBe(400)
      expect((bad.body as any).error.param).toBe("Nenas-Cache")
      const ttl = yield* modelCall(apiKey, "/v1/responses", body, { "Nenas-Cache": "on", "Nenas-Cache-TTL": "59" })
      expect(ttl.status).toBe(400)
      expect((ttl.body as any).error.param).toBe("Nenas-Cache-TTL")
      const stored = yield* modelCall(apiKey, "/v1/responses", body, { "Nenas-Cache": "on" })
      const continued = yield* modelCall(apiKey, "/v1/responses", {
        ...body,
        previous_response_id: (stored.body as any).id
      }, { "Nenas-Cache": "on" })
      expect(continued.status, continued.text).toBe(200)
      expect(continued.headers.get("nenas-cache")).toBe("BYPASS")
    }))

  it.effect("a key's cache_ttl_seconds turns it on; the TTL runs in seconds; DELETE /dashboard/cache empties it", () =>
    Effect.gen(function*() {
      const { clock } = yield* TestServer
      const { apiKey, keyId, token } = yield* caller("cache-ttl@example.com", { sen: 1000 })
      const patched = yield* call("PATCH", `/dashboard/api-keys/${keyId}`, { token, json: { cache_ttl_seconds: 120 } })
      expect(patched.status, patched.text).toBe(200)
      expect((patched.body as any).cache_ttl_seconds).toBe(120)
      const body = { model: "svc/nenas-flash", input: "Ttl?", max_output_tokens: 32 }
      expect((yield* modelCall(apiKey, "/v1/responses", body)).headers.get("nenas-cache")).toBe("MISS")
      clock.advance("119 seconds")
      expect((yield* modelCall(apiKey, "/v1/responses", body)).headers.get("nenas-cache")).toBe("HIT")
      clock.advance("2 seconds")
      expect((yield* modelCall(apiKey, "/v1/responses", body)).headers.get("nenas-cache")).toBe("MISS")
      const cleared = yield* call("DELETE", "/dashboard/cache", { token })
      expect(cleared.status, cleared.text).toBe(200)
      expect((yield* modelCall(apiKey, "/v1/responses", body)).headers.get("nenas-cache")).toBe("MISS")
    }))

  it.effect("embeddings are billed per input token, cached, and bounded by input", () =>
    Effect.gen(function*() {
      const { accountId, apiKey } = yield* caller("cache-embed@example.com", { sen: 1000 })
      const body = { model: "svc/nenas-embed", input: ["Kuala Lumpur", "Johor Bahru"], dimensions: 8 }
      const first = yield* modelCall(apiKey, "/v1/embeddings", body, { "Nenas-Cache": "on" })
      expect(first.status, first.text).toBe(200)
      const answer = first.body as any
      expect(answer.data).toHaveLength(2)
      expect(answer.data[0].embedding).toHaveLength(8)
      expect(answer.usage.prompt_tokens).toBeGreaterThan(0)
      expect(Number(answer.cost_myr)).toBeGreaterThan(0)
      const spent = (yield* walletOf(accountId)).spent
      const again = yield* modelCall(apiKey, "/v1/embeddings", body, { "Nenas-Cache": "on" })
      expect(again.headers.get("nenas-cache")).toBe("HIT")
      expect((again.body as any).data).toEqual(answer.data)
      expect((again.body as any).cost_myr).toBe("0.000000")
      expect((yield* walletOf(accountId)).spent).toBe(spent)
      const empty = yield* modelCall(apiKey, "/v1/embeddings", { model: "svc/nenas-embed", input: ["a", ""] })
      expect(empty.status).toBe(400)
      expect((empty.body as any).error.param).toBe("input[1]")
      const wrongModel = yield* modelCall(apiKey, "/v1/chat/completions", {
        model: "svc/nenas-embed",
        messages: [{ role: "user", content: "x" }]
      })
      expect(wrongModel.status).toBe(400)
    }))

  it.effect("an error, a stream the upstream cut and a stream its client cut are never stored", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      const { baseUrl } = yield* TestServer
      const { apiKey } = yield* caller("cache-never@example.com", { sen: 1000 })
      const ask = (content: string, stream: boolean) => ({
        model: "svc/nenas-flash",
        messages: [{ role: "user", content }],
        max_tokens: 64,
        stream
      })
      /** The same call again, with the upstream answering: MISS if nothing was kept. */
      const again = (content: string, stream: boolean) =>
        Effect.gen(function*() {
          upstream.reset()
          const reply = yield* modelCall(apiKey, "/v1/chat/completions", ask(content, stream), { "Nenas-Cache": "on" })
          expect(reply.status, reply.text).toBe(200)
          expect(upstream.requests.length, "the upstream was asked").toBe(1)
          return reply.headers.get("nenas-cache")
        })

      upstream.setBehaviour({ kind: "status", status: 400, body: { error: { message: "no" } } })
      const refused = yield* modelCall(apiKey, "/v1/chat/completions", ask("An error?", false), { "Nenas-Cache": "on" })
      expect(refused.status).not.toBe(200)
      expect(yield* again("An error?", false)).toBe("MISS")

      upstream.setBehaviour({ kind: "resetMidStream", afterChunks: 2 })
      const cut = yield* modelCall(apiKey, "/v1/chat/completions", ask("Cut by the upstream?", true), {
        "Nenas-Cache": "on"
      })
      expect(cut.text).toContain("error")
      expect(yield* again("Cut by the upstream?", true)).toBe("MISS")

      upstream.setBehaviour({ kind: "ok", chunkDelayMs: 100, text: "one two three four five six seven eight nine ten" })
      yield* Effect.promise(async () => {
        const client = new AbortController()
        const response = await fetch(`${baseUrl}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json", "nenas-cache": "on" },
          body: JSON.stringify(ask("Cut by its client?", true)),
          signal: client.signal
        })
        const reader = response.body!.getReader()
        await reader.read()
        client.abort()
        await reader.read().catch(() => undefined)
      })
      // The upstream would have finished by now.
      yield* realSleep(1_500)
      expect(yield* again("Cut by its client?", true)).toBe("MISS")
      // A whole answer is kept: the control that shows the three above could have hit.
      upstream.reset()
      expect(
        (yield* modelCall(apiKey, "/v1/chat/completions", ask("An error?", false), { "Nenas-Cache": "on" })).headers
          .get("nenas-cache")
      ).toBe("HIT")
      expect(upstream.requests.length).toBe(0)
    }))

  it.effect("refresh answers fresh and replaces the stored answer", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      const { apiKey } = yield* caller("cache-refresh@example.com", { sen: 1000 })
      const body = { model: "svc/nenas-flash", input: "Refresh?", max_output_tokens: 32 }
      upstream.reset()
      upstream.setBehaviour({ kind: "ok", text: "the first answer" })
      expect((yield* modelCall(apiKey, "/v1/responses", body, { "Nenas-Cache": "on" })).headers.get("nenas-cache"))
        .toBe("MISS")
      upstream.setBehaviour({ kind: "ok", text: "the second answer" })
      const refreshed = yield* modelCall(apiKey, "/v1/responses", body, { "Nenas-Cache": "refresh" })
      expect(refreshed.headers.get("nenas-cache")).toBe("MISS")
      expect((refreshed.body as any).output_text).toBe("the second answer")
      const hit = yield* modelCall(apiKey, "/v1/responses", body, { "Nenas-Cache": "on" })
      expect(hit.headers.get("nenas-cache")).toBe("HIT")
      expect((hit.body as any).output_text).toBe("the second answer")
      expect(upstream.requests.length).toBe(2)
    }))
})
