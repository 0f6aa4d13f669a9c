import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import { Effect, Either, Layer } from "effect"
import { NenasApi } from "../Api.js"
import { AppConfig } from "../AppConfig.js"
import { AuditLog } from "../Audit/Repo.js"
import { CurrentAccount } from "../Auth/Api.js"
import { InvalidRequest, NotFound, RateLimitExceeded } from "../Domain/Errors.js"
import { newId } from "../Domain/Ids.js"
import { HostResolver } from "../Search/Fetch.js"
import type { ProviderKeyRecord } from "./Api.js"
import { baseUrlText, NOT_ALLOWED, parseBaseUrl } from "./BaseUrl.js"
import { checkProvider } from "./ProviderCheck.js"
import { ProviderKeysRefresh } from "./ProviderKeys.js"
import { MAX_PROVIDER_KEYS, type ProviderKeyRow, ProviderKeysRepo, type SealedKey } from "./Repo.js"
import { ProviderKeySecrets } from "./SecretBox.js"

/** A key's last four characters, only when they leave most of it unsaid. */
const last4Of = (apiKey: string): string => apiKey.length > 8 ? apiKey.slice(-4) : ""

const toRecord = (row: ProviderKeyRow): ProviderKeyRecord => ({
  id: row.id,
  name: row.name,
  base_url: row.baseUrl,
  models: row.models,
  mode: row.mode,
  last4: row.last4,
  status: row.status,
  last_error: row.lastError,
  created_at: row.createdAt.toISOString()
})

const noSuchKey = (id: string) => new NotFound({ message: `No provider key with id '${id}'.`, param: "id" })

const tooMany = new InvalidRequest({
  message: `An account can have at most ${MAX_PROVIDER_KEYS} provider keys; delete one first.`
})

const baseUrlOf = (raw: string) =>
  Either.match(parseBaseUrl(raw), {
    onLeft: (reason) =>
      Effect.fail(new InvalidRequest({ message: `Invalid 'base_url': ${reason}.`, param: "base_url" })),
    onRight: Effect.succeed
  })

/** The most checks of provider keys (each an outbound request) one account makes per minute on an instance. */
export const CHECKS_PER_MINUTE = 10
const MINUTE_MS = 60_000
/** The most accounts the pace keeps at once; past it, those without a check in the last minute are forgotten. */
const PACED_ACCOUNTS_MAX = 10_000

/**
 * Each account's checks in the last minute: a check past `CHECKS_PER_MINUTE` is refused before any request goes
 * out, so that saving keys in a loop cannot make this instance a request cannon.
 */
const makeCheckPace = () => {
  const recent = new Map<string, ReadonlyArray<number>>()
  return (accountId: string, now: number) =>
    Effect.suspend(() => {
      const within = (recent.get(accountId) ?? []).filter((at) => at > now - MINUTE_MS)
      const oldest = within[0]
      if (within.length >= CHECKS_PER_MINUTE && oldest !== undefined) {
        return Effect.fail(
          new RateLimitExceeded({
            message: `At most ${CHECKS_PER_MINUTE} provider key checks a minute per account.`,
            retry_after_seconds: Math.max(1, Math.ceil((oldest + MINUTE_MS - now) / 1000))
          })
        )
      }
      if (recent.size >= PACED_ACCOUNTS_MAX) {
        for (const [id, times] of recent) if (times.every((at) => at <= now - MINUTE_MS)) recent.delete(id)
      }
      recent.set(accountId, [...within, now])
      return Effect.void
    })
}

