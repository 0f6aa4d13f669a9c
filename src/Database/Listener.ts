import { PgClient } from "@effect/sql-pg"
import { Context, Deferred, Duration, Effect, Fiber, Layer, Redacted } from "effect"
import pg from "pg"
import { randomBase62 } from "../Domain/Ids.js"

/** The `application_name` of every instance's LISTEN connection, so an operator finds them in `pg_stat_activity`. */
export const LISTEN_APPLICATION_NAME = "nenas-listen"

export interface ListenerOptions {
  /** Every channel this instance listens on: all of them on one connection, listened to again on every reconnect. */
  readonly channels: ReadonlyArray<string>
  /** How often the connection announces a ping to itself. */
  readonly pingEvery: Duration.DurationInput
  /** Without hearing its own ping for this long, the connection is dead: nothing is heard, and a new one is made. */
  readonly deadAfter: Duration.DurationInput
  /** The first wait before reconnecting; it doubles on each failed attempt, up to `backOffMax`. */
  readonly backOffFrom: Duration.DurationInput
  readonly backOffMax: Duration.DurationInput
  /** For operators: called with true once listening, false once the connection is lost (a metric, say). */
  readonly onConnected: (connected: boolean) => void
  /** For operators: called on every reconnect (not on the first connection). */
  readonly onReconnect: () => void
}

const defaults: Omit<ListenerOptions, "channels"> = {
  pingEvery: "250 millis",
  deadAfter: "600 millis",
  backOffFrom: "100 millis",
  backOffMax: "2 seconds",
  onConnected: () => undefined,
  onReconnect: () => undefined
}

/** How long a connection and its LISTEN may take before the attempt counts as failed. */
const CONNECT_TIMEOUT = Duration.seconds(5)
/** How long the layer waits at start for the first connection: calls before it reserve in SQL and look keys up in SQL. */
const FIRST_CONNECTION_WAIT = Duration.seconds(2)

/**
 * The one LISTEN connection of this instance
 * (docs/architecture.md, "Listening"; docs/money.md, "Faults"): a plain
 * `pg.Client` of its own, not the pool's shared listening client (whose errors
 * `@effect/sql-pg` swallows, so a dead one is never replaced). It carries every
 * channel the instance listens on. It is found dead by its error or end, or by
 * its own ping (a `pg_notify` on a channel only it listens on, sent on the
 * connection itself) going unheard for `deadAfter`, and is replaced with
 * back-off, on every channel. After every (re)connect the `onHeardAgain`
 * handlers run before `hearing` turns true: what was announced while nobody
 * listened is lost, so whoever relies on announcements starts afresh (the key
 * cache forgets, the grant pool hands its grants back).
 */
export class Listener extends Context.Tag("nenas/Listener")<Listener, {
  /** Calls `handler` with every payload announced on `channel`, which must be one of the layer's channels. */
  readonly on: (channel: string, handler: (payload: string) => void) => Effect.Effect<void>
  /** Calls `handler` after every (re)connection, before `hearing` turns true: announcements may have been missed. */
  readonly onHeardAgain: (handler: () => void) => Effect.Effect<void>
  /** Whether announcements are heard now: listening on every channel, and its own ping came back within `deadAfter`. */
  readonly hearing: () => boolean
  /** Reconnections so far (the first connection is not one). */
  readonly reconnects: () => number
}>() {
  /** The listener on the database of the service's `PgClient`. */
  static readonly layer = (options: Partial<ListenerOptions> & Pick<ListenerOptions, "channels">) =>
    Layer.scoped(
      Listener,
      Effect.flatMap(PgClient.PgClient, (client) =>
        listening(connectionConfig(client.config), { ...defaults, ...options }))
    )
}

/** What a plain `pg.Client` needs to reach the database the pool reaches. */
const connectionConfig = (config: PgClient.PgClientConfig): pg.ClientConfig => ({
  ...(config.url === undefined ? {} : { connectionString: Redacted.value(config.url) }),
  ...(config.host === undefined ? {} : { host: config.host }),
  ...(config.port === undefined ? {} : { port: config.port }),
  ...(config.database === undefined ? {} : { database: config.database }),
  ...(config.username === undefined ? {} : { user: config.username }),
  ...(config.password === undefined ? {} : { password: Redacted.value(config.password) }),
  ...(config.ssl === undefined ? {} : { ssl: config.ssl }),
  application_name: LISTEN_APPLICATION_NAME,
  keepAlive: true,
  connectionTimeoutMillis: Duration.toMillis(CONNECT_TIMEOUT)
})

/** One connection's life: dead once `died` is done. */
interface Session {
  readonly client: pg.Client
  readonly died: Deferred.Deferred<string>
  /** When it last heard its own ping (monotonic ms). */
  heardAt: number
  /** LISTEN ran on every channel and the handlers ran: announcements are heard. */
  ready: boolean
}

// Liveness is about a socket in real time: a test that shifts the service's Clock must not make it look deaf.
const monotonicMs = () => performance.now()

