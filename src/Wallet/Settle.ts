import { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Effect } from "effect"
import { newId } from "../Domain/Ids.js"
import type { LogWrite } from "../Logs/RequestLogs.js"
import { RequestLogs } from "../Logs/RequestLogs.js"

/**
 * Settlement in batches (DESIGN.md, Money): every capture, release and charge
 * against a credit grant, the grants returned, their ledger entries and the
 * calls' log rows, written in one transaction with one statement per table.
 * Locks are taken in one order — reservations, wallets, grants, each by id —
 * as every other movement takes them. A single movement (the sweeper's
 * release, a test's capture) is a batch of one: there is one copy of the rules.
 */

export type SettleItem =
  /** Bills up to `amount` from a reservation (never more than it held) and returns the rest. */
  | {
    readonly _tag: "Capture"
    readonly reservationId: string
    readonly amountMicroMyr: number
    readonly description: string
    readonly log?: LogWrite | undefined
  }
  /** Returns a reservation whole. */
  | { readonly _tag: "Release"; readonly reservationId: string; readonly log?: LogWrite | undefined }
  /** Bills a call reserved in memory from this instance's grant. */
  | {
    readonly _tag: "GrantCharge"
    readonly grantId: string
    readonly accountId: string
    readonly apiKeyId: string
    readonly requestId: string
    readonly amountMicroMyr: number
    readonly description: string
    readonly log?: LogWrite | undefined
  }

/** Part of a grant handed back to its wallet. */
export interface GrantReturn {
  readonly grantId: string
  readonly accountId: string
  readonly amountMicroMyr: number
}

export interface Batch {
  readonly items: ReadonlyArray<SettleItem>
  readonly returns: ReadonlyArray<GrantReturn>
  /** Rows of calls that move no money: still running, test keys, refusals, failures on a grant. */
  readonly logs: ReadonlyArray<LogWrite>
  /** Grants to delete once empty (idle, or this instance stopping). */
  readonly close: ReadonlyArray<string>
  /** The batch's time: its ledger entries' `created_at`. */
  readonly at: Date
  /** This process: the rows' holder. */
  readonly holder: string
}

export interface ItemOutcome {
  /** What was billed: never more than the hold, nor (late) than the wallet held. */
  readonly chargedMicroMyr: number
  readonly ledgerEntryId: string | null
  /** For a release: the reservation was open and is returned now. */
  readonly released: boolean
}

export interface BatchOutcome {
  readonly items: ReadonlyArray<ItemOutcome>
  /** Grants that no longer exist (the sweeper returned them, taking this process for dead). */
  readonly missingGrants: ReadonlySet<string>
}

interface ReservationRow {
  readonly id: string
  readonly accountId: string
  readonly apiKeyId: string
  readonly requestId: string
  readonly amountMicroMyr: number
  status: "open" | "captured" | "released"
  capturedMicroMyr: number | null
  changed?: boolean
}

interface WalletRow {
  readonly accountId: string
  availableMicroMyr: number
  reservedMicroMyr: number
  grantedMicroMyr: number
  lifetimeSpendMicroMyr: number
  changed?: boolean
}

interface GrantRow {
  readonly id: string
  amountMicroMyr: number
  changed?: boolean
}

interface Entry {
  readonly id: string
  readonly accountId: string
  readonly amountMicroMyr: number
  readonly balanceAfterMicroMyr: number
  readonly description: string
  readonly apiKeyId: string
  readonly requestId: string
}

const nothing: ItemOutcome = { chargedMicroMyr: 0, ledgerEntryId: null, released: false }

const unique = (values: Iterable<string>) => [...new Set(values)].sort()

