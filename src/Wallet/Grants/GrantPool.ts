import type { Scope } from "effect"
import { Deferred, Effect, Exit, FiberId, Option, Runtime } from "effect"
import { Listener } from "../../Database/Listener.js"
import { newId } from "../../Domain/Ids.js"
import { type FenceView, ReservationLeases } from "../Instances/Leases.js"
import { WalletRepo } from "../Repo.js"
import type { ReserveInput } from "../Reserve.js"
import type { GrantReturn, KeyHold } from "../Settlement/SettleBatch.js"
import { isLimited } from "../SpendLimits.js"
import { GRANT_CHANNEL, type GrantToGrow, KEY_LIMIT_CHANNEL } from "./GrantRows.js"
import type { Grant, Pace } from "./Grants.js"
import { grantGrowth, newGrant, newPace, notePace, wantsGrant } from "./Grants.js"

/** A grant no call has reserved from for this long is handed back. */
const GRANT_IDLE_MS = 5000
/** After a request to hand grants back (a call was refused), no grant for the account for this long. */
const GRANT_COOLDOWN_MS = 10_000
/** An account that has not called for this long (and holds no grant) has its pace forgotten... */
const PACE_FORGOTTEN_AFTER_MS = 60_000
/** ... looked for at most this often. */
const PACE_SWEEP_EVERY_MS = 5000

/** What the next flush writes for the grants: parts handed back, and grants to delete once empty. */
export interface HandBacks {
  readonly returns: ReadonlyArray<GrantReturn>
  readonly close: ReadonlyArray<Grant>
}

/**
 * The credit grants this instance lends to calls in memory (docs/money.md, "Credit grants"),
 * one per account that calls often, and the pace of each account's calls that
 * sizes them. A grant grows in the background (`WalletRepo.growGrant`); the
 * settlement queue writes what its calls were charged and hands it back when
 * it idles, when another instance asks (`GRANT_CHANNEL`), and at shutdown.
 */
export interface GrantPool {
  /**
   * Counts the call into its account's pace. For a call under no monthly limit (one under its key's or its
   * member's is counted in the database, call by call: `isLimited`), starts growing
   * the account's grant when its pace asks, and lends the call's amount from it
   * when it holds enough; undefined when the call must reserve.
   */
  readonly lend: (input: ReserveInput, now: number) => Grant | undefined
  /**
   * The end of a growth of the account's grant under way (undefined: none). A call its grant could not cover
   * waits for it and asks `lendAgain`, rather than reserving on the wallet's row while the growth holds it.
   */
  readonly growth: (accountId: string) => Effect.Effect<void> | undefined
  /** `lend` for a call already counted into its account's pace. */
  readonly lendAgain: (input: ReserveInput, now: number) => Grant | undefined
  /** A call of `apiKeyId` on `grant` settled: `charged` waits for the flush, the rest of `held` is lent again. */
  readonly charge: (grant: Grant, held: number, charged: number, apiKeyId: string) => void
  /** A call of `apiKeyId` on `grant` failed: all it held is lent again. */
  readonly giveBack: (grant: Grant, held: number, apiKeyId: string) => void
  /**
   * A monthly limit was set on the keys (a key's own, or its member's on each of its keys): their calls lend no more,
   * the account's grant is handed back, and from the next flush on `key_grant_holds` says what each key's calls hold
   * of this instance's grants until nothing is left.
   */
  readonly report: (accountId: string, apiKeyIds: ReadonlyArray<string>, now: number) => void
  /** What each reported key's calls will hold of grants once `entries` (a batch's) are written, where it changed. */
  readonly keyHoldsAfter: (
    entries: ReadonlyArray<{ readonly grant?: { readonly amount: number; readonly apiKeyId: string } | undefined }>
  ) => ReadonlyArray<KeyHold>
  /** Someone (another instance, a debit, a call refused here) needs the account's grant: hand it back, take none for a while. */
  readonly handBack: (accountId: string, now: number) => void
  /** Whether this instance holds a grant for the account. */
  readonly holds: (accountId: string) => boolean
  /** What calls in flight hold of the account's grant. */
  readonly inFlight: (accountId: string) => number
  /** What grants hold that no call holds yet, all accounts together. */
  readonly unlent: () => number
  /** What to hand back now: grants asked for, idle ones, and all of them when stopping. */
  readonly takeHandBacks: (now: number) => HandBacks
  /** A flush wrote `amount` of `grant`'s charges to a call of `apiKeyId`. */
  readonly chargeWritten: (grant: Grant, amount: number, apiKeyId: string) => void
  /**
   * A flush written: empty closed grants are gone, and so are those the
   * sweeper returned (`missing`); `keyHolds` are what it wrote of the reported keys.
   */
  readonly written: (
    close: ReadonlyArray<Grant>,
    missing: ReadonlySet<string>,
    keyHolds?: ReadonlyArray<KeyHold>
  ) => Effect.Effect<void>
  /** No more growth; every grant closes. Waits (briefly) for growths still committing, which would leave a grant behind. */
  readonly stop: Effect.Effect<void>
}

