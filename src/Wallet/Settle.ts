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
      const locked = yield* lockRows(sql, batch)
      const applied = apply(batch, locked)
      yield* writeRows(sql, batch, locked)
      yield* writeEntries(sql, batch.at, applied.entries)
      yield* logs.write(applied.logRows, batch.holder)
      const items = yield* withRepeatedEntries(sql, applied)
      return { items, missingGrants: locked.missingGrants } satisfies BatchOutcome
    }))
  })

/** The rows a batch moves, locked in one order — reservations, wallets, grants, each by id. */
interface Locked {
  readonly reservations: Map<string, ReservationRow>
  readonly wallets: Map<string, WalletRow>
  readonly grants: Map<string, GrantRow>
  readonly missingGrants: ReadonlySet<string>
}

const lockRows = (sql: SqlClient.SqlClient, batch: Batch) =>
  Effect.gen(function*() {
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
    return { reservations, wallets, grants, missingGrants } satisfies Locked
  })

/** The batch applied to its locked rows in memory: what changed, and what to write besides. */
interface Applied extends Locked {
  readonly outcomes: Array<ItemOutcome>
  readonly entries: Array<Entry>
  /** Captures already made (a retry), by item index: they answer with the entry they posted. */
  readonly repeated: Map<number, string>
  readonly logRows: Array<LogWrite>
}

const apply = (batch: Batch, locked: Locked): Applied => {
  const applied: Applied = { ...locked, outcomes: [], entries: [], repeated: new Map(), logRows: [...batch.logs] }
  for (const [index, item] of batch.items.entries()) {
    switch (item._tag) {
      case "Capture":
        applied.outcomes.push(capture(applied, item, index))
        break
      case "Release":
        applied.outcomes.push(release(applied, item))
        break
      case "GrantCharge":
        applied.outcomes.push(grantCharge(applied, item))
        break
    }
  }
  for (const back of batch.returns) handBack(applied, back)
  return applied
}

const walletOf = (applied: Applied, accountId: string) => {
  const wallet = applied.wallets.get(accountId)
  if (wallet === undefined) throw new Error(`no wallet for account ${accountId}`)
  wallet.changed = true
  return wallet
}

