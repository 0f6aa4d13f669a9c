import { type ChildProcess, spawn } from "node:child_process"
import { createWriteStream } from "node:fs"
import { Effect, Option, Redacted } from "effect"
import Stripe from "stripe"
import { AppConfig } from "../../src/AppConfig.js"
import { DatabaseLive } from "../../src/Database/Database.js"
import { randomBase62 } from "../../src/Domain/Ids.js"
import { checkInvariant } from "../../src/Wallet/Invariant.js"
import { WEBHOOK_SECRET } from "./Stripe.js"
import { withClient } from "./TestServer.js"

export { withClient }

/**
 * The service as `npm start` runs it, in a child process the test can
 * SIGKILL: for scenarios where the process itself dies.
 */
export interface ServiceProcess {
  readonly child: ChildProcess
  readonly baseUrl: string
  /** Milliseconds since the epoch when it was spawned. */
  readonly spawnedAt: number
}

export const spawnService = (env: Record<string, string>, logFile: string): ServiceProcess => {
  const child = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], {
    cwd: new URL("../..", import.meta.url).pathname,
    env: { ...process.env, NODE_ENV: "development", ...env },
    stdio: ["ignore", "pipe", "pipe"]
  })
  const log = createWriteStream(logFile, { flags: "a" })
  child.stdout?.pipe(log)
  child.stderr?.pipe(log)
  return { child, baseUrl: `http://127.0.0.1:${env["PORT"]}`, spawnedAt: Date.now() }
}

/** Waits until `/readyz` answers 200; returns when it did (ms since the epoch). */
export const waitReady = async (baseUrl: string, timeoutMs = 60_000): Promise<number> => {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    try {
      const reply = await fetch(`${baseUrl}/readyz`, { signal: AbortSignal.timeout(2_000) })
      if (reply.status === 200) return Date.now()
    } catch {
      // Not listening yet.
    }
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  throw new Error(`${baseUrl} was not ready within ${timeoutMs} ms`)
}

export const stopService = (service: ServiceProcess, signal: NodeJS.Signals = "SIGTERM") =>
  new Promise<void>((resolve) => {
    if (service.child.exitCode !== null || service.child.signalCode !== null) return resolve()
    service.child.once("exit", () => resolve())
    service.child.kill(signal)
  })

export const json = async (baseUrl: string, method: string, path: string, body?: unknown, token?: string) => {
  const reply = await fetch(`${baseUrl}${path}`, {
    method,
    headers: {
      ...(body === undefined ? {} : { "content-type": "application/json" }),
      ...(token === undefined ? {} : { authorization: `Bearer ${token}` })
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    signal: AbortSignal.timeout(30_000)
  })
  const text = await reply.text()
  return { status: reply.status, body: text === "" ? undefined : JSON.parse(text), text }
}

/** A developer with a live key and a wallet topped up with `amountSen` through a signed Stripe completion. */
export const liveDeveloper = async (baseUrl: string, email: string, amountSen: number) => {
  const { token } = (await json(baseUrl, "POST", "/dev/session", { email })).body as { token: string }
  const checkout = await json(baseUrl, "POST", "/dashboard/billing/checkout", { amount_sen: amountSen }, token)
  if (checkout.status !== 200) throw new Error(`checkout: ${checkout.text}`)
  const event = {
    id: `evt_${randomBase62(24)}`,
    object: "event",
    type: "checkout.session.completed",
    data: {
      object: {
        id: checkout.body.session_id,
        object: "checkout.session",
        payment_status: "paid",
        amount_total: amountSen,
        currency: "myr",
        client_reference_id: checkout.body.transaction_id,
        metadata: { transaction_id: checkout.body.transaction_id },
        payment_intent: `pi_${randomBase62(24)}`
      }
    }
  }
  const payload = JSON.stringify(event)
  const signature = Stripe.webhooks.generateTestHeaderString({ payload, secret: WEBHOOK_SECRET })
  const paid = await fetch(`${baseUrl}/billing/stripe/webhook`, {
    method: "POST",
    headers: { "content-type": "application/json", "stripe-signature": signature },
    body: payload
  })
  if (paid.status !== 200) throw new Error(`top-up: ${paid.status} ${await paid.text()}`)
  const key = await json(baseUrl, "POST", "/dashboard/api-keys", { name: "load", environment: "live" }, token)
  if (key.status !== 201) throw new Error(`key: ${key.text}`)
  const balance = await json(baseUrl, "GET", "/dashboard/billing/balance", undefined, token)
  return { token, apiKey: key.body.full_key as string, balance: balance.body }
}

/** DESIGN.md's invariant for each account: the violations found, empty when it holds everywhere. */
export const invariantViolations = (databaseUrl: string, accountIds: ReadonlyArray<string>) =>
  Effect.runPromise(
    Effect.forEach(accountIds, (id) => Effect.map(checkInvariant(id), (r) => r.violations.map((v) => `${id}: ${v}`))).pipe(
      Effect.map((all) => all.flat()),
      Effect.provide(DatabaseLive),
      Effect.provide(AppConfig.layerWith({ databaseUrl: Option.some(Redacted.make(databaseUrl)) })),
      Effect.scoped,
      Effect.orDie
    )
  )

/**
 * What money a crash or an outage may have left unsettled, and what would be
 * wrong however it is settled: open holds, pending logs, negative wallets,
 * requests billed twice, logs whose status disagrees with the ledger.
 */
export const moneyState = (databaseUrl: string) =>
  withClient(databaseUrl, async (client) => {
    const count = async (text: string) => Number((await client.query<{ n: string }>(text)).rows[0]?.n ?? 0)
    return {
      openReservations: await count("SELECT count(*) AS n FROM reservations WHERE status = 'open'"),
      /** Credit grants instances hold (a dead instance's are returned by the sweeper). */
      grants: await count("SELECT count(*) AS n FROM credit_grants"),
      pendingLogs: await count("SELECT count(*) AS n FROM request_logs WHERE status = 'pending'"),
      negativeWallets: await count("SELECT count(*) AS n FROM wallets WHERE available_micro_myr < 0"),
      billedTwice: await count(
        "SELECT count(*) AS n FROM (SELECT request_id FROM ledger_entries WHERE type = 'usage' GROUP BY request_id HAVING count(*) > 1) t"
      ),
      // A billed log's cost is its usage entry; a failed one has none.
      logLedgerMismatches: await count(`
        SELECT count(*) AS n FROM request_logs l
        LEFT JOIN ledger_entries e ON e.type = 'usage' AND e.request_id = l.request_id
        WHERE (l.status = 'billed' AND COALESCE(-e.amount_micro_myr, 0) <> l.cost_micro_myr)
           OR (l.status = 'failed' AND e.id IS NOT NULL)
      `),
      // A captured reservation's charge is its usage entry.
      captureMismatches: await count(`
        SELECT count(*) AS n FROM reservations r
        LEFT JOIN ledger_entries e ON e.type = 'usage' AND e.request_id = r.request_id
        WHERE (r.status = 'captured' AND COALESCE(-e.amount_micro_myr, 0) <> r.captured_micro_myr)
           OR (r.status = 'released' AND e.id IS NOT NULL)
      `)
    }
  })

export const accountIds = (databaseUrl: string) =>
  withClient(databaseUrl, async (client) => (await client.query<{ id: string }>("SELECT id FROM accounts")).rows.map((r) => r.id))
