import { SqlClient, SqlError } from "@effect/sql"
import { expect, layer } from "@effect/vitest"
import { Context, Effect, Layer, Option, Redacted } from "effect"
import { execFile } from "node:child_process"
import { resolve } from "node:path"
import { promisify } from "node:util"
import { AppConfig } from "../../../src/AppConfig.js"
import { DatabaseLive } from "../../../src/Database/Database.js"
import { newId } from "../../../src/Domain/Ids.js"
import type { LogWrite } from "../../../src/Logs/RequestLogs.js"
import { RequestLogs } from "../../../src/Logs/RequestLogs.js"
import { Metrics } from "../../../src/Observability/Metrics.js"
import type { GrantPool } from "../../../src/Wallet/Grants/GrantPool.js"
import { type Grant, newGrant } from "../../../src/Wallet/Grants/Grants.js"
import { ReservationLeases } from "../../../src/Wallet/Instances/Leases.js"
import { replayParked } from "../../../src/Wallet/Settlement/Parked.js"
import { settleBatch } from "../../../src/Wallet/Settlement/Settle.js"
import type { SettleItem } from "../../../src/Wallet/Settlement/SettleBatch.js"
import type { Queued } from "../../../src/Wallet/Settlement/SettleBatch.js"
import { makeSettlementQueue } from "../../../src/Wallet/Settlement/SettlementQueue.js"
import { caller, TestServerWithUpstream, violations } from "../../support/Models.js"
import { TestServer, withClient } from "../../support/TestServer.js"

/**
 * Settlement that cannot be poisoned (docs/money.md, "Parking and replay"), driven on a
 * settlement queue of its own on the test database: a charge retried after a
 * commit whose answer was lost is written once, usage PostgreSQL cannot store
 * is clamped, and a settlement the database keeps refusing is parked — its
 * hold back in the wallet — while the rest flows on; the replay bills it once
 * it can be written.
 */

const raw = <A>(text: string, values: Array<unknown> = []) =>
  Effect.flatMap(
    TestServer,
    ({ databaseUrl }) =>
      Effect.promise(() =>
        withClient(databaseUrl, async (client) => (await client.query(text, values)).rows as Array<A>)
      )
  )

/**
 * A pool that lends nothing: the test's grants are rows it makes itself. It hands back what `closing` grants
 * have not lent, as `GrantPool` does.
 */
const testPool = (closing: ReadonlyArray<Grant> = []): GrantPool => ({
  lend: () => undefined,
  growth: () => undefined,
  lendAgain: () => undefined,
  charge: () => undefined,
  giveBack: () => undefined,
  handBack: () => undefined,
  report: () => undefined,
  keyHoldsAfter: () => [],
  holds: () => false,
  inFlight: () => 0,
  unlent: () => 0,
  takeHandBacks: () => {
    const returns = closing.filter((grant) => grant.remaining > 0).map((grant) => {
      const back = { grantId: grant.id, accountId: grant.accountId, amountMicroMyr: grant.remaining }
      grant.remaining = 0
      return back
    })
    return { returns, close: [] }
  },
  chargeWritten: (grant, amount) => void (grant.pending -= amount),
  written: () => Effect.void,
  stop: Effect.void
})

/** The SqlClient, except that a transaction can be made to lose its COMMIT's answer: committed, yet failed. */
const losingCommits = (sql: SqlClient.SqlClient, lose: { next: boolean }): SqlClient.SqlClient =>
  new Proxy(sql, {
    get: (target, property, receiver) =>
      property !== "withTransaction"
        ? Reflect.get(target, property, receiver)
        : <A, E, R>(effect: Effect.Effect<A, E, R>) =>
          Effect.flatMap(target.withTransaction(effect), (value) => {
            if (!lose.next) return Effect.succeed(value)
            lose.next = false
            return Effect.fail(
              new SqlError.SqlError({
                cause: new Error("Connection terminated unexpectedly"),
                message: "lost after COMMIT"
              })
            )
          })
  })

