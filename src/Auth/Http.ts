import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import { Effect, Layer, Option, Redacted } from "effect"
import { IpLimits } from "../Addresses/IpLimits.js"
import { NenasApi } from "../Api.js"
import { NotFound } from "../Domain/Errors.js"
import { DashboardAuth } from "./Api.js"
import { IdentityProvider } from "./IdentityProvider.js"
import { makeSessionCheck } from "./Session.js"

export const DashboardAuthLive = Layer.effect(
  DashboardAuth,
  Effect.map(makeSessionCheck, (check) => DashboardAuth.of({ sessionToken: (token) => check(Redacted.value(token)) }))
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
