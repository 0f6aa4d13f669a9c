import { Effect, Option, Redacted } from "effect"
import { AppConfig } from "../../src/AppConfig.js"
import { DatabaseLive } from "../../src/Database/Database.js"
import { checkInvariant } from "../../src/Wallet/Invariant.js"
import { withClient } from "./TestServer.js"

/**
 * The books of a service running in a child process (`ServiceProcess`), read
 * straight from its database.
 */

/**
 * The ledger invariant (docs/money.md, "The ledger invariant") for each account: the violations found, empty
 * when it holds everywhere.
 */
export const invariantViolations = (databaseUrl: string, accountIds: ReadonlyArray<string>) =>
  Effect.runPromise(
    Effect.forEach(accountIds, (id) => Effect.map(checkInvariant(id), (r) => r.violations.map((v) => `${id}: ${v}`)))
      .pipe(
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
  withClient(
    databaseUrl,
    async (client) => (await client.query<{ id: string }>("SELECT id FROM accounts")).rows.map((r) => r.id)
  )
