import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { PaymentProcessor } from "../../../src/Billing/PaymentProcessor.js"
import { ProviderUnavailable } from "../../../src/Domain/Errors.js"
import { costOf, DEFAULT_PRICES } from "../../../src/Domain/Prices.js"
import { Provider, Script } from "../../../src/Providers/Provider.js"
import { Router } from "../../../src/Routing/Router.js"
import { caller, modelCall, walletOf } from "../../support/Models.js"
import { WEBHOOK_SECRET, webhookOverrides } from "../../support/Stripe.js"
import { TestServerLive } from "../../support/TestServer.js"

/**
 * Handlers over HTTP on the real server (`makeServer`), with the provider
 * scripted call by call, the route fixed and the checkout in memory: no
 * upstream double, no Stripe double. The wallet is the real one, on PostgreSQL.
 */

const script = Provider.scripted([
  Script.answer("Selamat pagi!", { usage: Script.usage(20, 40) }),
  Script.streamed(["Sela", "mat ", "pagi!"], { delay: "30 millis", usage: Script.usage(20, 40) }),
  Script.refuse(new ProviderUnavailable({ message: "The model provider answered HTTP 503." }))
])
const router = Router.fixed(Router.fixedRoute("reasoning", "o4-mini"))
const checkout = PaymentProcessor.inMemory()

const server = TestServerLive(webhookOverrides, {
  provider: Provider.Test(script),
  router: Router.Test(router),
  paymentProcessor: PaymentProcessor.Test(checkout, WEBHOOK_SECRET)
})

/** What 20 tokens in and 40 out cost on the routed model: what each successful call is billed. */
const billed = costOf(DEFAULT_PRICES, "o4-mini", {
  inputTokens: 20,
  cachedTokens: 0,
  outputTokens: 40,
  searches: 0,
  pages: 0
})
const chat = (stream: boolean) => ({
  model: "svc/nenas-flash",
  messages: [{ role: "user", content: "Say good morning in Malay." }],
  max_tokens: 100,
  stream
})

layer(server, { excludeTestServices: true })("a handler on test Layers", (it) => {
  it.effect("a chat completion answers what the provider said, on the routed model, and bills its usage", () =>
    Effect.gen(function*() {
      const { accountId, apiKey } = yield* caller("layers@example.com", { sen: 1_000 })
      expect(checkout.state.calls.map((c) => c.amountSen)).toEqual([1_000])
      const reply = yield* modelCall(apiKey, "/v1/chat/completions", chat(false))
      expect(reply.status, reply.text).toBe(200)
      expect(reply.body.choices[0].message.content).toBe("Selamat pagi!")
      expect(reply.body.usage).toMatchObject({ prompt_tokens: 20, completion_tokens: 40 })
      expect(billed).toBe(832)
      expect(reply.body.cost_myr).toBe("0.000832")
      expect(script.requests[0]).toMatchObject({ model: "o4-mini", reasoningModel: true, maxOutputTokens: 100 })
      expect(script.requests[0]?.messages.at(-1)).toEqual({ role: "user", content: "Say good morning in Malay." })
      expect(router.inputs[0]?.messages).toEqual([{ role: "user", content: "Say good morning in Malay." }])
      expect(yield* walletOf(accountId)).toEqual({ available: 10_000_000 - billed, reserved: 0, spent: billed })
    }))

  it.effect("a streamed completion relays the scripted parts as they come and bills the same", () =>
    Effect.gen(function*() {
      const { accountId, apiKey } = yield* caller("layers-stream@example.com", { sen: 1_000 })
      const started = Date.now()
      const reply = yield* modelCall(apiKey, "/v1/chat/completions", chat(true))
      expect(reply.status, reply.text).toBe(200)
      expect(Date.now() - started).toBeGreaterThanOrEqual(60)
      const chunks = reply.text.split("\n").filter((line) => line.startsWith("data: {")).map((line) =>
        JSON.parse(line.slice(6))
      )
      const text = chunks.map((chunk) => chunk.choices[0]?.delta?.content ?? "").join("")
      expect(text).toBe("Selamat pagi!")
      expect(chunks.at(-1)).toMatchObject({ usage: { prompt_tokens: 20, completion_tokens: 40 }, cost_myr: "0.000832" })
      expect(reply.text.trimEnd().endsWith("data: [DONE]")).toBe(true)
      expect(yield* walletOf(accountId)).toEqual({ available: 10_000_000 - billed, reserved: 0, spent: billed })
    }))

  it.effect("a provider refusal answers its error in the spec's shape and bills nothing", () =>
    Effect.gen(function*() {
      const { accountId, apiKey } = yield* caller("layers-refused@example.com", { sen: 1_000 })
      const reply = yield* modelCall(apiKey, "/v1/chat/completions", chat(false))
      expect(reply.status, reply.text).toBe(503)
      expect(reply.body.error).toMatchObject({ code: "provider_unavailable", retryable: true })
      expect(script.requests.length).toBe(3)
      expect(yield* walletOf(accountId)).toEqual({ available: 10_000_000, reserved: 0, spent: 0 })
    }))
})