/** The pool's state, and what it needs to grow grants. */
interface Pool {
  readonly grants: Map<string, Grant>
  /** What each key's calls hold of grants: in flight, and charged but not yet written. */
  readonly keyHolds: Map<string, number>
  /** Keys a limit (theirs or their member's) was set on, whose holds go to `key_grant_holds`: the amount last written there. */
  readonly reported: Map<string, number>
  /** Each account's growth under way, done when it ends. */
  readonly growths: Map<string, Deferred.Deferred<void>>
  readonly paces: Map<string, Pace>
  readonly wallets: WalletRepo["Type"]
  readonly nowMs: Effect.Effect<number>
  /** The same clock, for what runs outside a fiber (an announcement heard). */
  readonly now: () => number
  readonly fork: (effect: Effect.Effect<void>) => void
  /** Whether the pool may lend from its grants now (`mayLend`). */
  readonly listening: () => boolean
  /** This process's own heartbeat: grants are lent only while it is fresh. */
  readonly fence: FenceView
  /** The fence's epoch the grants were lent in: after a lapse they may have been taken back. */
  epoch: number
  stopping: boolean
  lastPaceSweep: number
}

/**
 * The pool, listening for other instances' requests to hand grants back
 * through the instance's `Listener` (on PostgreSQL). Without a listener (a
 * test's one instance) it lends while its beat is fresh.
 */
export const makeGrantPool: Effect.Effect<GrantPool, never, Scope.Scope | WalletRepo | ReservationLeases> = Effect.gen(
  function*() {
    const runtime = yield* Effect.runtime<never>()
    const clock = yield* Effect.clock
    const listener = yield* Effect.serviceOption(Listener)
    const { fence } = yield* ReservationLeases
    const pool: Pool = {
      grants: new Map(),
      keyHolds: new Map(),
      reported: new Map(),
      growths: new Map(),
      paces: new Map(),
      wallets: yield* WalletRepo,
      nowMs: clock.currentTimeMillis,
      now: () => clock.unsafeCurrentTimeMillis(),
      fork: (effect) => void Runtime.runFork(runtime)(effect),
      listening: Option.match(listener, { onNone: () => () => true, onSome: (heard) => heard.hearing }),
      fence,
      epoch: fence.epoch(),
      stopping: false,
      lastPaceSweep: 0
    }
    if (Option.isSome(listener)) yield* listen(pool, listener.value)
    return {
      lend: (input, now) => lend(pool, input, now, true),
      growth: (accountId) => {
        const growing = pool.growths.get(accountId)
        return growing === undefined ? undefined : Deferred.await(growing)
      },
      lendAgain: (input, now) => lend(pool, input, now, false),
      charge: (grant, held, charged, apiKeyId) => {
        charge(grant, held, charged)
        addKeyHold(pool, apiKeyId, charged - held)
      },
      giveBack: (grant, held, apiKeyId) => {
        giveBack(grant, held)
        addKeyHold(pool, apiKeyId, -held)
      },
      report: (accountId, apiKeyIds, now) => report(pool, accountId, apiKeyIds, now),
      keyHoldsAfter: (entries) => keyHoldsAfter(pool, entries),
      handBack: (accountId, now) => handBack(pool, accountId, now),
      holds: (accountId) => pool.grants.has(accountId),
      inFlight: (accountId) => pool.grants.get(accountId)?.inFlight ?? 0,
      unlent: () => [...pool.grants.values()].reduce((sum, grant) => sum + grant.remaining, 0),
      takeHandBacks: (now) => takeHandBacks(pool, now),
      chargeWritten: (grant, amount, apiKeyId) => {
        grant.pending -= amount
        addKeyHold(pool, apiKeyId, -amount)
      },
      written: (close, missing, keyHolds) => written(pool, close, missing, keyHolds ?? []),
      stop: stop(pool)
    }
  }
)

/**
 * Another instance's request for the account's grants is heard on
 * `GRANT_CHANNEL`. On every (re)connection of the listener, requests may have
 * been missed: every grant is handed back, and none lends again (a new grant
 * may grow once asked for).
 */
const listen = Effect.fnUntraced(function*(pool: Pool, listener: Listener["Type"]) {
  yield* listener.on(GRANT_CHANNEL, (accountId) => handBack(pool, accountId, pool.now()))
  yield* listener.on(KEY_LIMIT_CHANNEL, (payload) => {
    const [accountId = "", ...apiKeyIds] = payload.split(" ")
    report(pool, accountId, apiKeyIds, pool.now())
  })
  yield* listener.onHeardAgain(() => handBackAll(pool))
})

