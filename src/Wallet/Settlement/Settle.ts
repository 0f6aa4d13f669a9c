import { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Effect } from "effect"
import { newId } from "../../Domain/Ids.js"
import { RequestLogs } from "../../Logs/RequestLogs.js"
import type { LogWrite } from "../../Logs/RequestLogs.js"
import { writeStored } from "../../Responses/Store.js"
import { queueAutoTopups } from "../AutoTopupAttempts.js"
import { announceCrossings, balancesBefore } from "../LowBalance.js"
import type { Batch, BatchOutcome, Charge, ItemOutcome, NumberedReturn, SettleItem } from "./SettleBatch.js"
import type { Entry, GrantRow, Locked, WalletRow } from "./SettleRows.js"
import { lockRows, withRepeatedEntries, writeEntries, writeKeyHolds, writeRows } from "./SettleRows.js"

/**
 * Settlement in batches (docs/money.md, "Batched settlement"): every capture, release and charge
 * against a credit grant, the grants returned, their ledger entries and the
 * calls' log rows, written in one transaction with one statement per table.
 * Locks are taken in one order — reservations, wallets, grants, each by id —
 * as every other movement takes them. A single movement (the sweeper's
 * release, a test's capture) is a batch of one: there is one copy of the rules.
 * The rows' locks and statements are in `SettleRows.ts`.
 */

const nothing: ItemOutcome = { chargedMicroMyr: 0, ledgerEntryId: null, released: false }

/**
 * Runs `batch` in one transaction; the caller retries the whole batch when it
 * fails. Every item is safe to write again after a commit whose answer was
 * lost: a capture finds its reservation captured, a release finds it
 * released, a charge finds its call's `usage` entry, a hand-back its number,
 * and log rows only move forward.
 */
export const settleBatch = (
  batch: Batch
): Effect.Effect<BatchOutcome, SqlError.SqlError, SqlClient.SqlClient | RequestLogs> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const logs = yield* RequestLogs
    return yield* sql.withTransaction(Effect.gen(function*() {
      const locked = yield* lockRows(sql, batch)
      const before = balancesBefore(locked.wallets)
      const applied = apply(batch, locked)
      yield* writeRows(sql, batch, locked)
      yield* writeEntries(sql, batch.at, applied.entries)
      yield* logs.write(applied.logRows, batch.holder)
      yield* writeKeyHolds(sql, batch)
      yield* announceCrossings(before, locked.wallets, batch.at)
      yield* queueAutoTopups(before, locked.wallets, batch.at)
      const items = yield* withRepeatedEntries(sql, applied.outcomes, applied.repeated)
      // Last: its trigger locks the account's stored-response total, which two instances' flushes share; a
      // transaction holding it waits for no other lock, so flushes on two instances cannot deadlock on it.
      yield* writeStored(sql, batch.stored ?? [])
      return { items, missingGrants: locked.missingGrants } satisfies BatchOutcome
    }))
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
        applied.outcomes.push(charge(applied, item, applied.grants.get(item.grantId)))
        break
      case "LateCharge":
        applied.outcomes.push(charge(applied, item, undefined))
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
const bill = (
  applied: Applied,
  wallet: WalletRow,
  charged: number,
  description: string,
  apiKeyId: string,
  requestId: string
) => {
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
  applied.posted.set(requestId, { id, chargedMicroMyr: charged })
  return id
}

/**
 * The capture rule: an open hold is
 * charged at most its amount and the rest returns to available; a hold already
 * released (its process looked dead) is billed late, from what the wallet
 * holds. Returns the charge; the reservation is then captured.
 */
const captureInto = (
  wallet: { availableMicroMyr: number; reservedMicroMyr: number },
  reservation: {
    status: "open" | "captured" | "released"
    readonly amountMicroMyr: number
    capturedMicroMyr: number | null
  },
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
  return {
    chargedMicroMyr: charged,
    ledgerEntryId: bill(applied, wallet, charged, item.description, r.apiKeyId, r.requestId),
    released: false
  }
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

/** A charge from `grant` (undefined: from the wallet), once per call: a retry finds the call's entry and moves nothing. */
const charge = (applied: Applied, item: Charge, grant: GrantRow | undefined): ItemOutcome => {
  const posted = applied.posted.get(item.requestId)
  if (posted !== undefined) {
    billed(applied, item.log, posted.chargedMicroMyr)
    return { chargedMicroMyr: posted.chargedMicroMyr, ledgerEntryId: posted.id, released: false }
  }
  const wallet = walletOf(applied, item.accountId)
  const asked = Math.max(item.amountMicroMyr, 0)
  const fromGrant = Math.min(asked, grant?.amountMicroMyr ?? 0)
  // A grant the sweeper returned (or none): what it no longer covers is billed late, from what the wallet holds.
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

const handBack = (applied: Applied, back: NumberedReturn) => {
  const grant = applied.grants.get(back.grantId)
  // Written already (a retry after a commit whose answer was lost): hand nothing back twice.
  if (grant === undefined || (back.seq !== undefined && back.seq <= grant.returnedSeq)) return
  if (back.seq !== undefined) grant.returnedSeq = back.seq
  const amount = Math.min(back.amountMicroMyr, grant.amountMicroMyr)
  const wallet = walletOf(applied, back.accountId)
  grant.amountMicroMyr -= amount
  grant.changed = true
  wallet.grantedMicroMyr -= amount
  wallet.availableMicroMyr += amount
}
