import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import { Context, Effect, Layer, Option } from "effect"
import { Redis } from "ioredis"
import ipaddr from "ipaddr.js"
import { AppConfig } from "../AppConfig.js"
import { RateLimitExceeded } from "../Domain/Errors.js"
import { memoized } from "../Domain/Memo.js"

/** What is counted per client address, each over one minute. */
export type IpRule = "authFailures" | "checkouts" | "devSessions"

const WINDOW_MS = 60_000

/** A counter per key over a fixed one-minute window. */
interface WindowStore {
  /** The count in the key's current window and the milliseconds until it ends (0 and 0 when none). */
  readonly read: (key: string) => Effect.Effect<{ readonly count: number; readonly resetsInMs: number }>
  /** Adds one; the count now and the milliseconds until the window ends. */
  readonly add: (key: string) => Effect.Effect<{ readonly count: number; readonly resetsInMs: number }>
}

const inMemory = (): WindowStore => {
  const windows = new Map<string, { count: number; endsAt: number }>()
  const current = (key: string, now: number) => {
    const found = windows.get(key)
    if (found !== undefined && found.endsAt > now) return found
    windows.delete(key)
    return undefined
  }
  return {
    read: (key) =>
      Effect.clockWith((clock) =>
        Effect.sync(() => {
          const now = clock.unsafeCurrentTimeMillis()
          const found = current(key, now)
          return found === undefined
            ? { count: 0, resetsInMs: 0 }
            : { count: found.count, resetsInMs: found.endsAt - now }
        })
      ),
    add: (key) =>
      Effect.clockWith((clock) =>
        Effect.sync(() => {
          const now = clock.unsafeCurrentTimeMillis()
          // Expired windows of other addresses go as the map grows, so an address spray cannot fill memory for long.
          if (windows.size > 100_000) {
            for (const [other, entry] of windows) if (entry.endsAt <= now) windows.delete(other)
          }
          const found = current(key, now) ?? { count: 0, endsAt: now + WINDOW_MS }
          found.count++
          windows.set(key, found)
          return { count: found.count, resetsInMs: found.endsAt - now }
        })
      )
  }
}

/** INCR, and the window's expiry set with the first count only; answers the count and the milliseconds left. */
const ADD = `
local count = redis.call("INCR", KEYS[1])
if count == 1 then redis.call("PEXPIRE", KEYS[1], ARGV[1]) end
local ttl = redis.call("PTTL", KEYS[1])
if ttl < 0 then redis.call("PEXPIRE", KEYS[1], ARGV[1]); ttl = tonumber(ARGV[1]) end
return { count, ttl }
`

const inRedis = (url: string) =>
  Effect.map(
    Effect.acquireRelease(
      Effect.sync(() => new Redis(url, { keyPrefix: "nenas:iplimit:", maxRetriesPerRequest: 1 })),
      (redis) => Effect.promise(() => redis.quit().catch(() => "closed"))
    ),
    (redis): WindowStore => ({
      read: (key) =>
        Effect.tryPromise(() => redis.multi().get(key).pttl(key).exec()).pipe(
          Effect.map((replies) => ({
            count: Number(replies?.[0]?.[1] ?? 0) || 0,
            resetsInMs: Math.max(0, Number(replies?.[1]?.[1] ?? 0) || 0)
          })),
          // The store is unreachable: nobody is refused rather than everybody.
          Effect.catchAll((error) =>
            Effect.as(Effect.logWarning("per-address limit store failed; not limiting", error), {
              count: 0,
              resetsInMs: 0
            })
          )
        ),
      add: (key) =>
        Effect.tryPromise(() => redis.eval(ADD, 1, key, WINDOW_MS)).pipe(
          Effect.map((reply) => {
            const [count, ttl] = Array.isArray(reply) ? reply.map(Number) : [0, 0]
            return { count: count ?? 0, resetsInMs: Math.max(0, ttl ?? 0) }
          }),
          Effect.catchAll((error) =>
            Effect.as(Effect.logWarning("per-address limit store failed; not limiting", error), {
              count: 0,
              resetsInMs: 0
            })
          )
        )
    })
  )

/** Whether `address` lies in one of `ranges` (addresses or CIDR ranges); IPv4-mapped IPv6 is read as IPv4. */
const inRanges = (address: string, ranges: ReadonlyArray<Range>): boolean => {
  if (!ipaddr.isValid(address)) return false
  const parsed = ipaddr.process(address)
  return ranges.some(([range, bits]) => range.kind() === parsed.kind() && parsed.match(range, bits))
}

type Range = [ipaddr.IPv4 | ipaddr.IPv6, number]

/** `TRUSTED_PROXIES` entries as ranges (a bare address is a range of one), or the first entry that is neither. */
export const parseRanges = (entries: ReadonlyArray<string>): Array<Range> | { readonly invalid: string } => {
  const ranges: Array<Range> = []
  for (const entry of entries) {
    if (ipaddr.isValidCIDR(entry)) {
      const [range, bits] = ipaddr.parseCIDR(entry)
      const mapped = range.kind() === "ipv6" && (range as ipaddr.IPv6).isIPv4MappedAddress()
      ranges.push(mapped ? [(range as ipaddr.IPv6).toIPv4Address(), Math.max(0, bits - 96)] : [range, bits])
    } else if (ipaddr.isValid(entry)) {
      const address = ipaddr.process(entry)
      ranges.push([address, address.kind() === "ipv4" ? 32 : 128])
    } else {
      return { invalid: entry }
    }
  }
  return ranges
}