/** Another process's settlement parts on the test database: its queue, what it runs on, its metrics. */
const settlementInstance = (
  options: { readonly closing?: ReadonlyArray<Grant>; readonly lose?: { next: boolean } } = {}
) =>
  Effect.gen(function*() {
    const { databaseUrl } = yield* TestServer
    const config = AppConfig.layerWith({
      databaseUrl: Option.some(Redacted.make(databaseUrl)),
      instanceId: newId("test")
    })
    const parts = Layer.mergeAll(RequestLogs.layer, ReservationLeases.layer(), Metrics.Default).pipe(
      Layer.provideMerge(DatabaseLive),
      Layer.provideMerge(config)
    )
    const context = yield* Layer.build(parts)
    const sql = Context.get(context, SqlClient.SqlClient)
    const queueContext = Context.add(context, SqlClient.SqlClient, losingCommits(sql, options.lose ?? { next: false }))
    const queue = yield* makeSettlementQueue(testPool(options.closing)).pipe(Effect.provide(queueContext))
    const leases = context.unsafeMap.get(ReservationLeases.key) as ReservationLeases["Type"]
    const metrics = context.unsafeMap.get(Metrics.key) as Metrics
    const run = <A, E>(effect: Effect.Effect<A, E, SqlClient.SqlClient | RequestLogs>) =>
      Effect.provide(effect, context)
    return { queue, holder: leases.holder, metrics, run }
  })

/** A grant of `amount` held by `holder` for the account, taken from its wallet as `growGrant` takes it. */
const grantRow = (accountId: string, holder: string, amount: number) =>
  Effect.gen(function*() {
    const id = newId("gr")
    yield* raw(
      `UPDATE wallets SET available_micro_myr = available_micro_myr - $2, granted_micro_myr = granted_micro_myr + $2 WHERE account_id = $1`,
      [accountId, amount]
    )
    yield* raw(`INSERT INTO credit_grants (id, account_id, holder, amount_micro_myr) VALUES ($1, $2, $3, $4)`, [
      id,
      accountId,
      holder,
      amount
    ])
    const grant: Grant = { ...newGrant(id, accountId, Date.now()), stored: true }
    return grant
  })

const logOf = (
  accountId: string,
  apiKeyId: string,
  requestId: string,
  costMicroMyr: number,
  usage: Partial<LogWrite> = {}
): LogWrite => ({
  requestId,
  accountId,
  apiKeyId,
  publicModel: "svc/nenas-flash",
  upstreamModel: "gpt-4.1-mini",
  routingCategory: "general",
  endpoint: "/v1/chat/completions",
  stream: false,
  inputTokens: 10,
  outputTokens: 20,
  reasoningTokens: 0,
  cachedTokens: 0,
  usageSource: "provider",
  searchCount: 0,
  contentPages: 0,
  costMicroMyr,
  latencyMs: 5,
  reservationId: null,
  status: "billed",
  errorCode: null,
  createdAt: new Date(),
  completedAt: new Date(),
  ...usage
})

/** A call charged to `grant`, as `Spending.settle` queues it (the grant's `pending` counts it until written). */
const grantCharge = (grant: Grant, apiKeyId: string, amount: number, usage: Partial<LogWrite> = {}) => {
  const requestId = `req_${newId("poison")}`
  grant.pending += amount
  const item: SettleItem = {
    _tag: "GrantCharge",
    grantId: grant.id,
    accountId: grant.accountId,
    apiKeyId,
    requestId,
    amountMicroMyr: amount,
    description: "Model call",
    log: logOf(grant.accountId, apiKeyId, requestId, amount, usage)
  }
  return { requestId, item, queued: { item, grant: { grant, amount, apiKeyId } } satisfies Queued }
}

const usageEntries = (requestId: string) =>
  raw<{ amount: string }>(
    `SELECT -amount_micro_myr AS amount FROM ledger_entries WHERE type = 'usage' AND request_id = $1`,
    [requestId]
  )
const grantAmount = (grantId: string) =>
  Effect.map(
    raw<{ amount: string }>(`SELECT amount_micro_myr AS amount FROM credit_grants WHERE id = $1`, [grantId]),
    (rows) => Number(rows[0]?.amount)
  )
const counted = (
  counter: { get: () => Promise<{ values: ReadonlyArray<{ value: number; labels: object }> }> },
  labels: object
) =>
  Effect.promise(async () =>
    (await counter.get()).values.find((v) => JSON.stringify(v.labels) === JSON.stringify(labels))?.value ?? 0
  )

/** Polls `check` (real time) until it holds, for at most `ms`. */
const eventually = <A>(read: Effect.Effect<A, never, TestServer>, check: (a: A) => boolean, ms = 8000) =>
  Effect.gen(function*() {
    const deadline = Date.now() + ms
    let value = yield* read
    while (!check(value) && Date.now() < deadline) {
      yield* Effect.sleep("50 millis")
      value = yield* read
    }
    return value
  })

