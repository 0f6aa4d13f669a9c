import type { LogWrite } from "../../Logs/RequestLogs.js"
import type { StoredWrite } from "../../Responses/Store.js"
import type { Grant } from "../Grants/Grants.js"

/** What a settlement batch carries and answers (`Settle.ts` writes it; `SettleRows.ts` holds its statements). */

/** What a call without a reservation of its own is charged: at most `amount`, one `usage` entry for its request. */
export interface Charge {
  readonly accountId: string
  readonly apiKeyId: string
  readonly requestId: string
  readonly amountMicroMyr: number
  readonly description: string
  readonly log?: LogWrite | undefined
}

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
  | ({ readonly _tag: "GrantCharge"; readonly grantId: string } & Charge)
  /** Bills a call whose hold went back to its wallet (a parked grant charge, replayed): from what the wallet holds. */
  | ({ readonly _tag: "LateCharge" } & Charge)

/** Part of a grant handed back to its wallet. */
export interface GrantReturn {
  readonly grantId: string
  readonly accountId: string
  readonly amountMicroMyr: number
}

/**
 * A hand-back as the queue writes it: numbered, in the order taken, so that
 * one retried after a commit whose answer was lost is recognised (the grant
 * row keeps the last number written) and hands nothing back twice.
 */
export interface NumberedReturn extends GrantReturn {
  /** Absent: its writer makes sure it is written once (a parked charge's, by its parked row). */
  readonly seq?: number | undefined
}

/** What a key's calls hold of this process's grants (`key_grant_holds`): 0 deletes the row. */
export interface KeyHold {
  readonly apiKeyId: string
  readonly amountMicroMyr: number
}

export interface Batch {
  readonly items: ReadonlyArray<SettleItem>
  /** In the order they were numbered. */
  readonly returns: ReadonlyArray<NumberedReturn>
  /** Rows of calls that move no money: still running, test keys, refusals, failures on a grant. */
  readonly logs: ReadonlyArray<LogWrite>
  /** Responses stored with their calls (`store`), written in the same transaction. */
  readonly stored?: ReadonlyArray<StoredWrite> | undefined
  /** Grants to delete once empty (idle, or this instance stopping). */
  readonly close: ReadonlyArray<string>
  /** The batch's time: its ledger entries' `created_at`. */
  readonly at: Date
  /** This process: the rows' holder. */
  readonly holder: string
  /** For keys with a limit set since their calls took grants: what those calls hold now. */
  readonly keyHolds?: ReadonlyArray<KeyHold> | undefined
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

/** One settlement waiting for the flush: money to move, a log row, or both. */
export interface Queued {
  readonly item?: SettleItem | undefined
  readonly log?: LogWrite | undefined
  /** What a grant charge moved to the grant's `pending`. */
  readonly grant?: { readonly grant: Grant; readonly amount: number; readonly apiKeyId: string } | undefined
  /** The call's stored response (`store`): written with its settlement. */
  readonly stored?: StoredWrite | undefined
}
