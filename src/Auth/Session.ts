import { HttpServerRequest } from "@effect/platform"
import { Effect, Exit, FiberRef, Option } from "effect"
import type { Account } from "../Domain/Account.js"
import { AccountsRepo } from "../Accounts/Repo.js"
import { type AuthenticationError, CurrentRequestId, type RateLimitExceeded } from "../Domain/Errors.js"
import { noteRequestFacts } from "../Request/Context.js"
import { IpLimits } from "../Request/IpLimits.js"
import { IdentityProvider } from "./IdentityProvider.js"

type SessionFailure = AuthenticationError | RateLimitExceeded

/**
 * The outcome of checking a dashboard request's session token before its
 * body was read (`makeSessionBeforeBody`), for `DashboardAuth` to answer with
 * instead of verifying the token again. Marked with the request id and the
 * token, so that it never answers for another request or another token.
 */
const EarlySession = FiberRef.unsafeMake<
  { readonly requestId: string; readonly token: string; readonly exit: Exit.Exit<Account, SessionFailure> } | undefined
>(undefined)

/**
 * A session token's account. A refused token counts with failed API keys; past the limit it is answered 429.
 * A valid token always passes: its holder is known, and guessing one is hopeless, so the limit is on the noise.
 */
const verifySession = (
  identity: IdentityProvider["Type"],
  accounts: AccountsRepo["Type"],
  limits: IpLimits["Type"],
  token: string
) =>
  identity.verify(token).pipe(
    Effect.tapError(() => Effect.flatMap(limits.client, (address) => limits.take("authFailures", address))),
    Effect.flatMap((who) => accounts.signIn(who)),
    Effect.tap((account) => noteRequestFacts({ accountId: account.id }))
  )

/** `DashboardAuth`'s check: the early outcome when this request's token was checked before its body, else a check now. */
export const makeSessionCheck = Effect.gen(function*() {
  const identity = yield* IdentityProvider
  const accounts = yield* AccountsRepo
  const limits = yield* IpLimits
  return (token: string) =>
    Effect.gen(function*() {
      const early = yield* FiberRef.get(EarlySession)
      if (early !== undefined && early.token === token && early.requestId === (yield* FiberRef.get(CurrentRequestId))) {
        return yield* early.exit
      }
      return yield* verifySession(identity, accounts, limits, token)
    })
})

/**
 * Checks a dashboard request's session token before anything reads its body,
 * so that a request without a valid session costs a verification, not 8 MiB
 * of reading. `DashboardAuth` then answers with this outcome.
 */
export const makeSessionBeforeBody = Effect.gen(function*() {
  // Looked up, not required: the error middleware also serves APIs without a dashboard (tests' small APIs).
  const [identity, accounts, limits] = yield* Effect.all([
    Effect.serviceOption(IdentityProvider),
    Effect.serviceOption(AccountsRepo),
    Effect.serviceOption(IpLimits)
  ])
  if (Option.isNone(identity) || Option.isNone(accounts) || Option.isNone(limits)) {
    return yield* Effect.dieMessage("Dashboard endpoints need IdentityProvider, AccountsRepo and IpLimits under the error middleware.")
  }
  return Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    // As the platform's bearer decoding reads it (HttpApiBuilder.securityDecode).
    const token = (request.headers["authorization"] ?? "").slice("Bearer ".length)
    const exit = yield* Effect.exit(verifySession(identity.value, accounts.value, limits.value, token))
    const requestId = yield* FiberRef.get(CurrentRequestId)
    yield* FiberRef.set(EarlySession, { requestId, token, exit })
    yield* Effect.asVoid(exit)
  }).pipe(Effect.withSpan("auth.session_before_body"))
})
