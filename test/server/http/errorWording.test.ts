import { FetchHttpClient } from "@effect/platform"
import { describe, expect, it, layer } from "@effect/vitest"
import { Effect, Either, Layer, Option, Redacted, Stream } from "effect"
import { AppConfig } from "../../../src/AppConfig.js"
import { PaymentProcessor, PaymentProcessorLive } from "../../../src/Billing/PaymentProcessor.js"
import { freePort } from "../../../src/Database/EmbeddedPostgres.js"
import { type ApiError, providerTimeoutGuidance, toErrorBody } from "../../../src/Domain/Errors.js"
import { makeOpenAiCompatible } from "../../../src/Providers/OpenAiCompatible.js"
import type { ProviderRequest } from "../../../src/Providers/Provider.js"
import { PageFetcher } from "../../../src/Search/Fetch.js"
import { makeSearxng } from "../../../src/Search/Search.js"
import { call, createKey, type Reply } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream } from "../../support/Models.js"
import { startHttpDouble } from "../../support/Search.js"
import { TestServer } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"
import { developer } from "../../support/Wallet.js"

/** A host name only the service's configuration knows: it must never reach a client. */
const INTERNAL = "internal-upstream.corp.example"

/** The error body a client would read for `error`, as text. */
const bodyText = (error: ApiError) => JSON.stringify(toErrorBody(error, "req_test", "https://dash.test/app"))

const failureOf = <A, E>(effect: Effect.Effect<A, E>) =>
  Effect.flatMap(
    Effect.either(effect),
    (result) => Either.isLeft(result) ? Effect.succeed(result.left) : Effect.dieMessage("expected a failure")
  )

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
    }))
  )

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
        // A refusal of the caller's request keeps the upstream's words, less the URLs in them
        // (docs/security.md, "Security").
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

  it.effect(
    "Stripe: an unreachable API answers the generic checkout failure, not Stripe's message or address",
    () =>
      Effect.gen(function*() {
        const closedPort = yield* Effect.promise(freePort)
        const config = AppConfig.layerWith({
          stripeSecretKey: Option.some(Redacted.make("sk_test_private")),
          stripeWebhookSecret: Option.some(Redacted.make("whsec_private")),
          stripeApiUrl: Option.some(`http://127.0.0.1:${closedPort}/private-stripe`)
        })
        const processor = yield* Effect.provide(PaymentProcessor, PaymentProcessorLive.pipe(Layer.provide(config)))
        const error = yield* failureOf(
          processor.createCheckout({
            transactionId: "txn_test",
            accountId: "acct_test",
            amountSen: 1000,
            taxSen: 0,
            taxRateBps: 0,
            email: null,
            saveCardFor: null
          })
        )
        expect(error.message).toBe("The payment processor did not create a checkout session; nothing was charged.")
        expect(naming(bodyText(error), [String(closedPort), "private-stripe", "127.0.0.1", "Stripe"])).toEqual([])
      }),
    60_000
  )
})

