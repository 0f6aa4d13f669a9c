import { HttpServer } from "@effect/platform"
import { NodeHttpServer } from "@effect/platform-node"
import { describe, expect, it, layer } from "@effect/vitest"
import { ConfigProvider, Effect, Either, Layer, Option } from "effect"
import { createServer } from "node:http"
import OpenAI from "openai"
import { freePort } from "../../../src/Database/EmbeddedPostgres.js"
import {
  makeSimulatedUpstreamRouter,
  type SimulatedFaults,
  simulatedFaults,
  SimulatedUpstreamRouter
} from "../../../src/Providers/SimulatedUpstream.js"
import { caller, modelCall } from "../../support/Models.js"
import { webhookOverrides } from "../../support/Stripe.js"
import { query, TestServer, TestServerLive } from "../../support/TestServer.js"

/** compose.yaml's `upstream`: the simulated model behind an OpenAI-compatible endpoint, and the service's real client against it. */
const SimulatedUpstreamAndService = Layer.unwrapScoped(Effect.gen(function*() {
  const port = yield* Effect.promise(freePort)
  yield* Layer.buildWithScope(
    HttpServer.serve(SimulatedUpstreamRouter).pipe(
      Layer.provide(NodeHttpServer.layer(createServer, { port, host: "127.0.0.1" }))
    ),
    yield* Effect.scope
  )
  return TestServerLive({ ...webhookOverrides, upstreamBaseUrl: Option.some(`http://127.0.0.1:${port}/v1`) })
}))

layer(SimulatedUpstreamAndService, { excludeTestServices: true })(
  "the simulated upstream (compose.yaml's model)",
  (it) => {
    it.effect("answers the real upstream client plain and streamed, with usage the service bills", () =>
      Effect.gen(function*() {
        const live = yield* caller("sim-upstream@example.com", { sen: 1000 })
        const plain = yield* modelCall(live.apiKey, "/v1/chat/completions", {
          model: "svc/nenas-flash",
          messages: [{ role: "user", content: "Name a river in Malaysia." }]
        })
        expect(plain.status).toBe(200)
        expect(plain.body.choices[0].message.content).toContain("Simulated answer")
        expect(plain.body.usage.prompt_tokens).toBeGreaterThan(0)
        const { baseUrl } = yield* TestServer
        const client = new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey: live.apiKey })
        const stream = yield* Effect.promise(() =>
          client.chat.completions.create({
            model: "svc/nenas-flash",
            messages: [{ role: "user", content: "And a mountain?" }],
            stream: true,
            tools: [{
              type: "function",
              function: {
                name: "lookup",
                parameters: { type: "object", properties: { q: { type: "string" } }, required: ["q"] }
              }
            }],
            tool_choice: "required"
          })
        )
        let args = ""
        for (
          const chunk of yield* Effect.promise(async () => {
            const all = []
            for await (const chunk of stream) all.push(chunk)
            return all
          })
        ) {
          args += chunk.choices[0]?.delta.tool_calls?.[0]?.function?.arguments ?? ""
        }
        expect(JSON.parse(args)).toHaveProperty("q")
        const logs = yield* query<{ status: string; usage_source: string }>(
          "SELECT status, usage_source FROM request_logs WHERE account_id = $1",
          [live.accountId]
        )
        expect(logs).toHaveLength(2)
        for (const log of logs) expect(log).toEqual({ status: "billed", usage_source: "provider" })
      }))
  }
)

/** A simulated upstream with `faults` on a free port, for the life of the scope: its base URL. */
const flakyUpstream = (faults: SimulatedFaults) =>
  Effect.gen(function*() {
    const port = yield* Effect.promise(freePort)
    yield* Layer.buildWithScope(
      HttpServer.serve(makeSimulatedUpstreamRouter(faults)).pipe(
        Layer.provide(NodeHttpServer.layer(createServer, { port, host: "127.0.0.1" }))
      ),
      yield* Effect.scope
    )
    return `http://127.0.0.1:${port}/v1`
  })

