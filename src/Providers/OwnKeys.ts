import { Context, Effect, Option, type Stream } from "effect"
import { ProviderKeyRefused, ProviderUnavailable } from "../Domain/Errors.js"
import type { ProviderKeyOutcome, ResolvedProviderKey } from "../ProviderKeys/ProviderKeys.js"
import { OWN_KEY_BREAKER_PREFIX } from "./BreakerTypes.js"
import type { Attempted, AttemptPlan, Attempts, NoAnswer, Operation, Reachable } from "./Fallback.js"
import type { AttemptFailure, UpstreamClient } from "./OpenAiCompatible.js"
import { upstreamClient } from "./OpenAiCompatible.js"
import type { ProviderError, ProviderRequest, ProviderShape, StreamPart, UpstreamAttempt } from "./Provider.js"

/**
 * A team's own provider keys around nenas's provider (docs/api/provider-keys.md, "Routing"): the keys in mode
 * `first` or `only` are tried before nenas's upstreams, those in `fallback` after them, and nenas's upstreams
 * not at all when any key is `only`. Each list of keys is tried as Fallback.ts tries nenas's targets (the same
 * breakers, shared across instances, one per key and model; a first-byte budget shared with what comes after);
 * a key refused (401/403) moves the call on like a 5xx. A call that only keys may answer, whose last key
 * refused its credentials, answers `provider_key_refused`. Every attempt on a key sets its status.
 */

/** The category a request is routed in: which of a key's models it asks. */
type Category = "general" | "reasoning" | "embedding"

/** How the keys stand around nenas's upstreams for one account. */
interface Order {
  readonly before: ReadonlyArray<ResolvedProviderKey>
  readonly nenas: boolean
  readonly after: ReadonlyArray<ResolvedProviderKey>
}

/** An account's keys in their routing order (oldest first within each place). */
export const orderOf = (keys: ReadonlyArray<ResolvedProviderKey>): Order => ({
  before: keys.filter((key) => key.mode !== "fallback"),
  nenas: !keys.some((key) => key.mode === "only"),
  after: keys.filter((key) => key.mode === "fallback")
})

/** The log's and the breaker's name of a key's target: the key's id and the model asked there. */
export const keyTarget = (key: ResolvedProviderKey, model: string): string => `${key.id}/${model}`

/** nenas's failures that move a call on to the team's fallback keys: the upstreams down or silent, not the request refused. */
const movesOn = (error: ProviderError): boolean =>
  error._tag === "ProviderUnavailable" || error._tag === "ProviderTimeout"

const noKeyServes = (category: Category) =>
  new ProviderUnavailable({
    message: category === "embedding"
      ? "This account's provider keys are in mode `only`, and none names an embedding model (models.embedding)."
      : "This account's provider keys are in mode `only`, and none could be used.",
    retryable: false
  })

const keyRefused = (target: string | undefined) =>
  new ProviderKeyRefused({
    message: `Your provider refused your provider key${
      target === undefined ? "" : ` (${target})`
    } with HTTP 401 or 403, and this account's calls use only its own keys (a key is in mode \`only\`).`
  })

/**
 * A key's 404 (most often a model the provider does not have: `models` names it wrong) is the key's failure, not
 * the request's: the call moves on, and the key's status says so.
 */
const asKeyFailure = (failed: AttemptFailure): AttemptFailure =>
  failed.status === 404 ? Object.assign({}, failed, { outcome: "server_error" as const }) : failed

/** The outcome a key's status is set from: a request refused is the key working; a 401/403 its refusal. */
const keyOutcome = (failed: AttemptFailure | undefined): ProviderKeyOutcome => {
  if (failed === undefined || failed.outcome === "refused") return { _tag: "Ok" }
  return { _tag: failed.credentialsRefused === true ? "Refused" : "Failing", message: failed.error.message }
}

export interface OwnKeysOptions {
  readonly firstByteTimeoutMs: number
  readonly totalTimeoutMs: number
}

/** The most clients of provider keys one instance keeps (each with its keep-alive connections); the oldest go first. */
const CLIENTS_MAX = 1_000

