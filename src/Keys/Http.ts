import { HttpApiBuilder } from "@effect/platform"
import { Clock, DateTime, Effect, Option } from "effect"
import { NenasApi } from "../Api.js"
import { CurrentAccount } from "../Auth/Api.js"
import { InvalidRequest, NotFound } from "../Domain/Errors.js"
import { newId } from "../Domain/Ids.js"
import { fromMyr } from "../Domain/Money.js"
import type { ApiKeyRecord } from "./Api.js"
import { generateKey, hashKey, keyPrefix } from "./ApiKeys.js"
import { KeyCache } from "./KeyCache.js"
import { KeyLastUsed } from "./LastUsed.js"
import { type KeyRow, KeysRepo } from "./Repo.js"

const WARNING = "Store this key now: it is shown only once and cannot be recovered. Anyone holding it can spend your balance."

const later = (a: Date | null, b: Option.Option<Date>): Date | null =>
  Option.match(b, { onNone: () => a, onSome: (p) => a === null || p > a ? p : a })

const toRecord = (row: KeyRow, now: Date, pendingUse: Option.Option<Date>): ApiKeyRecord => {
  const lastUsed = later(row.lastUsedAt, pendingUse)
  return {
    id: row.id,
    name: row.name,
    prefix: row.prefix,
    environment: row.environment,
    status: row.expiresAt !== null && row.expiresAt <= now ? "expired" : "active",
    created_at: row.createdAt.toISOString(),
    last_used_at: lastUsed?.toISOString() ?? null,
    monthly_spend_limit_micro_myr: row.monthlySpendLimitMicroMyr,
    expires_at: row.expiresAt?.toISOString() ?? null
  }
}

export const KeysLive = HttpApiBuilder.group(NenasApi, "apiKeys", (handlers) =>
  Effect.gen(function*() {
    const repo = yield* KeysRepo
    const cache = yield* KeyCache
    const lastUsed = yield* KeyLastUsed
    const now = Effect.map(Clock.currentTimeMillis, (ms) => new Date(ms))
    return handlers
      .handle("create", ({ payload }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const at = yield* now
          const expiresAt = payload.expires_at === undefined ? null : DateTime.toDate(payload.expires_at)
          if (expiresAt !== null && expiresAt <= at) {
            return yield* new InvalidRequest({ message: "'expires_at' must be in the future.", param: "expires_at" })
          }
          const fullKey = generateKey(payload.environment)
          const row = yield* repo.create({
            id: newId("key"),
            accountId: account.id,
            name: payload.name,
            prefix: keyPrefix(fullKey),
            environment: payload.environment,
            keyHash: hashKey(fullKey),
            monthlySpendLimitMicroMyr: payload.monthly_spend_limit_myr === undefined
              ? null
              : fromMyr(payload.monthly_spend_limit_myr),
            expiresAt
          }).pipe(
            Effect.catchTag("TooManyKeys", ({ limit }) =>
              new InvalidRequest({ message: `An account can have at most ${limit} API keys; delete one first.` })),
            Effect.catchTag("SqlError", Effect.die)
          )
          return { key: toRecord(row, at, Option.none()), full_key: fullKey, warning: WARNING }
        }))
      .handle("list", () =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const at = yield* now
          const rows = yield* Effect.orDie(repo.list(account.id))
          return { keys: rows.map((row) => toRecord(row, at, lastUsed.pending(row.id))) }
        }))
      .handle("delete", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const deleted = yield* Effect.orDie(repo.remove(account.id, path.id))
          if (!deleted) return yield* new NotFound({ message: `No API key with id '${path.id}'.`, param: "id" })
          // Every instance hears of it within moments; this one knows at once.
          yield* cache.forgetAccount(account.id)
          return { ok: true } as const
        }))
  }))
