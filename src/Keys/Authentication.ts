import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import { Cause, type Clock, Effect, Exit, FiberRef, Layer, Option, Redacted } from "effect"
import { IpLimits } from "../Addresses/IpLimits.js"
import { ApiKeyAuth, type ApiKeyPrincipal } from "../Auth/Api.js"
import {
  AuthenticationError,
  ExpiredApiKey,
  InvalidApiKey,
  keyEditAction,
  PermissionDenied,
  type RateLimitExceeded,
  RevokedApiKey
} from "../Domain/Errors.js"
import { CurrentRequestId, noteRequestFacts } from "../Request/Context.js"
import { hashKey, keyPrefix } from "./ApiKeys.js"
import { KeyCache } from "./KeyCache.js"
import { KeyLastUsed } from "./LastUsed.js"

/** A hint that names the key without revealing it, as OpenAI's "sk-abc***" does. */
const describe = (key: string): string => key.startsWith("nns_") ? `${keyPrefix(key)}…` : "(not a nenas key)"

/** The previous secret of a rotated key, past its grace period (if it had one): the key lives on under its new secret. */
const rotatedOut = (key: string, keyId: string) =>
  new RevokedApiKey({
    message: `The API key ${describe(key)} was rotated, and the grace period of this old secret has ended.`,
    guidance:
      "This secret was replaced when the key was rotated; use the key's new secret (shown once at rotation), or rotate it again in the dashboard.",
    action: keyEditAction(keyId)
  })

type AuthFailure = AuthenticationError | InvalidApiKey | ExpiredApiKey | RevokedApiKey | PermissionDenied

/**
 * The outcome of authenticating a request's key before its body was read
 * (`authenticateBeforeBody`), for the API's own middleware to answer with
 * instead of looking the key up again. Marked with the request id and the
 * key, so that it never answers for another request or another key.
 */
const EarlyOutcome = FiberRef.unsafeMake<
  | { readonly requestId: string; readonly key: string; readonly exit: Exit.Exit<ApiKeyPrincipal, AuthFailure> }
  | undefined
>(undefined)

/**
 * The key's row and its checks; `clock` is the service's, read directly (no fiber steps on every request). One
 * generator function for every call (`Effect.fnUntraced`), not one made per call (docs/performance.md, "What kept a request's objects through young collections").
 */
const lookupWith = Effect.fnUntraced(
  function*(keys: KeyCache["Type"], lastUsed: KeyLastUsed["Type"], clock: Clock.Clock, key: string) {
    if (key.length === 0) {
      return yield* new AuthenticationError({
        message: "Missing API key. Send `Authorization: Bearer <API_KEY>`."
      })
    }
    const found = yield* keys.lookup(hashKey(key))
    if (found._tag === "Revoked") {
      return yield* found.rotatedOf === null
        ? new RevokedApiKey({ message: `The API key ${describe(key)} was deleted.` })
        : rotatedOut(key, found.rotatedOf)
    }
    if (found._tag === "Unknown") {
      return yield* new InvalidApiKey({ message: `Invalid API key provided: ${describe(key)}` })
    }
    const at = new Date(clock.unsafeCurrentTimeMillis())
    const { key: row } = found
    // The previous secret of a rotated key, remembered from within its grace period.
    if (found.graceUntil !== null && found.graceUntil <= at) return yield* rotatedOut(key, row.id)
    if (row.disabledAt !== null) {
      return yield* new PermissionDenied({
        message: `The API key ${row.prefix}… is disabled.`,
        guidance: "This API key is disabled; enable it again in the dashboard, or use another key.",
        action: keyEditAction(row.id)
      })
    }
    if (row.expiresAt !== null && row.expiresAt <= at) {
      return yield* new ExpiredApiKey({
        message: `The API key ${row.prefix}… expired at ${row.expiresAt.toISOString()}.`
      })
    }
    yield* lastUsed.touch(row.id, at)
    yield* noteRequestFacts({ keyId: row.id, accountId: row.accountId })
    return {
      keyId: row.id,
      accountId: row.accountId,
      environment: row.environment,
      monthlySpendLimitMicroMyr: row.monthlySpendLimitMicroMyr,
      memberId: row.memberId,
      memberMonthlySpendLimitMicroMyr: found.memberMonthlySpendLimitMicroMyr,
      accountSuspended: found.accountSuspended,
      rateLimitRpm: row.rateLimitRpm,
      rateLimitConcurrent: row.rateLimitConcurrent,
      accountGuardrails: found.accountGuardrails,
      keyGuardrails: row.guardrails,
      cacheTtlSeconds: row.cacheTtlSeconds
    }
  }
)

/** `Bearer ` in any letter case, as RFC 9110 reads an auth scheme. */
const BEARER = /^bearer /i