/** Runs `batch` in one transaction; the caller retries the whole batch when it fails. */
export const settleBatch = (batch: Batch): Effect.Effect<BatchOutcome, SqlError.SqlError, SqlClient.SqlClient | RequestLogs> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const logs = yield* RequestLogs
    return yield* sql.withTransaction(Effect.gen(function*() {
      const reservationIds = unique(batch.items.flatMap((i) => i._tag === "GrantCharge" ? [] : [i.reservationId]))
      const reservations = new Map<string, ReservationRow>()
      if (reservationIds.length > 0) {
        const rows = yield* sql<ReservationRow>`
          SELECT id, account_id, api_key_id, request_id, amount_micro_myr, status, captured_micro_myr
          FROM reservations WHERE id = ANY(${reservationIds}::text[]) ORDER BY id FOR UPDATE
        `
        for (const row of rows) reservations.set(row.id, { ...row })
      }
      const accountIds = unique([
        ...[...reservations.values()].map((r) => r.accountId),
        ...batch.items.flatMap((i) => i._tag === "GrantCharge" ? [i.accountId] : []),
        ...batch.returns.map((r) => r.accountId)
      ])
      const wallets = new Map<string, WalletRow>()
      if (accountIds.length > 0) {
        const rows = yield* sql<WalletRow>`
          SELECT account_id, available_micro_myr, reserved_micro_myr, granted_micro_myr, lifetime_spend_micro_myr
          FROM wallets WHERE account_id = ANY(${accountIds}::text[]) ORDER BY account_id FOR UPDATE
        `
        for (const row of rows) wallets.set(row.accountId, { ...row })
      }
      const grantIds = unique([
        ...batch.items.flatMap((i) => i._tag === "GrantCharge" ? [i.grantId] : []),
        ...batch.returns.map((r) => r.grantId),
        ...batch.close
      ])
      const grants = new Map<string, GrantRow>()
      if (grantIds.length > 0) {
        const rows = yield* sql<GrantRow>`
          SELECT id, amount_micro_myr FROM credit_grants WHERE id = ANY(${grantIds}::text[]) ORDER BY id FOR UPDATE
        `
        for (const row of rows) grants.set(row.id, { ...row })
      }
      const missingGrants = new Set(grantIds.filter((id) => !grants.has(id)))

      const entries: Array<Entry> = []
      /** Captures already made (a retry), by item index: they answer with the entry they posted. */
      const repeated = new Map<number, string>()
      const logRows: Array<LogWrite> = [...batch.logs]
      const walletOf = (accountId: string) => {
        const wallet = wallets.get(accountId)
        if (wallet === undefined) throw new Error(`no wallet for account ${accountId}`)
        wallet.changed = true
        return wallet
      }
      const bill = (wallet: WalletRow, charged: number, description: string, apiKeyId: string, requestId: string) => {
        wallet.lifetimeSpendMicroMyr += charged
        if (charged === 0) return null
        const id = newId("le")
        entries.push({
          id,
          accountId: wallet.accountId,
          amountMicroMyr: -charged,
          balanceAfterMicroMyr: wallet.availableMicroMyr + wallet.reservedMicroMyr + wallet.grantedMicroMyr,
          description,
          apiKeyId,
          requestId
        })
        return id
      }
      const billed = (log: LogWrite | undefined, charged: number) => {
        if (log !== undefined) logRows.push({ ...log, status: "billed", costMicroMyr: charged })
      }

      const outcomes = batch.items.map((item, index): ItemOutcome => {
        switch (item._tag) {
          case "Capture": {
            const r = reservations.get(item.reservationId)
            if (r === undefined) return nothing
            if (r.status === "captured") {
              repeated.set(index, r.requestId)
              return { chargedMicroMyr: r.capturedMicroMyr ?? 0, ledgerEntryId: null, released: false }
            }
            const wallet = walletOf(r.accountId)
            const asked = Math.max(item.amountMicroMyr, 0)
            let charged: number
            if (r.status === "open") {
              charged = Math.min(asked, r.amountMicroMyr)
              wallet.availableMicroMyr += r.amountMicroMyr - charged
              wallet.reservedMicroMyr -= r.amountMicroMyr
            } else {
              // Released by the sweeper (its process looked dead): billed late, from what the wallet holds.
              charged = Math.min(asked, r.amountMicroMyr, Math.max(wallet.availableMicroMyr, 0))
              wallet.availableMicroMyr -= charged
            }
            r.status = "captured"
            r.capturedMicroMyr = charged
            r.changed = true
            billed(item.log, charged)
            return { chargedMicroMyr: charged, ledgerEntryId: bill(wallet, charged, item.description, r.apiKeyId, r.requestId), released: false }
          }
          case "Release": {
            const r = reservations.get(item.reservationId)
            if (item.log !== undefined) logRows.push(item.log)
            if (r === undefined || r.status !== "open") return nothing
            const wallet = walletOf(r.accountId)
            wallet.availableMicroMyr += r.amountMicroMyr
            wallet.reservedMicroMyr -= r.amountMicroMyr
            r.status = "released"
            r.changed = true
            return { ...nothing, released: true }
          }
          case "GrantCharge": {
            const wallet = walletOf(item.accountId)
            const grant = grants.get(item.grantId)
            const asked = Math.max(item.amountMicroMyr, 0)
            const fromGrant = Math.min(asked, grant?.amountMicroMyr ?? 0)
            // A grant the sweeper returned: what it no longer covers is billed late, from what the wallet holds.
            const late = Math.min(asked - fromGrant, Math.max(wallet.availableMicroMyr, 0))
            if (grant !== undefined) {
              grant.amountMicroMyr -= fromGrant
              grant.changed = true
            }
            wallet.grantedMicroMyr -= fromGrant
            wallet.availableMicroMyr -= late
            const charged = fromGrant + late
            billed(item.log, charged)
            return {
              chargedMicroMyr: charged,
              ledgerEntryId: bill(wallet, charged, item.description, item.apiKeyId, item.requestId),
              released: false
            }
          }
        }
      })
      for (const back of batch.returns) {
        const grant = grants.get(back.grantId)
        if (grant === undefined) continue
        const amount = Math.min(back.amountMicroMyr, grant.amountMicroMyr)
        const wallet = walletOf(back.accountId)
        grant.amountMicroMyr -= amount
        grant.changed = true
        wallet.grantedMicroMyr -= amount
        wallet.availableMicroMyr += amount
      }

      const changedReservations = [...reservations.values()].filter((r) => r.changed)
      if (changedReservations.length > 0) {
        yield* sql`
          UPDATE reservations r
          SET status = v.status, captured_micro_myr = v.captured, settled_at = COALESCE(r.settled_at, ${batch.at})
          FROM unnest(${changedReservations.map((r) => r.id)}::text[], ${changedReservations.map((r) => r.status)}::text[],
                      ${changedReservations.map((r) => r.capturedMicroMyr)}::bigint[]) AS v(id, status, captured)
          WHERE r.id = v.id
        `
      }
      const changedWallets = [...wallets.values()].filter((w) => w.changed)
      if (changedWallets.length > 0) {
        yield* sql`
          UPDATE wallets w
          SET available_micro_myr = v.available, reserved_micro_myr = v.reserved, granted_micro_myr = v.granted,
              lifetime_spend_micro_myr = v.spent, updated_at = ${batch.at}
          FROM unnest(${changedWallets.map((w) => w.accountId)}::text[], ${changedWallets.map((w) => w.availableMicroMyr)}::bigint[],
                      ${changedWallets.map((w) => w.reservedMicroMyr)}::bigint[], ${changedWallets.map((w) => w.grantedMicroMyr)}::bigint[],
                      ${changedWallets.map((w) => w.lifetimeSpendMicroMyr)}::bigint[]) AS v(account_id, available, reserved, granted, spent)
          WHERE w.account_id = v.account_id
        `
      }
      const changedGrants = [...grants.values()].filter((g) => g.changed)
      if (changedGrants.length > 0) {
        yield* sql`
          UPDATE credit_grants g SET amount_micro_myr = v.amount, updated_at = ${batch.at}
          FROM unnest(${changedGrants.map((g) => g.id)}::text[], ${changedGrants.map((g) => g.amountMicroMyr)}::bigint[]) AS v(id, amount)
          WHERE g.id = v.id
        `
      }
      const emptied = batch.close.filter((id) => grants.get(id)?.amountMicroMyr === 0)
      if (emptied.length > 0) yield* sql`DELETE FROM credit_grants WHERE id = ANY(${emptied}::text[])`
      if (entries.length > 0) {
        yield* sql`
          INSERT INTO ledger_entries
            (id, account_id, type, amount_micro_myr, balance_after_micro_myr, description, api_key_id, request_id, created_at)
          SELECT v.id, v.account_id, 'usage', v.amount, v.balance_after, v.description, v.api_key_id, v.request_id, ${batch.at}
          FROM unnest(${entries.map((e) => e.id)}::text[], ${entries.map((e) => e.accountId)}::text[],
                      ${entries.map((e) => e.amountMicroMyr)}::bigint[], ${entries.map((e) => e.balanceAfterMicroMyr)}::bigint[],
                      ${entries.map((e) => e.description)}::text[], ${entries.map((e) => e.apiKeyId)}::text[],
                      ${entries.map((e) => e.requestId)}::text[])
            WITH ORDINALITY AS v(id, account_id, amount, balance_after, description, api_key_id, request_id, n)
          ORDER BY v.n
        `
      }
      yield* logs.write(logRows, batch.holder)
      if (repeated.size === 0) return { items: outcomes, missingGrants } satisfies BatchOutcome
      const posted = new Map<string, string>()
      const rows = yield* sql<{ id: string; requestId: string }>`
        SELECT id, request_id FROM ledger_entries WHERE type = 'usage' AND request_id = ANY(${[...repeated.values()]}::text[])
      `
      for (const row of rows) posted.set(row.requestId, row.id)
      const items = outcomes.map((outcome, index) => {
        const requestId = repeated.get(index)
        return requestId === undefined ? outcome : { ...outcome, ledgerEntryId: posted.get(requestId) ?? null }
      })
      return { items, missingGrants } satisfies BatchOutcome
    }))
  })
