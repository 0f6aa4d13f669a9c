import { describe, expect, layer } from "@effect/vitest"
import { Context, Effect, Fiber, Layer, Option } from "effect"
import { inject } from "vitest"
import { call, createKey, type Reply } from "../../support/Http.js"
import { modelCall, violations } from "../../support/Models.js"
import { deliverEvent, events, topUp } from "../../support/Stripe.js"
import { query, TestServer, withClient } from "../../support/TestServer.js"
import { twoInstances } from "../../support/TwoInstances.js"
import { Upstream } from "../../support/Upstream.js"
import { developer } from "../../support/Wallet.js"

/**
 * Every database connection of two instances cut at once (a failover, a
 * PostgreSQL restart, a network drop), then what listening
 * (docs/architecture.md, "Listening") must bring back: grants handed back when
 * asked, a debit heard by an instance lending from a grant, key changes seen
 * within a second, and the key cache answering from memory again.
 */

/** The bound for a change made anywhere: every instance sees it within a second. */
const DEADLINE_MS = 1_000

class Instances extends Context.Tag("test/ListenCutInstances")<Instances, {
  readonly a: string
  readonly b: string
  readonly databaseName: string
}>() {}

const InstancesLive = Layer.scopedContext(Effect.gen(function*() {
  const upstream = yield* Upstream
  const { a, b, clock, database, settled } = yield* twoInstances("listencut", {
    upstreamBaseUrl: Option.some(upstream.baseUrl),
    rateLimitRpm: 100_000,
    rateLimitConcurrent: 1_000
  })
  return Context.make(Instances, { a, b, databaseName: database.name }).pipe(
    Context.add(TestServer, { baseUrl: a, databaseUrl: database.url, clock, settled })
  )
})).pipe(Layer.provideMerge(Upstream.layer))

/** Runs `effect` against the instance at `baseUrl` (the support helpers call "the" test server). */
const on = (baseUrl: string) => <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.flatMap(TestServer, (server) => Effect.provideService(effect, TestServer, { ...server, baseUrl }))

const sleep = (ms: number) => Effect.promise(() => new Promise((resolve) => setTimeout(resolve, ms)))

/** Every connection to the service's database cut at once, as a failover does; returns when (ms since the epoch). */
const cut = Effect.gen(function*() {
  const { databaseName } = yield* Instances
  const at = Date.now()
  const rows = yield* Effect.promise(() =>
    withClient(inject("adminDatabaseUrl"), (client) =>
      client.query(
        "SELECT pg_terminate_backend(pid) AS cut FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
        [databaseName]
      ))
  )
  expect(rows.rowCount ?? 0, "connections cut").toBeGreaterThan(2)
  return at
})

/** Both instances answer `/readyz` again (the pool reconnects on demand). */
const bothReady = Effect.gen(function*() {
  const { a, b } = yield* Instances
  for (const base of [a, b]) {
    const since = Date.now()
    while ((yield* on(base)(call("GET", "/readyz"))).status !== 200) {
      if (Date.now() - since > 10_000) return yield* Effect.dieMessage(`${base} never ready again`)
      yield* sleep(50)
    }
  }
})

/**
 * Waits until both instances report listening again (`nenas_listen_connected`),
 * at most `HEARD_AGAIN_MS` after the cut; a build without the metric just waits that long.
 */
const HEARD_AGAIN_MS = 2_000
const bothListeningAgain = (cutAt: number) =>
  Effect.gen(function*() {
    const { a, b } = yield* Instances
    for (const base of [a, b]) {
      while (
        (yield* metric(base, "nenas_listen_connected")) !== 1 && Date.now() - cutAt < HEARD_AGAIN_MS
      ) yield* sleep(20)
    }
  })

/** A Prometheus sample of the instance at `baseUrl` (0 when absent). */
const metric = (baseUrl: string, sample: string) =>
  Effect.map(on(baseUrl)(call("GET", "/metrics")), (reply) => {
    const line = reply.text.split("\n").find((text) => text.startsWith(`${sample} `))
    return line === undefined ? 0 : Number(line.slice(sample.length + 1))
  })

const fromMemory = (baseUrl: string) => metric(baseUrl, `nenas_key_lookups_total{source="memory"}`)

/** What a reply says, in one word: `200`, or its error code. */
const outcome = (reply: Reply): string => reply.status === 200 ? "200" : String(reply.body?.error?.code ?? reply.status)

/** A live chat call whose hold is the estimate of 30k output tokens; the upstream bills `usage` tokens. */
const chat = (apiKey: string) =>
  modelCall(apiKey, "/v1/chat/completions", {
    model: "svc/nenas-flash",
    messages: [{ role: "user", content: "Say hello to the grant." }],
    max_tokens: 30_000
  })