/**
 * The API key a request presents: `Authorization: Bearer`, else Anthropic's `x-api-key` header (Claude Code may
 * send both). Another scheme (`Basic …`, a proxy's own credential) names no key of ours, so it hides no `x-api-key`.
 */
export const presentedKey = (headers: Readonly<Record<string, string | undefined>>): string => {
  const authorization = headers["authorization"] ?? ""
  const bearer = BEARER.test(authorization) ? authorization.slice("Bearer ".length) : ""
  return bearer !== "" ? bearer : headers["x-api-key"] ?? ""
}

export const ApiKeyAuthLive = Layer.effect(
  ApiKeyAuth,
  Effect.gen(function*() {
    const keys = yield* KeyCache
    const lastUsed = yield* KeyLastUsed
    const clock = yield* Effect.clock
    return ApiKeyAuth.of({
      apiKey: Effect.fnUntraced(function*(_token: Redacted.Redacted<string>) {
        // The request's own headers, not the platform's bearer slice, which cuts any scheme's first 7 characters off.
        const key = presentedKey((yield* HttpServerRequest.HttpServerRequest).headers)
        const early = yield* FiberRef.get(EarlyOutcome)
        if (early !== undefined && early.key === key && early.requestId === (yield* FiberRef.get(CurrentRequestId))) {
          return yield* early.exit
        }
        return yield* lookupWith(keys, lastUsed, clock, key)
      })
    })
  })
)

/**
 * Authenticates the request's API key before anything reads its body, so
 * that a request without a valid key costs a lookup, not 8 MiB of reading.
 * A client address that failed `IP_AUTH_FAILURES_PER_MINUTE` times this
 * minute is refused (429) unless its key is genuine: a valid key is never
 * refused by the limit (a neighbour behind one NAT, or someone who guessed
 * for a while, must not lock its holder out). What cannot be a key is refused
 * with no lookup at all. The API's middleware then answers with this outcome; the key found is returned,
 * for the guard to admit the request under its limits before the body is read.
 */
export const makeAuthenticateBeforeBody = Effect.gen(function*() {
  // Looked up, not required: the error middleware also serves APIs without keys (tests' small APIs).
  const [keys, lastUsed, limits] = yield* Effect.all([
    Effect.serviceOption(KeyCache),
    Effect.serviceOption(KeyLastUsed),
    Effect.serviceOption(IpLimits)
  ])
  if (Option.isNone(keys) || Option.isNone(lastUsed) || Option.isNone(limits)) {
    return yield* Effect.dieMessage(
      "API-key endpoints need KeyCache, KeyLastUsed and IpLimits under the error middleware."
    )
  }
  const authenticate = authenticating(keys.value, lastUsed.value, yield* Effect.clock, limits.value)
  // A span only while traces are exported: a span nobody reads still costs a copy of the request's context.
  return (yield* FiberRef.get(FiberRef.currentTracerEnabled))
    ? Effect.withSpan(authenticate, "auth.before_body")
    : authenticate
})

/** What every key ever issued looks like (`generateKey`; docs/security.md, "Security": 32 or more base62 characters). */
const KEY_SHAPE = /^nns_(?:live|test)_[0-9A-Za-z]{32,}$/

/** A refusal that names a real key: its holder is known, so the per-address limit does not stand in its way. */
const isGenuine = (failure: AuthFailure): boolean =>
  failure._tag === "PermissionDenied" || failure._tag === "ExpiredApiKey"

const authenticating = (
  keys: KeyCache["Type"],
  lastUsed: KeyLastUsed["Type"],
  clock: Clock.Clock,
  limits: IpLimits["Type"]
) =>
  // eslint-disable-next-line nenas/no-gen-in-arrow -- built once, with the middleware; the Effect runs per request
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const address = yield* limits.client
    // The refusal the address has earned this minute, if any.
    const over = yield* Effect.option(Effect.flip(limits.check("authFailures", address)))
    const key = presentedKey(request.headers)
    if (Option.isSome(over) && !KEY_SHAPE.test(key)) return yield* over.value
    const exit = yield* Effect.exit(lookupWith(keys, lastUsed, clock, key))
    const refused = Exit.isFailure(exit) ? Cause.failureOption(exit.cause) : Option.none()
    // Past the limit, only a genuine key (one that names a key, disabled or expired included) gets its own answer.
    if (Option.isSome(over) && Option.isSome(refused) && !isGenuine(refused.value)) return yield* over.value
    const requestId = yield* FiberRef.get(CurrentRequestId)
    yield* FiberRef.set(EarlyOutcome, { requestId, key, exit })
    // Only a refused key counts: a lookup that failed (the database away) says nothing of the client.
    if (Option.isNone(over) && Option.isSome(refused)) yield* limits.count("authFailures", address)
    return yield* exit
  }) satisfies Effect.Effect<
    ApiKeyPrincipal,
    AuthFailure | RateLimitExceeded,
    HttpServerRequest.HttpServerRequest
  >
