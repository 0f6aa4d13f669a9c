import { FetchHttpClient, HttpApiClient, HttpClient, HttpClientRequest } from "@effect/platform"
import { expect, layer } from "@effect/vitest"
import { DateTime, Effect, Layer } from "effect"
import { NenasApi } from "../../../src/Api.js"
import { ExpiredApiKey, RevokedApiKey } from "../../../src/Domain/Errors.js"
import { devToken } from "../../support/Http.js"
import { TestServer, TestServerLive } from "../../support/TestServer.js"

/** A typed client derived from the contract alone, authenticated with `token`. */
const clientWith = (token: string) =>
  Effect.flatMap(TestServer, ({ baseUrl }) =>
    HttpApiClient.make(NenasApi, {
      baseUrl,
      transformClient: HttpClient.mapRequest(HttpClientRequest.bearerToken(token))
    }))

layer(Layer.merge(TestServerLive(), FetchHttpClient.layer), { excludeTestServices: true })("the typed client", (it) => {
  it.effect("creates, lists and deletes keys and lists models with typed values", () =>
    Effect.gen(function*() {
      const dashboard = yield* clientWith(yield* devToken("typed@example.com"))
      const created = yield* dashboard.apiKeys.create({ payload: { name: "typed", environment: "test" } })
      expect(created.key.environment).toBe("test")
      expect(created.full_key.startsWith("nns_test_")).toBe(true)

      const { keys } = yield* dashboard.apiKeys.list({ urlParams: {} })
      expect(keys.map((k) => k.id)).toEqual([created.key.id])

      const api = yield* clientWith(created.full_key)
      const models = yield* api.models.list()
      expect(models.data[0]).toMatchObject({
        id: "svc/nenas-flash",
        context_window: 1_000_000,
        max_output_tokens: 32_000
      })

      expect(yield* dashboard.apiKeys.delete({ path: { id: created.key.id } })).toEqual({ ok: true })
      // The spec's error body decodes back into the tagged error the server failed with.
      const revoked = yield* Effect.flip(api.models.list())
      expect(revoked).toBeInstanceOf(RevokedApiKey)
    }))

  it.effect("a typed client sees expiry as ExpiredApiKey", () =>
    Effect.gen(function*() {
      const { clock } = yield* TestServer
      const dashboard = yield* clientWith(yield* devToken("typed-expiry@example.com"))
      const created = yield* dashboard.apiKeys.create({
        payload: {
          name: "soon",
          environment: "live",
          expires_at: DateTime.unsafeMake(clock.unsafeCurrentTimeMillis() + 60_000)
        }
      })
      clock.advance("2 minutes")
      const api = yield* clientWith(created.full_key)
      const error = yield* Effect.flip(api.models.list())
      expect(error).toBeInstanceOf(ExpiredApiKey)
      expect(error.message).toContain("expired")
    }))
})
