import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import { DateTime, Effect, Option } from "effect"
import { NenasApi } from "../Api.js"
import { AppConfig } from "../AppConfig.js"
import { AuditLog } from "../Audit/Repo.js"
import { CurrentAccount } from "../Auth/Api.js"
import type { SignedIn } from "../Domain/Account.js"
import { IdempotencyConflict, InvalidRequest, NotFound } from "../Domain/Errors.js"
import { newId } from "../Domain/Ids.js"
import { fromMyr } from "../Domain/Money.js"
import { keyChangeRefusal } from "../Domain/Roles.js"
import { now } from "../Domain/Time.js"
import type { GuardrailOverride } from "../Guardrails/Api.js"
import { allOff } from "../Guardrails/Api.js"
import { checkedFilters, effectivePolicy, loosenedParts } from "../Guardrails/Policy.js"
import { GuardrailsRepo } from "../Guardrails/Repo.js"
import { Spending } from "../Wallet/Spending.js"
import type { ApiKeyRecord } from "./Api.js"
import {
  effectiveRateLimits,
  generateKey,
  hashKey,
  keyPrefix,
  MAX_KEYS_PER_DEVELOPER,
  MIN_ROTATION_IDEMPOTENCY_KEY,
  rateLimitCeilings,
  ROTATION_REPEAT_SECONDS,
  rotationToken
} from "./ApiKeys.js"
import { loosened, loosenedRefusal, recordedControls } from "./Controls.js"
import { KeyCache } from "./KeyCache.js"
import { KeyLastUsed } from "./LastUsed.js"
import { type KeyRow, KeysRepo } from "./Repo.js"
import { RotationSeal } from "./RotationSeal.js"

const WARNING =
  "Store this key now: it is shown only once and cannot be recovered. Anyone holding it can spend your balance."

const later = (a: Date | null, b: Option.Option<Date>): Date | null =>
  Option.match(b, { onNone: () => a, onSome: (p) => a === null || p > a ? p : a })

type Limits = Parameters<typeof effectiveRateLimits>[0]

const statusOf = (row: KeyRow, now: Date): ApiKeyRecord["status"] =>
  row.disabledAt !== null ? "disabled" : row.expiresAt !== null && row.expiresAt <= now ? "expired" : "active"

const toRecord = (
  limits: Limits,
  row: KeyRow,
  now: Date,
  pendingUse: Option.Option<Date>,
  spentThisMonth: ReadonlyMap<string, number>
): ApiKeyRecord => {
  const lastUsed = later(row.lastUsedAt, pendingUse)
  const rate = effectiveRateLimits(limits, row)
  return {
    id: row.id,
    name: row.name,
    prefix: row.prefix,
    environment: row.environment,
    status: statusOf(row, now),
    created_at: row.createdAt.toISOString(),
    last_used_at: lastUsed?.toISOString() ?? null,
    monthly_spend_limit_micro_myr: row.monthlySpendLimitMicroMyr,
    month_to_date_spend_micro_myr: spentThisMonth.get(row.id) ?? 0,
    expires_at: row.expiresAt?.toISOString() ?? null,
    rate_limit_rpm: rate.rpm,
    rate_limit_concurrent: rate.concurrent,
    member_id: row.memberId,
    guardrails: row.guardrails === null ? null : JSON.parse(row.guardrails) as GuardrailOverride,
    cache_ttl_seconds: row.cacheTtlSeconds
  }
}

/** A per-key rate limit above the operator's ceiling is refused, naming the field. */
const withinCeilings = (
  limits: Limits,
  asked: {
    readonly rate_limit_rpm?: number | null | undefined
    readonly rate_limit_concurrent?: number | null | undefined
  }
) =>
  Effect.gen(function*() {
    const ceilings = rateLimitCeilings(limits)
    if (asked.rate_limit_rpm != null && asked.rate_limit_rpm > ceilings.rpm) {
      return yield* new InvalidRequest({
        message: `'rate_limit_rpm' may be at most ${ceilings.rpm} (the operator's ceiling).`,
        param: "rate_limit_rpm"
      })
    }
    if (asked.rate_limit_concurrent != null && asked.rate_limit_concurrent > ceilings.concurrent) {
      return yield* new InvalidRequest({
        message: `'rate_limit_concurrent' may be at most ${ceilings.concurrent} (the operator's ceiling).`,
        param: "rate_limit_concurrent"
      })
    }
  })

const noSuchKey = (id: string) => new NotFound({ message: `No API key with id '${id}'.`, param: "id" })

/**
 * The account's key `id`, when the signed-in member may change it: a developer changes only the keys it made
 * (docs/api/teams.md, "Teams"); owners and admins change any.
 */
const changeable = (repo: KeysRepo["Type"], account: SignedIn, id: string) =>
  Effect.gen(function*() {
    const found = (yield* repo.list(account.id)).find((row) => row.id === id)
    if (found === undefined) return yield* noSuchKey(id)
    const refusal = keyChangeRefusal(account.member, id, found.memberId)
    if (refusal !== undefined) return yield* refusal
    return found
  })

