import { Effect, Layer } from "effect"
import { accountSuspended, InsufficientBalance, NEGATIVE_BALANCE_GUIDANCE, type SpendLimitExceeded } from "../../src/Domain/Errors.js"
import { newId } from "../../src/Domain/Ids.js"
import { microMyr, type MicroMyr, toMyrString } from "../../src/Domain/Money.js"
import { now } from "../../src/Domain/Time.js"
import type { InvariantReport } from "../../src/Wallet/Invariant.js"
import type {
  Capture,
  GrantSizing,
  LedgerEntryRow,
  LedgerQuery,
  LedgerType,
  PostInput,
  Reservation,
  ReserveInput,
  StoredWallet
} from "../../src/Wallet/Repo.js"
import { WalletRepo } from "../../src/Wallet/Repo.js"
import { newReservation } from "../../src/Wallet/Reserve.js"
import { captureInto } from "../../src/Wallet/Settlement/Settle.js"
import { keyLimitRefusal, memberBudgetRefusal, type MonthToDate, spentByMember } from "../../src/Wallet/SpendLimits.js"

/**
 * `WalletRepo` in memory, for tests that decide things about money without
 * PostgreSQL. The same rules as the SQL (`Repo.ts`, `Settle.ts`): every
 * movement checks and changes the wallet in one synchronous step, as the SQL
 * does under the wallet's row lock, so concurrent fibers are serialized the
 * same way; available never goes negative through a hold; a capture bills at
 * most its reservation, once; a payment's effect is posted once. The store can
 * be shared by several views (instances) and checks DESIGN.md's invariant
 * (`invariant`) as `Invariant.ts` does.
 *
 * What it does not model: leases (no reservation expires by itself), grant
 * requests between instances (a debit's request is recorded in
 * `grantRequests`, nobody listens) and keys (a key's member is the one its
 * reservations named). Calls settled by `Spending` are written by its own SQL
 * (`Settle.ts`), not through `WalletRepo`: `Spending` cannot run on this store.
 */

interface MemoryWallet {
  availableMicroMyr: number
  reservedMicroMyr: number
  grantedMicroMyr: number
  lifetimeTopupMicroMyr: number
  lifetimeSpendMicroMyr: number
  suspended: boolean
}

interface MemoryReservation extends Reservation {
  readonly holder: string
  status: "open" | "captured" | "released"
  capturedMicroMyr: number | null
}

interface MemoryGrant {
  readonly id: string
  readonly accountId: string
  readonly holder: string
  amountMicroMyr: number
  /** When its row was last written: a grant written after a request for it has answered. */
  updatedAt: Date
}

interface MemoryEntry extends LedgerEntryRow {
  readonly accountId: string
  readonly apiKeyId: string | null
  readonly requestId: string | null
  readonly effectKey: string | null
}

/** Marks a `WalletRepo` made here: the server refuses it, since its calls settle in SQL. */
export const IN_MEMORY = Symbol.for("nenas/WalletRepo/inMemory")

