import { Duration } from "effect"
import { DEAD_AFTER, FRESH_FOR } from "./Instances.js"

/**
 * What this process knows of its own heartbeat (docs/money.md, "Faults"), on the
 * local monotonic clock (ms). Its holds — reservations, credit grants — are
 * safe only while no other instance can judge it dead: while its last beat is
 * fresh by the database's clock. The beat's `now()` is never earlier than the
 * moment the beat was sent, so the age counted from the send is never less
 * than the database's: a stalled beat makes the process stale, not falsely fresh.
 */
export interface Fence {
  /** When the last successful beat was sent (or the process registered). */
  lastBeatSentAt: number
  /** The database's `now()` of that beat. */
  lastBeatDbAt: Date | undefined
  /** Counts lapses: a beat that succeeded after the process was not fresh. A hold taken in an older epoch may have been taken back. */
  epoch: number
  /** When the process was fresh again after its last lapse; -Infinity when it never lapsed. */
  recoveredAt: number
  /** Its row was marked dead for good (replaced by a process with its identity): never fresh again. */
  replaced: boolean
}

const FRESH_MS = Duration.toMillis(FRESH_FOR)
const DEAD_MS = Duration.toMillis(DEAD_AFTER)

/** A fence for a process that registered (its first beat) with a statement sent at `sentAt`. */
export const newFence = (sentAt: number): Fence => ({
  lastBeatSentAt: sentAt,
  lastBeatDbAt: undefined,
  epoch: 0,
  recoveredAt: Number.NEGATIVE_INFINITY,
  replaced: false
})

/** Whether the process's last beat is under `FRESH_FOR` old at `now`: it may lend from grants and judge others. */
export const isFresh = (fence: Fence, now: number): boolean => !fence.replaced && now - fence.lastBeatSentAt < FRESH_MS

/** A beat sent at `sentAt` succeeded (answered at `receivedAt`): a lapse before it starts a new epoch. */
export const noteBeat = (fence: Fence, sentAt: number, dbAt: Date, receivedAt: number): void => {
  if (!isFresh(fence, receivedAt)) {
    fence.epoch++
    fence.recoveredAt = receivedAt
  }
  fence.lastBeatSentAt = Math.max(fence.lastBeatSentAt, sentAt)
  fence.lastBeatDbAt = dbAt
}

/** Whether a hold taken in `epoch` is still this process's at `now`: fresh all along since. */
export const holdIntact = (fence: Fence, epoch: number, now: number): boolean =>
  isFresh(fence, now) && fence.epoch === epoch

/**
 * Whether the process may declare others dead at `now`: fresh, and fresh for
 * `DEAD_AFTER` since its own last lapse — after a database stall every beat
 * is late, and a peer beats again within a beat interval.
 */
export const mayJudge = (fence: Fence, now: number): boolean =>
  isFresh(fence, now) && now - fence.recoveredAt >= DEAD_MS
