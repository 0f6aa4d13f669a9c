import type { OpenLog } from "../Logs/RequestLogs.js"
import type { Grant } from "./Grants/Grants.js"
import type { Reservation } from "./Reserve.js"

/** Where a call's money is held. */
export type HoldSource =
  /** In memory, from this instance's credit grant for the account. */
  | { readonly _tag: "Grant"; readonly grant: Grant }
  /** A reservation row of its own. */
  | { readonly _tag: "Reservation"; readonly reservation: Reservation }
  /** Nothing to hold: a test key, or a model priced at nothing. */
  | { readonly _tag: "None" }

/** A call admitted: its log and what it holds. */
export interface CallHold {
  readonly log: OpenLog
  readonly startedAt: Date
  readonly amountMicroMyr: number
  readonly source: HoldSource
  /**
   * This process's fence epoch when the hold was taken (`Instances/Fence.ts`): if its
   * beat lapsed since, another instance may have taken the hold back, and the
   * call pays before it answers.
   */
  readonly epoch: number
}

/** The reservation the call's log row names, when it holds one. */
export const reservationIdOf = (hold: CallHold): string | null =>
  hold.source._tag === "Reservation" ? hold.source.reservation.id : null
