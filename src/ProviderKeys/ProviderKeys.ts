import { Context, Effect, Either, FiberSet, Layer, Redacted } from "effect"
import type { LookupFunction } from "node:net"
import { AppConfig } from "../AppConfig.js"
import { Listener } from "../Database/Listener.js"
import { storable } from "../Domain/Strict.js"
import { HostResolver } from "../Search/Fetch.js"
import { callLookup } from "./BaseUrl.js"
import { type ProviderKeyRow, ProviderKeysRepo } from "./Repo.js"
import { resealUnderCurrent } from "./Reseal.js"
import { ProviderKeySecrets } from "./SecretBox.js"

/**
 * A team's own provider keys as the call path uses them (docs/api/provider-keys.md): every account's keys held
 * in memory, so a call of an account without one costs a map lookup; a change through any instance is applied by
 * every instance within a second.
 */

/** Where an account's provider keys stand among nenas's own upstreams. */
export type ProviderKeyMode = "first" | "fallback" | "only"

/** What the last call on a provider key said of it. */
export type ProviderKeyStatus = "unchecked" | "ok" | "refused" | "failing"

/** One provider key, its secret opened: what a call needs to reach the team's provider. */
export interface ResolvedProviderKey {
  readonly id: string
  readonly accountId: string
  readonly name: string
  /** OpenAI-compatible, without a trailing slash: calls POST `{baseUrl}/chat/completions`. */
  readonly baseUrl: string
  readonly apiKey: Redacted.Redacted<string>
  /** The model at the provider per routing category; `embedding` absent: embeddings never go to it. */
  readonly models: { readonly general: string; readonly reasoning: string; readonly embedding: string | null }
  readonly mode: ProviderKeyMode
  /** Changes with every PATCH: a client made for an older version is made again. */
  readonly version: string
  /** The address guard's lookup for `baseUrl`'s host (undefined for an IP literal or an allowed host). */
  readonly lookup: LookupFunction | undefined
}

/** How a call on a provider key went, for its status: `refused` is a 401 or 403, `failing` a 5xx, 429 or no answer. */
export type ProviderKeyOutcome =
  | { readonly _tag: "Ok" }
  | { readonly _tag: "Refused" | "Failing"; readonly message: string }

/** The channel migration 0028's trigger announces every change on, with the account's id. */
export const PROVIDER_KEYS_CHANNEL = "nenas_provider_keys"

/** What a key sealed under a secret this instance does not hold says of itself (docs/api/provider-keys.md, "Rotating the server secret"). */
export const SECRET_CHANGED = "The server secret changed: this key was sealed under another PROVIDER_KEYS_SECRET. " +
  "The operator sets that one as PROVIDER_KEYS_SECRET_PREVIOUS, or you send the API key again (PATCH api_key)."

const ALTERED = "The stored API key does not open (it was altered); send it again (PATCH api_key)."
const GUARD_REFUSES = "The address guard refuses base_url now"

/** A problem this instance found on loading the key (not a call's): once the key is usable again, it is cleared. */
const isLoadProblem = (lastError: string | null): boolean =>
  lastError === SECRET_CHANGED || lastError === ALTERED || lastError?.startsWith(GUARD_REFUSES) === true

/** The most of a call's error a key's `last_error` keeps. */
const LAST_ERROR_MAX = 500

/** This instance's own reload of an account's keys: its change is used here at once, not only once announced. */
export class ProviderKeysRefresh extends Context.Tag("nenas/ProviderKeysRefresh")<ProviderKeysRefresh, {
  readonly account: (accountId: string) => Effect.Effect<void>
}>() {}

type Resolved =
  | { readonly _tag: "Usable"; readonly key: ResolvedProviderKey }
  | { readonly _tag: "Unusable"; readonly problem: string }

interface KnownStatus {
  readonly status: ProviderKeyStatus
  readonly lastError: string | null
}

const EMPTY: ReadonlyArray<ResolvedProviderKey> = []

/**
 * Every account's usable keys in memory. Each reload takes a generation before it reads, and is applied only
 * when no later one was applied to the account before it: a slower, older read never undoes a newer one.
 */
