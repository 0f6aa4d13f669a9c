import { HttpApiBuilder } from "@effect/platform"
import { Effect, Layer, Option, Redacted } from "effect"
import { AccountsRepo } from "../Accounts/Repo.js"
import { NenasApi } from "../Api.js"
import { NotFound } from "../Domain/Errors.js"
import { noteRequestFacts } from "../Request/Context.js"
import { IpLimits } from "../Request/IpLimits.js"
import { DashboardAuth } from "./Api.js"
import { IdentityProvider } from "./IdentityProvider.js"

export const DashboardAuthLive = Layer.effect(
  DashboardAuth,
  Effect.gen(function*() {
    const identity = yield* IdentityProvider
    const accounts = yield* AccountsRepo
    const limits = yield* IpLimits
    return DashboardAuth.of({
      sessionToken: (token) =>
        identity.verify(Redacted.value(token)).pipe(
          // A refused token counts with failed API keys; past the limit it is answered 429. A valid token
          // always passes: its holder is known, and guessing one is hopeless, so the limit is on the noise.
          Effect.tapError(() => Effect.flatMap(limits.client, (address) => limits.take("authFailures", address))),
          Effect.flatMap((who) => Effect.orDie(accounts.signIn(who))),
          Effect.tap((account) => noteRequestFacts({ accountId: account.id }))
        )
    })
  })
)

export const DevIdentityLive = HttpApiBuilder.group(NenasApi, "devIdentity", (handlers) =>
  Effect.gen(function*() {
    const { dev, devOffReason } = yield* IdentityProvider
    const limits = yield* IpLimits
    const notConfigured = new NotFound({ message: devOffReason })
    return handlers
      .handle("createSession", ({ payload }) =>
        Option.match(dev, {
          onNone: () => Effect.fail(notConfigured),
          // Each token, for any email, opens an account and a wallet at first use: limited per client address.
          onSome: (d) =>
            Effect.zipRight(
              Effect.flatMap(limits.client, (address) => limits.take("devSessions", address)),
              Effect.map(d.issue(payload), (token) => ({ token }))
            )
        }))
      .handle("jwks", () =>
        Option.match(dev, {
          onNone: () => Effect.fail(notConfigured),
          onSome: (d) => Effect.succeed({ keys: d.jwks.keys as ReadonlyArray<Record<string, unknown>> })
        }))
  }))
