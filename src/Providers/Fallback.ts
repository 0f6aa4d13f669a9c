import { Effect, Option, type Stream } from "effect"
import { ProviderTimeout, ProviderUnavailable } from "../Domain/Errors.js"
import type { ModelCategory, Target, UpstreamConfig } from "../Domain/Upstreams.js"
import { targetsFor } from "../Domain/Upstreams.js"
import { tapFailure } from "../Lane/Wire/PartReader.js"
import type { BreakersShape } from "./BreakerTypes.js"
import type { AttemptFailure, UpstreamClient } from "./OpenAiCompatible.js"
import { makeUpstreamClient } from "./OpenAiCompatible.js"
import type {
  AttemptOutcome,
  EmbeddingRequest,
  ProviderError,
  ProviderRequest,
  ProviderShape,
  StreamPart,
  UpstreamAttempt
} from "./Provider.js"

/**
 * Fallbacks across upstreams
 * (docs/operations.md, "Several upstreams and fallbacks"). A call tries its
 * category's targets in order (Domain/Upstreams.ts). Before the answer's head
 * arrives, a connection error, 429, 5xx (or 408, or our credentials refused) or
 * a first-byte timeout moves it to the next target; a refusal of the request
 * itself (another 4xx: `invalid_request`, `context_length_exceeded`) ends it,
 * as it would end anywhere. Once a head has arrived the call stays with that
 * target: a stream cut later is the call's error, never a switch.
 *
 * Deadline: `UPSTREAM_FIRST_BYTE_TIMEOUT_MS` is the whole call's budget. Each
 * attempt may use what is left divided by the targets not yet tried (itself
 * included), so a silent target cannot spend the later ones' share, and a
 * target that fails at once leaves its share to the rest. A call with one
 * target has the whole budget, as before fallbacks.
 *
 * Breakers: a target whose breaker is open is skipped without a request; each
 * attempt is recorded to it (a refusal counts as a success: the upstream is
 * up), with the upstream's `Retry-After`. When every target is skipped as
 * open, the call answers `provider_unavailable` with `retry_after_seconds`
 * until the earliest half-open time.
 *
 * Embeddings go the same way over the `embedding` category's targets; with
 * none listed, an embeddings call fails at once.
 */

/**
 * Per-target metrics: one call per attempt, whatever its outcome (Live.ts
 * passes the `upstreamAttempts` counter and `upstreamAttemptLatency` histogram).
 */
export type RecordAttempt = (target: string, outcome: AttemptOutcome, seconds: number) => Effect.Effect<void>

export interface FallbackOptions {
  readonly upstreams: ReadonlyArray<UpstreamConfig>
  readonly firstByteTimeoutMs: number
  readonly totalTimeoutMs: number
  /**
   * Each attempt a span (`chat <model>`, `embeddings <model>`: GenAI conventions) under the call's: only while
   * traces are exported.
   */
  readonly traced?: boolean | undefined
}

/** What an attempt does, as GenAI's `gen_ai.operation.name` says it. */
export type Operation = "chat" | "embeddings"

/** One place a call may go: its breaker's and the log's name, its upstream (a span's word), the model asked there, its client. */
export interface Reachable {
  readonly id: string
  readonly upstream: string
  readonly model: string
  readonly client: UpstreamClient
  /** A team's own provider key's id (docs/api/provider-keys.md, "Routing"): the call is billed its fee. */
  readonly providerKeyId?: string | undefined
  /** Its breaker's name, when it is not `id`. */
  readonly breaker?: string | undefined
}

/** An attempt as its own span: which target, and how it went (never what was asked or answered). */
const attemptSpan =
  (target: Reachable, index: number, operation: Operation) =>
  <A>(attempt: Effect.Effect<A, AttemptFailure>): Effect.Effect<A, AttemptFailure> =>
    attempt.pipe(
      Effect.tapBoth({
        onFailure: (failed) => Effect.annotateCurrentSpan("nenas.attempt.outcome", failed.outcome),
        onSuccess: () => Effect.annotateCurrentSpan("nenas.attempt.outcome", "ok")
      }),
      Effect.withSpan(`${operation} ${target.model}`, {
        kind: "client",
        attributes: {
          "gen_ai.operation.name": operation,
          "gen_ai.system": "openai",
          "gen_ai.request.model": target.model,
          "nenas.upstream": target.upstream,
          "nenas.attempt": index + 1
        }
      })
    )

/** Every target open (`now` and `halfOpenAt` epoch ms, the service's `Clock`): retry once the earliest half-opens. */
const allOpen = (halfOpenAt: number, now: number) =>
  new ProviderUnavailable({
    message: "Every upstream for this model is failing; none is being tried until its cool-down ends.",
    retry_after_seconds: Math.max(1, Math.ceil((halfOpenAt - now) / 1000))
  })

