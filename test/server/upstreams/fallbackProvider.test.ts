import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Stream } from "effect"
import { freePort } from "../../../src/Database/EmbeddedPostgres.js"
import { parseUpstreams } from "../../../src/Domain/Upstreams.js"
import { makeFallbackProvider } from "../../../src/Providers/Fallback.js"
import type { AttemptOutcome, ProviderRequest, UpstreamAttempt } from "../../../src/Providers/Provider.js"
import { makeTestBreakers } from "../../support/Breakers.js"
import { startUpstream, type UpstreamServer } from "../../support/Upstream.js"

/**
 * The fallback provider's decisions without a database or a server: three
 * upstream stand-ins with real timing, breakers driven by hand, and the
 * attempts and metrics it reports. What the call path makes of them (billing,
 * logs, routing) is test/fallbacks.test.ts's.
 */

const three = Effect.acquireRelease(
  Effect.promise(() => Promise.all([startUpstream(), startUpstream(), startUpstream()])),
  (servers) => Effect.promise(() => Promise.all(servers.map((s) => s.close())))
)

const upstreamsOf = (urls: ReadonlyArray<string>) =>
  Either.getOrThrow(parseUpstreams(JSON.stringify(urls.map((url, i) => ({
    name: `u${i + 1}`,
    base_url: url,
    models: { general: [`m${i + 1}`], reasoning: [`r${i + 1}`] }
  })))))

const request = (attempts: Array<UpstreamAttempt>, model = "m1"): ProviderRequest => ({
  model,
  messages: [{ role: "user", content: "Hello" }],
  maxOutputTokens: 50,
  reasoningEffort: undefined,
  reasoningModel: false,
  attempted: (attempt, amend) =>
    Effect.sync(() => {
      if (amend) attempts.pop()
      attempts.push(attempt)
    })
})

const setup = (servers: ReadonlyArray<UpstreamServer>, firstByteTimeoutMs: number) =>
  Effect.gen(function*() {
    const breakers = makeTestBreakers()
    const metrics: Array<readonly [string, AttemptOutcome, number]> = []
    const provider = yield* makeFallbackProvider(
      { upstreams: upstreamsOf(servers.map((s) => s.baseUrl)), firstByteTimeoutMs, totalTimeoutMs: 5_000 },
      breakers.service,
      (target, outcome, seconds) => Effect.sync(() => void metrics.push([target, outcome, seconds]))
    )
    return { provider, breakers, metrics }
  })

const outcomes = (attempts: ReadonlyArray<UpstreamAttempt>) => attempts.map((a) => [a.target, a.outcome])

