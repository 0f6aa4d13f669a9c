import { Clock, Effect, Layer, Redacted } from "effect"
import { ApiKeyAuth } from "../Auth/Api.js"
import { AuthenticationError, ExpiredApiKey, InvalidApiKey, RevokedApiKey } from "../Domain/Errors.js"
import { noteRequestFacts } from "../Request/Context.js"
import { hashKey, keyPrefix } from "./ApiKeys.js"
import { KeyCache } from "./KeyCache.js"
import { KeyLastUsed } from "./LastUsed.js"

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