const outOfTime = () => new ProviderTimeout({ message: "The model provider did not start answering in time." })

/** No upstream lists an embedding model: no retry helps until the operator lists one. */
const noEmbeddingUpstream = () =>
  new ProviderUnavailable({
    message: "No upstream serves embeddings here; the operator lists them under models.embedding in UPSTREAMS.",
    retryable: false
  })

/** What an attempt needs of a request: its model, replaced by each target's, and whom to tell. */
export type Attempted = Pick<ProviderRequest, "model" | "attempted">

/**
 * Why a list of targets gave no answer: the last failure (none: every target was skipped as open, the earliest
 * half-opening at `halfOpenAt`); `final` when no other target may be tried (the request was refused, or an
 * answer had begun); `credentialsRefused` when that last failure was the target refusing its key.
 */
export interface NoAnswer {
  readonly error: ProviderError | undefined
  readonly final: boolean
  readonly credentialsRefused: boolean
  /** The target of that last failure. */
  readonly target?: string | undefined
  readonly halfOpenAt: number
}

/** How one list of targets is tried: by `deadline` (epoch ms), sharing it with `slotsAfter` more targets tried after them. */
export interface AttemptPlan {
  readonly deadline: number
  readonly slotsAfter: number
  readonly operation: Operation
  /** Told of each attempt's end at a target, besides its breaker and the metrics (a provider key's status). */
  readonly ended?: ((target: Reachable, failure: AttemptFailure | undefined) => Effect.Effect<void>) | undefined
}

/**
 * The attempt loop (the rules above) over any list of targets, each guarded by `breakers`, each attempt told to
 * `record` and to the request: nenas's upstreams here, a team's provider keys in OwnKeys.ts.
 */
export const makeAttempts = Effect.fnUntraced(function*(
  breakers: BreakersShape,
  record: RecordAttempt,
  traced: boolean
) {
  // Read directly on each attempt (docs/performance.md, "The clock read directly on the call path").
  const clock = yield* Effect.clock

  const tell = (request: Attempted, attempt: UpstreamAttempt, amend = false) =>
    Effect.zipRight(
      record(
        attempt.providerKeyId === undefined ? attempt.target : "provider_key",
        attempt.outcome,
        attempt.latencyMs / 1000
      ),
      request.attempted === undefined ? Effect.void : request.attempted(attempt, amend)
    )

  const told = (target: Reachable, outcome: AttemptOutcome, latencyMs: number): UpstreamAttempt =>
    target.providerKeyId === undefined
      ? { target: target.id, model: target.model, outcome, latencyMs }
      : { target: target.id, model: target.model, outcome, latencyMs, providerKeyId: target.providerKeyId }

  /** Tries `targets` in order until one opens an answer (`run`'s success), or the request is refused, or none is left. */
  const tryEach = Effect.fnUntraced(function*<R extends Attempted, A>(
    targets: ReadonlyArray<Reachable>,
    request: R,
    plan: AttemptPlan,
    run: (client: UpstreamClient, request: R, firstByteMs: number) => Effect.Effect<A, AttemptFailure>
  ): Effect.fn.Return<readonly [A, Reachable, number], NoAnswer> {
    let last: NoAnswer | undefined
    let halfOpenAt = Number.POSITIVE_INFINITY
    for (const [index, target] of targets.entries()) {
      const admission = yield* breakers.admit(target.breaker ?? target.id)
      if (admission._tag === "Open") {
        halfOpenAt = Math.min(halfOpenAt, admission.halfOpenAt)
        yield* tell(request, told(target, "breaker_open", 0))
        continue
      }
      const left = plan.deadline - clock.unsafeCurrentTimeMillis()
      if (left <= 0) {
        last ??= { error: outOfTime(), final: false, credentialsRefused: false, halfOpenAt }
        break
      }
      const started = performance.now()
      const share = Math.ceil(left / (targets.length - index + plan.slotsAfter))
      const tried = run(target.client, { ...request, model: target.model }, share)
      const result = yield* Effect.either(traced ? attemptSpan(target, index, plan.operation)(tried) : tried)
      const latencyMs = Math.round(performance.now() - started)
      if (result._tag === "Right") {
        yield* breakers.record(target.breaker ?? target.id, { _tag: "Success" })
        yield* tell(request, told(target, "ok", latencyMs))
        if (plan.ended !== undefined) yield* plan.ended(target, undefined)
        return [result.right, target, started] as const
      }
      const failed = result.left
      yield* breakers.record(
        target.breaker ?? target.id,
        failed.outcome === "refused" ? { _tag: "Success" } : { _tag: "Failure", retryAfterMs: failed.retryAfterMs }
      )
      yield* tell(request, told(target, failed.outcome, latencyMs))
      if (plan.ended !== undefined) yield* plan.ended(target, failed)
      // The request itself was refused, or an answer had begun: no other target is tried.
      const final = failed.outcome === "refused" || failed.outcome === "cut_short"
      last = {
        error: failed.error,
        final,
        credentialsRefused: failed.credentialsRefused === true,
        halfOpenAt,
        target: target.id
      }
      if (final) return yield* Effect.fail(last)
    }
    return yield* Effect.fail(last ?? { error: undefined, final: false, credentialsRefused: false, halfOpenAt })
  })

  /** A stream that fails after its head is told to the breaker and the log as `cut_short`. */
  const cutShort = (
    request: Attempted,
    parts: Stream.Stream<StreamPart, ProviderError>,
    target: Reachable,
    started: number,
    ended?: AttemptPlan["ended"]
  ) =>
    tapFailure(parts, (error) =>
      Effect.zipRight(
        Effect.zipRight(
          breakers.record(target.breaker ?? target.id, { _tag: "Failure" }),
          tell(request, told(target, "cut_short", Math.round(performance.now() - started)), true)
        ),
        ended === undefined ? Effect.void : ended(target, { error, outcome: "cut_short" })
      ))

  /** The caller's error for a list that gave no answer: its last failure, or every target open. */
  const errorOf = (none: NoAnswer): ProviderError => {
    if (none.error !== undefined) return none.error
    const now = clock.unsafeCurrentTimeMillis()
    return allOpen(Number.isFinite(none.halfOpenAt) ? none.halfOpenAt : now, now)
  }

  return { tryEach, cutShort, errorOf, clock }
})

