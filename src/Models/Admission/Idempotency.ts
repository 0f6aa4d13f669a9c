import { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Cause, Clock, Context, Duration, Effect, type Fiber, FiberSet, Layer, Schedule } from "effect"
import { createHash } from "node:crypto"
import { AppConfig } from "../../AppConfig.js"
import { type ApiError, errorMeta, IdempotencyConflict } from "../../Domain/Errors.js"
import { holderDead, secondsSql } from "../../Wallet/Instances/Instances.js"
import { LEASE_RENEWAL, MAX_HOLD, RESERVATION_LEASE, ReservationLeases } from "../../Wallet/Instances/Leases.js"

// Hand-cast SQL (docs/performance.md, "Hand-cast SQL on the call path"): claim, confirm and complete run on every call with an Idempotency-Key.

export const RETENTION = Duration.hours(24)
/** Tries of a record's completion on the call's path (back-off doubling from 50 ms); then it is retried in the background. */
export const COMPLETION_TRIES = 4
/** The longest the background retries a completion, the record's lease renewed meanwhile: as long as a call may hold money. */
const COMPLETION_RETRY_FOR = MAX_HOLD
/** How long calls run on at shutdown when no drain deadline was set (a test closing its server, say). */
const UNDRAINED_GRACE_MS = 25_000
/** Each unwritten completion's last try at shutdown. */
const LAST_TRY = Duration.seconds(2)

export interface Claim {
  readonly apiKeyId: string
  readonly key: string
  readonly endpoint: string
  /** The decoded request body, so that the same request in another spelling is the same request. */
  readonly body: unknown
  readonly requestId: string
}

export type Outcome =
  | { readonly _tag: "Claimed" }
  /** `requestId`: the first request's, which its body quotes and its replay answers with as `X-Request-Id`. */
  | { readonly _tag: "Replay"; readonly status: number; readonly body: string; readonly requestId: string }

export interface RecordRow {
  readonly endpoint: string
  readonly requestHash: Uint8Array
  readonly requestId: string
  readonly status: "running" | "completed"
  readonly responseStatus: number | null
  readonly responseBody: string | null
}

/** Failures that cost nothing when no web search could have spent: a retry they invite runs anew. */
const RELEASED_CODES: ReadonlySet<string> = new Set([
  "provider_unavailable",
  "provider_timeout",
  "internal_error",
  "rate_limit_exceeded"
])

/**
 * Whether a call's typed error is kept under its key and replayed. Not kept: one marked retryable that cost
 * nothing (a provider failure, an internal error, a 429; web search off, as a search is billed even when the
 * answer fails), so that the retry the flag invites runs; nor a taken-over key's conflict, not ours to write.
 */
export const keptForReplay = (error: ApiError, webSearchMode: string | undefined): boolean => {
  if (error._tag === "IdempotencyConflict") return false
  const retryable = error.retryable ?? errorMeta(error).retryable
  const free = RELEASED_CODES.has(errorMeta(error).code) && (webSearchMode ?? "off") === "off"
  return !(retryable && free)
}

export const hashOf = (endpoint: string, body: unknown): Buffer =>
  createHash("sha256").update(endpoint).update("\n").update(JSON.stringify(body)).digest()

/**
 * A key already claimed, by this request's twin or another: a different request
 * is a conflict; the same one still running is a retryable conflict; a finished
 * one is replayed with its stored status and body.
 */
export const judgeExisting = (
  input: Pick<Claim, "key" | "endpoint">,
  hash: Uint8Array,
  existing: RecordRow
): Effect.Effect<Outcome, IdempotencyConflict> => {
  if (existing.endpoint !== input.endpoint || !Buffer.from(hash).equals(Buffer.from(existing.requestHash))) {
    return new IdempotencyConflict({
      message: `The Idempotency-Key "${input.key}" was already used with a different request (${existing.endpoint}).`,
      param: "Idempotency-Key",
      guidance: "Use a new Idempotency-Key for a different request."
    })
  }
  if (existing.status === "running" || existing.responseStatus === null || existing.responseBody === null) {
    return new IdempotencyConflict({
      message: `A request with the Idempotency-Key "${input.key}" is still running (${existing.requestId}).`,
      param: "Idempotency-Key",
      retryable: true,
      retry_after_seconds: 1,
      guidance: "Wait for the first request to finish, then retry to receive its result."
    })
  }
  return Effect.succeed({
    _tag: "Replay",
    status: existing.responseStatus,
    body: existing.responseBody,
    requestId: existing.requestId
  })
}