const ask = (baseUrl: string) =>
  Effect.promise(async () => {
    const response = await fetch(`${baseUrl}/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: "Bearer sim" },
      body: JSON.stringify({ model: "gpt-4.1-mini", messages: [{ role: "user", content: "Hello?" }] })
    })
    return {
      status: response.status,
      retryAfter: response.headers.get("retry-after"),
      body: await response.json() as any
    }
  })

const faultsFrom = (env: Record<string, string>) =>
  Effect.either(Effect.withConfigProvider(simulatedFaults, ConfigProvider.fromMap(new Map(Object.entries(env)))))

describe("the flaky simulated upstream (compose.yaml's upstream-flaky)", () => {
  it.scopedLive("SIMULATED_UPSTREAM_FAILURE_RATE=1 answers every call 503 in OpenAI's error shape", () =>
    Effect.gen(function*() {
      const baseUrl = yield* flakyUpstream({ failureRate: 1, rateLimitRate: 0, retryAfterSeconds: 2 })
      for (let i = 0; i < 5; i++) {
        const reply = yield* ask(baseUrl)
        expect(reply.status).toBe(503)
        expect(reply.body.error.type).toBe("server_error")
      }
    }))

  it.scopedLive("SIMULATED_UPSTREAM_RATE_LIMIT_RATE=1 answers 429 with Retry-After", () =>
    Effect.gen(function*() {
      const baseUrl = yield* flakyUpstream({ failureRate: 0, rateLimitRate: 1, retryAfterSeconds: 7 })
      const reply = yield* ask(baseUrl)
      expect(reply.status).toBe(429)
      expect(reply.retryAfter).toBe("7")
      expect(reply.body.error.code).toBe("rate_limit_exceeded")
    }))

  it.scopedLive("at 0.3 and 0.2, about that share of 300 calls fail each way and the rest are answered", () =>
    Effect.gen(function*() {
      const baseUrl = yield* flakyUpstream({ failureRate: 0.3, rateLimitRate: 0.2, retryAfterSeconds: 1 })
      const replies = yield* Effect.all(Array.from({ length: 300 }, () => ask(baseUrl)), { concurrency: 10 })
      const count = (status: number) => replies.filter((reply) => reply.status === status).length
      // Binomial(300, 0.3): mean 90, sd 7.9; (300, 0.2): mean 60, sd 6.9; bounds at more than 5 sd.
      expect(count(503)).toBeGreaterThan(50)
      expect(count(503)).toBeLessThan(130)
      expect(count(429)).toBeGreaterThan(25)
      expect(count(429)).toBeLessThan(95)
      expect(count(200) + count(503) + count(429)).toBe(300)
      for (const reply of replies.filter((one) => one.status === 200)) {
        expect(reply.body.choices[0].message.content).toContain("Simulated answer")
      }
    }))

  it.effect("reads SIMULATED_UPSTREAM_* and refuses bad values in one line naming them", () =>
    Effect.gen(function*() {
      expect(yield* faultsFrom({})).toEqual(Either.right({ failureRate: 0, rateLimitRate: 0, retryAfterSeconds: 2 }))
      expect(yield* faultsFrom({ SIMULATED_UPSTREAM_FAILURE_RATE: "0.3", SIMULATED_UPSTREAM_RETRY_AFTER_SECONDS: "5" }))
        .toEqual(Either.right({ failureRate: 0.3, rateLimitRate: 0, retryAfterSeconds: 5 }))
      for (
        const [env, name] of [
          [{ SIMULATED_UPSTREAM_FAILURE_RATE: "1.5" }, "SIMULATED_UPSTREAM_FAILURE_RATE"],
          [{ SIMULATED_UPSTREAM_RATE_LIMIT_RATE: "-0.1" }, "SIMULATED_UPSTREAM_RATE_LIMIT_RATE"],
          [{ SIMULATED_UPSTREAM_FAILURE_RATE: "0.7", SIMULATED_UPSTREAM_RATE_LIMIT_RATE: "0.5" }, "together"]
        ] as const
      ) {
        const result = yield* faultsFrom(env)
        expect(Either.isLeft(result)).toBe(true)
        const message = Either.isLeft(result) ? String(result.left) : ""
        expect(message).toContain(name)
        expect(message.split("\n")).toHaveLength(1)
      }
    }))
})