/** The address as ipaddr.js writes it (IPv4-mapped IPv6 as IPv4), or as given when it is not one. */
const normal = memoized((address) => ipaddr.isValid(address) ? ipaddr.process(address).toString() : address)

/**
 * The client's address: the socket's peer, or, when that peer is a trusted
 * proxy, the nearest `X-Forwarded-For` entry that is not one (a client can
 * write any entries of its own to the left of what the proxies append).
 */
export const clientAddress = (
  peer: string | undefined,
  forwardedFor: string | undefined,
  trusted: ReadonlyArray<Range>
): string => {
  let client = peer ?? "unknown"
  if (forwardedFor === undefined || !inRanges(client, trusted)) return normal(client)
  const hops = forwardedFor.split(",").map((hop) => hop.trim()).filter((hop) => hop.length > 0)
  for (let index = hops.length - 1; index >= 0; index--) {
    const hop = hops[index] ?? ""
    if (!ipaddr.isValid(hop)) break
    client = hop
    if (!inRanges(hop, trusted)) break
  }
  return normal(client)
}

/**
 * What a per-address limit counts `address` under: an IPv6 client by its /64
 * (one subscriber's network, whose 2^64 addresses are its own to change), an
 * IPv4 one (IPv4-mapped IPv6 included) by its address.
 */
export const addressBucket = memoized((address) => {
  if (!ipaddr.isValid(address)) return address
  const parsed = ipaddr.process(address)
  if (parsed.kind() === "ipv4") return parsed.toString()
  const parts = (parsed as ipaddr.IPv6).parts.slice(0, 4).map((part) => part.toString(16))
  return `${parts.join(":")}::/64`
})

/**
 * Per-client-address limits on what costs us before anyone is known: failed
 * authentication (API keys and dashboard session tokens), checkout creation
 * and development sign-ins, IPv6 clients by /64 (`addressBucket`). A fixed one-minute window,
 * in memory, or in Redis when `REDIS_URL` is set so that every instance
 * counts together.
 */
export class IpLimits extends Context.Tag("nenas/IpLimits")<IpLimits, {
  /** The address of the client making the current request. */
  readonly client: Effect.Effect<string, never, HttpServerRequest.HttpServerRequest>
  /** Refuses with 429 when `address` has used up `rule` this minute; counts nothing. */
  readonly check: (rule: IpRule, address: string) => Effect.Effect<void, RateLimitExceeded>
  /** Counts one against `address`. */
  readonly count: (rule: IpRule, address: string) => Effect.Effect<void>
  /** Counts one against `address`, refusing with 429 when that passes the limit. */
  readonly take: (rule: IpRule, address: string) => Effect.Effect<void, RateLimitExceeded>
}>() {
  static readonly make = (store: WindowStore) =>
    Effect.gen(function*() {
      const config = yield* AppConfig
      const trusted = parseRanges(config.trustedProxies)
      if (!Array.isArray(trusted)) {
        return yield* Effect.dieMessage(
          `TRUSTED_PROXIES: ${trusted.invalid} is neither an IP address nor a CIDR range.`
        )
      }
      const limits: Record<IpRule, { readonly limit: number; readonly what: string }> = {
        authFailures: { limit: config.ipAuthFailuresPerMinute, what: "failed authentications" },
        checkouts: { limit: config.ipCheckoutsPerMinute, what: "checkout sessions" },
        devSessions: { limit: config.ipDevSessionsPerMinute, what: "development sessions" }
      }
      const refusal = (rule: IpRule, resetsInMs: number) =>
        new RateLimitExceeded({
          message: `Too many ${limits[rule].what} from this address; at most ${limits[rule].limit} a minute.`,
          retry_after_seconds: Math.max(1, Math.ceil(resetsInMs / 1000))
        })
      const keyOf = (rule: IpRule, address: string) => `${rule}:${addressBucket(address)}`
      return IpLimits.of({
        client: Effect.map(
          HttpServerRequest.HttpServerRequest,
          (request) =>
            clientAddress(Option.getOrUndefined(request.remoteAddress), request.headers["x-forwarded-for"], trusted)
        ),
        check: (rule, address) =>
          Effect.flatMap(
            store.read(keyOf(rule, address)),
            ({ count, resetsInMs }) =>
              count >= limits[rule].limit ? Effect.fail(refusal(rule, resetsInMs)) : Effect.void
          ),
        count: (rule, address) => Effect.asVoid(store.add(keyOf(rule, address))),
        take: (rule, address) =>
          Effect.flatMap(
            store.add(keyOf(rule, address)),
            ({ count, resetsInMs }) => count > limits[rule].limit ? Effect.fail(refusal(rule, resetsInMs)) : Effect.void
          )
      })
    })

  /** The store from configuration: Redis at `REDIS_URL`, else memory. */
  static readonly layer = Layer.unwrapEffect(Effect.map(AppConfig, ({ redisUrl }) =>
    Option.match(redisUrl, {
      onNone: () => Layer.effect(IpLimits, IpLimits.make(inMemory())),
      onSome: (url) => Layer.scoped(IpLimits, Effect.flatMap(inRedis(url), IpLimits.make))
    })))
}
