import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import pg from "pg"
import Stripe from "stripe"
import { freePort } from "../../../src/Database/EmbeddedPostgres.js"
import { randomBase62 } from "../../../src/Domain/Ids.js"
import { type ServiceProcess, startService, stopService } from "../../support/ServiceProcess.js"
import { events, WEBHOOK_SECRET } from "../../support/Stripe.js"
import { freshDatabase, withClient } from "../../support/TestServer.js"

/**
 * Invoice numbers across real service processes on one database
 * (docs/api/invoices.md, "Documents"): a document takes its number in the SQL
 * transaction that moves its money, from a counter row locked until that
 * transaction ends. Top-ups on two instances at once take consecutive numbers;
 * a process SIGKILLed inside that transaction gives its number back, and the
 * redelivered event issues it once.
 */

/** RM 10 with service tax at 8 % (`SST_RATE_BPS=800`): the wallet gets 1000 sen, the buyer pays 1080. */
const AMOUNT_SEN = 1000
const TOTAL_SEN = 1080
const TOP_UPS = 20
const ACCOUNTS = 4

interface Answer {
  readonly status: number
  readonly body: any // arbitrary JSON: each case asserts the shape it expects
  readonly text: string
}

const request = async (
  service: ServiceProcess,
  method: string,
  path: string,
  options: { token?: string; json?: unknown; body?: string; headers?: Record<string, string> } = {}
): Promise<Answer> => {
  const headers: Record<string, string> = { ...options.headers }
  if (options.token !== undefined) headers["authorization"] = `Bearer ${options.token}`
  let body = options.body
  if (options.json !== undefined) {
    body = JSON.stringify(options.json)
    headers["content-type"] = "application/json"
  }
  const response = await fetch(`${service.baseUrl}${path}`, {
    method,
    headers,
    signal: AbortSignal.timeout(60_000),
    ...(body === undefined ? {} : { body })
  })
  const text = await response.text()
  let parsed: unknown
  try {
    parsed = text === "" ? undefined : JSON.parse(text)
  } catch {
    parsed = undefined
  }
  return { status: response.status, body: parsed, text }
}

/** Signed as Stripe signs, at the real time now: the receiver is another process, on its own clock. */
const deliver = (service: ServiceProcess, event: object) => {
  const payload = JSON.stringify(event)
  const signature = Stripe.webhooks.generateTestHeaderString({
    payload,
    secret: WEBHOOK_SECRET,
    timestamp: Math.floor(Date.now() / 1000)
  })
  return request(service, "POST", "/billing/stripe/webhook", {
    body: payload,
    headers: { "content-type": "application/json", "stripe-signature": signature }
  })
}