const makeTable = Effect.fnUntraced(function*() {
  const repo = yield* ProviderKeysRepo
  const { current, previous } = yield* ProviderKeySecrets
  const config = yield* AppConfig
  const resolver = yield* HostResolver
  const listener = yield* Listener
  const run = yield* FiberSet.makeRuntime<never>()

  const byAccount = new Map<string, ReadonlyArray<ResolvedProviderKey>>()
  const statuses = new Map<string, KnownStatus>()
  const idsByAccount = new Map<string, ReadonlyArray<string>>()
  const appliedAt = new Map<string, number>()
  let generation = 0
  let allAppliedAt = 0

  const resolve = (row: ProviderKeyRow): Resolved => {
    const box = row.secretKeyId === current.keyId
      ? current
      : row.secretKeyId === previous?.keyId
      ? previous
      : undefined
    if (box === undefined) return { _tag: "Unusable", problem: SECRET_CHANGED }
    const apiKey = box.open(row.id, row.accountId, row.secret)
    if (apiKey === undefined) return { _tag: "Unusable", problem: ALTERED }
    const lookup = callLookup(resolver, config.providerAllowedHosts, new URL(row.baseUrl))
    if (Either.isLeft(lookup)) return { _tag: "Unusable", problem: `${GUARD_REFUSES}: ${lookup.left}.` }
    return {
      _tag: "Usable",
      key: {
        id: row.id,
        accountId: row.accountId,
        name: row.name,
        baseUrl: row.baseUrl,
        apiKey: Redacted.make(apiKey),
        models: row.models,
        mode: row.mode,
        version: row.version,
        lookup: lookup.right
      }
    }
  }

  /** Records a status in the table when it differs from what is known; never fails. */
  const writeStatus = (id: string, known: KnownStatus) =>
    repo.setStatus(id, known.status, known.lastError).pipe(
      Effect.catchAllCause((cause) => Effect.logWarning("a provider key's status could not be written", cause))
    )

  /**
   * Sets what the table should say of a key. Only the load at start writes it when the row says otherwise: two
   * instances that hold different secrets for a while (a rolling restart) would otherwise overwrite each other's
   * word on every announcement of the other's write.
   */
  const known = (row: ProviderKeyRow, status: KnownStatus, atStart: boolean) => {
    statuses.set(row.id, status)
    if (row.status === status.status && row.lastError === status.lastError) return
    if (atStart) run(writeStatus(row.id, status))
    else if (status.status === "failing") {
      run(Effect.logWarning(`provider key ${row.id} is not used on this instance: ${status.lastError}`))
    }
  }

  /**
   * The account's rows become its usable keys; an unusable one is marked `failing`, saying why, and a key
   * usable again loses what loading said of it.
   */
  const apply = (accountId: string, rows: ReadonlyArray<ProviderKeyRow>, atStart = false) => {
    const usable: Array<ResolvedProviderKey> = []
    for (const id of idsByAccount.get(accountId) ?? []) statuses.delete(id)
    for (const row of rows) {
      const resolved = resolve(row)
      if (resolved._tag === "Unusable") {
        known(row, { status: "failing", lastError: resolved.problem }, atStart)
        continue
      }
      usable.push(resolved.key)
      known(
        row,
        isLoadProblem(row.lastError)
          ? { status: "unchecked", lastError: null }
          : { status: row.status, lastError: row.lastError },
        atStart
      )
    }
    if (rows.length === 0) idsByAccount.delete(accountId)
    else idsByAccount.set(accountId, rows.map((row) => row.id))
    if (usable.length === 0) byAccount.delete(accountId)
    else byAccount.set(accountId, usable)
  }

  const reloadAccount = (accountId: string) =>
    Effect.suspend(() => {
      const taken = ++generation
      return Effect.map(repo.list(accountId), (rows) => {
        if (taken <= Math.max(appliedAt.get(accountId) ?? 0, allAppliedAt)) return
        appliedAt.set(accountId, taken)
        apply(accountId, rows)
      })
    })

  const reloadAll = (atStart: boolean) =>
    Effect.suspend(() => {
      const taken = ++generation
      return Effect.map(repo.listAll, (rows) => {
        if (taken <= allAppliedAt) return
        const grouped = new Map<string, Array<ProviderKeyRow>>()
        for (const row of rows) grouped.set(row.accountId, [...(grouped.get(row.accountId) ?? []), row])
        for (const accountId of new Set([...idsByAccount.keys(), ...grouped.keys()])) {
          if (taken > (appliedAt.get(accountId) ?? 0)) apply(accountId, grouped.get(accountId) ?? [], atStart)
        }
        allAppliedAt = taken
        for (const [accountId, at] of appliedAt) if (at <= taken) appliedAt.delete(accountId)
      })
    })

  const inBackground = (what: string, effect: Effect.Effect<void>) =>
    run(effect.pipe(Effect.catchAllCause((cause) => Effect.logWarning(`provider keys: ${what} failed`, cause))))

  // Listened to before the first load, which every announcement heard meanwhile waits for (the load at start is
  // the one that writes what it finds): each is reloaded after it.
  const starting: { heard: Set<string> | "all"; done: boolean } = { heard: new Set(), done: false }
  yield* listener.on(PROVIDER_KEYS_CHANNEL, (accountId) => {
    if (starting.done) return void inBackground("a reload", reloadAccount(accountId))
    if (starting.heard !== "all") starting.heard.add(accountId)
  })
  // Listening again after a silence: what was announced meanwhile is lost.
  yield* listener.onHeardAgain(() => {
    if (starting.done) return void inBackground("reloading every account", reloadAll(false))
    starting.heard = "all"
  })
  yield* resealUnderCurrent
  yield* reloadAll(true)
  starting.done = true
  if (starting.heard === "all") inBackground("reloading every account", reloadAll(false))
  else for (const accountId of starting.heard) inBackground("a reload", reloadAccount(accountId))

  return {
    forAccount: (accountId: string) => byAccount.get(accountId) ?? EMPTY,
    report: (id: string, outcome: ProviderKeyOutcome) =>
      Effect.sync(() => {
        const next: KnownStatus = outcome._tag === "Ok"
          ? { status: "ok", lastError: null }
          : {
            status: outcome._tag === "Refused" ? "refused" : "failing",
            lastError: storable(outcome.message.slice(0, LAST_ERROR_MAX))
          }
        const known = statuses.get(id)
        if (known === undefined || (known.status === next.status && known.lastError === next.lastError)) return
        statuses.set(id, next)
        // Off the call's path: the call does not wait for the write.
        run(writeStatus(id, next))
      }),
    refresh: (accountId: string) =>
      reloadAccount(accountId).pipe(
        Effect.catchAllCause((cause) => Effect.logWarning("provider keys: a reload failed", cause))
      )
  }
})

export class ProviderKeys extends Context.Tag("nenas/ProviderKeys")<ProviderKeys, {
  /** The account's provider keys, oldest first; empty for most accounts (no I/O). */
  readonly forAccount: (accountId: string) => ReadonlyArray<ResolvedProviderKey>
  /** Records a call's outcome on the key's status and last error (written only when it changes). Never fails. */
  readonly report: (id: string, outcome: ProviderKeyOutcome) => Effect.Effect<void>
}>() {
  /** No provider keys: the call path's Layer for tests that do not use them. */
  static readonly none = ProviderKeys.of({ forAccount: () => [], report: () => Effect.void })

  /**
   * Every account's keys, loaded at start (after sealing again what a rotation's previous secret sealed),
   * reloaded per account as `nenas_provider_keys` announces changes, and whole after the listener was deaf.
   */
  static readonly layer = Layer.scopedContext(
    Effect.map(
      makeTable(),
      ({ forAccount, refresh, report }) =>
        Context.make(ProviderKeys, ProviderKeys.of({ forAccount, report })).pipe(
          Context.add(ProviderKeysRefresh, { account: refresh })
        )
    )
  ).pipe(Layer.provide(HostResolver.system))
}
