import { HttpApi, HttpServerRequest } from "@effect/platform"
import { describe, expect, it } from "@effect/vitest"
import { Cause, Context, Effect, Exit, Layer, Option } from "effect"
import { AccountsRepo } from "../../src/Accounts/Repo.js"
import { NenasApi } from "../../src/Api.js"
import { AppConfig } from "../../src/AppConfig.js"
import { DashboardAuth } from "../../src/Auth/Api.js"
import { IdentityProvider } from "../../src/Auth/IdentityProvider.js"
import { makeTestLayer } from "../../src/Domain/TestLayer.js"
import { ROLES, type Role } from "../../src/Domain/Roles.js"
import { makeRequestGuard } from "../../src/Http/RequestGuard.js"
import { KeyCache } from "../../src/Keys/KeyCache.js"
import { KeyLastUsed } from "../../src/Keys/LastUsed.js"
import { MembersRepo } from "../../src/Members/Repo.js"
import { IpLimits } from "../../src/Request/IpLimits.js"

/**
 * Every dashboard endpoint × every role, decided by the real request guard and session check on test Layers:
 * no database, no server. The table below is the contract's, written out: a change to an endpoint's roles
 * must change it too.
 */

const o = "owner", a = "admin", d = "developer", b = "billing", v = "viewer"
const ALL: ReadonlyArray<Role> = [o, a, d, b, v]

const EXPECTED: Record<string, ReadonlyArray<Role>> = {
  "POST /dashboard/api-keys": [o, a, d],
  "GET /dashboard/api-keys": ALL,
  "PATCH /dashboard/api-keys/:id": [o, a, d],
  "POST /dashboard/api-keys/:id/rotate": [o, a, d],
  "DELETE /dashboard/api-keys/:id": [o, a, d],
  "POST /dashboard/billing/checkout": [o, b],
  "GET /dashboard/billing/balance": ALL,
  "GET /dashboard/billing/transactions": ALL,
  "GET /dashboard/billing/settings": ALL,
  "PUT /dashboard/billing/settings": [o, a, b],
  "POST /dashboard/billing/card": [o, b],
  "DELETE /dashboard/billing/card": [o, b],
  "GET /dashboard/logs": ALL,
  "GET /dashboard/logs/:request_id/conversation": ALL,
  "GET /dashboard/logs/export": ALL,
  "GET /dashboard/usage": ALL,
  "GET /dashboard/overview": ALL,
  "GET /dashboard/usage/export": ALL,
  "GET /dashboard/usage/grouping-tags": ALL,
  "PUT /dashboard/usage/grouping-tags": [o, a],
  "POST /dashboard/webhooks": [o, a],
  "GET /dashboard/webhooks": ALL,
  "GET /dashboard/webhooks/event-types": ALL,
  "GET /dashboard/webhooks/:id": ALL,
  "PATCH /dashboard/webhooks/:id": [o, a],
  "DELETE /dashboard/webhooks/:id": [o, a],
  "POST /dashboard/webhooks/:id/rotate-secret": [o, a],
  "POST /dashboard/webhooks/:id/test": [o, a],
  "GET /dashboard/webhooks/:id/deliveries": ALL,
  "POST /dashboard/webhooks/:id/deliveries/:delivery_id/resend": [o, a],
  "GET /dashboard/members": ALL,
  "PATCH /dashboard/members/:id": [o, a],
  // Anyone leaves; removing another member is checked by the handler (teams.test.ts).
  "DELETE /dashboard/members/:id": ALL,
  "POST /dashboard/members/invitations": [o, a],
  "GET /dashboard/members/invitations": ALL,
  "DELETE /dashboard/members/invitations/:id": [o, a],
  "GET /dashboard/accounts": ALL,
  "GET /dashboard/invitations": ALL,
  "POST /dashboard/invitations/:id/accept": ALL,
  "GET /dashboard/audit-log": ALL,
  "GET /dashboard/audit-log/export": ALL,
  "GET /dashboard/alerts": ALL
}

/** Every endpoint behind the session check, as `METHOD /path`. */
const dashboardEndpoints = (): ReadonlyArray<string> => {
  const found: Array<string> = []
  HttpApi.reflect(NenasApi, {
    onGroup: () => {},
    onEndpoint: ({ endpoint, middleware }) => {
      if ([...middleware].some((tag) => tag.key === DashboardAuth.key)) found.push(`${endpoint.method} ${endpoint.path}`)
    }
  })
  return found
}

/** A session token names its role: the person it verifies as is a member with that role. */
const Sessions = Layer.mergeAll(
  makeTestLayer(IdentityProvider)({
    verify: (token) => Effect.succeed({ issuer: "https://idp.test/", subject: token, email: `${token}@example.com`, name: null })
  }),
  AccountsRepo.Test({}),
  MembersRepo.Test({
    membership: (identity) =>
      Effect.succeed(Option.some({
        account: { id: "acct_team", issuer: "https://idp.test/", subject: "owner", email: null, suspended: false },
        member: { id: `mem_${identity.subject}`, role: identity.subject as Role, email: null, name: null, monthlySpendLimitMicroMyr: null }
      }))
  }),
  makeTestLayer(IpLimits)({ client: Effect.succeed("203.0.113.9"), take: () => Effect.void }),
  makeTestLayer(KeyCache)({}),
  makeTestLayer(KeyLastUsed)({}),
  AppConfig.layerWith({})
)

/** What the guard decides for `role` on `METHOD /path` (its parameters filled in), before any handler. */
const decide = (route: string, role: Role) =>
  Effect.gen(function*() {
    const guard = yield* makeRequestGuard
    const [method = "", path = ""] = route.split(" ")
    const request = HttpServerRequest.fromWeb(
      new Request(`http://localhost${path.replace(/:[^/]+/g, "x_1")}`, { method, headers: { authorization: `Bearer ${role}` } })
    )
    return yield* Effect.exit(Effect.provideService(guard(request.text), HttpServerRequest.HttpServerRequest, request))
  }).pipe(Effect.provideService(HttpApi.Api, { api: NenasApi as never, context: Context.empty() }), Effect.provide(Sessions))

describe("roles on every dashboard endpoint", () => {
  it("the table names every dashboard endpoint, and only those", () => {
    expect([...dashboardEndpoints()].sort()).toEqual(Object.keys(EXPECTED).sort())
  })

  it.effect("each endpoint × each role: the roles allowed pass, every other answers permission_denied naming them", () =>
    Effect.gen(function*() {
      let decided = 0
      for (const [route, allowed] of Object.entries(EXPECTED)) {
        for (const role of ROLES) {
          const exit = yield* decide(route, role)
          if (allowed.includes(role)) {
            expect(Exit.isSuccess(exit), `${route} as ${role}`).toBe(true)
          } else {
            const error = Exit.isFailure(exit) ? Option.getOrUndefined(Cause.failureOption(exit.cause)) : undefined
            expect(error?._tag, `${route} as ${role}`).toBe("PermissionDenied")
            const message = error !== undefined && "message" in error ? error.message : ""
            expect(message, `${route} as ${role}`).toContain(`you are ${role === "admin" || role === "owner" ? "an" : "a"} ${role}`)
            for (const needed of allowed) expect(message, `${route} as ${role}`).toContain(needed)
          }
          decided++
        }
      }
      expect(decided).toBe(Object.keys(EXPECTED).length * ROLES.length)
    }))
})