/**
 * `Idempotency-Key` (docs/money.md, "Idempotency"): the first request with a key
 * claims it; a finished one is replayed; one still running, or a different
 * body, is a conflict. What the first request answered is kept, its typed
 * errors too (a 402 is replayed, not run and billed after a top-up); a defect
 * and a retryable error that cost nothing free the key (`keptForReplay`). A call cut by shutdown's
 * deadline may have been billed for what it sent: it keeps a non-retryable 504
 * (`Http.ts`), so a retry never runs it twice. A billed call's answer is never
 * lost to its record: the write is retried, in the background once the answer
 * has gone out, and the record's lease is renewed until it is written, so a
 * retry with the key answers 409 until then and the answer after, and never
 * runs the call again. Calls run on without their client (`detach`); shutdown
 * waits for them up to its deadline, then interrupts them (they settle), before
 * the wallet's last flush.
 */
export class Idempotency extends Context.Tag("nenas/Idempotency")<Idempotency, {
  readonly claim: (claim: Claim) => Effect.Effect<Outcome, IdempotencyConflict | SqlError.SqlError>
  /** Stores the answer of the call that holds the key; a call whose key was taken over stores nothing. Never fails. */
  readonly complete: (
    apiKeyId: string,
    key: string,
    requestId: string,
    status: number,
    body: string
  ) => Effect.Effect<void>
  /**
   * Still this request's key, running: its lease is renewed. A key taken over
   * (this process looked dead) answers 409, so that the call is not billed twice.
   */
  readonly confirm: (apiKeyId: string, key: string, requestId: string) => Effect.Effect<void, IdempotencyConflict>
  /** Frees the key of a call that died (a defect, not an answer). Never fails: a record left behind lapses with its lease. */
  readonly abandon: (apiKeyId: string, key: string, requestId: string) => Effect.Effect<void>
  /** Runs a call on whether or not its client waits; shutdown settles it before the last flush. */
  readonly detach: <A, E, R>(call: Effect.Effect<A, E, R>) => Effect.Effect<Fiber.RuntimeFiber<A, E>, never, R>
  /** Shutdown began: detached calls may run until `deadlineMs` (this service's clock), then they are interrupted. */
  readonly drainBy: (deadlineMs: number) => Effect.Effect<void>
}>() {
  static readonly layer = Layer.scoped(
    Idempotency,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const { upstreamTotalTimeoutMs } = yield* AppConfig
      const { holder } = yield* ReservationLeases
      // Records written before leases existed: running after the longest call could take means dead.
      const legacyStaleAfterMs = upstreamTotalTimeoutMs + 60_000
      const lease = sql`now() + ${secondsSql(RESERVATION_LEASE)} * interval '1 second'`
      /** Request ids of the records this process's calls hold; their leases are renewed until written or freed. */
      const running = new Set<string>()

      const claim: (input: Claim) => Effect.Effect<Outcome, IdempotencyConflict | SqlError.SqlError> = Effect
        .fnUntraced(function*(input: Claim) {
          const at = yield* Clock.currentTimeMillis
          const hash = hashOf(input.endpoint, input.body)
          // A running record is taken over only when provably dead: its lease lapsed, or its process is dead.
          const claimed = yield* sql<{ requestId: string }>`
            INSERT INTO idempotency_records (api_key_id, idempotency_key, endpoint, request_hash, request_id, status,
                                             created_at, expires_at, holder, lease_expires_at)
            VALUES (${input.apiKeyId}, ${input.key}, ${input.endpoint}, ${hash}, ${input.requestId}, 'running',
                    ${new Date(at)}, ${new Date(at + Duration.toMillis(RETENTION))}, ${holder}, ${lease})
            ON CONFLICT (api_key_id, idempotency_key) DO UPDATE
              SET endpoint = EXCLUDED.endpoint, request_hash = EXCLUDED.request_hash, request_id = EXCLUDED.request_id,
                  status = 'running', response_status = NULL, response_body = NULL,
                  created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at,
                  holder = EXCLUDED.holder, lease_expires_at = EXCLUDED.lease_expires_at
              WHERE idempotency_records.expires_at <= ${new Date(at)}
                 OR (idempotency_records.status = 'running' AND (
                      idempotency_records.lease_expires_at < now()
                   OR ${holderDead(sql, "idempotency_records.holder", holder)}
                   OR (idempotency_records.lease_expires_at IS NULL
                       AND idempotency_records.created_at < ${new Date(at - legacyStaleAfterMs)})))
            RETURNING request_id
          `
          if (claimed[0]?.requestId === input.requestId) {
            running.add(input.requestId)
            return { _tag: "Claimed" } as const
          }
          const rows = yield* sql<RecordRow>`
            SELECT endpoint, request_hash, request_id, status, response_status, response_body
            FROM idempotency_records WHERE api_key_id = ${input.apiKeyId} AND idempotency_key = ${input.key}
          `
          const existing = rows[0]
          // Freed between our insert and this read (the first call failed): try again.
          if (existing === undefined) return yield* claim(input)
          return yield* judgeExisting(input, hash, existing)
        })

      const sweep = Effect.flatMap(
        Clock.currentTimeMillis,
        (at) => sql`DELETE FROM idempotency_records WHERE expires_at <= ${new Date(at)}`
      )
      yield* Effect.forkScoped(Effect.repeat(
        Effect.catchAllCause(sweep, (cause) => Effect.logWarning("idempotency sweep failed", cause)),
        Schedule.spaced("10 minutes")
      ))

      const renew = Effect.suspend(() =>
        running.size === 0 ? Effect.void : Effect.asVoid(sql`
          UPDATE idempotency_records SET lease_expires_at = ${lease}
          WHERE request_id = ANY(${[...running]}) AND status = 'running'
        `)
      )
      yield* Effect.forkScoped(Effect.repeat(
        Effect.catchAllCause(renew, (cause) => Effect.logWarning("idempotency lease renewal failed", cause)),
        Schedule.spaced(LEASE_RENEWAL)
      ))
      const release = (requestId: string) => Effect.sync(() => void running.delete(requestId))

      /** Calls running on without their client, and completions written after their answer went out. */
      const calls = yield* FiberSet.make<unknown, unknown>()
      const lateWrites = yield* FiberSet.make<void, never>()
      /** Completions not yet written, by request id: the last try at shutdown writes them. */
      const unwritten = new Map<string, Effect.Effect<void, SqlError.SqlError>>()
      let drainDeadline: number | undefined

      const onPath = Schedule.intersect(Schedule.exponential("50 millis"), Schedule.recurs(COMPLETION_TRIES - 1))
      const inBackground = Schedule.union(Schedule.exponential("500 millis"), Schedule.spaced("5 seconds")).pipe(
        Schedule.upTo(COMPLETION_RETRY_FOR)
      )

      /** The rest of a completion's tries, after its answer went out; the lease is renewed until they end. */
      const writeLate = (requestId: string, write: Effect.Effect<void, SqlError.SqlError>) => {
        unwritten.set(requestId, write)
        const done = Effect.zipRight(Effect.sync(() => unwritten.delete(requestId)), release(requestId))
        // Forked from the call's exit (uninterruptible): only the tries may be interrupted, at shutdown, which tries once more.
        return FiberSet.run(
          lateWrites,
          Effect.interruptible(Effect.retry(write, inBackground)).pipe(
            Effect.matchCauseEffect({
              onSuccess: () =>
                Effect.zipRight(Effect.logInfo(`idempotency record of ${requestId} written after its answer`), done),
              onFailure: (cause) =>
                Cause.isInterruptedOnly(cause) ? Effect.void : Effect.zipRight(
                  Effect.logError(
                    `idempotency record of ${requestId} could not be written: a retry with its key may run again`,
                    cause
                  ),
                  done
                )
            })
          )
        )
      }

      const complete = (apiKeyId: string, key: string, requestId: string, status: number, body: string) => {
        const write = Effect.asVoid(sql`
          UPDATE idempotency_records
          SET status = 'completed', response_status = ${status}, response_body = ${body}, lease_expires_at = NULL
          WHERE api_key_id = ${apiKeyId} AND idempotency_key = ${key} AND request_id = ${requestId} AND status = 'running'
        `)
        return write.pipe(
          Effect.retry(onPath),
          Effect.zipRight(release(requestId)),
          Effect.catchAllCause((cause) =>
            Effect.zipRight(
              Effect.logWarning(
                `idempotency record of ${requestId} not written yet; its answer goes out, the write goes on`,
                cause
              ),
              writeLate(requestId, write)
            )
          ),
          Effect.asVoid,
          Effect.uninterruptible
        )
      }

      const abandon = (apiKeyId: string, key: string, requestId: string) =>
        Effect.asVoid(sql`
          DELETE FROM idempotency_records
          WHERE api_key_id = ${apiKeyId} AND idempotency_key = ${key} AND request_id = ${requestId} AND status = 'running'
        `).pipe(
          Effect.retry(onPath),
          // Nothing was billed: a record left behind lapses with its lease, and a retry then runs again.
          Effect.catchAllCause((cause) =>
            Effect.logWarning(`idempotency record of ${requestId} not freed; it lapses with its lease`, cause)
          ),
          Effect.ensuring(release(requestId)),
          Effect.uninterruptible
        )

      const confirm = (apiKeyId: string, key: string, requestId: string) =>
        sql<{ held: number }>`
          UPDATE idempotency_records SET lease_expires_at = ${lease}
          WHERE api_key_id = ${apiKeyId} AND idempotency_key = ${key} AND request_id = ${requestId} AND status = 'running'
          RETURNING 1 AS held
        `.pipe(
          Effect.retry(onPath),
          // The database unreachable: the call is billed as it would have been; only a takeover is refused.
          Effect.catchAllCause((cause) =>
            Effect.as(Effect.logWarning(`idempotency record of ${requestId} not confirmed`, cause), [{ held: 1 }])
          ),
          Effect.flatMap((rows) =>
            rows.length > 0 ? Effect.void : new IdempotencyConflict({
              message:
                `The Idempotency-Key "${key}" was taken over by a retry while this request stalled (${requestId}); ` +
                "it is answered by that retry and billed once.",
              param: "Idempotency-Key",
              retryable: true,
              retry_after_seconds: 1,
              guidance: "Retry with the same Idempotency-Key to receive the result of the request that took it over."
            })
          )
        )

      // Shutdown, before the wallet's last flush: calls finish (or are interrupted, and settle), then unwritten records get a last try.
      yield* Effect.addFinalizer(Effect.fnUntraced(function*() {
        const now = yield* Clock.currentTimeMillis
        const waitMs = Math.max(0, (drainDeadline ?? now + UNDRAINED_GRACE_MS) - now)
        const size = yield* FiberSet.size(calls)
        if (size > 0) yield* Effect.logInfo(`stopping: ${size} calls running on without their client`)
        // A finalizer is uninterruptible: the waits are made interruptible, or their deadlines would not cut them.
        yield* Effect.timeout(Effect.interruptible(FiberSet.awaitEmpty(calls)), Duration.millis(waitMs)).pipe(
          Effect.ignore
        )
        yield* FiberSet.clear(calls)
        yield* FiberSet.clear(lateWrites)
        yield* Effect.forEach([...unwritten.entries()], ([requestId, write]) =>
          Effect.interruptible(write).pipe(
            Effect.timeout(LAST_TRY),
            Effect.catchAllCause((cause) =>
              Effect.logError(`idempotency record of ${requestId} could not be written before stopping`, cause)
            )
          ), { discard: true })
      }))

      return {
        claim,
        complete,
        confirm,
        abandon,
        detach: (call) => FiberSet.run(calls, call),
        drainBy: (deadlineMs: number) =>
          Effect.sync(() => {
            drainDeadline = deadlineMs
          })
      }
    })
  )
}