export const makeOwnKeys = (
  attempts: Attempts,
  options: OwnKeysOptions,
  report: (id: string, outcome: ProviderKeyOutcome) => Effect.Effect<void>
) => {
  const clients = new Map<string, { readonly version: string; readonly client: UpstreamClient }>()

  /** The key's client, made again when the key changed. */
  const clientOf = (key: ResolvedProviderKey): UpstreamClient => {
    const known = clients.get(key.id)
    if (known !== undefined && known.version === key.version) return known.client
    known?.client.close()
    const client = upstreamClient({
      baseUrl: key.baseUrl,
      apiKey: Option.some(key.apiKey),
      totalTimeoutMs: options.totalTimeoutMs,
      lookup: key.lookup,
      credentials: `provider key ${key.id}`
    })
    clients.delete(key.id)
    clients.set(key.id, { version: key.version, client })
    if (clients.size > CLIENTS_MAX) {
      const oldest = clients.entries().next()
      if (oldest.done !== true) {
        oldest.value[1].client.close()
        clients.delete(oldest.value[0])
      }
    }
    return client
  }

  const reachable = (keys: ReadonlyArray<ResolvedProviderKey>, category: Category): ReadonlyArray<Reachable> =>
    keys.flatMap((key) => {
      const model = key.models[category]
      return model === null
        ? []
        : [{
          id: keyTarget(key, model),
          breaker: `${OWN_KEY_BREAKER_PREFIX}${keyTarget(key, model)}`,
          upstream: "provider_key",
          model,
          client: clientOf(key),
          providerKeyId: key.id
        }]
    })

  const ended = (target: Reachable, failed: AttemptFailure | undefined) =>
    target.providerKeyId === undefined ? Effect.void : report(target.providerKeyId, keyOutcome(failed))

  /**
   * A request routed over the account's keys and nenas's provider (`viaNenas`), in `order`; `opened` wraps an
   * answer a key opened (a stream, to tell its cut).
   */
  const routed = Effect.fnUntraced(function*<R extends Attempted, A>(
    order: Order,
    category: Category,
    request: R,
    run: (client: UpstreamClient, request: R, firstByteMs: number) => Effect.Effect<A, AttemptFailure>,
    viaNenas: (request: R) => Effect.Effect<A, ProviderError>,
    opened: (answer: A, target: Reachable, started: number) => A
  ): Effect.fn.Return<A, ProviderError> {
    const operation: Operation = category === "embedding" ? "embeddings" : "chat"
    // Without nenas's upstreams, the keys are one list under one budget.
    const before = reachable(order.nenas ? order.before : [...order.before, ...order.after], category)
    const after = order.nenas ? reachable(order.after, category) : []
    const onKey = (client: UpstreamClient, r: R, firstByteMs: number) =>
      Effect.mapError(run(client, r, firstByteMs), asKeyFailure)
    const plan = (slotsAfter: number): AttemptPlan => ({
      deadline: attempts.clock.unsafeCurrentTimeMillis() + options.firstByteTimeoutMs,
      slotsAfter,
      operation,
      ended
    })
    let last: NoAnswer | undefined
    if (before.length > 0) {
      const tried = yield* Effect.either(
        attempts.tryEach(before, request, plan((order.nenas ? 1 : 0) + after.length), onKey)
      )
      if (tried._tag === "Right") return opened(...tried.right)
      if (tried.left.final) return yield* Effect.fail(attempts.errorOf(tried.left))
      last = tried.left
    }
    if (order.nenas) {
      // An answer nenas's upstream began and lost is the call's error: the call does not move on after it.
      let cut = false
      const told = request.attempted
      const watched: R = Object.assign({}, request, {
        attempted: (attempt: UpstreamAttempt, amend: boolean) => {
          if (attempt.outcome === "cut_short") cut = true
          return told === undefined ? Effect.void : told(attempt, amend)
        }
      })
      const answered = yield* Effect.either(viaNenas(watched))
      if (answered._tag === "Right") return answered.right
      if (after.length === 0 || cut || !movesOn(answered.left)) return yield* Effect.fail(answered.left)
      last = { error: answered.left, final: false, credentialsRefused: false, halfOpenAt: Number.POSITIVE_INFINITY }
    }
    if (after.length > 0) {
      // After nenas's upstreams, the fallback keys have a first-byte budget of their own.
      const tried = yield* Effect.either(attempts.tryEach(after, request, plan(0), onKey))
      if (tried._tag === "Right") return opened(...tried.right)
      // Every fallback key open: the failure before them stands, or the earliest of all to half-open.
      last = tried.left.error !== undefined || last === undefined
        ? tried.left
        : last.error !== undefined
        ? last
        : Object.assign({}, tried.left, { halfOpenAt: Math.min(last.halfOpenAt, tried.left.halfOpenAt) })
    }
    if (last === undefined) return yield* Effect.fail(noKeyServes(category))
    if (!order.nenas && last.credentialsRefused) return yield* Effect.fail(keyRefused(last.target))
    return yield* Effect.fail(attempts.errorOf(last))
  })

  const categoryOf = (request: ProviderRequest): Category => request.reasoningModel ? "reasoning" : "general"
  const same = <A>(answer: A) => answer

  /** `nenas` with the account's `keys` around it; nenas's provider itself for an account without keys. */
  const around = (keys: ReadonlyArray<ResolvedProviderKey>, nenas: ProviderShape): ProviderShape => {
    if (keys.length === 0) return nenas
    const order = orderOf(keys)
    const stream = (request: ProviderRequest) =>
      routed<ProviderRequest, Stream.Stream<StreamPart, ProviderError>>(
        order,
        categoryOf(request),
        request,
        (client, r, ms) => client.stream(r, ms),
        nenas.stream,
        (parts, target, started) => attempts.cutShort(request, parts, target, started, ended)
      )
    return {
      complete: (request) =>
        routed(order, categoryOf(request), request, (client, r, ms) => client.complete(r, ms), nenas.complete, same),
      stream,
      embed: (request) => routed(order, "embedding", request, (client, r, ms) => client.embed(r, ms), nenas.embed, same)
    }
  }

  return { around }
}

/** How a live call of an account with provider keys reaches them (ModelCalls, embeddings); Live.ts makes it. */
export class OwnKeyRouting
  extends Context.Tag("nenas/OwnKeyRouting")<OwnKeyRouting, ReturnType<typeof makeOwnKeys>>()
{}
