import { expect, layer } from "@effect/vitest"
import { createServer } from "node:http"
import { HttpServer } from "@effect/platform"
import { NodeHttpServer } from "@effect/platform-node"
import { Effect, Layer, Option } from "effect"
import OpenAI from "openai"
import { freePort } from "../src/Database/EmbeddedPostgres.js"
import { SimulatedUpstreamRouter } from "../src/Providers/SimulatedUpstream.js"
import { caller, modelCall } from "./support/Models.js"
import { webhookOverrides } from "./support/Stripe.js"
import { query, TestServer, TestServerLive } from "./support/TestServer.js"

/** compose.yaml's `upstream`: the simulated model behind an OpenAI-compatible endpoint, and the service's real client against it. */
const SimulatedUpstreamAndService = Layer.unwrapScoped(Effect.gen(function*() {
  const port = yield* Effect.promise(freePort)
  yield* Layer.buildWithScope(
    HttpServer.serve(SimulatedUpstreamRouter).pipe(Layer.provide(NodeHttpServer.layer(createServer, { port, host: "127.0.0.1" }))),
    yield* Effect.scope
  )
  return TestServerLive({ ...webhookOverrides, upstreamBaseUrl: Option.some(`http://127.0.0.1:${port}/v1`) })
}))

layer(SimulatedUpstreamAndService, { excludeTestServices: true })("the simulated upstream (compose.yaml's model)", (it) => {
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
            tools: [{ type: "function", function: { name: "lookup", parameters: { type: "object", properties: { q: { type: "string" } }, required: ["q"] } } }],
            tool_choice: "required"
          })
        )
        let args = ""
        for (const chunk of yield* Effect.promise(async () => {
          const all = []
          for await (const chunk of stream) all.push(chunk)
          return all
        })) {
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
})
