import type { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import type { Batch, ItemOutcome } from "./SettleBatch.js"

// Hand-cast SQL (docs/performance.md, "Hand-cast SQL on the call path"): every settlement flush.

/**
 * The rows a settlement batch moves (`Settle.ts` applies the rules to them in
 * memory): locked in one order — reservations, wallets, grants, each by id —
 * as every other movement takes them, then written with one statement per table.
 */

export interface ReservationRow {
  readonly id: string
  readonly accountId: string
  readonly apiKeyId: string
  readonly requestId: string
  readonly amountMicroMyr: number
  status: "open" | "captured" | "released"
  capturedMicroMyr: number | null
  changed?: boolean
}

export interface WalletRow {
  readonly accountId: string
  availableMicroMyr: number
  reservedMicroMyr: number
  grantedMicroMyr: number
  lifetimeSpendMicroMyr: number
  /** The developer's low-balance threshold (`LowBalance.ts`); null: none. */
  readonly lowBalanceThresholdMicroMyr: number | null
  /** Auto top-up's threshold while it is on; null: off. */
  readonly autoTopupThresholdMicroMyr: number | null
  readonly autoTopupAmountSen: number | null
  readonly autoTopupMaxPerDay: number
  changed?: boolean
}

export interface GrantRow {
  readonly id: string
  amountMicroMyr: number
  /** The last hand-back written (`NumberedReturn.seq`): one numbered no higher was written already. */
  returnedSeq: number
  changed?: boolean
}

/** A call's `usage` entry already posted: a charge retried after its commit is recognised by it. */
export interface Posted {
  readonly id: string
  readonly chargedMicroMyr: number
}

export interface Entry {
  readonly id: string
  readonly accountId: string
  readonly amountMicroMyr: number
  readonly balanceAfterMicroMyr: number
  readonly description: string
  readonly apiKeyId: string
  readonly requestId: string
}

export interface Locked {
  readonly reservations: Map<string, ReservationRow>
  readonly wallets: Map<string, WalletRow>
  readonly grants: Map<string, GrantRow>
  readonly missingGrants: ReadonlySet<string>
  /** The `usage` entries of the batch's charges' calls, by request id (read under the wallets' locks). */
  readonly posted: Map<string, Posted>
}

const unique = (values: Iterable<string>) => [...new Set(values)].sort()

/** The calls a batch charges without a reservation: a grant charge, or one replayed from the wallet. */
const chargesOf = (batch: Batch) =>
  batch.items.flatMap((i) => i._tag === "GrantCharge" || i._tag === "LateCharge" ? [i] : [])

export const lockRows = (sql: SqlClient.SqlClient, batch: Batch) =>
  Effect.gen(function*() {
    const charges = chargesOf(batch)
    const reservationIds = unique(
      batch.items.flatMap((i) => i._tag === "Capture" || i._tag === "Release" ? [i.reservationId] : [])
    )
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
      ...charges.map((c) => c.accountId),
      ...batch.returns.map((r) => r.accountId)
    ])
    const wallets = new Map<string, WalletRow>()
    if (accountIds.length > 0) {
      const rows = yield* sql<WalletRow>`
        SELECT account_id, available_micro_myr, reserved_micro_myr, granted_micro_myr, lifetime_spend_micro_myr,
               low_balance_threshold_micro_myr,
               CASE WHEN auto_topup_enabled THEN auto_topup_threshold_micro_myr END AS auto_topup_threshold_micro_myr,
               auto_topup_amount_sen, auto_topup_max_per_day
        FROM wallets WHERE account_id = ANY(${accountIds}::text[]) ORDER BY account_id FOR UPDATE
      `
      for (const row of rows) wallets.set(row.accountId, { ...row })
    }
    const grantIds = unique([
      ...charges.flatMap((c) => c._tag === "GrantCharge" ? [c.grantId] : []),
      ...batch.returns.map((r) => r.grantId),
      ...batch.close
    ])
    const grants = new Map<string, GrantRow>()
    if (grantIds.length > 0) {
      const rows = yield* sql<GrantRow>`
        SELECT id, amount_micro_myr, returned_seq FROM credit_grants WHERE id = ANY(${grantIds}::text[]) ORDER BY id FOR UPDATE
      `
      for (const row of rows) grants.set(row.id, { ...row })
    }
    const missingGrants = new Set(grantIds.filter((id) => !grants.has(id)))
    // Under the wallets' locks: an entry a twin of this batch committed is visible here.
    const posted = new Map<string, Posted>()
    if (charges.length > 0) {
      const rows = yield* sql<{ id: string; requestId: string; chargedMicroMyr: number }>`
        SELECT id, request_id, -amount_micro_myr AS charged_micro_myr FROM ledger_entries
        WHERE type = 'usage' AND request_id = ANY(${unique(charges.map((c) => c.requestId))}::text[])
      `
      for (const row of rows) posted.set(row.requestId, { id: row.id, chargedMicroMyr: row.chargedMicroMyr })
    }
    return { reservations, wallets, grants, missingGrants, posted } satisfies Locked
  })