/** Guidance that says what is so, through the real server. */
layer(TestServerWithUpstream({ upstreamFirstByteTimeoutMs: 300, upstreamTotalTimeoutMs: 1_500 }), { timeout: 60_000 })(
  "guidance that says what is so",
  (it) => {
    const errorOf = (reply: Reply, status: number, code: string) => {
      expect(reply.status, reply.text).toBe(status)
      expect(reply.body.error.code, reply.text).toBe(code)
      return reply.body.error as { message: string; guidance: string; action_url: string | null }
    }

    it.effect("a refused /dashboard preflight says the origin is not allowed, with no billing link", () =>
      Effect.gen(function*() {
        const refused = yield* call("OPTIONS", "/dashboard/api-keys", {
          headers: { origin: "https://elsewhere.example", "access-control-request-method": "GET" }
        })
        const error = errorOf(refused, 403, "permission_denied")
        expect(error.message).toContain("not allowed from https://elsewhere.example")
        expect(error.guidance).toMatch(/origin/i)
        expect(error.guidance).not.toMatch(/dispute|suspended/i)
        expect(error.action_url).toBeNull()
      }))

    it.effect("a rotated key's old secret says it was rotated, from the cache (grace over) and from its tombstone; a deleted key says deleted", () =>
      Effect.gen(function*() {
        const { clock } = yield* TestServer
        const { token } = yield* developer("wording-rotated@example.com")
        const rotate = (id: string, graceSeconds: number) =>
          Effect.map(
            call("POST", `/dashboard/api-keys/${id}/rotate`, { token, json: { grace_seconds: graceSeconds } }),
            (reply) => {
              expect(reply.status, reply.text).toBe(200)
            }
          )
        const models = (key: string) => call("GET", "/v1/models", { token: key })

        // Without grace: the old secret is a tombstone of a key that lives on.
        const plain = yield* createKey(token, { name: "rotated at once", environment: "test" })
        yield* rotate(plain.key.id, 0)
        const tombstone = errorOf(yield* models(plain.full_key), 401, "revoked_api_key")
        expect(tombstone.message).toMatch(/was rotated/)
        expect(tombstone.guidance).toMatch(/new secret/)
        expect(tombstone.guidance).not.toMatch(/deleted/)

        // With grace: remembered while it works, then its grace ends.
        const graced = yield* createKey(token, { name: "rotated with grace", environment: "test" })
        yield* rotate(graced.key.id, 60)
        expect((yield* models(graced.full_key)).status).toBe(200)
        clock.advance("61 seconds")
        const ended = errorOf(yield* models(graced.full_key), 401, "revoked_api_key")
        expect(ended.message).toMatch(/was rotated, and the grace period of this old secret has ended/)
        expect(ended.guidance).toMatch(/new secret/)
        expect(ended.guidance).not.toMatch(/deleted/)

        // Deleted: the rotated-out secret and the current one now belong to no key.
        const removed = yield* call("DELETE", `/dashboard/api-keys/${plain.key.id}`, { token })
        expect(removed.status, removed.text).toBeLessThan(300)
        const gone = errorOf(yield* models(plain.full_key), 401, "revoked_api_key")
        expect(gone.message).toMatch(/was deleted/)
        expect(gone.guidance).toMatch(/deleted/)
      }))

    it.effect("chat's cost-cap and provider_timeout guidance name max_tokens; the cap shows the input count it priced", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const { apiKey } = yield* caller("wording-chat@example.com", { sen: 1000 })
        const chat = { model: "svc/nenas-flash", messages: [{ role: "user", content: "Say hi." }], max_tokens: 100 }
        const capped = errorOf(
          yield* modelCall(apiKey, "/v1/chat/completions", { ...chat, max_total_cost_myr: 0.000001 }),
          400,
          "invalid_request"
        )
        expect(capped.guidance).toMatch(/or lower max_tokens\.$/)
        expect(capped.guidance).not.toMatch(/max_output_tokens/)
        // The priced count is the counted one with its margin: both shown, the priced one larger.
        const [, priced, counted] = /\((\d+) input tokens: (\d+) counted plus a safety margin/.exec(capped.guidance) ??
          []
        expect(Number(priced)).toBeGreaterThan(Number(counted))
        const responses = errorOf(
          yield* modelCall(apiKey, "/v1/responses", {
            model: "svc/nenas-flash",
            input: "Say hi.",
            max_output_tokens: 100,
            max_total_cost_myr: 0.000001
          }),
          400,
          "invalid_request"
        )
        expect(responses.guidance).toMatch(/or lower max_output_tokens\.$/)

        upstream.setBehaviour({ kind: "hang" })
        for (const stream of [false, true]) {
          const timedOut = errorOf(
            yield* modelCall(apiKey, "/v1/chat/completions", { ...chat, stream }),
            504,
            "provider_timeout"
          )
          expect(timedOut.guidance, `stream ${stream}`).toBe(providerTimeoutGuidance("max_tokens"))
        }
        const responsesTimeout = errorOf(
          yield* modelCall(apiKey, "/v1/responses", { model: "svc/nenas-flash", input: "Say hi." }),
          504,
          "provider_timeout"
        )
        expect(responsesTimeout.guidance).toBe(providerTimeoutGuidance("max_output_tokens"))
        upstream.reset()
      }))
  }
)