layer(TestServerWithUpstream(), { excludeTestServices: true })("settlement that cannot be poisoned", (it) => {
  it.scoped("a grant charge and a hand-back retried after a commit whose answer was lost are written once", () =>
    Effect.gen(function*() {
      const dev = yield* caller("poison-ambiguous@example.com", { sen: 1000 })
      const instance = yield* settlementInstance()
      const grant = yield* grantRow(dev.accountId, instance.holder, 100_000)
      const charge = grantCharge(grant, dev.keyId, 7_000)
      // The first write committed (its usage entry is there), but its answer never reached the queue.
      yield* instance.run(settleBatch({
        items: [charge.item],
        returns: [{ grantId: grant.id, accountId: dev.accountId, amountMicroMyr: 20_000, seq: 1 }],
        logs: [],
        close: [],
        at: new Date(),
        holder: instance.holder
      }))
      // The queue writes it again, with the same hand-back, as a failed flush retries it.
      instance.queue.enqueue(charge.queued)
      yield* instance.run(settleBatch({
        items: [],
        returns: [{ grantId: grant.id, accountId: dev.accountId, amountMicroMyr: 20_000, seq: 1 }],
        logs: [],
        close: [],
        at: new Date(),
        holder: instance.holder
      }))
      yield* instance.queue.flush
      expect((yield* usageEntries(charge.requestId)).map((e) => Number(e.amount))).toEqual([7_000])
      expect(yield* grantAmount(grant.id)).toBe(100_000 - 7_000 - 20_000)
      expect(grant.pending).toBe(0)
      const log = yield* raw<{ status: string; cost: string }>(
        `SELECT status, cost_micro_myr AS cost FROM request_logs WHERE request_id = $1`,
        [charge.requestId]
      )
      expect(log).toEqual([{ status: "billed", cost: "7000" }])
      expect(instance.queue.health()).toEqual({ failures: 0, refused: 0 })
      expect(yield* violations(dev.accountId)).toEqual([])
    }))

  it.scoped("a flush whose COMMIT answer was lost is retried whole and moves nothing twice: its charge, its hand-back", () =>
    Effect.gen(function*() {
      const dev = yield* caller("poison-lost-commit@example.com", { sen: 1000 })
      const lose = { next: false }
      const closing: Array<Grant> = []
      const instance = yield* settlementInstance({ closing, lose })
      const grant = yield* grantRow(dev.accountId, instance.holder, 100_000)
      const charge = grantCharge(grant, dev.keyId, 7_000)
      // What no call holds of the grant (100 000 - 7 000 charged) is handed back with the same flush.
      grant.remaining = 93_000
      closing.push(grant)
      instance.queue.enqueue(charge.queued)
      lose.next = true
      // The flush that writes them (this one, or the queue's own tick) commits and fails; a later one writes them again.
      yield* Effect.exit(instance.queue.flush)
      expect(lose.next).toBe(false)
      yield* instance.queue.flush
      expect((yield* usageEntries(charge.requestId)).map((e) => Number(e.amount))).toEqual([7_000])
      expect(yield* grantAmount(grant.id)).toBe(0)
      // Nothing of the grant came back to it in memory: what it handed back is the wallet's.
      expect({ remaining: grant.remaining, pending: grant.pending }).toEqual({ remaining: 0, pending: 0 })
      const wallet = yield* raw<{ available: string; granted: string }>(
        `SELECT available_micro_myr AS available, granted_micro_myr AS granted FROM wallets WHERE account_id = $1`,
        [dev.accountId]
      )
      expect(wallet).toEqual([{ available: String(10_000_000 - 7_000), granted: "0" }])
      expect(yield* violations(dev.accountId)).toEqual([])
    }))

  it.scoped("usage of 3e9 tokens is clamped to what an integer column holds, counted and written with its charge", () =>
    Effect.gen(function*() {
      const dev = yield* caller("poison-huge@example.com", { sen: 1000 })
      const instance = yield* settlementInstance()
      const grant = yield* grantRow(dev.accountId, instance.holder, 100_000)
      const charge = grantCharge(grant, dev.keyId, 9_000, { outputTokens: 3e9, inputTokens: 12 })
      instance.queue.enqueue(charge.queued)
      yield* instance.queue.flush
      const log = yield* raw<{ output: number; input: number; status: string }>(
        `SELECT output_tokens AS output, input_tokens AS input, status FROM request_logs WHERE request_id = $1`,
        [charge.requestId]
      )
      expect(log).toEqual([{ output: 2_147_483_647, input: 12, status: "billed" }])
      expect((yield* usageEntries(charge.requestId)).map((e) => Number(e.amount))).toEqual([9_000])
      expect(yield* counted(instance.metrics.settlementClamped, { field: "outputTokens" })).toBe(1)
      expect(yield* violations(dev.accountId)).toEqual([])
    }))

  it.scoped(
    "a settlement the database keeps refusing is parked, its hold back in the wallet; the rest flows, the counter resets, and the replay bills it",
    () =>
      Effect.gen(function*() {
        const dev = yield* caller("poison-parked@example.com", { sen: 1000 })
        const instance = yield* settlementInstance()
        const grant = yield* grantRow(dev.accountId, instance.holder, 100_000)
        const poisoned = grantCharge(grant, dev.keyId, 11_000)
        // A refusal nothing in the queue can cure: this call's log row breaks a rule of the table.
        yield* raw(`ALTER TABLE request_logs ADD CONSTRAINT refuse_one CHECK (request_id <> '${poisoned.requestId}')`)
        const before = grantCharge(grant, dev.keyId, 3_000)
        instance.queue.enqueue(before.queued)
        instance.queue.enqueue(poisoned.queued)
        const after = grantCharge(grant, dev.keyId, 4_000)
        instance.queue.enqueue(after.queued)

        const parked = yield* eventually(
          raw<
            {
              id: string
              kind: string
              attempts: number
              error: string
              status: string
              item: { item: { amountMicroMyr: number } }
            }
          >(
            `SELECT id, kind, attempts, error, status, item FROM settlement_parked WHERE request_id = $1`,
            [poisoned.requestId]
          ),
          (rows) => rows.length > 0
        )
        expect(parked).toHaveLength(1)
        expect(parked[0]).toMatchObject({
          kind: "GrantCharge",
          attempts: 3,
          status: "parked",
          item: { item: { amountMicroMyr: 11_000 } }
        })
        expect(parked[0]?.error).toContain("refuse_one")
        // The rest flowed: both other calls are billed, the poisoned one is not, and its charge went back to the wallet.
        expect((yield* usageEntries(before.requestId)).map((e) => Number(e.amount))).toEqual([3_000])
        expect((yield* usageEntries(after.requestId)).map((e) => Number(e.amount))).toEqual([4_000])
        expect(yield* usageEntries(poisoned.requestId)).toEqual([])
        expect(yield* grantAmount(grant.id)).toBe(100_000 - 3_000 - 4_000 - 11_000)
        expect(grant.pending).toBe(0)
        expect(yield* counted(instance.metrics.settlementParked, { kind: "GrantCharge" })).toBe(1)
        expect(yield* violations(dev.accountId)).toEqual([])
        // The failure counter is back to 0: the next settlement is written in a batch at once.
        const next = grantCharge(grant, dev.keyId, 1_000)
        instance.queue.enqueue(next.queued)
        yield* instance.queue.flush
        expect((yield* usageEntries(next.requestId)).map((e) => Number(e.amount))).toEqual([1_000])
        expect(instance.queue.health()).toEqual({ failures: 0, refused: 0 })

        // Still refused: the replay says so and keeps it parked.
        const refused = yield* instance.run(replayParked([poisoned.requestId]))
        expect(refused).toMatchObject([{ outcome: "failed", requestId: poisoned.requestId }])
        yield* raw(`ALTER TABLE request_logs DROP CONSTRAINT refuse_one`)
        const { databaseUrl } = yield* TestServer
        const replay = yield* Effect.promise(() =>
          promisify(execFile)("node", ["--import", "tsx", "src/Wallet/Settlement/ReplayParked.ts"], {
            cwd: resolve(import.meta.dirname, "../../.."),
            env: { ...process.env, DATABASE_URL: databaseUrl, LOG_FORMAT: "json" }
          })
        )
        expect(replay.stdout).toContain(
          `replayed ${parked[0]?.id} (GrantCharge, request ${poisoned.requestId}): billed RM 0.011000`
        )
        expect(replay.stdout).toContain("1 replayed, 0 still parked")
        expect((yield* usageEntries(poisoned.requestId)).map((e) => Number(e.amount))).toEqual([11_000])
        const log = yield* raw<{ status: string; cost: string }>(
          `SELECT status, cost_micro_myr AS cost FROM request_logs WHERE request_id = $1`,
          [poisoned.requestId]
        )
        expect(log).toEqual([{ status: "billed", cost: "11000" }])
        expect(yield* raw(`SELECT 1 FROM settlement_parked WHERE status = 'parked'`)).toEqual([])
        // A second replay finds nothing to do: billed once.
        expect(yield* instance.run(replayParked())).toEqual([])
        expect((yield* usageEntries(poisoned.requestId)).length).toBe(1)
        expect(yield* violations(dev.accountId)).toEqual([])
      }),
    30_000
  )
})

