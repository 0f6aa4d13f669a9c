import { HttpApi, HttpServerRequest } from "@effect/platform"
import { describe, expect, it } from "@effect/vitest"
import { Cause, Context, Effect, Exit, Layer, Option } from "effect"
import { AccountsRepo } from "../../src/Accounts/Repo.js"
import { IpLimits } from "../../src/Addresses/IpLimits.js"
import { NenasApi } from "../../src/Api.js"
import { AppConfig } from "../../src/AppConfig.js"
import { DashboardAuth } from "../../src/Auth/Api.js"
import { IdentityProvider } from "../../src/Auth/IdentityProvider.js"
import {
  EVERY_ROLE,
  keyChangeRefusal,
  type MemberAction,
  memberActionRefusal,
  permits,
  type Role
} from "../../src/Domain/Roles.js"
import { makeTestLayer } from "../../src/Domain/TestLayer.js"
import { makeRequestGuard } from "../../src/Http/RequestGuard.js"
import { loosened } from "../../src/Keys/Controls.js"
import { KeyCache } from "../../src/Keys/KeyCache.js"
import { KeyLastUsed } from "../../src/Keys/LastUsed.js"
import { MembersRepo } from "../../src/Members/Repo.js"

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
  "GET /dashboard/billing/profile": ALL,
  "PUT /dashboard/billing/profile": [o, a, b],
  "GET /dashboard/billing/invoices": ALL,
  "POST /dashboard/guardrails/test": ALL,
  "GET /dashboard/guardrails": ALL,
  "PUT /dashboard/guardrails": [o, a],
  "GET /dashboard/provider-keys": ALL,
  "POST /dashboard/provider-keys": [o, a],
  "PATCH /dashboard/provider-keys/:id": [o, a],
  "POST /dashboard/provider-keys/:id/check": [o, a],
  "DELETE /dashboard/provider-keys/:id": [o, a],
  "GET /dashboard/billing/invoices/:id": ALL,
  "GET /dashboard/billing/invoices/:id/pdf": ALL,
  "POST /dashboard/billing/invoices/:id/resubmit": [o, a, b],
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
  "DELETE /dashboard/cache": [o, a],
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
      if ([...middleware].some((tag) => tag.key === DashboardAuth.key)) {
        found.push(`${endpoint.method} ${endpoint.path}`)
      }
    }
  })
  return found
}

