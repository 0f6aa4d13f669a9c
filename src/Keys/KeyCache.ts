import { Context, Duration, Effect, Layer } from "effect"
import { Listener } from "../Database/Listener.js"
import { Metrics } from "../Observability/Metrics.js"
import { type KeyLookup, KeysRepo } from "./Repo.js"

/** The channel the triggers of migrations 0004 and 0018 announce changes on: `key:<hash hex>`, `key_id:<id>` or `account:<id>`. */
export const KEYS_CHANNEL = "nenas_keys"

export interface KeyCacheOptions {
  /** Lookups remembered at most; the oldest is dropped first. */
  readonly capacity: number
  /** How long a remembered lookup answers, should an announcement ever go unheard. */
  readonly timeToLive: Duration.DurationInput
}

const defaults: KeyCacheOptions = {
  capacity: 10_000,
  timeToLive: "30 seconds"
}

interface Entry {
  readonly found: KeyLookup
  readonly accountId: string | undefined
  readonly keyId: string | undefined
  readonly storedAt: number
}

/**
 * `KeysRepo.lookup` answered from memory, so that a model call's
 * authentication usually costs no SQL. Entries are indexed by key id too, so
 * that a change to a key drops each of its secrets. Every change to a key, a tombstone or
 * an account's suspension is announced by the database (LISTEN/NOTIFY on
 * `nenas_keys`, heard through the instance's `Listener`) and drops what every
 * instance remembered of it, within milliseconds. Memory answers only while
 * the listener provably hears (`Listener.hearing`); while it does not, lookups
 * go to SQL, and each time it listens again everything remembered is dropped,
 * since announcements may have been missed meanwhile. Lookups are counted by
 * where they were answered (`nenas_key_lookups_total`).
 */
export class KeyCache extends Context.Tag("nenas/KeyCache")<KeyCache, {
  readonly lookup: (keyHash: Buffer) => Effect.Effect<KeyLookup>
  /** Drops what is remembered of an account's keys: this instance just changed them. */
  readonly forgetAccount: (accountId: string) => Effect.Effect<void>
  /** Whether memory answers now (announcements are being heard). */
  readonly listening: Effect.Effect<boolean>
}>() {
  /**
   * Where LISTEN is impossible (a transaction-pooling proxy, say) the
   * listener never hears, and every lookup stays SQL.
   */
  static readonly layer = (options: Partial<KeyCacheOptions> = {}) =>
    Layer.scoped(
      KeyCache,
      Effect.gen(function*() {
        const repo = yield* KeysRepo
        const listener = yield* Listener
        const metrics = yield* Metrics
        return yield* remembering(repo, listener, metrics, { ...defaults, ...options })
      })
    )
}

const remembering = Effect.fnUntraced(
  function*(repo: KeysRepo["Type"], listener: Listener["Type"], metrics: Metrics, options: KeyCacheOptions) {
    const ttl = Duration.toMillis(options.timeToLive)
    // Read directly on each lookup (docs/performance.md, "The clock read directly on the call path").
    const clock = yield* Effect.clock
    const entries = new Map<string, Entry>()
    /** The hashes remembered of each key: its current secret and, after a rotation with grace, its previous one. */
    const byKeyId = new Map<string, Set<string>>()
    /** Moves on every drop, so that a lookup that raced one is not remembered. */
    let generation = 0

    const drop = (hash: string) => {
      const entry = entries.get(hash)
      if (entry === undefined) return
      entries.delete(hash)
      if (entry.keyId === undefined) return
      const hashes = byKeyId.get(entry.keyId)
      hashes?.delete(hash)
      if (hashes?.size === 0) byKeyId.delete(entry.keyId)
    }
    const forgetKey = (hash: string) => {
      generation++
      drop(hash)
    }
    const forgetKeyId = (keyId: string) => {
      generation++
      for (const hash of byKeyId.get(keyId) ?? []) drop(hash)
    }
    const forgetAccount = (accountId: string) => {
      generation++
      for (const [hash, entry] of entries) if (entry.accountId === accountId) drop(hash)
    }
    const forgetAll = () => {
      generation++
      entries.clear()
      byKeyId.clear()
    }
    const remember = (hash: string, found: KeyLookup, storedAt: number) => {
      drop(hash)
      if (entries.size >= options.capacity) {
        const oldest = entries.keys().next()
        if (oldest.done !== true) drop(oldest.value)
      }
      // A rotated-out secret is remembered under its key too: deleting the key changes what it answers.
      const keyId = found._tag === "Active"
        ? found.key.id
        : found._tag === "Revoked"
        ? found.rotatedOf ?? undefined
        : undefined
      entries.set(hash, {
        found,
        accountId: found._tag === "Active" ? found.key.accountId : undefined,
        keyId,
        storedAt
      })
      if (keyId !== undefined) byKeyId.set(keyId, (byKeyId.get(keyId) ?? new Set()).add(hash))
    }

    yield* listener.on(KEYS_CHANNEL, (payload) => {
      // Pings an earlier version sent on this channel (a rolling deploy) say nothing about keys.
      if (payload.startsWith("ping:")) return
      if (payload.startsWith("key:")) return forgetKey(payload.slice("key:".length))
      // Any change to a key reaches every secret it is remembered under (a rotated key's previous one too).
      if (payload.startsWith("key_id:")) return forgetKeyId(payload.slice("key_id:".length))
      if (payload.startsWith("account:")) return forgetAccount(payload.slice("account:".length))
      forgetAll()
    })
    // Listening again after a silence: what was announced meanwhile is lost.
    yield* listener.onHeardAgain(forgetAll)

    return KeyCache.of({
      // One generator function for every call (`Effect.fnUntraced`), not one made per call
      // (docs/performance.md, "What kept a request's objects through young collections").
      lookup: Effect.fnUntraced(function*(keyHash: Buffer) {
        const hash = keyHash.toString("hex")
        const now = clock.unsafeCurrentTimeMillis()
        if (listener.hearing()) {
          const entry = entries.get(hash)
          if (entry !== undefined && now - entry.storedAt < ttl) {
            metrics.keyLookups.inc({ source: "memory" })
            return entry.found
          }
        }
        metrics.keyLookups.inc({ source: "database" })
        const before = generation
        const found = yield* repo.lookup(keyHash)
        // A drop announced while SQL answered may be newer than the answer: then it is not remembered.
        // Unknown keys never are: anyone can send endless new ones, which would push real keys out.
        if (found._tag !== "Unknown" && before === generation && listener.hearing()) remember(hash, found, now)
        return found
      }),
      forgetAccount: (accountId) => Effect.sync(() => forgetAccount(accountId)),
      listening: Effect.sync(listener.hearing)
    })
  }
)
