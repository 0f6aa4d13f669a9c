import { HttpApi, HttpApiBuilder, HttpClient, HttpClientRequest } from "@effect/platform"
import { NodeHttpServer } from "@effect/platform-node"
import { expect, layer } from "@effect/vitest"
import { Cause, Effect, Layer, Logger, Option, Schema } from "effect"
import { AccountsRepo } from "../../src/Accounts/Repo.js"
import { AppConfig } from "../../src/AppConfig.js"
import { DashboardAuthLive } from "../../src/Auth/Http.js"
import { IdentityProvider } from "../../src/Auth/IdentityProvider.js"
import type { Account } from "../../src/Domain/Account.js"
import { AuthenticationError, ContextLengthExceeded, InternalError, InvalidRequest, NotFound, wire } from "../../src/Domain/Errors.js"
import { microMyr } from "../../src/Domain/Money.js"
import { makeTestLayer } from "../../src/Domain/TestLayer.js"
import { PipelineLive } from "../../src/Http/Pipeline.js"
import { ApiKeyList, KeysApi } from "../../src/Keys/Api.js"
import { KeysLive } from "../../src/Keys/Http.js"
import { KeyCache } from "../../src/Keys/KeyCache.js"
import { KeyLastUsed } from "../../src/Keys/LastUsed.js"
import { type KeyRow, KeysRepo } from "../../src/Keys/Repo.js"
import { RotationSeal } from "../../src/Keys/RotationSeal.js"
import { MembersRepo } from "../../src/Members/Repo.js"
import { AuditLog } from "../../src/Audit/Repo.js"
import { IpLimits } from "../../src/Addresses/IpLimits.js"
import { Spending } from "../../src/Wallet/Spending.js"
import { expectClientError, isErrorBody } from "../support/ErrorBody.js"
import type { Reply } from "../support/Http.js"

/**
 * The API keys handlers (`KeysLive`) over HTTP, on a server of their group
 * alone: no `makeServer`, no PostgreSQL. Each service they use is a test
 * Layer of the members a test gives (`makeTestLayer`); calling any other
 * member dies, naming itself. The session check and the error middleware
 * are the real ones.
 */

/** The keys group under the composed API's id and errors: `KeysLive`, written for `NenasApi`, implements it as it is. */
class KeysOnlyApi extends HttpApi.make("nenas")
  .add(KeysApi)
  .addError(wire(InvalidRequest))
  .addError(wire(NotFound))
  .addError(wire(ContextLengthExceeded))
  .addError(wire(InternalError))
{}

const ANA: Account = { id: "acc_ana", issuer: "https://idp.test/", subject: "ana", email: "ana@example.com", suspended: false }
const SESSION = "session-of-ana"

/** Ana's session and nobody else's: the identity provider knows one token, and signing in finds her account. */
const SignedIn = Layer.mergeAll(
  makeTestLayer(IdentityProvider)({
    verify: (token) =>
      token === SESSION
        ? Effect.succeed({ issuer: ANA.issuer ?? "", subject: ANA.subject, email: ANA.email, name: null })
        : Effect.fail(new AuthenticationError({ message: "The session token is not valid." }))
  }),
  AccountsRepo.Test({ signIn: () => Effect.succeed(ANA) }),
  MembersRepo.Test({
    membership: () =>
      Effect.succeed(Option.some({
        account: ANA,
        member: { id: "mem_ana", role: "owner" as const, email: ANA.email, name: null, monthlySpendLimitMicroMyr: null }
      }))
  }),
  makeTestLayer(IpLimits)({ client: Effect.succeed("203.0.113.9"), take: () => Effect.void })
)

/** What the error middleware logs: a defect's cause goes there, never to the client. */
const logged: Array<string> = []
const KeepLogs = Logger.replace(
  Logger.defaultLogger,
  Logger.make(({ cause }) => {
    if (!Cause.isEmpty(cause)) logged.push(Cause.pretty(cause))
  })
)

