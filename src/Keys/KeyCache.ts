import type { SqlError } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { Cause, Clock, Context, Data, Duration, Effect, Exit, Layer, Stream } from "effect"
import { randomBase62 } from "../Domain/Ids.js"
import { type KeyLookup, KeysRepo } from "./Repo.js"

/** The channel migration 0004's triggers announce changes on: `key:<hash hex>` or `account:<id>`. */
export const KEYS_CHANNEL = "nenas_keys"

export interface KeyCacheOptions {
  /** Lookups remembered at most; the oldest is dropped first. */
  readonly capacity: number
  /** How long a remembered lookup answers, should an announcement ever go unheard. */
  readonly timeToLive: Duration.DurationInput
  /** How often this instance announces a ping to itself, to prove it still hears the channel. */
  readonly pingEvery: Duration.DurationInput
  /** Without hearing its own ping for this long, memory stops answering: announcements may be going unheard. */
  readonly deafAfter: Duration.DurationInput
  /** Without hearing its own ping for this long, the instance listens again on a new connection. */
  readonly reconnectAfter: Duration.DurationInput
}

const defaults: KeyCacheOptions = {
  capacity: 10_000,
  timeToLive: "30 seconds",
  pingEvery: "250 millis",
  deafAfter: "750 millis",
  reconnectAfter: "3 seconds"
}

class Deaf extends Data.TaggedError("Deaf")<{ readonly message: string }> {}

interface Entry {
  readonly found: KeyLookup
  readonly accountId: string | undefined
  readonly storedAt: number
}

/**
 * `KeysRepo.lookup` answered from memory, so that a model call's
 * authentication usually costs no SQL. Every change to a key, a tombstone or
 * an account's suspension is announced by the database (LISTEN/NOTIFY on
 * `nenas_keys`) and drops what every instance remembered of it, within
 * milliseconds. Memory answers only while this instance provably hears the
 * channel (its own ping came back within `deafAfter`); when it stops, lookups
 * go to SQL, and once it hears again everything remembered is dropped, since
 * announcements may have been missed meanwhile.
 */
export class KeyCache extends Context.Tag("nenas/KeyCache")<KeyCache, {
  readonly lookup: (keyHash: Buffer) => Effect.Effect<KeyLookup, SqlError.SqlError>
  /** Drops what is remembered of an account's keys: this instance just changed them. */
  readonly forgetAccount: (accountId: string) => Effect.Effect<void>
  /** Whether memory answers now (announcements are being heard). */
  readonly listening: Effect.Effect<boolean>
}>() {
  /**
   * Where LISTEN is impossible (a transaction-pooling proxy, say) the ping is
   * never heard, and every lookup stays SQL.
   */
  static readonly layer = (options: Partial<KeyCacheOptions> = {}) =>
    Layer.scoped(
      KeyCache,
      Effect.gen(function*() {
        const repo = yield* KeysRepo
        const pg = yield* PgClient.PgClient
        return yield* remembering(repo, pg, { ...defaults, ...options })
      })
    )
}

