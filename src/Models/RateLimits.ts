import { RateLimiter } from "@effect/experimental"
import { layerStore as redisStore } from "@effect/experimental/RateLimiter/Redis"
import { Redis } from "ioredis"
import { type Clock, Context, Duration, Effect, Layer, Option, Scope } from "effect"
import { AppConfig } from "../AppConfig.js"
import { CurrentApiKey } from "../Auth/Api.js"
import { effectiveRateLimits } from "../Keys/ApiKeys.js"
import { RateLimitExceeded } from "../Domain/Errors.js"
import { addResponseHeaders } from "../Request/Context.js"

const seconds = (duration: Duration.Duration): number => Math.max(1, Math.ceil(Duration.toSeconds(duration)))
const MINUTE_MS = 60_000

/** A refusal with the headers that say which limit it met. */
const refuse = (headers: Record<string, string>, error: RateLimitExceeded) => Effect.zipRight(addResponseHeaders(headers), Effect.fail(error))

/**
 * Calls in flight per key. Each call holds a slot named by its request id
 * until it ends; a slot also lapses after the longest a call can run, so the
 * slots of an instance that died come back. A slot given back can never raise
 * the limit.
 */
export interface InFlightStore {
  /** The number of calls in flight with this one, or `undefined` when `limit` are already in flight. */
  readonly take: (key: string, id: string, limit: number, lapseMs: number) => Effect.Effect<number | undefined>
  readonly giveBack: (key: string, id: string) => Effect.Effect<void>
}

/** In this instance's memory, on the service's `clock` (read directly: no fiber steps on every call). */
const inFlightInMemory = (clock: Clock.Clock): InFlightStore => {
  const slots = new Map<string, Map<string, number>>()
  return {
    take: (key, id, limit, lapseMs) =>
      Effect.sync(() => {
        const now = clock.unsafeCurrentTimeMillis()
        const held = slots.get(key) ?? new Map<string, number>()
        for (const [slot, lapsesAt] of held) if (lapsesAt <= now) held.delete(slot)
        if (held.size >= limit) return undefined
        held.set(id, now + lapseMs)
        slots.set(key, held)
        return held.size
      }),
    giveBack: (key, id) =>
      Effect.sync(() => {
        const held = slots.get(key)
        held?.delete(id)
        if (held?.size === 0) slots.delete(key)
      })
  }
}

/** One sorted set per key, scored by when each slot lapses; one script takes a slot atomically. */
const TAKE_SLOT = `
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", ARGV[1])
local held = redis.call("ZCARD", KEYS[1])
if held >= tonumber(ARGV[2]) then return -1 end
redis.call("ZADD", KEYS[1], ARGV[3], ARGV[4])
redis.call("PEXPIRE", KEYS[1], ARGV[5])
return held + 1
`

const inFlightInRedis = (url: string) =>
  Effect.map(
    Effect.acquireRelease(
      Effect.sync(() => new Redis(redisOptions(url))),
      (redis) => Effect.promise(() => redis.quit().catch(() => "closed"))
    ),
    (redis): InFlightStore => ({
      take: (key, id, limit, lapseMs) =>
        Effect.clockWith((clock) => {
          const now = clock.unsafeCurrentTimeMillis()
          return Effect.tryPromise(() =>
            redis.eval(TAKE_SLOT, 1, `nenas:ratelimit:inflight:${key}`, now, limit, now + lapseMs, id, lapseMs)
          ).pipe(
            Effect.map((held) => Number(held) < 0 ? undefined : Number(held)),
            // The store is unreachable: calls go on unlimited rather than all failing.
            Effect.catchAll((error) => Effect.as(Effect.logWarning("in-flight store failed; admitting the call", error), 0))
          )
        }),
      giveBack: (key, id) =>
        Effect.ignore(Effect.tryPromise(() => redis.zrem(`nenas:ratelimit:inflight:${key}`, id)))
    })
  )

/**
 * Per-key limits of model calls: requests per minute through `RateLimiter` (a
 * token bucket refilled over a minute) and calls in flight, each the key's own
 * (`rate_limit_rpm`, `rate_limit_concurrent`) or else `RATE_LIMIT_RPM` and
 * `RATE_LIMIT_CONCURRENT`, never above `RATE_LIMIT_RPM_MAX` and
 * `RATE_LIMIT_CONCURRENT_MAX`; in memory, or in Redis when `REDIS_URL` is set, so that every
 * instance shares them.
 */