/** Text PostgreSQL cannot store: U+0000 (text, jsonb) and unpaired surrogates (jsonb refuses their escapes). */
const HOSTILE = { endUser: "u\u0000\ud800", metadata: { "t\u0000": "v\udc00", team: "\ud83d" } }
const STORED = { endUser: "u\uFFFD\uFFFD", metadata: { "t\uFFFD": "v\uFFFD", team: "\uFFFD" } }

layer(TestServerWithUpstream(), { excludeTestServices: true })(
  "settlement of hostile text",
  (it) => {
    it.scoped("a log row whose user and tags PostgreSQL cannot store is written storable, with its charge; nothing refused or parked", () =>
      Effect.gen(function*() {
        const dev = yield* caller("poison-text@example.com", { sen: 1000 })
        const instance = yield* settlementInstance()
        const grant = yield* grantRow(dev.accountId, instance.holder, 100_000)
        const charge = grantCharge(grant, dev.keyId, 8_000, HOSTILE)
        const logOnly = `req_${newId("poison")}`
        instance.queue.enqueue(charge.queued)
        instance.queue.enqueue({
          log: { ...logOf(dev.accountId, dev.keyId, logOnly, 0, HOSTILE), status: "succeeded" }
        })
        yield* instance.queue.flush
        expect((yield* usageEntries(charge.requestId)).map((e) => Number(e.amount))).toEqual([8_000])
        const rows = yield* raw<{ requestId: string; status: string; endUser: string; metadata: unknown }>(
          `SELECT request_id AS "requestId", status, end_user AS "endUser", metadata FROM request_logs WHERE request_id = ANY($1) ORDER BY status`,
          [[charge.requestId, logOnly]]
        )
        expect(rows).toEqual([
          { requestId: charge.requestId, status: "billed", ...STORED },
          { requestId: logOnly, status: "succeeded", ...STORED }
        ])
        expect(grant.pending).toBe(0)
        expect(instance.queue.health()).toEqual({ failures: 0, refused: 0 })
        expect(yield* raw(`SELECT 1 FROM settlement_parked WHERE request_id = ANY($1)`, [[charge.requestId, logOnly]]))
          .toEqual([])
        expect(yield* counted(instance.metrics.settlementClamped, { field: "endUser" })).toBe(2)
        expect(yield* violations(dev.accountId)).toEqual([])
      }))

    it.scoped(
      "a refused settlement holding text PostgreSQL cannot store is parked all the same: its hold back, the queue flowing",
      () =>
        Effect.gen(function*() {
          const dev = yield* caller("poison-text-parked@example.com", { sen: 1000 })
          const closing: Array<Grant> = []
          const instance = yield* settlementInstance({ closing })
          const grant = yield* grantRow(dev.accountId, instance.holder, 100_000)
          const poisoned = grantCharge(grant, dev.keyId, 6_000, HOSTILE)
          const item = { ...poisoned.item, description: "Model call \u0000\ud800" }
          yield* raw(
            `ALTER TABLE request_logs ADD CONSTRAINT refuse_text CHECK (request_id <> '${poisoned.requestId}')`
          )
          instance.queue.enqueue({ ...poisoned.queued, item })
          const parked = yield* eventually(
            raw<
              {
                kind: string
                status: string
                item: { item: { description: string; log: { endUser: string; metadata: unknown } } }
              }
            >(
              `SELECT kind, status, item FROM settlement_parked WHERE request_id = $1`,
              [poisoned.requestId]
            ),
            (rows) => rows.length > 0
          )
          yield* raw(`ALTER TABLE request_logs DROP CONSTRAINT refuse_text`)
          expect(parked).toHaveLength(1)
          expect(parked[0]).toMatchObject({ kind: "GrantCharge", status: "parked" })
          expect(parked[0]?.item.item.description).toBe("Model call \uFFFD\uFFFD")
          expect(parked[0]?.item.item.log).toMatchObject(STORED)
          // Its charge went back to the wallet; the queue is empty and flows: a later charge and a hand-back are written.
          expect(yield* usageEntries(poisoned.requestId)).toEqual([])
          expect(grant.pending).toBe(0)
          expect(instance.queue.health()).toEqual({ failures: 0, refused: 0 })
          const next = grantCharge(grant, dev.keyId, 1_000)
          instance.queue.enqueue(next.queued)
          grant.remaining = 100_000 - 6_000 - 1_000
          closing.push(grant)
          yield* instance.queue.flush
          expect((yield* usageEntries(next.requestId)).map((e) => Number(e.amount))).toEqual([1_000])
          expect(yield* grantAmount(grant.id)).toBe(0)
          expect(yield* violations(dev.accountId)).toEqual([])
        }),
      30_000
    )

    it.scoped(
      "a settlement the database will neither write nor park is given up after a few tries: nothing loops, the rest is written",
      () =>
        Effect.gen(function*() {
          const dev = yield* caller("poison-give-up@example.com", { sen: 1000 })
          const instance = yield* settlementInstance()
          const grant = yield* grantRow(dev.accountId, instance.holder, 100_000)
          const doomed = grantCharge(grant, dev.keyId, 5_000)
          yield* raw(
            `ALTER TABLE request_logs ADD CONSTRAINT refuse_doomed CHECK (request_id <> '${doomed.requestId}')`
          )
          yield* raw(
            `ALTER TABLE settlement_parked ADD CONSTRAINT refuse_doomed CHECK (request_id <> '${doomed.requestId}')`
          )
          instance.queue.enqueue(doomed.queued)
          const health = yield* eventually(Effect.sync(() => instance.queue.health()), (h) =>
            h.refused === 0 && grant.pending === 0, 15_000)
          yield* raw(`ALTER TABLE request_logs DROP CONSTRAINT refuse_doomed`)
          yield* raw(`ALTER TABLE settlement_parked DROP CONSTRAINT refuse_doomed`)
          expect(health).toEqual({ failures: 0, refused: 0 })
          expect(grant.pending).toBe(0)
          expect(yield* counted(instance.metrics.settlementParked, { kind: "dropped" })).toBe(1)
          expect(yield* raw(`SELECT 1 FROM settlement_parked WHERE request_id = $1`, [doomed.requestId])).toEqual([])
          const next = grantCharge(grant, dev.keyId, 2_000)
          instance.queue.enqueue(next.queued)
          yield* instance.queue.flush
          expect((yield* usageEntries(next.requestId)).map((e) =>
            Number(e.amount)
          )).toEqual([2_000])
          expect(instance.queue.health()).toEqual({ failures: 0, refused: 0 })
        }),
      30_000
    )

    it.scoped(
      "a pending row the database refuses does not hold back the grants' hand-backs",
      () =>
        Effect.gen(function*() {
          const dev = yield* caller("poison-pending@example.com", { sen: 1000 })
          const closing: Array<Grant> = []
          const instance = yield* settlementInstance({ closing })
          const grant = yield* grantRow(dev.accountId, instance.holder, 100_000)
          const running = `req_${newId("poison")}`
          yield* raw(`ALTER TABLE request_logs ADD CONSTRAINT refuse_pending CHECK (request_id <> '${running}')`)
          const log = logOf(dev.accountId, dev.keyId, running, 0)
          // A call running for two seconds: its pending row is due, and the database refuses it.
          instance.queue.track({
            log,
            startedAt: new Date(Date.now() - 2_000),
            amountMicroMyr: 0,
            source: { _tag: "None" },
            epoch: 0
          })
          grant.remaining = 100_000
          closing.push(grant)
          const left = yield* eventually(grantAmount(grant.id), (amount) => amount === 0)
          yield* raw(`ALTER TABLE request_logs DROP CONSTRAINT refuse_pending`)
          expect(left).toBe(0)
          expect(yield* raw(`SELECT 1 FROM request_logs WHERE request_id = $1`, [running])).toEqual([])
          expect(yield* violations(dev.accountId)).toEqual([])
        }),
      30_000
    )
  }
)