const poll = async <A>(
  what: string,
  probe: () => Promise<A>,
  done: (a: A) => boolean,
  limitMs = 30_000
): Promise<A> => {
  const until = Date.now() + limitMs
  while (true) {
    const answer = await probe()
    if (done(answer)) return answer
    if (Date.now() > until) throw new Error(`${what}: not seen; last ${JSON.stringify(answer).slice(0, 300)}`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

/** The calendar year in the business time zone (`BUSINESS_TIMEZONE`'s default): the number's year. */
const yearInKualaLumpur = (iso: string) =>
  Number(new Intl.DateTimeFormat("en", { timeZone: "Asia/Kuala_Lumpur", year: "numeric" }).format(new Date(iso)))

const tempDir = Effect.acquireRelease(
  Effect.promise(() => mkdtemp(join(tmpdir(), "nenas-invoices-"))),
  (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
)

/**
 * What both instances of a case share: the database, `DATA_DIR` (one development identity key), the public
 * address (the development sign-in's token issuer) and the webhook secret. Checkouts and sign-ins all come from
 * 127.0.0.1: its per-address limits are not what is tested here.
 */
const sharedEnv = (databaseUrl: string, dataDir: string, publicPort: number) => ({
  PUBLIC_BASE_URL: `http://127.0.0.1:${publicPort}`,
  DATABASE_URL: databaseUrl,
  DATA_DIR: dataDir,
  STRIPE_WEBHOOK_SECRET: WEBHOOK_SECRET,
  SST_RATE_BPS: "800",
  IP_CHECKOUTS_PER_MINUTE: "1000",
  IP_DEV_SESSIONS_PER_MINUTE: "1000",
  LOG_FORMAT: "json"
})

/** The service from source in a child process, SIGKILLed when the scope closes (a no-op once it has exited). */
const started = (port: number, env: Record<string, string>) =>
  Effect.acquireRelease(
    Effect.promise(() => startService({ from: "source", port, env })),
    (service) => Effect.promise(() => stopService(service, "SIGKILL"))
  )

/** A signed-in developer on `service`: a development session token and the account the first dashboard call made. */
const developer = async (service: ServiceProcess, databaseUrl: string, email: string) => {
  const session = await request(service, "POST", "/dev/session", { json: { email } })
  expect(session.status, session.text).toBe(200)
  const token = session.body.token as string
  const balance = await request(service, "GET", "/dashboard/billing/balance", { token })
  expect(balance.status, balance.text).toBe(200)
  const accountId = await withClient(
    databaseUrl,
    async (client) =>
      (await client.query("SELECT id FROM accounts WHERE email = $1", [email])).rows[0]?.id as string | undefined
  )
  if (accountId === undefined) throw new Error(`no account for ${email}`)
  return { token, accountId }
}

/** A checkout of RM 10 (the simulated checkout: no STRIPE_SECRET_KEY), with the tax it charges on top. */
const checkout = async (service: ServiceProcess, token: string) => {
  const made = await request(service, "POST", "/dashboard/billing/checkout", {
    token,
    json: { amount_sen: AMOUNT_SEN }
  })
  expect(made.status, made.text).toBe(200)
  expect(made.body).toMatchObject({ amount_sen: AMOUNT_SEN, tax_sen: TOTAL_SEN - AMOUNT_SEN, total_sen: TOTAL_SEN })
  return { transactionId: made.body.transaction_id as string, sessionId: made.body.session_id as string }
}

/** The completed checkout Stripe would send: paid in full, amount and tax (`amount_total`). */
const completed = (session: { transactionId: string; sessionId: string }) =>
  events.checkoutCompleted({
    transactionId: session.transactionId,
    sessionId: session.sessionId,
    paymentIntentId: `pi_${randomBase62(24)}`,
    amountSen: TOTAL_SEN
  })

const invoicesOf = async (service: ServiceProcess, token: string) => {
  const page = await request(service, "GET", "/dashboard/billing/invoices?limit=50", { token })
  expect(page.status, page.text).toBe(200)
  return page.body.data as Array<
    { id: string; number: string; type: string; issued_at: string; net_myr: number; tax_myr: number; total_myr: number }
  >
}

const balanceOf = async (service: ServiceProcess, token: string) => {
  const balance = await request(service, "GET", "/dashboard/billing/balance", { token })
  expect(balance.status, balance.text).toBe(200)
  return balance.body as { balance_myr: number; wallet: { availableMicroMyr: number; lifetimeTopupMicroMyr: number } }
}

const count = async (client: pg.Client, text: string, values: Array<unknown> = []) =>
  (await client.query<{ n: number }>(`SELECT count(*)::int AS n FROM (${text}) AS rows`, values)).rows[0]!.n

describe("invoice numbers across processes", { timeout: 180_000 }, () => {
  it.scopedLive(
    "20 concurrent top-ups on two instances take 20 consecutive numbers",
    () =>
      Effect.gen(function*() {
        const database = yield* freshDatabase
        const dataDir = yield* tempDir
        const ports = [yield* Effect.promise(freePort), yield* Effect.promise(freePort)] as const
        const env = sharedEnv(database.url, dataDir, ports[0])
        // One after the other: the second finds the migrations applied.
        const a = yield* started(ports[0], { ...env, INSTANCE_ID: "invoices-a" })
        const b = yield* started(ports[1], { ...env, INSTANCE_ID: "invoices-b" })
        const instance = (i: number) => (i % 2 === 0 ? a : b)
        yield* Effect.promise(async () => {
          // Four accounts of five top-ups each: their transactions meet at the counter row, not only at a wallet.
          const accounts = await Promise.all(
            Array.from({ length: ACCOUNTS }, (_, i) => developer(a, database.url, `numbers-${i}@example.com`))
          )
          const sessions: Array<{ transactionId: string; sessionId: string }> = []
          for (let i = 0; i < TOP_UPS; i++) sessions.push(await checkout(a, accounts[i % ACCOUNTS]!.token))
          const paid = sessions.map(completed)
          for (const event of paid) expect(event.data.object.amount_total).toBe(TOTAL_SEN)

          // All at once, alternating instances: each takes the counter row in its own transaction.
          const first = await Promise.all(paid.map((event, i) => deliver(instance(i), event)))
          expect(first.map((answer) => answer.status), first.map((answer) => answer.text).join("\n")).toEqual(
            Array.from({ length: TOP_UPS }, () => 200)
          )
          expect(first.map((answer) => answer.body)).toEqual(
            Array.from({ length: TOP_UPS }, () => ({ received: true, processed: true }))
          )

          const expectTwentyInvoices = async () => {
            const lists = await Promise.all(accounts.map(({ token }) => invoicesOf(b, token)))
            for (const list of lists) expect(list).toHaveLength(TOP_UPS / ACCOUNTS)
            const invoices = lists.flat()
            expect(invoices).toHaveLength(TOP_UPS)
            const year = yearInKualaLumpur(invoices[0]!.issued_at)
            for (const invoice of invoices) expect(yearInKualaLumpur(invoice.issued_at)).toBe(year)
            expect(invoices.map((invoice) => invoice.number).sort()).toEqual(
              Array.from({ length: TOP_UPS }, (_, i) => `INV-${year}-${String(i + 1).padStart(6, "0")}`)
            )
            for (const invoice of invoices) {
              expect(invoice).toMatchObject({ type: "invoice", net_myr: 10, tax_myr: 0.8, total_myr: 10.8 })
            }
            return invoices
          }
          const invoices = await expectTwentyInvoices()
          const details = await Promise.all(accounts.flatMap(({ token }) =>
            invoices.map((invoice) => request(a, "GET", `/dashboard/billing/invoices/${invoice.id}`, { token }))
          )).then((answers) =>
            answers.filter((answer) => answer.status !== 404)
          )
          for (const detail of details) expect(detail.status, detail.text).toBe(200)
          // One invoice per payment: each transaction's, with its payment intent as the reference.
          expect(details.map((detail) => detail.body.transaction_id).sort()).toEqual(
            sessions.map((session) => session.transactionId).sort()
          )
          expect(details.map((detail) => detail.body.payment_reference).sort()).toEqual(
            paid.map((event) => event.data.object.payment_intent).sort()
          )
          // The tax is the state's, never the wallet's.
          for (const { token } of accounts) {
            const credited = await balanceOf(a, token)
            expect(credited.balance_myr).toBe(50)
            expect(credited.wallet.availableMicroMyr).toBe(50_000_000)
          }

          // Stripe redelivers each event (same ids), and sends a twin of each under a new id: nothing moves.
          const twins = paid.map((event) => ({ ...event, id: `evt_${randomBase62(24)}` }))
          const again = await Promise.all(
            [...paid, ...twins].map((event, i) => deliver(instance(i + 1), event))
          )
          expect(again.map((answer) => answer.status), again.map((answer) => answer.text).join("\n")).toEqual(
            Array.from({ length: 2 * TOP_UPS }, () => 200)
          )
          expect(again.map((answer) => answer.body)).toEqual(
            Array.from({ length: 2 * TOP_UPS }, () => ({ received: true, processed: false }))
          )
          expect((await expectTwentyInvoices()).map((invoice) => invoice.id).sort()).toEqual(
            invoices.map((invoice) => invoice.id).sort()
          )
          for (const { token } of accounts) {
            const after = await balanceOf(b, token)
            expect(after.balance_myr).toBe(50)
            expect(after.wallet.lifetimeTopupMicroMyr).toBe(50_000_000)
          }

          await withClient(database.url, async (client) => {
            const numbered = await client.query<{ n: number; min: number; max: number; distinct: number }>(
              `SELECT count(*)::int AS n, min(sequence) AS min, max(sequence) AS max,
                      count(DISTINCT sequence)::int AS distinct
               FROM billing_documents WHERE type = 'invoice'`
            )
            expect(numbered.rows[0]).toEqual({ n: 20, min: 1, max: 20, distinct: 20 })
            const counter = await client.query("SELECT prefix, last_number FROM document_numbers")
            expect(counter.rows).toEqual([{ prefix: "INV", last_number: 20 }])
            const topups = await client.query<{ n: number; total: string }>(
              `SELECT count(*)::int AS n, sum(amount_micro_myr)::text AS total
               FROM ledger_entries WHERE account_id = ANY($1) AND type = 'topup'`,
              [accounts.map((account) => account.accountId)]
            )
            expect(topups.rows[0]).toEqual({ n: 20, total: "200000000" })
          })
        })
      }),
    180_000
  )

  it.scopedLive(
    "a SIGKILL inside the money's transaction gives its number back; the retry issues it once",
    () =>
      Effect.gen(function*() {
        const database = yield* freshDatabase
        const dataDir = yield* tempDir
        const ports = [yield* Effect.promise(freePort), yield* Effect.promise(freePort)] as const
        const env = sharedEnv(database.url, dataDir, ports[0])
        const a = yield* started(ports[0], { ...env, INSTANCE_ID: "invoices-killed" })
        const { accountId, event, token, transactionId } = yield* Effect.promise(async () => {
          const { accountId, token } = await developer(a, database.url, "killed-number@example.com")
          const session = await checkout(a, token)
          const event = completed(session)
          // The counter is held by the test: A's transaction gets as far as taking the number, and waits there.
          const holder = new pg.Client({ connectionString: database.url })
          await holder.connect()
          try {
            await holder.query("BEGIN")
            await holder.query("LOCK TABLE document_numbers IN EXCLUSIVE MODE")
            const inFlight = deliver(a, event).then(
              (answer) => ({ answered: answer.status }),
              (error: unknown) => ({ failed: String(error) })
            )
            // Watched from a connection of its own: within the holder's transaction, pg_stat_activity would keep
            // the snapshot of its first read.
            const observer = new pg.Client({ connectionString: database.url })
            await observer.connect()
            try {
              const waiting = await poll(
                "A's transaction waiting on the number's lock",
                async () =>
                  (await observer.query<{ pid: number; query: string }>(
                    `SELECT a.pid, a.query FROM pg_stat_activity a
                     JOIN pg_locks l ON l.pid = a.pid AND l.relation = 'document_numbers'::regclass AND NOT l.granted
                     WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'`
                  )).rows,
                (rows) => rows.length > 0
              )
              expect(waiting).toHaveLength(1)
              const { pid, query } = waiting[0]!
              expect(query).toContain("INSERT INTO document_numbers")
              // Inside the money's transaction: its top-up is written (not committed), its number not yet taken.
              const held = await observer.query<{ rel: string }>(
                `SELECT relation::regclass::text AS rel FROM pg_locks
                 WHERE pid = $1 AND granted AND mode = 'RowExclusiveLock' AND relation IS NOT NULL`,
                [pid]
              )
              expect(held.rows.map((row) => row.rel)).toEqual(
                expect.arrayContaining(["webhook_events", "payment_transactions", "wallets", "ledger_entries"])
              )
              await stopService(a, "SIGKILL")
              expect(await inFlight).toHaveProperty("failed")
              await holder.query("ROLLBACK")
              // Once the lock is free the orphaned backend runs on, finds its client gone and rolls back.
              await poll(
                "A's backend gone",
                async () => (await observer.query("SELECT 1 FROM pg_stat_activity WHERE pid = $1", [pid])).rowCount,
                (n) => n === 0
              )
            } finally {
              await observer.end()
            }
          } finally {
            await holder.end()
          }
          return { accountId, event, token, transactionId: session.transactionId }
        })

        yield* Effect.promise(() =>
          withClient(database.url, async (client) => {
            expect(await count(client, "SELECT 1 FROM billing_documents")).toBe(0)
            expect(
              await count(client, "SELECT 1 FROM ledger_entries WHERE account_id = $1 AND type = 'topup'", [accountId])
            ).toBe(0)
            const status = await client.query("SELECT status FROM payment_transactions WHERE id = $1", [transactionId])
            expect(status.rows).toEqual([{ status: "pending" }])
            // The number was never taken: no counter row at all, so the next invoice is number 1.
            expect((await client.query("SELECT prefix, year, last_number FROM document_numbers")).rows).toEqual([])
            // Nor was the event recorded, nor anything announced: the redelivery is the first application.
            expect(await count(client, "SELECT 1 FROM webhook_events WHERE id = $1", [event.id])).toBe(0)
            expect(await count(client, "SELECT 1 FROM outbox_events WHERE account_id = $1", [accountId])).toBe(0)
          })
        )

        const b = yield* started(ports[1], { ...env, INSTANCE_ID: "invoices-retry" })
        yield* Effect.promise(async () => {
          // Stripe retries the very event the killed process never answered.
          const retried = await deliver(b, event)
          expect(retried.status, retried.text).toBe(200)
          expect(retried.body).toEqual({ received: true, processed: true })
          const invoices = await invoicesOf(b, token)
          expect(invoices).toHaveLength(1)
          const year = yearInKualaLumpur(invoices[0]!.issued_at)
          expect(invoices[0]).toMatchObject({
            number: `INV-${year}-000001`,
            type: "invoice",
            net_myr: 10,
            tax_myr: 0.8,
            total_myr: 10.8
          })
          const balance = await balanceOf(b, token)
          expect(balance.balance_myr).toBe(10)
          expect(balance.wallet.availableMicroMyr).toBe(10_000_000)
          await withClient(database.url, async (client) => {
            const topups = await client.query(
              "SELECT amount_micro_myr::text AS amount FROM ledger_entries WHERE account_id = $1 AND type = 'topup'",
              [accountId]
            )
            expect(topups.rows).toEqual([{ amount: "10000000" }])
            const counter = await client.query("SELECT prefix, year, last_number FROM document_numbers")
            expect(counter.rows).toEqual([{ prefix: "INV", year, last_number: 1 }])
          })

          const duplicate = await deliver(b, event)
          expect(duplicate.status, duplicate.text).toBe(200)
          expect(duplicate.body).toEqual({ received: true, processed: false })
          expect((await invoicesOf(b, token)).map((invoice) => invoice.number)).toEqual([`INV-${year}-000001`])
          expect((await balanceOf(b, token)).balance_myr).toBe(10)
        })
      }),
    180_000
  )
})