/** One statement per table for the rows the batch changed; grants closed and empty are deleted. */
export const writeRows = (sql: SqlClient.SqlClient, batch: Batch, locked: Locked) =>
  Effect.gen(function*() {
    const changedReservations = [...locked.reservations.values()].filter((r) => r.changed)
    if (changedReservations.length > 0) {
      yield* sql`
        UPDATE reservations r
        SET status = v.status, captured_micro_myr = v.captured, settled_at = COALESCE(r.settled_at, ${batch.at})
        FROM unnest(${changedReservations.map((r) => r.id)}::text[], ${
        changedReservations.map((r) => r.status)
      }::text[],
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
        FROM unnest(${changedWallets.map((w) => w.accountId)}::text[], ${
        changedWallets.map((w) => w.availableMicroMyr)
      }::bigint[],
                    ${changedWallets.map((w) => w.reservedMicroMyr)}::bigint[], ${
        changedWallets.map((w) => w.grantedMicroMyr)
      }::bigint[],
                    ${
        changedWallets.map((w) => w.lifetimeSpendMicroMyr)
      }::bigint[]) AS v(account_id, available, reserved, granted, spent)
        WHERE w.account_id = v.account_id
      `
    }
    const changedGrants = [...locked.grants.values()].filter((g) => g.changed)
    if (changedGrants.length > 0) {
      yield* sql`
        UPDATE credit_grants g SET amount_micro_myr = v.amount, returned_seq = v.returned_seq, updated_at = ${batch.at}
        FROM unnest(${changedGrants.map((g) => g.id)}::text[], ${changedGrants.map((g) => g.amountMicroMyr)}::bigint[],
                    ${changedGrants.map((g) => g.returnedSeq)}::bigint[]) AS v(id, amount, returned_seq)
        WHERE g.id = v.id
      `
    }
    const emptied = batch.close.filter((id) => locked.grants.get(id)?.amountMicroMyr === 0)
    if (emptied.length > 0) yield* sql`DELETE FROM credit_grants WHERE id = ANY(${emptied}::text[])`
  })

export const writeEntries = (sql: SqlClient.SqlClient, at: Date, entries: ReadonlyArray<Entry>) =>
  entries.length === 0 ? Effect.void : Effect.asVoid(sql`
    INSERT INTO ledger_entries
      (id, account_id, type, amount_micro_myr, balance_after_micro_myr, description, api_key_id, request_id, created_at)
    SELECT v.id, v.account_id, 'usage', v.amount, v.balance_after, v.description, v.api_key_id, v.request_id, ${at}
    FROM unnest(${entries.map((e) => e.id)}::text[], ${entries.map((e) => e.accountId)}::text[],
                ${entries.map((e) => e.amountMicroMyr)}::bigint[], ${
    entries.map((e) => e.balanceAfterMicroMyr)
  }::bigint[],
                ${entries.map((e) => e.description)}::text[], ${entries.map((e) => e.apiKeyId)}::text[],
                ${entries.map((e) => e.requestId)}::text[])
      WITH ORDINALITY AS v(id, account_id, amount, balance_after, description, api_key_id, request_id, n)
    ORDER BY v.n
  `)

/** The outcomes, a repeated capture (by item index: its call's request id) answering with the entry its first capture posted. */
export const withRepeatedEntries = (
  sql: SqlClient.SqlClient,
  outcomes: ReadonlyArray<ItemOutcome>,
  repeated: ReadonlyMap<number, string>
) =>
  Effect.gen(function*() {
    if (repeated.size === 0) return outcomes
    const posted = new Map<string, string>()
    const rows = yield* sql<{ id: string; requestId: string }>`
      SELECT id, request_id FROM ledger_entries WHERE type = 'usage' AND request_id = ANY(${[
      ...repeated.values()
    ]}::text[])
    `
    for (const row of rows) posted.set(row.requestId, row.id)
    return outcomes.map((outcome, index) => {
      const requestId = repeated.get(index)
      return requestId === undefined ? outcome : { ...outcome, ledgerEntryId: posted.get(requestId) ?? null }
    })
  })

/** This process's rows of `key_grant_holds` the batch changes: an amount, or none (deleted). */
export const writeKeyHolds = (sql: SqlClient.SqlClient, batch: Batch) =>
  Effect.gen(function*() {
    const holds = batch.keyHolds ?? []
    if (holds.length === 0) return
    const held = holds.filter((hold) => hold.amountMicroMyr > 0)
    const gone = holds.filter((hold) => hold.amountMicroMyr === 0).map((hold) => hold.apiKeyId)
    if (held.length > 0) {
      yield* sql`
        INSERT INTO key_grant_holds (holder, api_key_id, amount_micro_myr, updated_at)
        SELECT ${batch.holder}, v.api_key_id, v.amount, ${batch.at}
        FROM unnest(${held.map((hold) => hold.apiKeyId)}::text[], ${
        held.map((hold) => hold.amountMicroMyr)
      }::bigint[]) AS v(api_key_id, amount)
        ON CONFLICT (api_key_id, holder) DO UPDATE SET amount_micro_myr = EXCLUDED.amount_micro_myr, updated_at = EXCLUDED.updated_at
      `
    }
    if (gone.length > 0) {
      yield* sql`DELETE FROM key_grant_holds WHERE holder = ${batch.holder} AND api_key_id = ANY(${gone}::text[])`
    }
  })