const paceOf = (pool: Pool, accountId: string, now: number): Pace => {
  let pace = pool.paces.get(accountId)
  if (pace === undefined) {
    pace = newPace(now)
    pool.paces.set(accountId, pace)
  }
  return pace
}

/**
 * This instance's own heartbeat is fresh (docs/money.md, "Faults"): no other
 * instance can have judged it dead and taken its grants back.
 */
const beatFresh = (pool: Pool): boolean => pool.fence.fresh()

/**
 * Whether the pool may lend (or grow) grants now; every condition of lending is here:
 * it hears the other instances' requests for its grants (and a debit's), and its own beat is fresh.
 */
const mayLend = (pool: Pool): boolean => pool.listening() && beatFresh(pool)

/** After a lapse of this instance's beat, another's sweeper may have returned its grants: none lends again; each is handed back. */
const closeAfterLapse = (pool: Pool) => {
  const epoch = pool.fence.epoch()
  if (epoch === pool.epoch) return
  pool.epoch = epoch
  for (const grant of pool.grants.values()) grant.closing = true
}

const lend = (pool: Pool, input: ReserveInput, now: number, count: boolean): Grant | undefined => {
  const pace = paceOf(pool, input.accountId, now)
  if (count) notePace(pace, input.amountMicroMyr, now)
  // Deaf, or stale, a request for the grant would go unheard or a sweeper may have taken it: no lending, and no growing.
  if (isLimited(input) || pool.reported.has(input.apiKeyId) || !mayLend(pool)) return undefined
  closeAfterLapse(pool)
  const grant = pool.grants.get(input.accountId)
  if (!pool.stopping && wantsGrant(pace, grant, now)) startGrowing(pool, input.accountId, pace, now)
  if (grant === undefined || grant.closing || grant.remaining < input.amountMicroMyr) return undefined
  grant.remaining -= input.amountMicroMyr
  grant.inFlight += input.amountMicroMyr
  grant.lastHoldAt = now
  addKeyHold(pool, input.apiKeyId, input.amountMicroMyr)
  return grant
}

const addKeyHold = (pool: Pool, apiKeyId: string, amount: number) => {
  const held = (pool.keyHolds.get(apiKeyId) ?? 0) + amount
  if (held > 0) pool.keyHolds.set(apiKeyId, held)
  else pool.keyHolds.delete(apiKeyId)
}

const report = (pool: Pool, accountId: string, apiKeyIds: ReadonlyArray<string>, now: number) => {
  // -1: nothing written yet, so the next flush writes the key's holds even when they are none.
  for (const apiKeyId of apiKeyIds) if (apiKeyId !== "" && !pool.reported.has(apiKeyId)) pool.reported.set(apiKeyId, -1)
  handBack(pool, accountId, now)
}

const keyHoldsAfter = (
  pool: Pool,
  entries: ReadonlyArray<{ readonly grant?: { readonly amount: number; readonly apiKeyId: string } | undefined }>
): ReadonlyArray<KeyHold> => {
  if (pool.reported.size === 0) return []
  const writing = new Map<string, number>()
  for (const { grant } of entries) {
    if (grant !== undefined) writing.set(grant.apiKeyId, (writing.get(grant.apiKeyId) ?? 0) + grant.amount)
  }
  const holds: Array<KeyHold> = []
  for (const [apiKeyId, last] of pool.reported) {
    const amountMicroMyr = Math.max((pool.keyHolds.get(apiKeyId) ?? 0) - (writing.get(apiKeyId) ?? 0), 0)
    if (amountMicroMyr !== last) holds.push({ apiKeyId, amountMicroMyr })
  }
  return holds
}

const charge = (grant: Grant, held: number, charged: number) => {
  grant.inFlight -= held
  grant.remaining += held - charged
  grant.pending += charged
}

const giveBack = (grant: Grant, held: number) => {
  grant.inFlight -= held
  grant.remaining += held
}

const handBack = (pool: Pool, accountId: string, now: number) => {
  paceOf(pool, accountId, now).noGrantUntil = now + GRANT_COOLDOWN_MS
  const grant = pool.grants.get(accountId)
  if (grant !== undefined) {
    grant.closing = true
    grant.asked = true
  }
}

/** Requests may have gone unheard: every grant closes, what it has not lent goes back with the next flush. */
const handBackAll = (pool: Pool) => {
  for (const grant of pool.grants.values()) {
    grant.closing = true
    grant.asked = true
  }
}

/** Forgets `grant` unless a newer grant for its account took its place. */
const forget = (pool: Pool, grant: Grant) => {
  if (pool.grants.get(grant.accountId) === grant) pool.grants.delete(grant.accountId)
}

