import { type Clock, Context, Duration, Effect, FiberRef, Layer, Option, Scope } from "effect"
import { Redis } from "ioredis"
import { AppConfig } from "../../AppConfig.js"
import { type ApiKeyPrincipal, CurrentApiKey } from "../../Auth/Api.js"
import { RateLimitExceeded } from "../../Domain/Errors.js"
import { effectiveRateLimits } from "../../Keys/ApiKeys.js"
import { addResponseHeaders } from "../../Request/Context.js"

const seconds = (duration: Duration.Duration): number => Math.max(1, Math.ceil(Duration.toSeconds(duration)))
const MINUTE_MS = 60_000

/** A refusal with the headers that say which limit it met. */
const refuse = (headers: Record<string, string>, error: RateLimitExceeded) =>
  Effect.zipRight(addResponseHeaders(headers), Effect.fail(error))

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

const inFlightInRedis = (redis: Redis): InFlightStore => ({
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
  giveBack: (key, id) => Effect.ignore(Effect.tryPromise(() => redis.zrem(`nenas:ratelimit:inflight:${key}`, id)))
})

/**
 * Requests per minute per key: a token bucket of `limit` tokens, one back every `refillMs`. A bucket never holds
 * more than the limit it is asked with, so a lowered limit holds from the next request on, not after a minute.
 */
export interface MinuteStore {
  /** The tokens left after this request's, or a negative number (how many short) when none was left; undefined: the store failed. */
  readonly take: (key: string, limit: number, refillMs: number) => Effect.Effect<number | undefined>
}

/** In this instance's memory, on the service's `clock`. */
const minuteInMemory = (clock: Clock.Clock): MinuteStore => {
  const buckets = new Map<string, { tokens: number; lastRefill: number }>()
  return {
    take: (key, limit, refillMs) =>
      Effect.sync(() => {
        const now = clock.unsafeCurrentTimeMillis()
        const bucket = buckets.get(key) ?? { tokens: limit, lastRefill: now }
        buckets.set(key, bucket)
        const refills = Math.floor((now - bucket.lastRefill) / refillMs)
        if (refills > 0) {
          bucket.tokens = bucket.tokens + refills
          bucket.lastRefill += refills * refillMs
        }
        // What a higher limit left over is not kept: the key is held to the limit it has now.
        bucket.tokens = Math.min(bucket.tokens, limit)
        const left = bucket.tokens - 1
        if (left >= 0) bucket.tokens = left
        return left
      })
  }
}

/** The same bucket in Redis (the tokens at the key, its last refill beside it), taken atomically by one script. */
const TAKE_TOKEN = `
local refill_key = KEYS[1] .. ":refill"
local refill_ms = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local current = tonumber(redis.call("GET", KEYS[1]))
local last = tonumber(redis.call("GET", refill_key))
if not current or not last then
  current = limit
  last = now
  redis.call("SET", refill_key, last)
end
local refills = math.floor((now - last) / refill_ms)
if refills > 0 then
  current = current + refills
  redis.call("SET", refill_key, last + refills * refill_ms)
end
if current > limit then current = limit end
local left = current - 1
if left >= 0 then current = left end
redis.call("SET", KEYS[1], current)
return left
`

const minuteInRedis = (redis: Redis): MinuteStore => ({
  take: (key, limit, refillMs) =>
    Effect.clockWith((clock) =>
      Effect.tryPromise(() =>
        redis.eval(TAKE_TOKEN, 1, `nenas:ratelimit:${key}`, refillMs, limit, clock.unsafeCurrentTimeMillis())
      ).pipe(
        Effect.map(Number),
        // The store is unreachable: calls go on unlimited rather than all failing.
        Effect.catchAll((error) =>
          Effect.as(Effect.logWarning("rate limit store failed; admitting the call", error), undefined)
        )
      )
    )
})

/**
 * A request's admission taken before its body was read (`admitBeforeBody`): its handler's own admission takes
 * it over (one token, one slot a request), or the error middleware gives its slot back (`releaseUnclaimed`).
 */
interface EarlyAdmission {
  readonly requestId: string
  readonly keyId: string
  claimed: boolean
}

const Admitted = FiberRef.unsafeMake<EarlyAdmission | undefined>(undefined)