/** Counts `charged` as spent and, unless 0, posts its `usage` entry; the entry's id. */
const bill = (applied: Applied, wallet: WalletRow, charged: number, description: string, apiKeyId: string, requestId: string) => {
  wallet.lifetimeSpendMicroMyr += charged
  if (charged === 0) return null
  const id = newId("le")
  applied.entries.push({
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

/**
 * The capture rule, once for the SQL and the in-memory wallet: an open hold is
 * charged at most its amount and the rest returns to available; a hold already
 * released (its process looked dead) is billed late, from what the wallet
 * holds. Returns the charge; the reservation is then captured.
 */
export const captureInto = (
  wallet: { availableMicroMyr: number; reservedMicroMyr: number },
  reservation: { status: "open" | "captured" | "released"; readonly amountMicroMyr: number; capturedMicroMyr: number | null },
  amountMicroMyr: number
): number => {
  const asked = Math.max(amountMicroMyr, 0)
  const open = reservation.status === "open"
  const charged = open
    ? Math.min(asked, reservation.amountMicroMyr)
    : Math.min(asked, reservation.amountMicroMyr, Math.max(wallet.availableMicroMyr, 0))
  if (open) {
    wallet.availableMicroMyr += reservation.amountMicroMyr - charged
    wallet.reservedMicroMyr -= reservation.amountMicroMyr
  } else {
    wallet.availableMicroMyr -= charged
  }
  reservation.status = "captured"
  reservation.capturedMicroMyr = charged
  return charged
}

const billed = (applied: Applied, log: LogWrite | undefined, charged: number) => {
  if (log !== undefined) applied.logRows.push({ ...log, status: "billed", costMicroMyr: charged })
}

const capture = (applied: Applied, item: SettleItem & { readonly _tag: "Capture" }, index: number): ItemOutcome => {
  const r = applied.reservations.get(item.reservationId)
  if (r === undefined) return nothing
  if (r.status === "captured") {
    applied.repeated.set(index, r.requestId)
    return { chargedMicroMyr: r.capturedMicroMyr ?? 0, ledgerEntryId: null, released: false }
  }
  const wallet = walletOf(applied, r.accountId)
  const charged = captureInto(wallet, r, item.amountMicroMyr)
  r.changed = true
  billed(applied, item.log, charged)
  return { chargedMicroMyr: charged, ledgerEntryId: bill(applied, wallet, charged, item.description, r.apiKeyId, r.requestId), released: false }
}

const release = (applied: Applied, item: SettleItem & { readonly _tag: "Release" }): ItemOutcome => {
  const r = applied.reservations.get(item.reservationId)
  if (item.log !== undefined) applied.logRows.push(item.log)
  if (r === undefined || r.status !== "open") return nothing
  const wallet = walletOf(applied, r.accountId)
  wallet.availableMicroMyr += r.amountMicroMyr
  wallet.reservedMicroMyr -= r.amountMicroMyr
  r.status = "released"
  r.changed = true
  return { ...nothing, released: true }
}

const grantCharge = (applied: Applied, item: SettleItem & { readonly _tag: "GrantCharge" }): ItemOutcome => {
  const wallet = walletOf(applied, item.accountId)
  const grant = applied.grants.get(item.grantId)
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
  billed(applied, item.log, charged)
  return {
    chargedMicroMyr: charged,
    ledgerEntryId: bill(applied, wallet, charged, item.description, item.apiKeyId, item.requestId),
    released: false
  }
}

const handBack = (applied: Applied, back: GrantReturn) => {
  const grant = applied.grants.get(back.grantId)
  if (grant === undefined) return
  const amount = Math.min(back.amountMicroMyr, grant.amountMicroMyr)
  const wallet = walletOf(applied, back.accountId)
  grant.amountMicroMyr -= amount
  grant.changed = true
  wallet.grantedMicroMyr -= amount
  wallet.availableMicroMyr += amount
}

/** One statement per table for the rows the batch changed; grants closed and empty are deleted. */
const writeRows = (sql: SqlClient.SqlClient, batch: Batch, locked: Locked) =>
  Effect.gen(function*() {
    const changedReservations = [...locked.reservations.values()].filter((r) => r.changed)
    if (changedReservations.length > 0) {
      yield* sql`
        UPDATE reservations r
        SET status = v.status, captured_micro_myr = v.captured, settled_at = COALESCE(r.settled_at, ${batch.at})
        FROM unnest(${changedReservations.map((r) => r.id)}::text[], ${changedReservations.map((r) => r.status)}::text[],
                    ${changedReservations.map((r) => r.capturedMicroMyr)}::bigint[]) AS v(id, status, captured)
        WHERE r.id = v.id
      `
    }
    const changedWallets = [...locked.wallets.values()].filter((w) => w.changed)
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
    const changedGrants = [...locked.grants.values()].filter((g) => g.changed)
    if (changedGrants.length > 0) {
      yield* sql`
        UPDATE credit_grants g SET amount_micro_myr = v.amount, updated_at = ${batch.at}
        FROM unnest(${changedGrants.map((g) => g.id)}::text[], ${changedGrants.map((g) => g.amountMicroMyr)}::bigint[]) AS v(id, amount)
        WHERE g.id = v.id
      `
    }
    const emptied = batch.close.filter((id) => locked.grants.get(id)?.amountMicroMyr === 0)
    if (emptied.length > 0) yield* sql`DELETE FROM credit_grants WHERE id = ANY(${emptied}::text[])`
  })

const writeEntries = (sql: SqlClient.SqlClient, at: Date, entries: ReadonlyArray<Entry>) =>
  entries.length === 0 ? Effect.void : Effect.asVoid(sql`
    INSERT INTO ledger_entries
      (id, account_id, type, amount_micro_myr, balance_after_micro_myr, description, api_key_id, request_id, created_at)
    SELECT v.id, v.account_id, 'usage', v.amount, v.balance_after, v.description, v.api_key_id, v.request_id, ${at}
    FROM unnest(${entries.map((e) => e.id)}::text[], ${entries.map((e) => e.accountId)}::text[],
                ${entries.map((e) => e.amountMicroMyr)}::bigint[], ${entries.map((e) => e.balanceAfterMicroMyr)}::bigint[],
                ${entries.map((e) => e.description)}::text[], ${entries.map((e) => e.apiKeyId)}::text[],
                ${entries.map((e) => e.requestId)}::text[])
      WITH ORDINALITY AS v(id, account_id, amount, balance_after, description, api_key_id, request_id, n)
    ORDER BY v.n
  `)

/** The outcomes, a repeated capture answering with the entry its first capture posted. */
const withRepeatedEntries = (sql: SqlClient.SqlClient, applied: Applied) =>
  Effect.gen(function*() {
    if (applied.repeated.size === 0) return applied.outcomes
    const posted = new Map<string, string>()
    const rows = yield* sql<{ id: string; requestId: string }>`
      SELECT id, request_id FROM ledger_entries WHERE type = 'usage' AND request_id = ANY(${[...applied.repeated.values()]}::text[])
    `
    for (const row of rows) posted.set(row.requestId, row.id)
    return applied.outcomes.map((outcome, index) => {
      const requestId = applied.repeated.get(index)
      return requestId === undefined ? outcome : { ...outcome, ledgerEntryId: posted.get(requestId) ?? null }
    })
  })