/** A session token names its role: the person it verifies as is a member with that role. */
const Sessions = Layer.mergeAll(
  makeTestLayer(IdentityProvider)({
    verify: (token) =>
      Effect.succeed({ issuer: "https://idp.test/", subject: token, email: `${token}@example.com`, name: null })
  }),
  AccountsRepo.Test({}),
  MembersRepo.Test({
    membership: (identity) =>
      Effect.succeed(Option.some({
        account: { id: "acct_team", issuer: "https://idp.test/", subject: "owner", email: null, suspended: false },
        member: {
          id: `mem_${identity.subject}`,
          role: identity.subject as Role,
          email: null,
          name: null,
          monthlySpendLimitMicroMyr: null
        }
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
      new Request(`http://localhost${path.replace(/:[^/]+/g, "x_1")}`, {
        method,
        headers: { authorization: `Bearer ${role}` }
      })
    )
    return yield* Effect.exit(Effect.provideService(guard(request.text), HttpServerRequest.HttpServerRequest, request))
  }).pipe(
    Effect.provideService(HttpApi.Api, { api: NenasApi as never, context: Context.empty() }),
    Effect.provide(Sessions)
  )

describe("roles on every dashboard endpoint", () => {
  it("the table names every dashboard endpoint, and only those", () => {
    expect([...dashboardEndpoints()].sort()).toEqual(Object.keys(EXPECTED).sort())
  })

  it.effect("each endpoint × each role: the roles allowed pass, every other answers permission_denied naming them", () =>
    Effect.gen(function*() {
      let decided = 0
      for (const [route, allowed] of Object.entries(EXPECTED)) {
        for (const role of EVERY_ROLE) {
          const exit = yield* decide(route, role)
          if (allowed.includes(role)) {
            expect(Exit.isSuccess(exit), `${route} as ${role}`).toBe(true)
          } else {
            const error = Exit.isFailure(exit) ? Option.getOrUndefined(Cause.failureOption(exit.cause)) : undefined
            expect(error?._tag, `${route} as ${role}`).toBe("PermissionDenied")
            const message = error !== undefined && "message" in error ? error.message : ""
            expect(message, `${route} as ${role}`).toContain(
              `you are ${role === "admin" || role === "owner" ? "an" : "a"} ${role}`
            )
            for (const needed of allowed) expect(message, `${route} as ${role}`).toContain(needed)
          }
          decided++
        }
      }
      expect(decided).toBe(Object.keys(EXPECTED).length * EVERY_ROLE.length)
    }))
})

/**
 * The same endpoints × every role × whose resource it is: the acting member's own (itself, its key) or another
 * member's (an owner, an admin, a developer; another's key). The guard's roles above come first; then the handler's
 * decision (`memberActionRefusal`, `keyChangeRefusal`, `loosened`), which is where leaving, removal, budgets and
 * key controls are decided. "ok" passes to the repository (the last owner is its to refuse), "403" is
 * permission_denied, "400" invalid_request.
 */
type Outcome = "ok" | "403" | "400"
type MemberTarget = "self" | "owner" | "admin" | "developer"
type KeyTarget = "own" | "another's"

const MEMBER_TARGETS: ReadonlyArray<MemberTarget> = ["self", "owner", "admin", "developer"]
const KEY_TARGETS: ReadonlyArray<KeyTarget> = ["own", "another's"]

/** Each case: the endpoint (as in the table above), what it does, and per role the outcome per target, in the targets' order. */
const MEMBER_CASES: ReadonlyArray<{
  readonly route: string
  readonly does: string
  readonly action: MemberAction
  readonly outcomes: Record<Role, ReadonlyArray<Outcome>>
}> = [
  {
    route: "PATCH /dashboard/members/:id",
    does: "role → developer",
    action: { _tag: "Update", role: "developer", budget: false },
    outcomes: {
      owner: ["ok", "ok", "ok", "ok"],
      admin: ["ok", "403", "ok", "ok"],
      developer: ["403", "403", "403", "403"],
      billing: ["403", "403", "403", "403"],
      viewer: ["403", "403", "403", "403"]
    }
  },
  {
    route: "PATCH /dashboard/members/:id",
    does: "role → owner",
    action: { _tag: "Update", role: "owner", budget: false },
    outcomes: {
      owner: ["ok", "ok", "ok", "ok"],
      admin: ["403", "403", "403", "403"],
      developer: ["403", "403", "403", "403"],
      billing: ["403", "403", "403", "403"],
      viewer: ["403", "403", "403", "403"]
    }
  },
  {
    route: "PATCH /dashboard/members/:id",
    does: "monthly budget",
    action: { _tag: "Update", budget: true },
    outcomes: {
      owner: ["ok", "ok", "ok", "ok"],
      admin: ["ok", "403", "ok", "ok"],
      developer: ["403", "403", "403", "403"],
      billing: ["403", "403", "403", "403"],
      viewer: ["403", "403", "403", "403"]
    }
  },
  {
    route: "DELETE /dashboard/members/:id",
    does: "remove, keys disabled",
    action: { _tag: "Remove", transfer: false },
    outcomes: {
      owner: ["ok", "ok", "ok", "ok"],
      admin: ["ok", "403", "ok", "ok"],
      developer: ["ok", "403", "403", "403"],
      billing: ["ok", "403", "403", "403"],
      viewer: ["ok", "403", "403", "403"]
    }
  },
  {
    route: "DELETE /dashboard/members/:id",
    does: "remove, keys given to another (transfer_keys_to)",
    action: { _tag: "Remove", transfer: true },
    outcomes: {
      owner: ["400", "ok", "ok", "ok"],
      admin: ["400", "403", "ok", "ok"],
      developer: ["400", "403", "403", "403"],
      billing: ["400", "403", "403", "403"],
      viewer: ["400", "403", "403", "403"]
    }
  }
]

const KEY_CASES: ReadonlyArray<{
  readonly route: string
  readonly does: string
  /** The change loosens a control an owner set on the key. */
  readonly loosens: boolean
  readonly outcomes: Record<Role, ReadonlyArray<Outcome>>
}> = [
  ...["PATCH /dashboard/api-keys/:id", "POST /dashboard/api-keys/:id/rotate", "DELETE /dashboard/api-keys/:id"].map((
    route
  ) => ({
    route,
    does: "change, rotate or delete",
    loosens: false,
    outcomes: {
      owner: ["ok", "ok"],
      admin: ["ok", "ok"],
      developer: ["ok", "403"],
      billing: ["403", "403"],
      viewer: ["403", "403"]
    } as Record<Role, ReadonlyArray<Outcome>>
  })),
  {
    route: "PATCH /dashboard/api-keys/:id",
    does: "re-enable a key an owner disabled",
    loosens: true,
    outcomes: {
      owner: ["ok", "ok"],
      admin: ["ok", "ok"],
      developer: ["403", "403"],
      billing: ["403", "403"],
      viewer: ["403", "403"]
    }
  }
]

const outcomeOf = (refusal: { readonly _tag: string } | undefined): Outcome =>
  refusal === undefined ? "ok" : refusal._tag === "PermissionDenied" ? "403" : "400"

/** What the guard, then the handler, answer `role` on `route` doing `action` to `target`. */
const memberOutcome = (route: string, role: Role, action: MemberAction, target: MemberTarget): Outcome => {
  if (!permits(EXPECTED[route] ?? [], role)) return "403"
  const actor = { id: `mem_${role}`, role }
  return outcomeOf(
    memberActionRefusal(actor, target === "self" ? actor : { id: `mem_other_${target}`, role: target }, action)
  )
}

const keyOutcome = (route: string, role: Role, loosens: boolean, target: KeyTarget): Outcome => {
  if (!permits(EXPECTED[route] ?? [], role)) return "403"
  const actor = { id: `mem_${role}`, role }
  const refusal = keyChangeRefusal(actor, "key_1", target === "own" ? actor.id : "mem_someone_else")
  if (refusal !== undefined || role !== "developer" || !loosens) return outcomeOf(refusal)
  const disabledByOwner = {
    disabled: true,
    monthlySpendLimitMicroMyr: null,
    rateLimitRpm: null,
    rateLimitConcurrent: null
  }
  return loosened(disabledByOwner, ["disabled"], { disabled: false }).length > 0 ? "403" : "ok"
}

describe("roles × whose resource, on the endpoints where it matters", () => {
  it("every case names an endpoint of the table above", () => {
    for (const { route } of [...MEMBER_CASES, ...KEY_CASES]) expect(Object.keys(EXPECTED), route).toContain(route)
  })

  it("members: leaving, removing, changing a role or a budget, per role and per member acted on", () => {
    for (const { action, does, outcomes, route } of MEMBER_CASES) {
      for (const role of EVERY_ROLE) {
        const decided = MEMBER_TARGETS.map((target) => memberOutcome(route, role, action, target))
        expect(decided, `${route} (${does}) as ${role}, on ${MEMBER_TARGETS.join(" / ")}`).toEqual(outcomes[role])
      }
    }
  })

  it("keys: own or another member's, and a control an owner set", () => {
    for (const { does, loosens, outcomes, route } of KEY_CASES) {
      for (const role of EVERY_ROLE) {
        const decided = KEY_TARGETS.map((target) => keyOutcome(route, role, loosens, target))
        expect(decided, `${route} (${does}) as ${role}, on ${KEY_TARGETS.join(" / ")}`).toEqual(outcomes[role])
      }
    }
  })
})