export const ProviderKeysLive = HttpApiBuilder.group(NenasApi, "providerKeys", (handlers) =>
  Effect.gen(function*() {
    const repo = yield* ProviderKeysRepo
    const { current, previous } = yield* ProviderKeySecrets
    const refresh = yield* ProviderKeysRefresh
    const audit = yield* AuditLog
    const config = yield* AppConfig
    const resolver = yield* HostResolver
    const paced = makeCheckPace()
    const clock = yield* Effect.clock
    const pace = (accountId: string) => paced(accountId, clock.unsafeCurrentTimeMillis())

    const seal = (id: string, accountId: string, apiKey: string): SealedKey => ({
      secret: current.seal(id, accountId, apiKey),
      secretKeyId: current.keyId,
      last4: last4Of(apiKey)
    })

    /**
     * The address guard, then `GET {base_url}/models` with the key. Its answer never says what the host resolves
     * to (the log does), nor anything of the key.
     */
    const checked = (url: URL, apiKey: string) =>
      Effect.flatMap(checkProvider(resolver, config.providerAllowedHosts, url, apiKey), (outcome) => {
        const models = `GET ${baseUrlText(url)}/models`
        switch (outcome._tag) {
          case "Accepted":
            return Effect.void
          case "Refused":
            return Effect.fail(
              new InvalidRequest({
                message: `The provider refused the API key: ${models} answered HTTP ${outcome.status}.`,
                param: "api_key",
                guidance: "Check the key at the provider (revoked, mistyped, or without access to its models), " +
                  "then send it again."
              })
            )
          case "Answered":
            return Effect.fail(
              new InvalidRequest({
                message: `The provider did not take the check: ${models} answered HTTP ${outcome.status}.`,
                param: "base_url",
                guidance: "base_url is the root of an OpenAI-compatible API, where /models and /chat/completions " +
                  "are (it ends in /v1 for most providers)."
              })
            )
          case "Unreachable":
            return Effect.fail(
              new InvalidRequest({
                message: `The provider could not be reached at base_url: ${outcome.reason}.`,
                param: "base_url",
                guidance: "Check base_url, and that the provider is up; then send it again."
              })
            )
          case "NotAllowed":
            return Effect.zipRight(
              Effect.logInfo(`provider key base_url refused: ${baseUrlText(url)}: ${outcome.reason}`),
              Effect.fail(
                new InvalidRequest({
                  message: `The base_url is refused: ${NOT_ALLOWED}.`,
                  param: "base_url",
                  guidance: "Use the provider's public https URL. A provider on this machine or a private network " +
                    "must be listed in PROVIDER_ALLOWED_HOSTS by the operator."
                })
              )
            )
        }
      })

    /** The stored key opened, for a check of a new base URL with it. */
    const storedKey = (row: ProviderKeyRow) => {
      const box = row.secretKeyId === current.keyId ? current : previous
      const opened = box?.keyId === row.secretKeyId ? box.open(row.id, row.accountId, row.secret) : undefined
      return opened === undefined
        ? Effect.fail(
          new InvalidRequest({
            message: "The stored API key cannot be opened (the server secret changed); send api_key with base_url.",
            param: "api_key"
          })
        )
        : Effect.succeed(opened)
    }

    return handlers
      .handle("list", () =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          return { provider_keys: (yield* repo.list(account.id)).map(toRecord) }
        }))
      .handle("create", ({ payload }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const url = yield* baseUrlOf(payload.base_url)
          // Refused before any outbound request; the repository counts again under the account's lock.
          if ((yield* repo.list(account.id)).length >= MAX_PROVIDER_KEYS) return yield* tooMany
          yield* pace(account.id)
          yield* checked(url, payload.api_key)
          const id = newId("pk")
          const row = yield* audit.within(
            repo.create({
              id,
              accountId: account.id,
              name: payload.name,
              baseUrl: baseUrlText(url),
              models: payload.models,
              mode: payload.mode,
              status: "ok",
              ...seal(id, account.id, payload.api_key)
            }),
            (created) => ({
              action: "provider_key.created",
              targetType: "provider_key",
              targetId: created.id,
              details: {
                name: created.name,
                base_url: created.baseUrl,
                mode: created.mode,
                models: created.models,
                last4: created.last4
              }
            })
          ).pipe(Effect.catchTag("TooManyProviderKeys", () => tooMany))
          yield* refresh.account(account.id)
          return { provider_key: toRecord(row) }
        }))
      .handle("update", ({ path, payload }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const row = yield* repo.find(account.id, path.id)
          if (row === undefined) return yield* noSuchKey(path.id)
          const url = payload.base_url === undefined ? undefined : yield* baseUrlOf(payload.base_url)
          const baseUrl = url === undefined || baseUrlText(url) === row.baseUrl ? undefined : baseUrlText(url)
          const recheck = baseUrl !== undefined || payload.api_key !== undefined
          if (recheck) {
            yield* pace(account.id)
            const apiKey = payload.api_key ?? (yield* storedKey(row))
            yield* checked(url ?? new URL(row.baseUrl), apiKey)
          }
          const sealed = payload.api_key === undefined ? undefined : seal(row.id, account.id, payload.api_key)
          // What changed, as given: never the API key, only its last four characters.
          const details = Object.fromEntries(
            Object.entries({
              name: payload.name,
              base_url: baseUrl,
              mode: payload.mode,
              models: payload.models,
              last4: sealed?.last4
            }).filter(([, value]) => value !== undefined)
          )
          if (Object.keys(details).length === 0) return { provider_key: toRecord(row) }
          const updated = yield* audit.within(
            repo.update(account.id, row.id, {
              name: payload.name,
              baseUrl,
              models: payload.models,
              mode: payload.mode,
              sealed,
              status: recheck ? "ok" : undefined
            }),
            (changed) =>
              changed === undefined
                ? undefined
                : { action: "provider_key.updated", targetType: "provider_key", targetId: changed.id, details }
          )
          if (updated === undefined) return yield* noSuchKey(path.id)
          yield* refresh.account(account.id)
          return { provider_key: toRecord(updated) }
        }))
      .handle("check", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const row = yield* repo.find(account.id, path.id)
          if (row === undefined) return yield* noSuchKey(path.id)
          yield* pace(account.id)
          const apiKey = yield* storedKey(row)
          // The check's refusal is the key's status, not this request's failure.
          const outcome = yield* Effect.either(checked(new URL(row.baseUrl), apiKey))
          const [status, lastError] = Either.match(outcome, {
            onRight: () => ["ok", null] as const,
            onLeft: (refused) => [refused.param === "api_key" ? "refused" : "failing", refused.message] as const
          })
          yield* repo.setStatus(row.id, status, lastError)
          yield* refresh.account(account.id)
          const checkedRow = yield* repo.find(account.id, path.id)
          if (checkedRow === undefined) return yield* noSuchKey(path.id)
          return { provider_key: toRecord(checkedRow) }
        }))
      .handle("delete", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const removed = yield* audit.within(
            repo.remove(account.id, path.id),
            (gone) =>
              gone === undefined ? undefined : {
                action: "provider_key.deleted",
                targetType: "provider_key",
                targetId: gone.id,
                details: { name: gone.name, base_url: gone.baseUrl, mode: gone.mode, last4: gone.last4 }
              }
          )
          if (removed === undefined) return yield* noSuchKey(path.id)
          yield* refresh.account(account.id)
        }))
  })).pipe(Layer.provide(HostResolver.system))