export class CallLimits extends Context.Tag("nenas/CallLimits")<CallLimits, {
  /** Admits call `requestId` of the key for the life of the scope, or fails with 429. */
  readonly admit: (apiKeyId: string, requestId: string) => Effect.Effect<void, RateLimitExceeded, Scope.Scope>
  /**
   * Call `requestId`'s slot: `take` admits it (or fails with 429) until `giveBack`, without a scope. Giving back a
   * slot not held does nothing, so a caller may give it back on any failure, taken or not.
   */
  readonly slot: (apiKeyId: string, requestId: string) => { readonly take: Effect.Effect<void, RateLimitExceeded>; readonly giveBack: Effect.Effect<void> }
  /** Admits call `requestId` of the key while `effect` runs, or fails with 429. */
  readonly admitting: <A, E, R>(
    apiKeyId: string,
    requestId: string,
    effect: Effect.Effect<A, E, R>
  ) => Effect.Effect<A, E | RateLimitExceeded, R>
}>() {
  static readonly make = (inFlight: InFlightStore) =>
    Effect.gen(function*() {
      // The bucket store itself, not `RateLimiter.consume`: in memory a take is one synchronous step (issue 36).
      const store = yield* RateLimiter.RateLimiterStore
      const config = yield* AppConfig
      const { upstreamTotalTimeoutMs } = config
      // A slot outlives the longest call by a minute.
      const lapseMs = upstreamTotalTimeoutMs + 60_000

      /** A token bucket of `rpm` tokens refilled over a minute: the tokens left after this call's, or none when the store failed. */
      const perMinute = (key: string, rpm: number) => {
        const refillMs = MINUTE_MS / rpm
        return store.tokenBucket({ key: `rpm:${key}`, tokens: 1, limit: rpm, refillRate: Duration.millis(refillMs), allowOverflow: false }).pipe(
          Effect.flatMap((remaining) =>
            remaining >= 0
              ? Effect.succeed({ remaining, resetSeconds: seconds(Duration.millis(refillMs * (rpm - remaining))) })
              : refuse(
                {
                  "x-ratelimit-limit-requests": String(rpm),
                  "x-ratelimit-remaining-requests": "0",
                  "x-ratelimit-reset-requests": `${seconds(Duration.millis(refillMs * -remaining))}s`
                },
                new RateLimitExceeded({
                  message: `This API key is limited to ${rpm} requests per minute.`,
                  retry_after_seconds: seconds(Duration.millis(refillMs * -remaining))
                })
              )
          ),
          // The store is unreachable: calls go on unlimited rather than all failing.
          Effect.catchTag("RateLimiterError", (error) => Effect.as(Effect.logWarning("rate limit store failed; admitting the call", error), undefined))
        )
      }

      /** A slot in flight (how many the key holds with it), or a refusal (429). `inFlight.giveBack` returns it. */
      const takeSlot = (key: string, requestId: string, concurrent: number) =>
        Effect.flatMap(inFlight.take(key, requestId, concurrent, lapseMs), (held) =>
          held === undefined
            ? refuse(
              { "x-ratelimit-limit-concurrent": String(concurrent), "x-ratelimit-remaining-concurrent": "0" },
              new RateLimitExceeded({
                message: `This API key is limited to ${concurrent} requests in flight at once.`,
                // A slot frees as soon as one of the calls in flight ends.
                retry_after_seconds: 1
              })
            )
            : Effect.succeed(held))

      /**
       * The key's limits for this call and its per-minute token; then `hold` takes a slot and says when it is given back.
       * Each call answers with its limits' headers.
       */
      const admission = <A, E, R>(
        apiKeyId: string,
        requestId: string,
        hold: (slot: Effect.Effect<void, RateLimitExceeded>, giveBack: Effect.Effect<void>) => Effect.Effect<A, E, R>
      ) =>
        Effect.flatMap(Effect.serviceOption(CurrentApiKey), (principal) => {
          // The key's own limits (capped by the operator's ceilings) when the call is that key's, else the defaults.
          const own = Option.getOrElse(Option.filter(principal, (key) => key.keyId === apiKeyId), () => ({}))
          const { concurrent, rpm } = effectiveRateLimits(config, own)
          return Effect.flatMap(perMinute(apiKeyId, rpm), (minute) => {
            const slot = Effect.flatMap(takeSlot(apiKeyId, requestId, concurrent), (held) =>
              addResponseHeaders({
                ...(minute === undefined ? {} : {
                  "x-ratelimit-limit-requests": String(rpm),
                  "x-ratelimit-remaining-requests": String(minute.remaining),
                  "x-ratelimit-reset-requests": `${minute.resetSeconds}s`
                }),
                "x-ratelimit-limit-concurrent": String(concurrent),
                "x-ratelimit-remaining-concurrent": String(Math.max(0, concurrent - held))
              }))
            return hold(slot, inFlight.giveBack(apiKeyId, requestId))
          })
        })

      /**
       * A slot for the life of the scope. Its release is the scope's own finalizer, not `Effect.acquireRelease`'s,
       * which diffs and patches the fiber's references (its whole context) around every release.
       */
      const admit = (apiKeyId: string, requestId: string) =>
        admission(apiKeyId, requestId, (slot, giveBack) =>
          Effect.uninterruptible(Effect.flatMap(Effect.scope, (scope) => Effect.zipRight(slot, Scope.addFinalizer(scope, giveBack)))))

      /** A slot while `effect` runs: no scope of its own to make, extend and close on every call (issue 36). */
      const admitting = <A, E, R>(apiKeyId: string, requestId: string, effect: Effect.Effect<A, E, R>) =>
        admission(apiKeyId, requestId, (slot, giveBack) => Effect.acquireUseRelease(slot, () => effect, () => giveBack))

      const slot = (apiKeyId: string, requestId: string) => ({
        take: admission(apiKeyId, requestId, (slot) => slot),
        giveBack: inFlight.giveBack(apiKeyId, requestId)
      })

      return { admit, admitting, slot }
    })

  /** The stores from configuration: Redis at `REDIS_URL`, else memory. */
  static readonly layer = Layer.unwrapEffect(Effect.map(AppConfig, ({ redisUrl }) =>
    Option.match(redisUrl, {
      onNone: () =>
        Layer.effect(CallLimits, Effect.flatMap(Effect.clock, (clock) => CallLimits.make(inFlightInMemory(clock)))).pipe(
          Layer.provide(RateLimiter.layerStoreMemory)
        ),
      onSome: (url) =>
        Layer.scoped(CallLimits, Effect.flatMap(inFlightInRedis(url), CallLimits.make)).pipe(
          Layer.provide(redisStore(redisOptions(url)))
        )
    })
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