const burst = (baseUrl: string, apiKey: string, calls: number) =>
  on(baseUrl)(Effect.all(Array.from({ length: calls }, () => chat(apiKey)), { concurrency: "unbounded" }))

/** What one call holds: a call billed above its hold is billed exactly its hold. */
const holdOfOneCall = Effect.gen(function*() {
  const { a } = yield* Instances
  const upstream = yield* Upstream
  const probe = yield* on(a)(funded("listencut-probe", 10_000))
  upstream.setBehaviour({ kind: "ok", usage: { prompt_tokens: 1_000_000 } })
  const reply = yield* on(a)(chat(probe.apiKey))
  expect(reply.status).toBe(200)
  return Math.round(Number(reply.body.cost_myr) * 1_000_000)
})

/** A developer with a live key and `sen` in the wallet; the payment's ids for a refund. */
const funded = (name: string, sen: number) =>
  Effect.gen(function*() {
    const { accountId, token } = yield* developer(`${name}-${Date.now()}@example.com`)
    const payment = yield* topUp(token, sen)
    const created = yield* createKey(token, { name, environment: "live" })
    return { accountId, token, payment, apiKey: created.full_key }
  })

/** What the instance with `identity` holds in credit grants for the account (micro-MYR, as written). */
const grantsOf = (accountId: string, identity: string) =>
  Effect.map(
    query<{ held: string }>(
      `SELECT coalesce(sum(amount_micro_myr), 0) AS held FROM credit_grants
       WHERE account_id = $1 AND holder IN (SELECT id FROM instances WHERE identity = $2)`,
      [accountId, identity]
    ),
    (rows) => Number(rows[0]?.held ?? 0)
  )

const identityOf = (baseUrl: string) => `listencut:${new URL(baseUrl).port}`

/** Waits until `done` holds (polling every `everyMs`); the milliseconds from `since`; dies after `limitMs`. */
const until = <E, R>(since: number, done: Effect.Effect<boolean, E, R>, limitMs: number, what: string, everyMs = 20) =>
  Effect.gen(function*() {
    while (!(yield* done)) {
      if (Date.now() - since > limitMs) return yield* Effect.dieMessage(`${what}: not within ${limitMs} ms`)
      yield* sleep(everyMs)
    }
    return Date.now() - since
  })