/** The keys handlers served on a test port, over `repo` and stubs of what else they use. */
const keysServer = (repo: Layer.Layer<KeysRepo>) =>
  HttpApiBuilder.serve().pipe(
    Layer.provide(PipelineLive),
    Layer.provide(HttpApiBuilder.api(KeysOnlyApi).pipe(Layer.provide(KeysLive))),
    Layer.provide(Layer.mergeAll(
      repo,
      DashboardAuthLive,
      makeTestLayer(Spending)({ spentThisMonth: () => Effect.succeed(new Map([["key_limited", 1_250_000]])) }),
      makeTestLayer(KeyLastUsed)({ pending: () => Option.none() }),
      makeTestLayer(KeyCache)({}),
      makeTestLayer(RotationSeal)({}),
      AuditLog.Test({ within: (change) => change })
    )),
    Layer.provide(SignedIn),
    Layer.provide(AppConfig.layerWith({ dashboardUrl: "https://dash.test" })),
    Layer.provideMerge(NodeHttpServer.layerTest),
    Layer.provide(KeepLogs)
  )

/** One request to the test server as Ana (or with `token`), its JSON body read. */
const dashboard = (method: "GET" | "PATCH", path: string, options: { readonly json?: unknown; readonly token?: string } = {}) =>
  Effect.gen(function*() {
    const base = HttpClientRequest.make(method)(path).pipe(HttpClientRequest.bearerToken(options.token ?? SESSION))
    const request = options.json === undefined ? base : yield* HttpClientRequest.bodyJson(base, options.json)
    const response = yield* HttpClient.execute(request)
    const text = yield* response.text
    const reply: Reply = { status: response.status, headers: new Headers(response.headers), body: text === "" ? undefined : JSON.parse(text), text }
    return reply
  }).pipe(Effect.orDie)

const row = (id: string, fields: Partial<KeyRow>): KeyRow => ({
  id,
  accountId: ANA.id,
  memberId: "mem_ana",
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
  row("key_limited", { name: "production backend", monthlySpendLimitMicroMyr: microMyr(50_000_000), rateLimitRpm: 120 }),
  row("key_old", { environment: "test", prefix: "nns_test_x9Z", expiresAt: new Date("2020-01-01T00:00:00.000Z") }),
  row("key_off", { disabledAt: new Date("2026-11-02T00:00:00.000Z"), lastUsedAt: new Date("2026-11-01T09:30:00.000Z") })
]

const listedFor: Array<string> = []

layer(
  keysServer(KeysRepo.Test({ list: (accountId) => Effect.sync(() => (listedFor.push(accountId), ROWS)) })),
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
        member_id: "mem_ana"
      })
      expect(reply.body.keys[1]).toMatchObject({ expires_at: "2020-01-01T00:00:00.000Z", month_to_date_spend_micro_myr: 0 })
      expect(reply.body.keys[2]).toMatchObject({ last_used_at: "2026-11-01T09:30:00.000Z" })
    }))

  it.effect("PATCH reaches `update`, which the test did not give: it dies, and the answer is a 500 in the error shape", () =>
    Effect.gen(function*() {
      const reply = yield* dashboard("PATCH", "/dashboard/api-keys/key_limited", { json: { disabled: true } })
      expect(reply.status, reply.text).toBe(500)
      expect(isErrorBody(reply.body), reply.text).toBe(true)
      expect(reply.body.error).toMatchObject({ code: "internal_error", type: "api_error", message: "Internal server error." })
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
  keysServer(KeysRepo.Test({ update: () => Effect.succeed(undefined) })),
  { excludeTestServices: true }
)("a keys repository whose `update` finds no key", (it) => {
  it.effect("PATCH /dashboard/api-keys/:id answers 404 not_found, naming the id", () =>
    Effect.gen(function*() {
      const reply = yield* dashboard("PATCH", "/dashboard/api-keys/key_gone", { json: { disabled: true } })
      expectClientError(reply, { status: 404, code: "not_found", param: "id" })
      expect(reply.body.error.message).toBe("No API key with id 'key_gone'.")
    }))
})
