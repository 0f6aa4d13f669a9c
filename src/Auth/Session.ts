import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import { Effect, Exit, FiberRef, Option } from "effect"
import { AccountsRepo } from "../Accounts/Repo.js"
import { IpLimits } from "../Addresses/IpLimits.js"
import type { Identity, SignedIn } from "../Domain/Account.js"
import { type AuthenticationError, PermissionDenied, type RateLimitExceeded } from "../Domain/Errors.js"
import { permits, type Role, roleRefusal } from "../Domain/Roles.js"
import { MembersRepo } from "../Members/Repo.js"
import { CurrentRequestId, noteRequestFacts } from "../Request/Context.js"
import { IdentityProvider } from "./IdentityProvider.js"

type SessionFailure = AuthenticationError | RateLimitExceeded | PermissionDenied

/** The header a dashboard request names its account with (docs/api/teams.md, "Teams"); absent: the person's personal account. */
export const ACCOUNT_HEADER = "nenas-account"

/** What the session check reads: who the token names, their accounts, and the failed-authentication limit. */
interface SessionServices {
  readonly identity: IdentityProvider["Type"]
  readonly accounts: AccountsRepo["Type"]
  readonly members: MembersRepo["Type"]
  readonly limits: IpLimits["Type"]
}

/**
 * The outcome of checking a dashboard request's session token before its
 * body was read (`makeSessionBeforeBody`), for `DashboardAuth` to answer with
 * instead of verifying the token again. Marked with the request id and the
 * token, so that it never answers for another request or another token.
 */
const EarlySession = FiberRef.unsafeMake<
  { readonly requestId: string; readonly token: string; readonly exit: Exit.Exit<SignedIn, SessionFailure> } | undefined
>(undefined)

const notAMember = (accountId: string | null) =>
  new PermissionDenied({
    message: accountId === null
      ? "You are not a member of any account."
      : `You are not a member of the account '${accountId.slice(0, 100)}' named by Nenas-Account.`,
    guidance:
      "GET /dashboard/accounts lists the accounts you belong to; send one of their ids as Nenas-Account, or none for your own.",
    action: "/"
  })

/** The person's membership in the account they name, or in their own: the first sign-in opens their personal account. */
const membershipOf = (services: SessionServices, who: Identity, named: string | undefined) =>
  Effect.gen(function*() {
    // A header no account id could be is no member's; it never reaches SQL.
    const accountId = named === undefined || named === "" ? null : named
    if (accountId !== null && (accountId.length > 100 || accountId.includes("\u0000"))) return yield* notAMember(null)
    let found = yield* services.members.membership(who, accountId)
    if (Option.isNone(found) && accountId === null) {
      yield* services.accounts.signIn(who)
      found = yield* services.members.membership(who, null)
    }
    if (Option.isNone(found)) return yield* notAMember(accountId)
    const { account, member } = found.value
    return { ...account, member, identity: who } satisfies SignedIn
  })

/**
 * A session token's account and the person's role in it, refused unless the role is one of `roles`.
 * A refused token counts with failed API keys; past the limit it is answered 429.
 * A valid token always passes: its holder is known, and guessing one is hopeless, so the limit is on the noise.
 */
const verifySession = (
  services: SessionServices,
  token: string,
  named: string | undefined,
  roles: ReadonlyArray<Role>
) =>
  services.identity.verify(token).pipe(
    Effect.tapError(() =>
      Effect.flatMap(services.limits.client, (address) => services.limits.take("authFailures", address))
    ),
    Effect.flatMap((who) => membershipOf(services, who, named)),
    Effect.tap((signedIn) => noteRequestFacts({ accountId: signedIn.id })),
    Effect.filterOrFail((signedIn) => permits(roles, signedIn.member.role), (signedIn) =>
      roleRefusal(roles, signedIn.member.role))
  )

/**
 * `DashboardAuth`'s check: the outcome of this request's token, checked by the request guard before its body
 * against the roles its endpoint allows. Without it no role was checked, so nothing is allowed.
 */
export const makeSessionCheck = Effect.succeed((token: string) =>
  Effect.gen(function*() {
    const early = yield* FiberRef.get(EarlySession)
    if (early !== undefined && early.token === token && early.requestId === (yield* FiberRef.get(CurrentRequestId))) {
      return yield* early.exit
    }
    return yield* Effect.dieMessage(
      "A dashboard endpoint was served without the request guard's session and role check."
    )
  })
)

/**
 * Checks a dashboard request's session token before anything reads its body,
 * so that a request without a valid session costs a verification, not 8 MiB
 * of reading. `DashboardAuth` then answers with this outcome.
 */
export const makeSessionBeforeBody = Effect.gen(function*() {
  // Looked up, not required: the error middleware also serves APIs without a dashboard (tests' small APIs).
  const [identity, accounts, members, limits] = yield* Effect.all([
    Effect.serviceOption(IdentityProvider),
    Effect.serviceOption(AccountsRepo),
    Effect.serviceOption(MembersRepo),
    Effect.serviceOption(IpLimits)
  ])
  if (Option.isNone(identity) || Option.isNone(accounts) || Option.isNone(members) || Option.isNone(limits)) {
    return yield* Effect.dieMessage(
      "Dashboard endpoints need IdentityProvider, AccountsRepo, MembersRepo and IpLimits under the error middleware."
    )
  }
  const services: SessionServices = {
    identity: identity.value,
    accounts: accounts.value,
    members: members.value,
    limits: limits.value
  }
  return (roles: ReadonlyArray<Role>) =>
    Effect.gen(function*() {
      const request = yield* HttpServerRequest.HttpServerRequest
      // As the platform's bearer decoding reads it (HttpApiBuilder.securityDecode).
      const token = (request.headers["authorization"] ?? "").slice("Bearer ".length)
      const exit = yield* Effect.exit(verifySession(services, token, request.headers[ACCOUNT_HEADER], roles))
      const requestId = yield* FiberRef.get(CurrentRequestId)
      yield* FiberRef.set(EarlySession, { requestId, token, exit })
      yield* Effect.asVoid(exit)
    }).pipe(Effect.withSpan("auth.session_before_body"))
})
