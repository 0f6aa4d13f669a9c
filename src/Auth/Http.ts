import { HttpApiBuilder } from "@effect/platform"
import { Clock, Effect, Layer, Option, Redacted } from "effect"
import { AccountsRepo } from "../Accounts/Repo.js"
import { NenasApi } from "../Api.js"
import { AuthenticationError, ExpiredApiKey, InvalidApiKey, NotFound, RevokedApiKey } from "../Domain/Errors.js"
import { noteRequestFacts } from "../Http/RequestContext.js"
import { hashKey, keyPrefix } from "../Keys/ApiKeys.js"
import { KeyCache } from "../Keys/KeyCache.js"
import { KeyLastUsed } from "../Keys/LastUsed.js"
import { ApiKeyAuth, DashboardAuth } from "./Api.js"
import { IdentityProvider } from "./IdentityProvider.js"

export const DashboardAuthLive = Layer.effect(
  DashboardAuth,
  Effect.gen(function*() {
    const identity = yield* IdentityProvider
    const accounts = yield* AccountsRepo
    return DashboardAuth.of({
      sessionToken: (token) =>
        identity.verify(Redacted.value(token)).pipe(
          Effect.flatMap((who) => Effect.orDie(accounts.signIn(who))),
          Effect.tap((account) => noteRequestFacts({ accountId: account.id }))
        )
    })
  })
)

/** A hint that names the key without revealing it, as OpenAI's "sk-abc***" does. */
const describe = (key: string): string => key.startsWith("nns_") ? `${keyPrefix(key)}…` : "(not a nenas key)"

export const ApiKeyAuthLive = Layer.effect(
  ApiKeyAuth,
  Effect.gen(function*() {
    const keys = yield* KeyCache
    const lastUsed = yield* KeyLastUsed
    return ApiKeyAuth.of({
      apiKey: (token) =>
        Effect.gen(function*() {
          const key = Redacted.value(token)
          if (key.length === 0) {
            return yield* new AuthenticationError({
              message: "Missing API key. Send `Authorization: Bearer <API_KEY>`."
            })
          }
          const found = yield* Effect.orDie(keys.lookup(hashKey(key)))
          if (found._tag === "Revoked") {
            return yield* new RevokedApiKey({ message: `The API key ${describe(key)} was deleted.` })
          }
          if (found._tag === "Unknown") {
            return yield* new InvalidApiKey({ message: `Invalid API key provided: ${describe(key)}` })
          }
          const now = new Date(yield* Clock.currentTimeMillis)
          const { key: row } = found
          if (row.expiresAt !== null && row.expiresAt <= now) {
            return yield* new ExpiredApiKey({
              message: `The API key ${row.prefix}… expired at ${row.expiresAt.toISOString()}.`
            })
          }
          yield* lastUsed.touch(row.id, now)
          yield* noteRequestFacts({ keyId: row.id, accountId: row.accountId })
          return {
            keyId: row.id,
            accountId: row.accountId,
            environment: row.environment,
            monthlySpendLimitMicroMyr: row.monthlySpendLimitMicroMyr,
            accountSuspended: found.accountSuspended
          }
        })
    })
  })
)

export const DevIdentityLive = HttpApiBuilder.group(NenasApi, "devIdentity", (handlers) =>
  Effect.gen(function*() {
    const { dev } = yield* IdentityProvider
    const notConfigured = new NotFound({
      message: "The development identity provider is off: an identity provider is configured."
    })
    return handlers
      .handle("createSession", ({ payload }) =>
        Option.match(dev, {
          onNone: () => Effect.fail(notConfigured),
          onSome: (d) => Effect.map(d.issue(payload), (token) => ({ token }))
        }))
      .handle("jwks", () =>
        Option.match(dev, {
          onNone: () => Effect.fail(notConfigured),
          onSome: (d) => Effect.succeed({ keys: d.jwks.keys as ReadonlyArray<Record<string, unknown>> })
        }))
  }))
