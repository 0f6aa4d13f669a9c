import { FetchHttpClient } from "@effect/platform"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Layer, Option, Redacted, Stream } from "effect"
import { AppConfig } from "../src/AppConfig.js"
import { PaymentProcessor, PaymentProcessorLive } from "../src/Billing/PaymentProcessor.js"
import { freePort } from "../src/Database/EmbeddedPostgres.js"
import { type ApiError, toErrorBody } from "../src/Domain/Errors.js"
import { makeOpenAiCompatible } from "../src/Providers/OpenAiCompatible.js"
import type { ProviderRequest } from "../src/Providers/Provider.js"
import { PageFetcher } from "../src/Search/Fetch.js"
import { makeSearxng } from "../src/Search/Search.js"
import { startHttpDouble } from "./support/Search.js"

/** A host name only the service's configuration knows: it must never reach a client. */
const INTERNAL = "internal-upstream.corp.example"

/** The error body a client would read for `error`, as text. */
const bodyText = (error: ApiError) => JSON.stringify(toErrorBody(error, "req_test", "https://dash.test/app"))

const failureOf = <A, E>(effect: Effect.Effect<A, E>) =>
  Effect.flatMap(Effect.either(effect), (result) =>
    Either.isLeft(result) ? Effect.succeed(result.left) : Effect.dieMessage("expected a failure"))

const request: ProviderRequest = {
  model: "gpt-test",
  messages: [{ role: "user", content: "hello" }],
  maxOutputTokens: 16,
  reasoningEffort: undefined,
  reasoningModel: false
}

/** Answers every path with `status` and a body naming internal addresses, as a misbehaving proxy might. */
const leakyServer = (status: number) =>
  startHttpDouble((_request, response) =>
    void response.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify({
      error: { message: `backend http://${INTERNAL}:8000/v1/chat failed; see https://10.9.8.7/admin` }
    })))

/** Whether `text` names any of `secrets`. */
const naming = (text: string, secrets: ReadonlyArray<string>) => secrets.filter((secret) => text.includes(secret))

describe("failures of what the service calls are answered in generic words", () => {
  it.effect("the upstream: unreachable, 5xx, 429, a refusal and a broken stream name no URL", () =>
    Effect.gen(function*() {
      const closedPort = yield* Effect.promise(freePort)
      const upstream = (baseUrl: string) =>
        makeOpenAiCompatible({ baseUrl, apiKey: Option.none(), firstByteTimeoutMs: 5_000, totalTimeoutMs: 10_000 })
      const unreachable = yield* upstream(`http://127.0.0.1:${closedPort}/private-path/v1`)
      const down = yield* failureOf(unreachable.complete(request))
      expect(down._tag).toBe("ProviderUnavailable")
      expect(naming(bodyText(down), [String(closedPort), "private-path", "127.0.0.1"])).toEqual([])
      for (const status of [500, 429, 400]) {
        const server = yield* Effect.promise(() => leakyServer(status))
        const leaky = yield* upstream(`${server.baseUrl}/private-path/v1`)
        const refused = yield* failureOf(leaky.complete(request))
        const streamed = yield* failureOf(Effect.flatMap(leaky.stream(request), Stream.runDrain))
        yield* Effect.promise(() => server.close())
        for (const error of [refused, streamed]) {
          const text = bodyText(error)
          expect(naming(text, [INTERNAL, "10.9.8.7", server.host, "private-path"]), `${status}: ${text}`).toEqual([])
        }
        // A refusal of the caller's request keeps the upstream's words (DESIGN.md), less the URLs in them.
        if (status === 400) expect(refused.message).toContain("backend [url] failed")
      }
    }).pipe(Effect.provide(FetchHttpClient.layer)))

  it.effect("the search API: unreachable names neither SEARCH_BASE_URL nor its port", () =>
    Effect.gen(function*() {
      const closedPort = yield* Effect.promise(freePort)
      const search = yield* makeSearxng(`http://127.0.0.1:${closedPort}/private-search`)
      const error = yield* failureOf(search.search("floods", 3))
      expect(error._tag).toBe("SearchError")
      expect(naming(bodyText(error), [String(closedPort), "private-search", "127.0.0.1"])).toEqual([])
      const server = yield* Effect.promise(() => leakyServer(502))
      const failing = yield* makeSearxng(`${server.baseUrl}/private-search`)
      const answered = yield* failureOf(failing.search("floods", 3))
      yield* Effect.promise(() => server.close())
      expect(naming(bodyText(answered), [INTERNAL, "10.9.8.7", server.host, "private-search"])).toEqual([])
    }).pipe(
      Effect.provide(FetchHttpClient.layer),
      Effect.provide(Layer.succeed(PageFetcher, { fetch: () => Effect.dieMessage("no page is read here") }))
    ))

  it.effect("Stripe: an unreachable API answers the generic checkout failure, not Stripe's message or address", () =>
    Effect.gen(function*() {
      const closedPort = yield* Effect.promise(freePort)
      const config = AppConfig.layerWith({
        stripeSecretKey: Option.some(Redacted.make("sk_test_private")),
        stripeWebhookSecret: Option.some(Redacted.make("whsec_private")),
        stripeApiUrl: Option.some(`http://127.0.0.1:${closedPort}/private-stripe`)
      })
      const processor = yield* Effect.provide(PaymentProcessor, PaymentProcessorLive.pipe(Layer.provide(config)))
      const error = yield* failureOf(processor.createCheckout({ transactionId: "txn_test", accountId: "acct_test", amountSen: 1000, email: null, saveCardFor: null }))
      expect(error.message).toBe("The payment processor did not create a checkout session; nothing was charged.")
      expect(naming(bodyText(error), [String(closedPort), "private-stripe", "127.0.0.1", "Stripe"])).toEqual([])
    }), 60_000)
})