export type Attempts = Effect.Effect.Success<ReturnType<typeof makeAttempts>>

/**
 * The provider over `options.upstreams`, each upstream with its own client, each target guarded by `breakers`,
 * each attempt told to `record` (the metrics; Live.ts passes them).
 */
export const makeFallbackProvider = Effect.fnUntraced(
  function*(options: FallbackOptions, breakers: BreakersShape, record: RecordAttempt) {
    const attempts = yield* makeAttempts(breakers, record, options.traced === true)
    const clients = new Map<string, UpstreamClient>()
    for (const upstream of options.upstreams) {
      clients.set(
        upstream.name,
        yield* makeUpstreamClient({
          baseUrl: upstream.baseUrl,
          apiKey: upstream.apiKey,
          totalTimeoutMs: options.totalTimeoutMs
        })
      )
    }
    const reachable = (targets: ReadonlyArray<Target>): ReadonlyArray<Reachable> =>
      targets.flatMap((target) => {
        const client = clients.get(target.upstream)
        return client === undefined ? [] : [{ id: target.id, upstream: target.upstream, model: target.model, client }]
      })

    /**
     * Tries `category`'s targets in order until one opens an answer (`run`'s success), or the request is
     * refused, or none is left: then the last failure, or `allOpen`.
     */
    const attempt = <R extends Attempted, A>(
      category: ModelCategory,
      request: R,
      run: (client: UpstreamClient, request: R, firstByteMs: number) => Effect.Effect<A, AttemptFailure>
    ): Effect.Effect<readonly [A, Reachable, number], ProviderError> => {
      const targets = targetsFor(options.upstreams, category, request.model)
      if (targets.length === 0 && category === "embedding") return Effect.fail(noEmbeddingUpstream())
      const plan: AttemptPlan = {
        deadline: attempts.clock.unsafeCurrentTimeMillis() + options.firstByteTimeoutMs,
        slotsAfter: 0,
        operation: category === "embedding" ? "embeddings" : "chat"
      }
      return Effect.mapError(attempts.tryEach(reachable(targets), request, plan, run), attempts.errorOf)
    }

    const categoryOf = (request: ProviderRequest): ModelCategory => request.reasoningModel ? "reasoning" : "general"

    const complete: ProviderShape["complete"] = (request) =>
      Effect.map(
        attempt(categoryOf(request), request, (client, r, ms) => client.complete(r, ms)),
        ([completion]) => completion
      )

    const stream: ProviderShape["stream"] = (request) =>
      Effect.map(
        attempt(categoryOf(request), request, (client, r, ms) => client.stream(r, ms)),
        ([parts, target, started]) => attempts.cutShort(request, parts, target, started)
      )

    const embed: ProviderShape["embed"] = (request) =>
      Effect.map(
        attempt("embedding", request, (client, r: EmbeddingRequest, ms) => client.embed(r, ms)),
        ([answer]) => answer
      )

    return { complete, stream, embed } satisfies ProviderShape
  }
)

/** The model that answered: the last attempt told `ok`. */
export const servedBy = (attempts: ReadonlyArray<UpstreamAttempt>): Option.Option<UpstreamAttempt> =>
  Option.fromNullable([...attempts].reverse().find((a) => a.outcome === "ok" || a.outcome === "cut_short"))