describe("the fallback provider", () => {
  it.scopedLive("three targets, the first two silent: each is given its share of the 900 ms budget, the third answers", () =>
    Effect.gen(function*() {
      const servers = yield* three
      servers[0]?.setBehaviour({ kind: "hang" })
      servers[1]?.setBehaviour({ kind: "hang" })
      servers[2]?.setBehaviour({ kind: "ok", text: "third" })
      const { metrics, provider } = yield* setup(servers, 900)
      const attempts: Array<UpstreamAttempt> = []
      const started = Date.now()
      const completion = yield* provider.complete(request(attempts))
      const took = Date.now() - started
      expect(completion.text).toBe("third")
      expect(outcomes(attempts)).toEqual([["u1/m1", "first_byte_timeout"], ["u2/m2", "first_byte_timeout"], [
        "u3/m3",
        "ok"
      ]])
      // 900 / 3 = 300 ms for the first; (900 - 300) / 2 = 300 ms for the second.
      expect(attempts[0]?.latencyMs).toBeGreaterThanOrEqual(290)
      expect(attempts[0]?.latencyMs).toBeLessThan(450)
      expect(attempts[1]?.latencyMs).toBeGreaterThanOrEqual(290)
      expect(attempts[1]?.latencyMs).toBeLessThan(450)
      expect(took).toBeLessThan(900 + 400)
      expect(metrics.map(([target, outcome]) => [target, outcome])).toEqual(outcomes(attempts))
      expect(servers[2]?.requests.map((r) => (r.body as { model: string }).model)).toEqual(["m3"])
    }))

  it.scopedLive("a first target that refuses at once leaves its share to the others: the second may take 380 ms of a 900 ms budget", () =>
    Effect.gen(function*() {
      const servers = yield* three
      servers[0]?.setBehaviour({ kind: "status", status: 503 })
      servers[1]?.setBehaviour({ kind: "ok", text: "second, slowly", delayMs: 380 })
      const { provider } = yield* setup(servers, 900)
      const attempts: Array<UpstreamAttempt> = []
      const completion = yield* provider.complete(request(attempts))
      // A fixed third of the budget (300 ms) would give up on it; what is left over two targets (about 445 ms) does not.
      expect(completion.text).toBe("second, slowly")
      expect(outcomes(attempts)).toEqual([["u1/m1", "server_error"], ["u2/m2", "ok"]])
      expect(servers[2]?.requests.length).toBe(0)
    }))

  it.scopedLive("every target silent: provider_timeout once the budget is spent, each tried once", () =>
    Effect.gen(function*() {
      const servers = yield* three
      for (const server of servers) server.setBehaviour({ kind: "hang" })
      const { provider } = yield* setup(servers, 600)
      const attempts: Array<UpstreamAttempt> = []
      const error = yield* Effect.flip(provider.complete(request(attempts)))
      expect(error._tag).toBe("ProviderTimeout")
      expect(outcomes(attempts).map(([, outcome]) => outcome)).toEqual([
        "first_byte_timeout",
        "first_byte_timeout",
        "first_byte_timeout"
      ])
      expect(servers.map((s) => s.requests.length)).toEqual([1, 1, 1])
    }))

  it.scopedLive("a 429 with Retry-After is recorded to that target's breaker; an open target gets no request", () =>
    Effect.gen(function*() {
      const servers = yield* three
      servers[0]?.setBehaviour({ kind: "status", status: 429, retryAfter: "3" })
      const { breakers, provider } = yield* setup(servers, 900)
      breakers.open("u2/m2", Date.now() + 60_000)
      const attempts: Array<UpstreamAttempt> = []
      yield* provider.complete(request(attempts))
      expect(outcomes(attempts)).toEqual([["u1/m1", "rate_limited"], ["u2/m2", "breaker_open"], ["u3/m3", "ok"]])
      expect(breakers.recorded).toEqual([
        { target: "u1/m1", outcome: { _tag: "Failure", retryAfterMs: 3000 } },
        { target: "u3/m3", outcome: { _tag: "Success" } }
      ])
      expect(servers[1]?.requests.length).toBe(0)
    }))

  it.scopedLive("a stream cut after its head does not switch: the parts fail, the attempt is amended to cut_short", () =>
    Effect.gen(function*() {
      const servers = yield* three
      servers[0]?.setBehaviour({ kind: "resetMidStream", afterChunks: 2 })
      const { breakers, provider } = yield* setup(servers, 900)
      const attempts: Array<UpstreamAttempt> = []
      const parts = yield* provider.stream(request(attempts))
      expect(outcomes(attempts)).toEqual([["u1/m1", "ok"]])
      const result = yield* Effect.either(Stream.runCollect(parts))
      expect(Either.isLeft(result)).toBe(true)
      expect(outcomes(attempts)).toEqual([["u1/m1", "cut_short"]])
      expect(breakers.recorded.map((r) => r.outcome._tag)).toEqual(["Success", "Failure"])
      expect(servers[1]?.requests.length).toBe(0)
      expect(servers[2]?.requests.length).toBe(0)
    }))

  it.scopedLive("reasoning requests try the reasoning models; a model no category starts with goes alone to its upstream", () =>
    Effect.gen(function*() {
      const servers = yield* three
      servers[0]?.setBehaviour({ kind: "status", status: 500 })
      const { provider } = yield* setup(servers, 900)
      const attempts: Array<UpstreamAttempt> = []
      yield* provider.complete({ ...request(attempts, "r1"), reasoningModel: true })
      expect(outcomes(attempts)).toEqual([["u1/r1", "server_error"], ["u2/r2", "ok"]])
      const alone: Array<UpstreamAttempt> = []
      const error = yield* Effect.flip(provider.complete(request(alone, "m2-other")))
      expect(error._tag).toBe("ProviderUnavailable")
      expect(outcomes(alone)).toEqual([["u1/m2-other", "server_error"]])
    }))

  it.scopedLive("every target open: provider_unavailable with retry_after_seconds to the earliest half-open", () =>
    Effect.gen(function*() {
      const servers = yield* three
      const { breakers, provider } = yield* setup(servers, 900)
      const now = Date.now()
      breakers.open("u1/m1", now + 30_000)
      breakers.open("u2/m2", now + 2_500)
      breakers.open("u3/m3", now + 10_000)
      const error = yield* Effect.flip(provider.complete(request([])))
      expect(error._tag).toBe("ProviderUnavailable")
      expect(error._tag === "ProviderUnavailable" ? error.retry_after_seconds : undefined).toBe(3)
      expect(servers.map((s) => s.requests.length)).toEqual([0, 0, 0])
    }))

  it.scopedLive("connection refused moves on at once", () =>
    Effect.gen(function*() {
      const servers = yield* three
      const port = yield* Effect.promise(freePort)
      const upstreams = upstreamsOf([`http://127.0.0.1:${port}/v1`, servers[1]?.baseUrl ?? ""])
      const provider = yield* makeFallbackProvider(
        { upstreams, firstByteTimeoutMs: 900, totalTimeoutMs: 5_000 },
        makeTestBreakers().service,
        () => Effect.void
      )
      const attempts: Array<UpstreamAttempt> = []
      yield* provider.complete(request(attempts))
      expect(outcomes(attempts)).toEqual([["u1/m1", "connection_error"], ["u2/m2", "ok"]])
      expect(attempts[0]?.latencyMs).toBeLessThan(200)
    }))
})