describe("two instances after every database connection is cut", () => {
  layer(InstancesLive, { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("a burst on A (A holds a grant), then one on B that the wallet affords only with A's grant back: all answered", () =>
      Effect.gen(function*() {
        const { a, b } = yield* Instances
        const upstream = yield* Upstream
        const hold = yield* holdOfOneCall
        // RM 10 affords B's burst at once, but not beside A's grant (up to a third of it): the grant must come back.
        const wallet = 10_000_000
        const calls = Math.floor((wallet * 0.8) / hold)
        expect(calls * hold, "B's burst does not fit beside a grant of a third").toBeGreaterThan((wallet * 2) / 3)
        const dev = yield* on(a)(funded("listencut-grant", wallet / 10_000))
        upstream.setBehaviour({ kind: "ok", delayMs: 300, usage: { completion_tokens: 10 } })
        // Before the cut too: A holds a grant when the connections die.
        for (const reply of yield* burst(a, dev.apiKey, 16)) expect(outcome(reply)).toBe("200")
        expect(yield* grantsOf(dev.accountId, identityOf(a)), "A holds a grant before the cut").toBeGreaterThan(0)

        const cutAt = yield* cut
        // The first correct hand-back, watched meanwhile: A's grant from before the cut is back in the wallet.
        const handedBack = yield* Effect.fork(Effect.either(
          until(
            cutAt,
            Effect.map(grantsOf(dev.accountId, identityOf(a)), (held) => held === 0),
            4_000,
            "A's grant handed back"
          )
        ))
        yield* bothReady
        yield* bothListeningAgain(cutAt)
        // A lends again only once its beat is fresh after the cut (fencing): bursts until it holds a grant, a few seconds at most.
        let heldAgain = 0
        for (let tries = 0; tries < 8 && heldAgain === 0; tries++) {
          const afterA = yield* burst(a, dev.apiKey, 16)
          expect(afterA.map(outcome)).toEqual(Array.from({ length: 16 }, () => "200"))
          heldAgain = yield* grantsOf(dev.accountId, identityOf(a))
          if (heldAgain === 0) yield* Effect.sleep("250 millis")
        }
        expect(heldAgain, "A holds a grant again").toBeGreaterThan(0)
        // Calls outlast the second a refused call waits for grants to come back: only A's grant can free the money.
        upstream.setBehaviour({ kind: "ok", delayMs: 3_000, usage: { completion_tokens: 10 } })
        const afterB = yield* burst(b, dev.apiKey, calls)
        const answeredMs = Date.now() - cutAt
        expect(afterB.map(outcome)).toEqual(Array.from({ length: calls }, () => "200"))
        const handedBackMs = yield* Effect.flatten(Fiber.join(handedBack))
        console.log(
          `[figures] after the cut: A's grant handed back at ${handedBackMs} ms; B's burst of ${calls} all answered by ${answeredMs} ms`
        )
        expect(yield* violations(dev.accountId)).toEqual([])
      }))

    it.effect("a refund heard by an instance lending from a grant: no call admitted past the balance", () =>
      Effect.gen(function*() {
        const { a, b } = yield* Instances
        const upstream = yield* Upstream
        upstream.setBehaviour({ kind: "ok", delayMs: 300, usage: { completion_tokens: 10 } })
        const dev = yield* on(a)(funded("listencut-refund", 5_000))
        const cutAt = yield* cut
        yield* bothReady
        // Once it hears again, calls on A lend from a grant again.
        yield* bothListeningAgain(cutAt)
        for (const reply of yield* burst(a, dev.apiKey, 16)) expect(outcome(reply)).toBe("200")
        expect(yield* grantsOf(dev.accountId, identityOf(a)), "A lends from a grant").toBeGreaterThan(0)
        // The whole top-up refunded through B: the balance is below zero, whatever A's grant holds.
        const refunded = yield* on(b)(deliverEvent(events.chargeRefunded({
          chargeId: dev.payment.chargeId,
          paymentIntentId: dev.payment.paymentIntentId,
          amountSen: dev.payment.amountSen,
          amountRefundedSen: dev.payment.amountSen
        })))
        expect(refunded.status).toBe(200)
        // The debit's announcement reaches A within milliseconds; a little slack for the event loop.
        yield* sleep(200)
        const after = yield* burst(a, dev.apiKey, 8)
        expect(after.map(outcome)).toEqual(Array.from({ length: 8 }, () => "insufficient_balance"))
        expect(yield* violations(dev.accountId)).toEqual([])
      }))

    it.effect("the key cache answers from memory again on both instances, and a key deleted then is refused by both within a second", () =>
      Effect.gen(function*() {
        const { a, b } = yield* Instances
        const { token } = yield* on(a)(developer(`listencut-keys-${Date.now()}@example.com`))
        const created = yield* on(a)(createKey(token, { name: "cached", environment: "test" }))
        const models = call("GET", "/v1/models", { token: created.full_key })
        const cutAt = yield* cut
        yield* bothReady
        // Lookups until one is answered from memory, on each instance.
        const backMs: Array<number> = []
        for (const base of [a, b]) {
          backMs.push(
            yield* until(
              cutAt,
              Effect.gen(function*() {
                const before = yield* fromMemory(base)
                expect(outcome(yield* on(base)(models))).toBe("200")
                return (yield* fromMemory(base)) > before
              }),
              5_000,
              `${base} answering keys from memory`,
              50
            )
          )
        }
        console.log(
          `[figures] after the cut: key cache answering from memory again at ${backMs.join(" ms and ")} ms (A, B)`
        )
        // Both remember the key now: a deletion must still reach both within the deadline.
        const deletedAt = Date.now()
        expect((yield* on(a)(call("DELETE", `/dashboard/api-keys/${created.key.id}`, { token }))).status).toBe(200)
        for (const base of [a, b]) {
          const seenMs = yield* until(
            deletedAt,
            Effect.map(on(base)(models), (reply) => outcome(reply) === "revoked_api_key"),
            DEADLINE_MS,
            `${base} refusing the deleted key`,
            50
          )
          expect(seenMs).toBeLessThanOrEqual(DEADLINE_MS)
        }
      }))

    it.effect("each instance says so to operators: connected again, one reconnect more per cut", () =>
      Effect.gen(function*() {
        const { a, b } = yield* Instances
        const before = yield* Effect.all([a, b].map((base) => metric(base, "nenas_listen_reconnects_total")))
        const cutAt = yield* cut
        yield* bothReady
        for (const [index, base] of [a, b].entries()) {
          yield* until(
            cutAt,
            Effect.gen(function*() {
              const reconnects = yield* metric(base, "nenas_listen_reconnects_total")
              return reconnects > (before[index] ?? 0) && (yield* metric(base, "nenas_listen_connected")) === 1
            }),
            5_000,
            `${base} reporting its reconnect`,
            50
          )
        }
      }))
  })
})