const remembering = (repo: KeysRepo["Type"], pg: PgClient.PgClient, options: KeyCacheOptions) =>
  Effect.gen(function*() {
    const ttl = Duration.toMillis(options.timeToLive)
    const deafAfter = Duration.toMillis(options.deafAfter)
    const reconnectAfter = Duration.toMillis(options.reconnectAfter)
    const ping = `ping:${randomBase62(16)}`
    const entries = new Map<string, Entry>()
    /** When this instance last heard its own ping on the current connection. */
    let heardAt: number | undefined
    /** Moves on every drop, so that a lookup that raced one is not remembered. */
    let generation = 0

    const hearing = (now: number) => heardAt !== undefined && now - heardAt <= deafAfter
    const forgetKey = (hash: string) => {
      generation++
      entries.delete(hash)
    }
    const forgetAccount = (accountId: string) => {
      generation++
      for (const [hash, entry] of entries) if (entry.accountId === accountId) entries.delete(hash)
    }
    const forgetAll = () => {
      generation++
      entries.clear()
    }
    const remember = (hash: string, found: KeyLookup, storedAt: number) => {
      entries.delete(hash)
      if (entries.size >= options.capacity) {
        const oldest = entries.keys().next()
        if (oldest.done !== true) entries.delete(oldest.value)
      }
      entries.set(hash, { found, accountId: found._tag === "Active" ? found.key.accountId : undefined, storedAt })
    }

    const heard = (payload: string) =>
      Effect.map(Clock.currentTimeMillis, (now) => {
        if (payload === ping) {
          // Hearing again after a silence: what was announced meanwhile may be lost.
          if (!hearing(now)) forgetAll()
          heardAt = now
        } else if (payload.startsWith("ping:")) {
          // Another instance's ping.
        } else if (payload.startsWith("key:")) {
          forgetKey(payload.slice("key:".length))
        } else if (payload.startsWith("account:")) {
          forgetAccount(payload.slice("account:".length))
        } else {
          forgetAll()
        }
      })

    // PgClient's own `notify` sends `NOTIFY channel, $1`, which PostgreSQL refuses: pg_notify takes parameters.
    const sendPing = pg`SELECT pg_notify(${KEYS_CHANNEL}, ${ping})`.pipe(
      Effect.timeout(options.reconnectAfter),
      Effect.catchAll((error) => Effect.logDebug("API key cache: ping not sent", error))
    )

    /**
     * One LISTEN connection, until it stops delivering. The library swallows a
     * dropped listening connection's error, so the ping is what tells.
     */
    const session = Effect.gen(function*() {
      heardAt = undefined
      const startedAt = yield* Clock.currentTimeMillis
      const listen = pg.listen(KEYS_CHANNEL).pipe(
        Stream.runForEach(heard),
        // A dead connection's UNLISTEN may never answer: stopping must not wait for it.
        Effect.disconnect,
        Effect.zipRight(new Deaf({ message: "the notification stream ended" }))
      )
      const watch = Effect.gen(function*() {
        while (true) {
          yield* Effect.fork(sendPing)
          yield* Effect.sleep(options.pingEvery)
          const now = yield* Clock.currentTimeMillis
          if (now - (heardAt ?? startedAt) > reconnectAfter) {
            return yield* new Deaf({ message: `its own ping went unheard for ${reconnectAfter} ms` })
          }
        }
      })
      return yield* Effect.raceFirst(listen, watch)
    })

    /** Warned of the current silence already: a database that stays away is one line, not one a second. */
    let warned = false
    const relisten = Effect.gen(function*() {
      const exit = yield* Effect.exit(session)
      if (heardAt !== undefined) warned = false
      heardAt = undefined
      forgetAll()
      if (!warned) {
        warned = true
        yield* Effect.logWarning(
          "API key cache: invalidations unheard; lookups go to the database until it listens again",
          Exit.isFailure(exit) ? exit.cause : Cause.empty
        )
      }
      yield* Effect.sleep("1 second")
    })
    yield* Effect.forkScoped(Effect.forever(relisten))

    return KeyCache.of({
      lookup: (keyHash) =>
        Effect.gen(function*() {
          const hash = keyHash.toString("hex")
          const now = yield* Clock.currentTimeMillis
          if (hearing(now)) {
            const entry = entries.get(hash)
            if (entry !== undefined && now - entry.storedAt < ttl) return entry.found
          }
          const before = generation
          const found = yield* repo.lookup(keyHash)
          // A drop announced while SQL answered may be newer than the answer: then it is not remembered.
          // Unknown keys never are: anyone can send endless new ones, which would push real keys out.
          if (found._tag !== "Unknown" && before === generation && hearing(yield* Clock.currentTimeMillis)) {
            remember(hash, found, now)
          }
          return found
        }),
      forgetAccount: (accountId) => Effect.sync(() => forgetAccount(accountId)),
      listening: Effect.map(Clock.currentTimeMillis, hearing)
    })
  })
