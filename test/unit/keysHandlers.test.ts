import { expect, layer } from "@effect/vitest"
import { Cause, Effect, Layer, Logger, Option, Schema } from "effect"
import { microMyr } from "../../src/Domain/Money.js"
import { ApiKeyList, KeysApi } from "../../src/Keys/Api.js"
import { KeysLive } from "../../src/Keys/Http.js"
import type { KeyRow } from "../../src/Keys/Repo.js"
import { expectClientError, isErrorBody } from "../support/ErrorBody.js"
import { ANA, asAna as dashboard, groupServer, type Stubs } from "../support/GroupServer.js"

/**
 * The API keys handlers (`KeysLive`) over HTTP, on a server of their group
 * alone (`groupServer`): no `makeServer`, no PostgreSQL. Each service they use
 * is a test Layer of the members a test gives; calling any other member dies,
 * naming itself. The session check and the request pipeline are the real ones.
 */

/** What the pipeline logs: a defect's cause goes there, never to the client. */
const logged: Array<string> = []
const KeepLogs = Logger.replace(
  Logger.defaultLogger,
  Logger.make(({ cause }) => {
    if (!Cause.isEmpty(cause)) logged.push(Cause.pretty(cause))
  })
)

/** The keys handlers over `KeysRepo`'s given methods, and the month's spend and last use they show. */
const keysServer = (KeysRepo: NonNullable<Stubs["KeysRepo"]>) =>
  groupServer(KeysApi, KeysLive, {
    KeysRepo,
    Spending: { spentThisMonth: () => Effect.succeed(new Map([["key_limited", 1_250_000]])) },
    KeyLastUsed: { pending: () => Option.none() }
  }).pipe(Layer.provide(KeepLogs))

const row = (id: string, fields: Partial<KeyRow>): KeyRow => ({
  id,
  accountId: ANA.id,
  memberId: "mem_ana",
  guardrails: null,
  cacheTtlSeconds: null,
  name: id,
  prefix: "nns_live_a1B",
  environment: "live",
  monthlySpendLimitMicroMyr: null,
  expiresAt: null,
  createdAt: new Date("2026-11-01T08:00:00.000Z"),
  lastUsedAt: null,
  disabledAt: null,
  rateLimitRpm: null,
  rateLimitConcurrent: null,
  ...fields
})

const ROWS = [
  row("key_limited", {
    name: "production backend",
    monthlySpendLimitMicroMyr: microMyr(50_000_000),
    rateLimitRpm: 120
  }),
  row("key_old", { environment: "test", prefix: "nns_test_x9Z", expiresAt: new Date("2020-01-01T00:00:00.000Z") }),
  row("key_off", { disabledAt: new Date("2026-11-02T00:00:00.000Z"), lastUsedAt: new Date("2026-11-01T09:30:00.000Z") })
]

const listedFor: Array<string> = []

layer(
  keysServer({ list: (accountId) => Effect.sync(() => (listedFor.push(accountId), ROWS)) }),
  { excludeTestServices: true }
)("a keys repository stubbed with `list` only", (it) => {
  it.effect("GET /dashboard/api-keys answers the signed-in account's rows as the contract's records", () =>
    Effect.gen(function*() {
      const reply = yield* dashboard("GET", "/dashboard/api-keys")
      expect(reply.status, reply.text).toBe(200)
      expect(listedFor).toEqual([ANA.id])
      const { keys } = yield* Schema.decodeUnknown(ApiKeyList)(reply.body)
      expect(keys.map((key) => [key.id, key.environment, key.status])).toEqual([
        ["key_limited", "live", "active"],
        ["key_old", "test", "expired"],
        ["key_off", "live", "disabled"]
      ])
      expect(reply.body.keys[0]).toEqual({
        id: "key_limited",
        name: "production backend",
        prefix: "nns_live_a1B",
        environment: "live",
        status: "active",
        created_at: "2026-11-01T08:00:00.000Z",
        last_used_at: null,
        monthly_spend_limit_micro_myr: 50_000_000,
        month_to_date_spend_micro_myr: 1_250_000,
        expires_at: null,
        rate_limit_rpm: 120,
        rate_limit_concurrent: expect.any(Number),
        member_id: "mem_ana",
        guardrails: null,
        cache_ttl_seconds: null
      })
      expect(reply.body.keys[1]).toMatchObject({
        expires_at: "2020-01-01T00:00:00.000Z",
        month_to_date_spend_micro_myr: 0
      })
      expect(reply.body.keys[2]).toMatchObject({ last_used_at: "2026-11-01T09:30:00.000Z" })
    }))

  it.effect("PATCH reaches `update`, which the test did not give: it dies, and the answer is a 500 in the error shape", () =>
    Effect.gen(function*() {
      const reply = yield* dashboard("PATCH", "/dashboard/api-keys/key_limited", { json: { disabled: true } })
      expect(reply.status, reply.text).toBe(500)
      expect(isErrorBody(reply.body), reply.text).toBe(true)
      expect(reply.body.error).toMatchObject({
        code: "internal_error",
        type: "api_error",
        message: "Internal server error."
      })
      expect(reply.text).not.toContain("unimplemented")
      expect(logged.join("\n")).toContain("nenas/KeysRepo: unimplemented update")
    }))

  it.effect("a session the identity provider refuses answers 401 before any repository method is asked", () =>
    Effect.gen(function*() {
      const asked = listedFor.length
      const reply = yield* dashboard("GET", "/dashboard/api-keys", { token: "someone-else" })
      expectClientError(reply, { status: 401, code: "authentication_error" })
      expect(listedFor.length).toBe(asked)
    }))
})

layer(
  keysServer({ update: () => Effect.succeed(undefined) }),
  { excludeTestServices: true }
)("a keys repository whose `update` finds no key", (it) => {
  it.effect("PATCH /dashboard/api-keys/:id answers 404 not_found, naming the id", () =>
    Effect.gen(function*() {
      const reply = yield* dashboard("PATCH", "/dashboard/api-keys/key_gone", { json: { disabled: true } })
      expectClientError(reply, { status: 404, code: "not_found", param: "id" })
      expect(reply.body.error.message).toBe("No API key with id 'key_gone'.")
    }))
})