/** What an audit entry of a key change says about it: the fields given, never its secret. */
const keyDetails = (row: KeyRow, given: object) => ({
  name: row.name,
  environment: row.environment,
  ...Object.fromEntries(
    Object.entries(given).map((
      [field, value]
    ) => [field, DateTime.isDateTime(value) ? DateTime.formatIso(value) : value])
  )
})

export const KeysLive = HttpApiBuilder.group(NenasApi, "apiKeys", (handlers) =>
  Effect.gen(function*() {
    const repo = yield* KeysRepo
    const cache = yield* KeyCache
    const lastUsed = yield* KeyLastUsed
    const spending = yield* Spending
    const limits = yield* AppConfig
    const seals = yield* RotationSeal
    const audit = yield* AuditLog
    const guardrails = yield* GuardrailsRepo
    return handlers
      .handle("create", ({ payload }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const at = yield* now
          const expiresAt = payload.expires_at === undefined ? null : DateTime.toDate(payload.expires_at)
          if (expiresAt !== null && expiresAt <= at) {
            return yield* new InvalidRequest({ message: "'expires_at' must be in the future.", param: "expires_at" })
          }
          yield* withinCeilings(limits, payload)
          const fullKey = generateKey(payload.environment)
          const row = yield* audit.within(
            repo.create({
              id: newId("key"),
              accountId: account.id,
              memberId: account.member.id,
              name: payload.name,
              prefix: keyPrefix(fullKey),
              environment: payload.environment,
              keyHash: hashKey(fullKey),
              monthlySpendLimitMicroMyr: payload.monthly_spend_limit_myr === undefined
                ? null
                : fromMyr(payload.monthly_spend_limit_myr),
              expiresAt,
              rateLimitRpm: payload.rate_limit_rpm ?? null,
              rateLimitConcurrent: payload.rate_limit_concurrent ?? null,
              cacheTtlSeconds: payload.cache_ttl_seconds ?? null
            }, account.member.role === "developer" ? MAX_KEYS_PER_DEVELOPER : undefined),
            (created) => ({
              action: "api_key.created",
              targetType: "api_key",
              targetId: created.id,
              details: keyDetails(created, payload)
            })
          ).pipe(
            Effect.catchTag("TooManyKeys", ({ limit, of }) =>
              new InvalidRequest({
                message: of === "account"
                  ? `An account can have at most ${limit} API keys; delete one first.`
                  : `A developer can have at most ${limit} of the account's API keys; delete one of yours first, or ask an owner or admin.`
              }))
          )
          return { key: toRecord(limits, row, at, Option.none(), new Map()), full_key: fullKey, warning: WARNING }
        }))
      .handle("list", () =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const at = yield* now
          const rows = yield* repo.list(account.id)
          const spent = yield* spending.spentThisMonth(account.id)
          return { keys: rows.map((row) => toRecord(limits, row, at, lastUsed.pending(row.id), spent)) }
        }))
      .handle("update", ({ path, payload }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const at = yield* now
          const expiresAt = payload.expires_at == null ? payload.expires_at : DateTime.toDate(payload.expires_at)
          if (expiresAt != null && expiresAt <= at) {
            return yield* new InvalidRequest({ message: "'expires_at' must be in the future.", param: "expires_at" })
          }
          yield* withinCeilings(limits, payload)
          const limit = payload.monthly_spend_limit_myr
          const controls = {
            disabled: payload.disabled,
            monthlySpendLimitMicroMyr: limit === undefined || limit === null ? limit : fromMyr(limit),
            rateLimitRpm: payload.rate_limit_rpm,
            rateLimitConcurrent: payload.rate_limit_concurrent
          }
          const override = payload.guardrails
          if (override?.filters !== undefined) yield* checkedFilters(override.filters, "guardrails.filters")
          // Owners and admins change any key of the account: only a developer's is read first, and held to what they set.
          if (account.member.role === "developer") {
            const found = yield* changeable(repo, account, path.id)
            const held = yield* repo.adminControls(account.id, path.id)
            const loose = loosened(Object.assign({ disabled: found.disabledAt !== null }, found), held, controls)
            if (loose.length > 0) return yield* loosenedRefusal(path.id, loose)
            if (override !== undefined) {
              // A developer may tighten the account's policy (and an override an owner or admin set), never loosen it.
              const account_ = (yield* Effect.orDie(guardrails.find(account.id)))?.policy ?? allOff
              const current = found.guardrails === null ? null : JSON.parse(found.guardrails) as GuardrailOverride
              const floor = effectivePolicy(account_, held.includes("guardrails") ? current : null)
              const parts = loosenedParts(floor, effectivePolicy(account_, override))
              if (parts.length > 0) {
                return yield* loosenedRefusal(path.id, parts.map((part) => `guardrails.${part}` as const))
              }
            }
          }
          const recorded = recordedControls(controls)
          const guardrailsRecord = override === undefined
            ? recorded
            : override === null
            ? { add: recorded.add, drop: [...recorded.drop, "guardrails" as const] }
            : { add: [...recorded.add, "guardrails" as const], drop: recorded.drop }
          const row = yield* audit.within(
            repo.update(account.id, path.id, {
              ...(payload.name === undefined ? {} : { name: payload.name }),
              ...(limit === undefined ? {} : { monthlySpendLimitMicroMyr: limit === null ? null : fromMyr(limit) }),
              ...(expiresAt === undefined ? {} : { expiresAt }),
              ...(payload.disabled === undefined ? {} : { disabled: payload.disabled }),
              ...(payload.rate_limit_rpm === undefined ? {} : { rateLimitRpm: payload.rate_limit_rpm }),
              ...(payload.rate_limit_concurrent === undefined
                ? {}
                : { rateLimitConcurrent: payload.rate_limit_concurrent }),
              ...(override === undefined ? {} : { guardrails: override === null ? null : JSON.stringify(override) }),
              ...(payload.cache_ttl_seconds === undefined ? {} : { cacheTtlSeconds: payload.cache_ttl_seconds })
            }, account.member.role === "developer" ? undefined : guardrailsRecord),
            (updated) =>
              updated === undefined
                ? undefined
                : {
                  action: "api_key.updated",
                  targetType: "api_key",
                  targetId: updated.id,
                  details: keyDetails(updated, payload)
                }
          )
          if (row === undefined) return yield* noSuchKey(path.id)
          // Every instance hears of it through the key's NOTIFY within moments; this one knows at once.
          yield* cache.forgetAccount(account.id)
          // The new limit counts what the key's calls on credit grants hold, on every instance, before this answers.
          if (typeof limit === "number") yield* spending.limitSet(account.id, row.id)
          const spent = yield* spending.spentThisMonth(account.id)
          return toRecord(limits, row, at, lastUsed.pending(row.id), spent)
        }))
      .handle("rotate", ({ headers, path, payload }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const at = yield* now
          const idempotencyKey = headers["idempotency-key"]
          if (idempotencyKey !== undefined && idempotencyKey.length < MIN_ROTATION_IDEMPOTENCY_KEY) {
            return yield* new InvalidRequest({
              message:
                `A rotation's Idempotency-Key must be at least ${MIN_ROTATION_IDEMPOTENCY_KEY} characters (a random one, such as a UUID).`,
              param: "Idempotency-Key"
            })
          }
          const current = yield* changeable(repo, account, path.id)
          const fullKey = generateKey(current.environment)
          const rotated = yield* audit.within(
            repo.rotate(account.id, path.id, {
              keyHash: hashKey(fullKey),
              prefix: keyPrefix(fullKey),
              graceSeconds: payload.grace_seconds,
              repeat: idempotencyKey === undefined ? null : {
                tokenHash: rotationToken(path.id, idempotencyKey),
                sealed: seals.seal(path.id, idempotencyKey, fullKey)
              }
            }, ROTATION_REPEAT_SECONDS),
            (result) =>
              // A repeat of the same rotation changed nothing: its entry is the first one's.
              result === undefined || result.repeatOf !== null ? undefined : {
                action: "api_key.rotated",
                targetType: "api_key",
                targetId: result.row.id,
                details: keyDetails(result.row, { grace_seconds: payload.grace_seconds })
              }
          )
          if (rotated === undefined) return yield* noSuchKey(path.id)
          const answered = rotated.repeatOf === null || idempotencyKey === undefined
            ? fullKey
            : seals.open(path.id, idempotencyKey, rotated.repeatOf)
          // Sealed under another server secret (an instance without the shared ROTATION_SEAL_SECRET): done, not shown again.
          if (answered === undefined) {
            return yield* new IdempotencyConflict({
              message: "This rotation was already made, and its new secret cannot be shown again here. " +
                "Rotate again with a new Idempotency-Key."
            })
          }
          yield* cache.forgetAccount(account.id)
          const spent = yield* spending.spentThisMonth(account.id)
          return {
            key: toRecord(limits, rotated.row, at, lastUsed.pending(rotated.row.id), spent),
            full_key: answered,
            previous_key_valid_until: rotated.graceUntil !== null && rotated.graceUntil > at
              ? rotated.graceUntil.toISOString()
              : null,
            warning: WARNING
          }
        }))
      .handle("delete", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const key = yield* changeable(repo, account, path.id)
          const deleted = yield* audit.within(
            repo.remove(account.id, path.id),
            (removed) =>
              removed
                ? { action: "api_key.deleted", targetType: "api_key", targetId: path.id, details: keyDetails(key, {}) }
                : undefined
          )
          if (!deleted) return yield* noSuchKey(path.id)
          // Every instance hears of it within moments; this one knows at once.
          yield* cache.forgetAccount(account.id)
          return { ok: true } as const
        }))
  }))