export const makeStore = (options: { readonly businessTimezone?: string } = {}) => {
  const timeZone = options.businessTimezone ?? "Asia/Kuala_Lumpur"
  const wallets = new Map<string, MemoryWallet>()
  const reservations = new Map<string, MemoryReservation>()
  const grants = new Map<string, MemoryGrant>()
  /** Oldest first, as `seq` orders them. */
  const entries: Array<MemoryEntry> = []
  const effectKeys = new Set<string>()
  const alive = new Set<string>()
  const grantRequests: Array<string> = []

  const walletOf = (accountId: string): MemoryWallet => {
    const wallet = wallets.get(accountId)
    if (wallet === undefined) throw new Error(`no wallet for account ${accountId}`)
    return wallet
  }
  const monthOf = (at: Date): string => {
    const parts = new Intl.DateTimeFormat("en-US", { timeZone, year: "numeric", month: "2-digit" }).formatToParts(at)
    return `${parts.find((p) => p.type === "year")?.value}-${parts.find((p) => p.type === "month")?.value}`
  }

  const store = {
    wallets: wallets as ReadonlyMap<string, Readonly<MemoryWallet>>,
    reservations: reservations as ReadonlyMap<string, Readonly<MemoryReservation>>,
    grants: grants as ReadonlyMap<string, Readonly<MemoryGrant>>,
    entries: entries as ReadonlyArray<MemoryEntry>,
    grantRequests: grantRequests as ReadonlyArray<string>,
    /** An account's empty wallet, as signing up makes it. */
    open: (accountId: string) => {
      if (!wallets.has(accountId)) {
        wallets.set(accountId, {
          availableMicroMyr: 0,
          reservedMicroMyr: 0,
          grantedMicroMyr: 0,
          lifetimeTopupMicroMyr: 0,
          lifetimeSpendMicroMyr: 0,
          suspended: false
        })
      }
    },
    /** A dispute's suspension (`accounts.suspended_at`), owned by Billing in the real service. */
    suspend: (accountId: string, suspended: boolean) => void (walletOf(accountId).suspended = suspended),
    /** The instance stops beating: other views return its grants. */
    kill: (holder: string) => void alive.delete(holder),
    alive: (holder: string) => void alive.add(holder),
    walletOf,
    /** The month (`YYYY-MM`) in `BUSINESS_TIMEZONE` of a time. */
    monthOf,
    /** DESIGN.md's ledger invariant for one account, as `checkInvariant` reads it from SQL. */
    invariant: (accountId: string): InvariantReport => {
      const wallet = walletOf(accountId)
      const own = entries.filter((e) => e.accountId === accountId)
      const sum = (values: ReadonlyArray<number>) => values.reduce((a, b) => a + b, 0)
      const ledgerSum = sum(own.map((e) => e.amountMicroMyr))
      const violations: Array<string> = []
      const expect = (what: string, actual: number, expected: number) => {
        if (actual !== expected) violations.push(`${what}: ${actual}, expected ${expected}`)
      }
      expect("available + reserved + granted", wallet.availableMicroMyr + wallet.reservedMicroMyr + wallet.grantedMicroMyr, ledgerSum)
      expect("granted", wallet.grantedMicroMyr, sum([...grants.values()].filter((g) => g.accountId === accountId).map((g) => g.amountMicroMyr)))
      expect("lifetime top-up", wallet.lifetimeTopupMicroMyr, sum(own.filter((e) => e.type === "topup").map((e) => e.amountMicroMyr)))
      expect("lifetime spend", wallet.lifetimeSpendMicroMyr, -sum(own.filter((e) => e.type === "usage").map((e) => e.amountMicroMyr)))
      expect(
        "reserved",
        wallet.reservedMicroMyr,
        sum([...reservations.values()].filter((r) => r.accountId === accountId && r.status === "open").map((r) => r.amountMicroMyr))
      )
      let running = 0
      let broken = 0
      for (const entry of own) {
        running += entry.amountMicroMyr
        if (entry.balanceAfterMicroMyr !== running) broken++
      }
      expect("entries whose balance after is not the running sum", broken, 0)
      return { accountId, availableMicroMyr: wallet.availableMicroMyr, reservedMicroMyr: wallet.reservedMicroMyr, ledgerSumMicroMyr: ledgerSum, violations }
    },
    /** Internal: appends a ledger entry whose balance after is the wallet's total now. */
    append: (
      accountId: string,
      entry: { type: LedgerType; amountMicroMyr: number; description: string; at: Date; apiKeyId?: string; requestId?: string; effectKey?: string }
    ): string => {
      const wallet = walletOf(accountId)
      const id = newId("le")
      entries.push({
        id,
        accountId,
        type: entry.type,
        amountMicroMyr: entry.amountMicroMyr,
        balanceAfterMicroMyr: wallet.availableMicroMyr + wallet.reservedMicroMyr + wallet.grantedMicroMyr,
        description: entry.description,
        createdAt: entry.at,
        apiKeyId: entry.apiKeyId ?? null,
        requestId: entry.requestId ?? null,
        effectKey: entry.effectKey ?? null
      })
      if (entry.effectKey !== undefined) effectKeys.add(entry.effectKey)
      return id
    },
    hasEffect: (effectKey: string) => effectKeys.has(effectKey),
    holders: alive as ReadonlySet<string>,
    notify: (accountId: string) => void grantRequests.push(accountId),
    mutable: { reservations, grants, memberOf: new Map<string, string>() }
  }
  return store
}

