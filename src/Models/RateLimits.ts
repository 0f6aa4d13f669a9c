import { RateLimiter } from "@effect/experimental"
import { layerStore as redisStore } from "@effect/experimental/RateLimiter/Redis"
import { Context, Duration, Effect, Layer, Option } from "effect"
import type { Scope } from "effect"
import { AppConfig } from "../AppConfig.js"
import { RateLimitExceeded } from "../Domain/Errors.js"
import { addResponseHeaders } from "../Http/ResponseHeaders.js"

const seconds = (duration: Duration.Duration): number => Math.max(1, Math.ceil(Duration.toSeconds(duration)))

/**
 * Per-key limits of model calls (`RATE_LIMIT_RPM`, `RATE_LIMIT_CONCURRENT`)
 * in the `RateLimiter` store: in memory, or Redis when `REDIS_URL` is set so
 * that every instance shares them.
 */
export class CallLimits extends Context.Tag("nenas/CallLimits")<CallLimits, {
  /** Admits one call of the key for the life of the scope, or fails with 429. */
  readonly admit: (apiKeyId: string) => Effect.Effect<void, RateLimitExceeded, Scope.Scope>
}>() {
  static readonly layerWithoutStore = Layer.effect(
    CallLimits,
    Effect.gen(function*() {
      const limiter = yield* RateLimiter.RateLimiter
      const { rateLimitConcurrent, rateLimitRpm } = yield* AppConfig
      // Requests per minute: a token bucket that refills RPM tokens a minute, so bursts up to RPM pass.
      const perMinute = (key: string) =>
        limiter.consume({ algorithm: "token-bucket", key: `rpm:${key}`, limit: rateLimitRpm, window: "1 minute" })
      // Calls in flight: a bucket of RATE_LIMIT_CONCURRENT slots, taken at the start and given back at the end.
      // It also refills one slot a minute, so slots held by an instance that died come back.
      const inFlight = (key: string, tokens: 1 | -1) =>
        limiter.consume({
          algorithm: "token-bucket",
          key: `inflight:${key}`,
          limit: rateLimitConcurrent,
          window: Duration.minutes(rateLimitConcurrent),
          tokens
        })

      const exceeded = (what: string, limit: number) => (error: RateLimiter.RateLimiterError) =>
        error.reason === "Exceeded"
          ? Effect.zipRight(
            addResponseHeaders(what === "requests" ? {
              "x-ratelimit-limit-requests": String(limit),
              "x-ratelimit-remaining-requests": "0",
              "x-ratelimit-reset-requests": `${seconds(error.retryAfter)}s`
            } : {
              "x-ratelimit-limit-concurrent": String(limit),
              "x-ratelimit-remaining-concurrent": "0"
            }),
            Effect.fail(new RateLimitExceeded({
              message: what === "requests"
                ? `This API key is limited to ${limit} requests per minute.`
                : `This API key is limited to ${limit} requests in flight at once.`,
              retry_after_seconds: seconds(error.retryAfter)
            }))
          )
          // The store is unreachable: calls go on unlimited rather than all failing.
          : Effect.as(Effect.logWarning("rate limit store failed; admitting the call", error), Option.none())

      const admit = (apiKeyId: string) =>
        Effect.gen(function*() {
          const minute = yield* perMinute(apiKeyId).pipe(Effect.map(Option.some), Effect.catchAll(exceeded("requests", rateLimitRpm)))
          const slot = yield* Effect.acquireRelease(
            inFlight(apiKeyId, 1).pipe(Effect.map(Option.some), Effect.catchAll(exceeded("concurrent", rateLimitConcurrent))),
            (taken) => Option.isSome(taken) ? Effect.ignore(inFlight(apiKeyId, -1)) : Effect.void
          )
          yield* addResponseHeaders({
            ...Option.match(minute, {
              onNone: () => ({}),
              onSome: (result) => ({
                "x-ratelimit-limit-requests": String(result.limit),
                "x-ratelimit-remaining-requests": String(Math.max(0, result.remaining)),
                "x-ratelimit-reset-requests": `${seconds(result.resetAfter)}s`
              })
            }),
            ...Option.match(slot, {
              onNone: () => ({}),
              onSome: (result) => ({
                "x-ratelimit-limit-concurrent": String(result.limit),
                "x-ratelimit-remaining-concurrent": String(Math.max(0, result.remaining))
              })
            })
          })
        })

      return { admit }
    })
  )

  /** The store from configuration: Redis at `REDIS_URL`, else memory. */
  static readonly layer = Layer.unwrapEffect(Effect.map(AppConfig, ({ redisUrl }) =>
    CallLimits.layerWithoutStore.pipe(
      Layer.provide(RateLimiter.layer),
      Layer.provide(Option.match(redisUrl, {
        onNone: () => RateLimiter.layerStoreMemory,
        onSome: (url) => redisStore(redisOptions(url))
      }))
    )
  ))
}

/** ioredis options from a `redis://[user:password@]host:port/db` URL. */
const redisOptions = (url: string) => {
  const parsed = new URL(url)
  return {
    host: parsed.hostname,
    port: parsed.port === "" ? 6379 : Number(parsed.port),
    ...(parsed.username === "" ? {} : { username: decodeURIComponent(parsed.username) }),
    ...(parsed.password === "" ? {} : { password: decodeURIComponent(parsed.password) }),
    db: parsed.pathname.length > 1 ? Number(parsed.pathname.slice(1)) : 0,
    ...(parsed.protocol === "rediss:" ? { tls: {} } : {}),
    prefix: "nenas:ratelimit:"
  }
}