const listening = (config: pg.ClientConfig, options: ListenerOptions) =>
  Effect.gen(function*() {
    const deadAfter = Duration.toMillis(options.deadAfter)
    const pingChannel = `nenas_ping_${randomBase62(16).toLowerCase()}`
    const channels = new Set(options.channels)
    const handlers = new Map<string, Array<(payload: string) => void>>()
    const heardAgain: Array<() => void> = []
    let session: Session | undefined = undefined
    let reconnects = 0

    const hearing = () => session !== undefined && session.ready && monotonicMs() - session.heardAt <= deadAfter

    const dispatch = (current: Session, message: pg.Notification) => {
      if (message.channel === pingChannel) {
        current.heardAt = monotonicMs()
        return
      }
      for (const handler of handlers.get(message.channel) ?? []) handler(message.payload ?? "")
    }

    /** Connects and listens on every channel; the session is dead once its `died` is done. */
    const connect = Effect.gen(function*() {
      const client = new pg.Client(config)
      const died = yield* Deferred.make<string>()
      const current: Session = { client, died, heardAt: monotonicMs(), ready: false }
      const die = (reason: string) => Deferred.unsafeDone(died, Effect.succeed(reason))
      // Kept for good: an emitter's unhandled `error` would crash the process.
      client.on("error", (error) => die(`connection error: ${error.message}`))
      client.on("end", () => die("connection ended"))
      client.on("notification", (message) => dispatch(current, message))
      const statements = [...channels, pingChannel].map((channel) => `LISTEN ${client.escapeIdentifier(channel)}`)
      yield* Effect.tryPromise(async () => {
        await client.connect()
        await client.query(statements.join("; "))
      }).pipe(
        Effect.timeoutFail({ duration: CONNECT_TIMEOUT, onTimeout: () => new Error("connecting timed out") }),
        Effect.tapError(() => close(client))
      )
      return current
    })

    /** Ends a client without waiting on a dead socket. */
    const close = (client: pg.Client) => Effect.sync(() => void client.end().catch(() => undefined))

    /** Pings itself until the connection dies or its ping goes unheard for `deadAfter`; returns why. */
    const watch = (current: Session) =>
      Effect.gen(function*() {
        while (true) {
          if (yield* Deferred.isDone(current.died)) return yield* Deferred.await(current.died)
          if (monotonicMs() - current.heardAt > deadAfter) return `its own ping went unheard for ${deadAfter} ms`
          current.client.query("SELECT pg_notify($1, '')", [pingChannel]).catch(() => undefined)
          yield* Effect.raceFirst(Deferred.await(current.died), Effect.sleep(options.pingEvery))
        }
      })

    /** Connects, listens, and reconnects with back-off for as long as the scope lives. */
    const run = (firstAttempt: Deferred.Deferred<void>) =>
      Effect.gen(function*() {
        let backOff = Duration.toMillis(options.backOffFrom)
        let lostAt: number | undefined = undefined
        let everConnected = false
        while (true) {
          const attempt = yield* Effect.either(connect)
          if (attempt._tag === "Right") {
            const current = attempt.right
            backOff = Duration.toMillis(options.backOffFrom)
            // Announcements sent while nobody listened are lost: whoever relied on them starts afresh, before hearing resumes.
            for (const handler of heardAgain) handler()
            current.heardAt = monotonicMs()
            current.ready = true
            session = current
            yield* Deferred.succeed(firstAttempt, undefined)
            options.onConnected(true)
            if (everConnected) {
              reconnects++
              options.onReconnect()
              yield* Effect.logWarning("LISTEN connection back: listening again on every channel").pipe(
                Effect.annotateLogs({ deafMs: Math.round(monotonicMs() - (lostAt ?? monotonicMs())), reconnects })
              )
            }
            everConnected = true
            const reason = yield* watch(current)
            session = undefined
            lostAt = monotonicMs()
            options.onConnected(false)
            yield* close(current.client)
            yield* Effect.logWarning(
              "LISTEN connection lost: until it is back, no lending from credit grants and no API key from memory"
            ).pipe(Effect.annotateLogs({ reason }))
          } else {
            yield* Deferred.succeed(firstAttempt, undefined)
            yield* Effect.logDebug("LISTEN connection failed; trying again", attempt.left)
          }
          yield* Effect.sleep(Duration.millis(backOff))
          backOff = Math.min(backOff * 2, Duration.toMillis(options.backOffMax))
        }
      })

    const firstAttempt = yield* Deferred.make<void>()
    options.onConnected(false)
    const fiber = yield* Effect.forkDaemon(run(firstAttempt))
    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        yield* Fiber.interrupt(fiber)
        const last = session
        session = undefined
        if (last !== undefined) yield* close(last.client)
      })
    )
    yield* Effect.raceFirst(Deferred.await(firstAttempt), Effect.sleep(FIRST_CONNECTION_WAIT))

    return Listener.of({
      on: (channel, handler) =>
        channels.has(channel)
          ? Effect.sync(() => void handlers.set(channel, [...(handlers.get(channel) ?? []), handler]))
          : Effect.dieMessage(`Listener: channel ${channel} is not among those the listener was made with`),
      onHeardAgain: (handler) => Effect.sync(() => void heardAgain.push(handler)),
      hearing,
      reconnects: () => reconnects
    })
  })