export type WalletStore = ReturnType<typeof makeStore>

/** One instance's `WalletRepo` on `store`: what it holds is written with `holder`. */
export const make = (store: WalletStore, holder: string = newId("inst")): WalletRepo["Type"] => {
  store.alive(holder)
  const { grants, memberOf, reservations } = store.mutable

  const refusal = (input: ReserveInput, at: Date): InsufficientBalance | SpendLimitExceeded | ReturnType<typeof accountSuspended> | undefined => {
    const wallet = store.walletOf(input.accountId)
    if (wallet.suspended) return accountSuspended()
    if (wallet.availableMicroMyr < 0) {
      return new InsufficientBalance({
        message: `The wallet's balance is negative (RM ${toMyrString(microMyr(wallet.availableMicroMyr))} available); calls resume after a top-up.`,
        guidance: NEGATIVE_BALANCE_GUIDANCE
      })
    }
    if (wallet.availableMicroMyr < input.amountMicroMyr) {
      return new InsufficientBalance({
        message: `This request may cost up to RM ${toMyrString(input.amountMicroMyr)}, and the wallet holds RM ${
          toMyrString(microMyr(Math.max(wallet.availableMicroMyr, 0)))
        } available.`
      })
    }
    const { amountMicroMyr, apiKeyId, memberId, memberMonthlySpendLimitMicroMyr: budget, monthlySpendLimitMicroMyr: limit } = input
    const keyRefusal = limit === null ? undefined : keyLimitRefusal(limit, monthToDate((key) => key === apiKeyId, at), amountMicroMyr)
    if (keyRefusal !== undefined || memberId === null || budget === null) return keyRefusal
    return memberBudgetRefusal(budget, monthToDate((key) => memberOf.get(key) === memberId, at), amountMicroMyr)
  }

  const monthToDate = (counts: (apiKeyId: string) => boolean, at: Date): MonthToDate => ({
    spent: [...spentIn(at)].reduce((total, [apiKeyId, spent]) => counts(apiKeyId) ? total + spent : total, 0),
    held: [...reservations.values()].reduce((total, r) => r.status === "open" && counts(r.apiKeyId) ? total + r.amountMicroMyr : total, 0)
  })

  /** Moves available → reserved and writes the reservation; the caller has checked that it may. */
  const hold = (input: ReserveInput): Reservation => {
    const wallet = store.walletOf(input.accountId)
    const reservation = newReservation(input)
    wallet.availableMicroMyr -= input.amountMicroMyr
    wallet.reservedMicroMyr += input.amountMicroMyr
    reservations.set(reservation.id, { ...reservation, holder, status: "open", capturedMicroMyr: null })
    if (input.memberId !== null) memberOf.set(input.apiKeyId, input.memberId)
    return reservation
  }

  const positive = (input: ReserveInput) =>
    input.amountMicroMyr <= 0 ? Effect.dieMessage("a reservation must be positive") : Effect.void

  const reserve = (input: ReserveInput) =>
    Effect.zipRight(positive(input), now).pipe(Effect.flatMap((at) =>
      Effect.suspend(() => {
        const refused = refusal(input, at)
        return refused === undefined ? Effect.succeed(hold(input)) : Effect.fail(refused)
      })
    ))

  const reserveQuickly = (input: ReserveInput) =>
    Effect.zipRight(positive(input), Effect.sync(() => {
      const wallet = store.walletOf(input.accountId)
      // As the one-statement SQL: monthly limits are not checked here, which is why only calls under none come.
      return wallet.suspended || wallet.availableMicroMyr < input.amountMicroMyr ? undefined : hold(input)
    }))

  const capture = (reservationId: string, amountMicroMyr: MicroMyr, description: string) =>
    Effect.flatMap(now, (at) =>
      Effect.sync((): Capture => {
        const r = reservations.get(reservationId)
        if (r === undefined) return { reservationId, chargedMicroMyr: 0, ledgerEntryId: null }
        if (r.status === "captured") {
          const posted = store.entries.find((e) => e.type === "usage" && e.requestId === r.requestId)
          return { reservationId, chargedMicroMyr: r.capturedMicroMyr ?? 0, ledgerEntryId: posted?.id ?? null }
        }
        const wallet = store.walletOf(r.accountId)
        const charged = captureInto(wallet, r, amountMicroMyr)
        wallet.lifetimeSpendMicroMyr += charged
        const ledgerEntryId = charged === 0 ? null : store.append(r.accountId, {
          type: "usage",
          amountMicroMyr: -charged,
          description,
          at,
          apiKeyId: r.apiKeyId,
          requestId: r.requestId
        })
        return { reservationId, chargedMicroMyr: charged, ledgerEntryId }
      }))

  const release = (reservationId: string) =>
    Effect.sync(() => {
      const r = reservations.get(reservationId)
      if (r === undefined || r.status !== "open") return false
      const wallet = store.walletOf(r.accountId)
      wallet.availableMicroMyr += r.amountMicroMyr
      wallet.reservedMicroMyr -= r.amountMicroMyr
      r.status = "released"
      return true
    })

  const growGrant = (grant: { readonly id: string; readonly accountId: string; readonly create: boolean }, size: GrantSizing) =>
    Effect.flatMap(now, (at) => Effect.sync((): number | "missing" => {
      const wallet = store.walletOf(grant.accountId)
      if (wallet.suspended) return 0
      const held = grants.get(grant.id)
      if (held === undefined && !grant.create) return "missing"
      const growth = Math.floor(size({ availableMicroMyr: wallet.availableMicroMyr, heldMicroMyr: held?.amountMicroMyr ?? 0 }))
      if (growth <= 0 || growth > wallet.availableMicroMyr) return 0
      wallet.availableMicroMyr -= growth
      wallet.grantedMicroMyr += growth
      if (held === undefined) grants.set(grant.id, { id: grant.id, accountId: grant.accountId, holder, amountMicroMyr: growth, updatedAt: at })
      else Object.assign(held, { amountMicroMyr: held.amountMicroMyr + growth, updatedAt: at })
      return growth
    }))

  /** What each key (of `accountId`, or of all) was billed in `at`'s month. */
  const spentIn = (at: Date, accountId?: string) => {
    const spent = new Map<string, number>()
    for (const e of store.entries) {
      if (e.type !== "usage" || e.apiKeyId === null || store.monthOf(e.createdAt) < store.monthOf(at)) continue
      if (accountId !== undefined && e.accountId !== accountId) continue
      spent.set(e.apiKeyId, (spent.get(e.apiKeyId) ?? 0) - e.amountMicroMyr)
    }
    return spent
  }

  const othersGrants = (accountId: string) =>
    [...grants.values()].filter((grant) => grant.accountId === accountId && grant.holder !== holder)

  /** Asks the other instances for the account's grants back (recorded in `grantRequests`; nobody listens). */
  const askForGrants = (accountId: string) =>
    Effect.map(now, (askedAt) => {
      store.notify(accountId)
      return { others: othersGrants(accountId).length, askedAt }
    })

  const unansweredGrants = (accountId: string, askedAt: Date) =>
    Effect.sync(() => othersGrants(accountId).filter((grant) => grant.updatedAt < askedAt).length)

  const open = (accountId: string) => Effect.sync(() => store.open(accountId))

  const returnDeadGrants = Effect.sync(() => {
    let returned = 0
    for (const grant of [...grants.values()]) {
      if (grant.holder === holder || store.holders.has(grant.holder)) continue
      const wallet = store.walletOf(grant.accountId)
      wallet.availableMicroMyr += grant.amountMicroMyr
      wallet.grantedMicroMyr -= grant.amountMicroMyr
      grants.delete(grant.id)
      returned++
    }
    return returned
  })

  const post = (input: PostInput) =>
    Effect.flatMap(now, (at) =>
      Effect.sync(() => {
        const wallet = store.walletOf(input.accountId)
        if (store.hasEffect(input.effectKey) || input.amountMicroMyr === 0) return false
        wallet.availableMicroMyr += input.amountMicroMyr
        if (input.type === "topup") wallet.lifetimeTopupMicroMyr += input.amountMicroMyr
        store.append(input.accountId, {
          type: input.type,
          amountMicroMyr: input.amountMicroMyr,
          description: input.description,
          at,
          effectKey: input.effectKey
        })
        // A debit asks every instance for the account's grants back (NOTIFY in the SQL one).
        if (input.amountMicroMyr < 0) store.notify(input.accountId)
        return true
      }))

  const ledger = (accountId: string, query: LedgerQuery) =>
    Effect.sync((): ReadonlyArray<LedgerEntryRow> =>
      store.entries
        .filter((e) => e.accountId === accountId && (query.type === undefined || e.type === query.type))
        .reverse()
        .slice((query.page - 1) * query.limit, query.page * query.limit)
        .map(({ amountMicroMyr, balanceAfterMicroMyr, createdAt, description, id, type }) => ({
          id,
          type,
          amountMicroMyr,
          balanceAfterMicroMyr,
          description,
          createdAt
        }))
    )

  const wallet = (accountId: string) =>
    Effect.sync((): StoredWallet => {
      const found = store.wallets.get(accountId)
      return found === undefined
        ? { availableMicroMyr: 0, reservedMicroMyr: 0, grantedMicroMyr: 0, lifetimeTopupMicroMyr: 0, lifetimeSpendMicroMyr: 0 }
        : {
          availableMicroMyr: found.availableMicroMyr,
          reservedMicroMyr: found.reservedMicroMyr,
          grantedMicroMyr: found.grantedMicroMyr,
          lifetimeTopupMicroMyr: found.lifetimeTopupMicroMyr,
          lifetimeSpendMicroMyr: found.lifetimeSpendMicroMyr
        }
    })

  const openHolds = Effect.sync(() => [...reservations.values()].filter((r) => r.status === "open").length)

  return Object.assign(
    WalletRepo.of({
      open, wallet, reserve, reserveQuickly, capture, release, growGrant, returnDeadGrants, askForGrants, unansweredGrants,
      // Nobody listens here, and nobody holds grants but this repository's own instance.
      askForKeyHolds: (accountId) => askForGrants(accountId),
      spentThisMonth: (accountId) =>
        Effect.map(now, (at) => spentIn(at, accountId)),
      spentThisMonthByMember: (accountId) => Effect.map(now, (at) => spentByMember(spentIn(at, accountId), (key) => memberOf.get(key))),
      memberKeys: (_accountId, memberId) => Effect.sync(() => [...memberOf].filter(([, member]) => member === memberId).map(([apiKeyId]) => apiKeyId)),
      post, ledger, openHolds
    }),
    { [IN_MEMORY]: true }
  )
}

/** The in-memory repository as `WalletRepo`, on a store of its own or a shared one. */
export const layer = (store: WalletStore = makeStore(), holder?: string): Layer.Layer<WalletRepo> =>
  Layer.sync(WalletRepo, () => make(store, holder))
