import { Effect, Runtime, Schedule } from "effect"
import type { Scope } from "effect"
import { Redis } from "ioredis"
import { randomUUID } from "node:crypto"
import { type OpenStore, stateAt } from "./BreakerService.js"
import type { Admission, BreakerState } from "./BreakerTypes.js"

/**
 * Breakers' open state shared by every instance through Redis:
 * - `<prefix>open`, a hash of target → the epoch millisecond it half-opens;
 *   the hash lapses a day after the latest half-open time written (a breaker
 *   left half-open with no traffic for a day is closed by then);
 * - `<prefix>probe:<target>`, the half-open breaker's one probe, taken with
 *   `SET NX PX` inside a script, so two instances cannot both take it;
 * - `<prefix>events`, a channel on which each change is published: every
 *   instance keeps a copy of the hash in memory, so `admit` on a closed target
 *   is a map lookup and asks Redis only once a breaker is due to half-open.
 * The copy is also read again in whole every `resyncMs` and on each
 * reconnection, in case a message was lost.
 */
export interface RedisBreakersOptions {
  readonly url: string
  /** Key and channel prefix; tests give each its own. */
  readonly prefix?: string | undefined
  readonly resyncMs?: number | undefined
}

const KEEP_MS = 24 * 60 * 60 * 1000

/** Opens (or keeps open longer) a breaker and frees its probe. Answers the half-open time. */
const OPEN = `
local at = tonumber(ARGV[2])
local current = tonumber(redis.call("HGET", KEYS[1], ARGV[1]) or "0")
if current > at then at = current end
local text = string.format("%.0f", at)
redis.call("HSET", KEYS[1], ARGV[1], text)
local keep = at - tonumber(ARGV[3]) + ${KEEP_MS}
if redis.call("PTTL", KEYS[1]) < keep then redis.call("PEXPIRE", KEYS[1], string.format("%.0f", keep)) end
redis.call("DEL", KEYS[2])
redis.call("PUBLISH", ARGV[4], text .. " " .. ARGV[1])
return text
`

/** Closes a half-open breaker: "0", or the half-open time of one opened again meanwhile (left open). */
const CLOSE = `
local current = redis.call("HGET", KEYS[1], ARGV[1])
if not current then return "0" end
if tonumber(current) > tonumber(ARGV[2]) then return current end
redis.call("HDEL", KEYS[1], ARGV[1])
redis.call("DEL", KEYS[2])
redis.call("PUBLISH", ARGV[3], "0 " .. ARGV[1])
return "0"
`

/**
 * The half-open breaker's probe: `{"closed"}`, `{"probe"}` (the caller's), `{"open", half-open time}`
 * (opened again meanwhile) or `{"held", lease end}` (another caller's probe holds it).
 */
const PROBE = `
local current = redis.call("HGET", KEYS[1], ARGV[1])
if not current then return {"closed"} end
if tonumber(current) > tonumber(ARGV[2]) then return {"open", current} end
if redis.call("SET", KEYS[2], ARGV[3], "NX", "PX", ARGV[4]) then return {"probe"} end
local ttl = redis.call("PTTL", KEYS[2])
if ttl < 0 then ttl = 0 end
return {"held", string.format("%.0f", tonumber(ARGV[2]) + ttl)}
`

const CLOSED: Admission = { _tag: "Closed" }

const attempt = <A>(command: () => Promise<A>) =>
  Effect.tryPromise({ try: command, catch: (error) => error instanceof Error ? error : new Error(String(error)) })

/** Resolves once the client is ready, or after `ms` (it keeps trying in the background). */
const ready = (redis: Redis, ms: number) =>
  Effect.promise(() =>
    redis.status === "ready" ? Promise.resolve(true) : new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), ms)
      redis.once("ready", () => {
        clearTimeout(timer)
        resolve(true)
      })
    })
  )

const connect = (url: string, options: { readonly enableOfflineQueue: boolean }) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      // Commands fail at once while Redis is away (no offline queue) and within a second at worst: a call never waits on it.
      const redis = new Redis(url, { maxRetriesPerRequest: 1, commandTimeout: 1_000, ...options })
      // Failures are logged where a command fails; the connection's own errors would only repeat them.
      redis.on("error", () => {})
      return redis
    }),
    (redis) => Effect.promise(() => redis.quit().catch(() => "closed"))
  )