/** Starts growing the account's grant in the background, creating it first when there is none. */
const startGrowing = (pool: Pool, accountId: string, pace: Pace, now: number) => {
  let grant = pool.grants.get(accountId)
  if (grant === undefined) {
    grant = newGrant(newId("gr"), accountId, now)
    pool.grants.set(accountId, grant)
  }
  grant.growing = true
  const done = Deferred.unsafeMake<void>(FiberId.none)
  pool.growths.set(accountId, done)
  pool.fork(Effect.ensuring(
    grow(pool, grant, pace),
    Effect.sync(() => {
      if (pool.growths.get(accountId) === done) pool.growths.delete(accountId)
      Deferred.unsafeDone(done, Exit.void)
    })
  ))
}

/** Grows `grant` (marked growing by the caller) by what the wallet affords at the account's pace. */
const grow = Effect.fnUntraced(function*(pool: Pool, grant: Grant, pace: Pace) {
  const row: GrantToGrow = { id: grant.id, accountId: grant.accountId, create: !grant.stored }
  const result = yield* pool.wallets.growGrant(row, (wallet) =>
    grantGrowth({
      spendPerSecond: pace.spendPerSecond,
      estimate: pace.lastEstimate,
      remaining: grant.remaining,
      heldMicroMyr: wallet.heldMicroMyr,
      availableMicroMyr: wallet.availableMicroMyr
    }))
  if (result === "missing") {
    forget(pool, grant)
  } else if (result > 0) {
    grant.stored = true
    grant.remaining += result
  } else {
    // The wallet is low: calls reserve one by one for a while.
    pace.noGrantUntil = (yield* pool.nowMs) + 1000
    if (!grant.stored) forget(pool, grant)
  }
}, (effect, pool, grant) =>
  effect.pipe(
    Effect.catchAllCause((cause) =>
      Effect.zipRight(
        Effect.sync(() => {
          if (!grant.stored) forget(pool, grant)
        }),
        Effect.logWarning("growing a credit grant failed", cause)
      )
    ),
    Effect.ensuring(Effect.sync(() => void (grant.growing = false)))
  ))

/** Forgets the pace of accounts that have not called for a minute (and hold no grant). */
const forgetQuietAccounts = (pool: Pool, now: number) => {
  if (now - pool.lastPaceSweep < PACE_SWEEP_EVERY_MS) return
  pool.lastPaceSweep = now
  for (const [accountId, pace] of pool.paces) {
    if (now - pace.windowStart > PACE_FORGOTTEN_AFTER_MS && !pool.grants.has(accountId)) pool.paces.delete(accountId)
  }
}

const takeHandBacks = (pool: Pool, now: number): HandBacks => {
  forgetQuietAccounts(pool, now)
  closeAfterLapse(pool)
  const returns: Array<GrantReturn> = []
  const close: Array<Grant> = []
  for (const grant of pool.grants.values()) {
    if (!grant.stored) continue
    const idle = now - grant.lastHoldAt >= GRANT_IDLE_MS
    if (pool.stopping || idle) grant.closing = true
    if (!grant.closing) continue
    // Even 0 when asked: the row's updated_at tells the waiting instance this one answered.
    if (grant.remaining > 0 || grant.asked) {
      returns.push({ grantId: grant.id, accountId: grant.accountId, amountMicroMyr: grant.remaining })
      grant.remaining = 0
      grant.asked = false
    }
    if (grant.inFlight === 0) close.push(grant)
  }
  return { returns, close }
}

const written = Effect.fnUntraced(
  function*(pool: Pool, close: ReadonlyArray<Grant>, missing: ReadonlySet<string>, keyHolds: ReadonlyArray<KeyHold>) {
    for (const { amountMicroMyr, apiKeyId } of keyHolds) {
      // Nothing left, in the table or here: the key is no longer reported.
      if (amountMicroMyr === 0 && !pool.keyHolds.has(apiKeyId)) pool.reported.delete(apiKeyId)
      else if (pool.reported.has(apiKeyId)) pool.reported.set(apiKeyId, amountMicroMyr)
    }
    for (const grant of close) {
      if (grant.inFlight === 0 && grant.pending === 0 && grant.remaining === 0) forget(pool, grant)
    }
    for (const grant of [...pool.grants.values()]) {
      if (!missing.has(grant.id)) continue
      // The sweeper returned it (this process looked dead): calls on it were billed late; take no more from it.
      pool.grants.delete(grant.accountId)
      yield* Effect.logWarning("a credit grant was returned by another instance's sweeper").pipe(
        Effect.annotateLogs({ grantId: grant.id, accountId: grant.accountId })
      )
    }
  }
)

const stop = Effect.fnUntraced(function*(pool: Pool) {
  pool.stopping = true
  const growing = () => [...pool.grants.values()].some((grant) => grant.growing)
  for (let waits = 0; waits < 100 && growing(); waits++) yield* Effect.sleep("10 millis")
})