/**
 * Per-key limits of model calls: requests per minute (a token bucket refilled
 * over a minute, `MinuteStore`) and calls in flight, each the key's own
 * (`rate_limit_rpm`, `rate_limit_concurrent`) or else `RATE_LIMIT_RPM` and
 * `RATE_LIMIT_CONCURRENT`, never above `RATE_LIMIT_RPM_MAX` and
 * `RATE_LIMIT_CONCURRENT_MAX`; in memory, or in Redis when `REDIS_URL` is set, so that every
 * instance shares them. The request guard admits a request as soon as its key is known, before its body is
 * read (`admitBeforeBody`); the handler's own admission then takes that one over instead of taking another.
 */
export class CallLimits extends Context.Tag("nenas/CallLimits")<CallLimits, {
  /** Admits call `requestId` of the key for the life of the scope, or fails with 429. */
  readonly admit: (apiKeyId: string, requestId: string) => Effect.Effect<void, RateLimitExceeded, Scope.Scope>
  /**
   * Call `requestId`'s slot: `take` admits it (or fails with 429) until `giveBack`, without a scope. Giving back a
   * slot not held does nothing, so a caller may give it back on any failure, taken or not.
   */
  readonly slot: (
    apiKeyId: string,
    requestId: string
  ) => { readonly take: Effect.Effect<void, RateLimitExceeded>; readonly giveBack: Effect.Effect<void> }
  /** Admits call `requestId` of the key while `effect` runs, or fails with 429. */
  readonly admitting: <A, E, R>(
    apiKeyId: string,
    requestId: string,
    effect: Effect.Effect<A, E, R>
  ) => Effect.Effect<A, E | RateLimitExceeded, R>
  /**
   * Takes request `requestId`'s token and slot for `key` before its body is read, or fails with 429; the
   * request's first `admit`, `admitting` or `slot.take` for that key then holds it instead of taking another.
   */
  readonly admitBeforeBody: (key: ApiKeyPrincipal, requestId: string) => Effect.Effect<void, RateLimitExceeded>
  /** Gives back the slot `admitBeforeBody` took if no handler took it over (the request ended before one ran). */
  readonly releaseUnclaimed: Effect.Effect<void>
}>() {
  static readonly make = Effect.fnUntraced(function*(inFlight: InFlightStore, minutes: MinuteStore) {
    const config = yield* AppConfig
    const { upstreamTotalTimeoutMs } = config
    // A slot outlives the longest call by a minute.
    const lapseMs = upstreamTotalTimeoutMs + 60_000

    /** A token bucket of `rpm` tokens refilled over a minute: the tokens left after this call's, or none when the store failed. */
    const perMinute = (key: string, rpm: number) => {
      const refillMs = MINUTE_MS / rpm
      return Effect.flatMap(minutes.take(`rpm:${key}`, rpm, refillMs), (remaining) =>
        remaining === undefined
          ? Effect.succeed(undefined)
          : remaining >= 0
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
          ))
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

    /** The key's per-minute token, then `hold` takes a slot and says when it is given back; with its limits' headers. */
    const fresh = <A, E, R>(
      apiKeyId: string,
      requestId: string,
      own: { readonly rateLimitRpm?: number | null; readonly rateLimitConcurrent?: number | null },
      hold: (slot: Effect.Effect<void, RateLimitExceeded>, giveBack: Effect.Effect<void>) => Effect.Effect<A, E, R>
    ) => {
      const { concurrent, rpm } = effectiveRateLimits(config, own)
      return Effect.flatMap(perMinute(apiKeyId, rpm), (minute) => {
        const slot = Effect.flatMap(takeSlot(apiKeyId, requestId, concurrent), (held) => {
          const headers: Record<string, string> = {
            "x-ratelimit-limit-concurrent": String(concurrent),
            "x-ratelimit-remaining-concurrent": String(Math.max(0, concurrent - held))
          }
          if (minute !== undefined) {
            headers["x-ratelimit-limit-requests"] = String(rpm)
            headers["x-ratelimit-remaining-requests"] = String(minute.remaining)
            headers["x-ratelimit-reset-requests"] = `${minute.resetSeconds}s`
          }
          return addResponseHeaders(headers)
        })
        return hold(slot, inFlight.giveBack(apiKeyId, requestId))
      })
    }

    /**
     * The request's admission taken before its body (its headers already added), taken over once; else the key's
     * limits for this call: its own (capped by the operator's ceilings) when the call is that key's, else the defaults.
     */
    const admission = <A, E, R>(
      apiKeyId: string,
      requestId: string,
      hold: (slot: Effect.Effect<void, RateLimitExceeded>, giveBack: Effect.Effect<void>) => Effect.Effect<A, E, R>
    ) =>
      Effect.flatMap(FiberRef.get(Admitted), (early) => {
        if (early !== undefined && !early.claimed && early.requestId === requestId && early.keyId === apiKeyId) {
          early.claimed = true
          return hold(Effect.void, inFlight.giveBack(apiKeyId, requestId))
        }
        return Effect.flatMap(Effect.serviceOption(CurrentApiKey), (principal) =>
          fresh(
            apiKeyId,
            requestId,
            Option.getOrElse(Option.filter(principal, (key) => key.keyId === apiKeyId), () => ({})),
            hold
          ))
      })

    /**
     * A slot for the life of the scope. Its release is the scope's own finalizer, not `Effect.acquireRelease`'s,
     * which diffs and patches the fiber's references (its whole context) around every release.
     */
    const admit = (apiKeyId: string, requestId: string) =>
      admission(
        apiKeyId,
        requestId,
        (slot, giveBack) =>
          Effect.uninterruptible(
            Effect.flatMap(Effect.scope, (scope) => Effect.zipRight(slot, Scope.addFinalizer(scope, giveBack)))
          )
      )

    /**
     * A slot while `effect` runs: no scope of its own to make, extend and close on every call
     * (docs/performance.md, "Going around the platform").
     */
    const admitting = <A, E, R>(apiKeyId: string, requestId: string, effect: Effect.Effect<A, E, R>) =>
      admission(apiKeyId, requestId, (slot, giveBack) => Effect.acquireUseRelease(slot, () => effect, () => giveBack))

    const slot = (apiKeyId: string, requestId: string) => ({
      take: admission(apiKeyId, requestId, (slot) => slot),
      giveBack: inFlight.giveBack(apiKeyId, requestId)
    })

    // Marked before the slot is taken (uninterruptibly with it): an interruption in between leaves nothing held unmarked.
    const admitBeforeBody = (key: ApiKeyPrincipal, requestId: string) =>
      fresh(key.keyId, requestId, key, (slot) =>
        Effect.uninterruptible(
          Effect.zipRight(slot, FiberRef.set(Admitted, { requestId, keyId: key.keyId, claimed: false }))
        ))

    const releaseUnclaimed = Effect.flatMap(FiberRef.get(Admitted), (early) => {
      if (early === undefined || early.claimed) {
        return Effect.void
      }
      early.claimed = true
      return inFlight.giveBack(early.keyId, early.requestId)
    })

    return { admit, admitting, slot, admitBeforeBody, releaseUnclaimed }
  })

  /** The stores from configuration: Redis at `REDIS_URL`, else memory. */
  static readonly layer = Layer.unwrapEffect(Effect.map(AppConfig, ({ redisUrl }) =>
    Option.match(redisUrl, {
      onNone: () =>
        Layer.effect(
          CallLimits,
          Effect.flatMap(Effect.clock, (clock) => CallLimits.make(inFlightInMemory(clock), minuteInMemory(clock)))
        ),
      onSome: (url) =>
        Layer.scoped(
          CallLimits,
          Effect.flatMap(
            Effect.acquireRelease(
              Effect.sync(() => new Redis(redisOptions(url))),
              (redis) => Effect.promise(() => redis.quit().catch(() => "closed"))
            ),
            (redis) => CallLimits.make(inFlightInRedis(redis), minuteInRedis(redis))
          )
        )
    })))
}

/** ioredis options from a `redis://[user:password@]host:port/db` URL. */
const redisOptions = (url: string) => {
  const parsed = new URL(url)
  // eslint-disable-next-line nenas/no-spread-adding-field -- once per call, not per chunk
  return {
    host: parsed.hostname,
    port: parsed.port === "" ? 6379 : Number(parsed.port),
    ...(parsed.username === "" ? {} : { username: decodeURIComponent(parsed.username) }),
    ...(parsed.password === "" ? {} : { password: decodeURIComponent(parsed.password) }),
    db: parsed.pathname.length > 1 ? Number(parsed.pathname.slice(1)) : 0,
    ...(parsed.protocol === "rediss:" ? { tls: {} } : {})
  }
}