export const redisOpenStore = (options: RedisBreakersOptions): Effect.Effect<OpenStore, never, Scope.Scope> =>
  Effect.gen(function*() {
    const prefix = options.prefix ?? "nenas:breaker:"
    const hash = `${prefix}open`
    const channel = `${prefix}events`
    const probeKey = (target: string) => `${prefix}probe:${target}`
    const token = randomUUID()
    const mirror = new Map<string, number>()
    /** Until when another instance's probe holds a half-open breaker, as this one was told: no need to ask again before. */
    const probeHeld = new Map<string, number>()

    const redis = yield* connect(options.url, { enableOfflineQueue: false })
    const subscriber = yield* connect(options.url, { enableOfflineQueue: true })

    const apply = (target: string, halfOpenAt: number) => {
      probeHeld.delete(target)
      if (halfOpenAt > 0) mirror.set(target, halfOpenAt)
      else mirror.delete(target)
    }

    const warn = (what: string) => (error: Error) =>
      Effect.logWarning(
        `circuit breakers: Redis failed (${what}: ${error.message}); ${
          what === "probe" ? "admitting the call" : "going on from this instance's copy"
        }`
      )

    const readAll = attempt(() => redis.hgetall(hash)).pipe(
      Effect.map((entries) => {
        mirror.clear()
        for (const [target, at] of Object.entries(entries)) mirror.set(target, Number(at))
        return mirror
      })
    )
    // While Redis stays away, one warning, not one every `resyncMs`.
    let failing = false
    const resync = readAll.pipe(
      Effect.zipLeft(Effect.sync(() => (failing = false))),
      Effect.catchAll((error) =>
        failing ? Effect.void : Effect.zipRight(Effect.sync(() => (failing = true)), warn("resync")(error))
      ),
      Effect.asVoid
    )

    subscriber.on("message", (_channel: string, message: string) => {
      const space = message.indexOf(" ")
      apply(message.slice(space + 1), Number(message.slice(0, space)))
    })
    yield* ready(redis, 2_000)
    yield* Effect.promise(() => subscriber.subscribe(channel).catch(() => 0))
    yield* resync
    // A reconnected subscriber may have missed messages; the timer catches any other loss.
    const runtime = yield* Effect.runtime<never>()
    redis.on("ready", () => Runtime.runFork(runtime)(resync))
    // Subscribing again is harmless, and needed when the first subscription failed (Redis was away at start).
    subscriber.on("ready", () => {
      subscriber.subscribe(channel).catch(() => 0)
      Runtime.runFork(runtime)(resync)
    })
    yield* Effect.forkScoped(Effect.repeat(resync, Schedule.spaced(options.resyncMs ?? 5_000)))

    const store: OpenStore = {
      openUntil: (target) => mirror.get(target),
      claimProbe: (target, now, leaseMs) => {
        const held = probeHeld.get(target) ?? 0
        if (now < held) return Effect.succeed<Admission>({ _tag: "Open", halfOpenAt: held })
        return attempt(() => redis.eval(PROBE, 2, hash, probeKey(target), target, now, token, leaseMs)).pipe(
          Effect.map((reply): Admission => {
            const [kind, value] = Array.isArray(reply) ? reply.map(String) : []
            if (kind === "probe") return { _tag: "Probe" }
            const at = Number(value)
            if (kind === "open") apply(target, at)
            else if (kind === "held") probeHeld.set(target, at)
            else {
              apply(target, 0)
              return CLOSED
            }
            return { _tag: "Open", halfOpenAt: at }
          }),
          Effect.catchAll((error) => Effect.as(warn("probe")(error), CLOSED))
        )
      },
      open: (target, until) =>
        Effect.clockWith((clock) =>
          attempt(() =>
            redis.eval(OPEN, 2, hash, probeKey(target), target, until, clock.unsafeCurrentTimeMillis(), channel)
          )
        ).pipe(
          Effect.map((reply) => Number(reply)),
          Effect.catchAll((error) => Effect.as(warn("open")(error), Math.max(until, mirror.get(target) ?? 0))),
          Effect.tap((halfOpenAt) => apply(target, halfOpenAt))
        ),
      close: (target, now) =>
        attempt(() => redis.eval(CLOSE, 2, hash, probeKey(target), target, now, channel)).pipe(
          Effect.map((reply) => Number(reply)),
          Effect.catchAll((error) => Effect.as(warn("close")(error), 0)),
          Effect.map((halfOpenAt) => {
            apply(target, halfOpenAt)
            return halfOpenAt === 0
          })
        ),
      list: (now) =>
        readAll.pipe(
          Effect.catchAll((error) => Effect.as(warn("list")(error), mirror)),
          Effect.map((entries): ReadonlyArray<BreakerState> =>
            [...entries].map(([target, halfOpenAt]) => stateAt(target, halfOpenAt, now))
          )
        )
    }
    return store
  })
