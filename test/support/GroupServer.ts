import { HttpApi, HttpApiBuilder, type HttpApiGroup, HttpClient, HttpClientRequest } from "@effect/platform"
import { NodeHttpServer } from "@effect/platform-node"
import { Context, Effect, Layer, Option } from "effect"
import { AccountsRepo } from "../../src/Accounts/Repo.js"
import { IpLimits } from "../../src/Addresses/IpLimits.js"
import { AppConfig } from "../../src/AppConfig.js"
import { AuditLog } from "../../src/Audit/Repo.js"
import { DashboardAuthLive } from "../../src/Auth/Http.js"
import { IdentityProvider } from "../../src/Auth/IdentityProvider.js"
import { AutoTopupOutcomes } from "../../src/Billing/AutoTopupCharges.js"
import { CardProcessor } from "../../src/Billing/CardProcessor.js"
import { Cards } from "../../src/Billing/Cards.js"
import { PaymentProcessor } from "../../src/Billing/PaymentProcessor.js"
import { Payments } from "../../src/Billing/Payments.js"
import { PaymentsRepo } from "../../src/Billing/Repo.js"
import type { Account } from "../../src/Domain/Account.js"
import {
  AuthenticationError,
  ContextLengthExceeded,
  InternalError,
  InvalidRequest,
  NotFound,
  wire
} from "../../src/Domain/Errors.js"
import type { Role } from "../../src/Domain/Roles.js"
import { makeTestLayer } from "../../src/Domain/TestLayer.js"
import { GuardrailsRepo } from "../../src/Guardrails/Repo.js"
import { PipelineLive } from "../../src/Http/Pipeline.js"
import { KeyExpiry } from "../../src/Keys/Expiring.js"
import { KeyCache } from "../../src/Keys/KeyCache.js"
import { KeyLastUsed } from "../../src/Keys/LastUsed.js"
import { KeyLimitReached } from "../../src/Keys/LimitReached.js"
import { KeysRepo } from "../../src/Keys/Repo.js"
import { RotationSeal } from "../../src/Keys/RotationSeal.js"
import { RequestLogReads } from "../../src/Logs/Reads.js"
import { RequestLogs } from "../../src/Logs/RequestLogs.js"
import { MembersRepo } from "../../src/Members/Repo.js"
import { Mail } from "../../src/Outbox/Mail.js"
import { StoredResponses } from "../../src/Responses/Store.js"
import { AutoTopups } from "../../src/Wallet/AutoTopupAttempts.js"
import { WalletRepo } from "../../src/Wallet/Repo.js"
import { WalletSettings } from "../../src/Wallet/Settings.js"
import { Spending } from "../../src/Wallet/Spending.js"
import { WebhookDelivery } from "../../src/Webhooks/Delivery.js"
import { WebhookEndpoints } from "../../src/Webhooks/Endpoints.js"
import type { Reply } from "./Http.js"

/**
 * Every service a dashboard area's handlers may use, by name. `groupServer`
 * fills each with a Layer whose every method dies when called, naming itself
 * (`makeTestLayer`), unless a test gives it some methods.
 */
const SERVICES = {
  AccountsRepo,
  AuditLog,
  AutoTopupOutcomes,
  AutoTopups,
  CardProcessor,
  Cards,
  GuardrailsRepo,
  IdentityProvider,
  IpLimits,
  KeyCache,
  KeyExpiry,
  KeyLastUsed,
  KeyLimitReached,
  KeysRepo,
  Mail,
  MembersRepo,
  PaymentProcessor,
  Payments,
  PaymentsRepo,
  RequestLogReads,
  RequestLogs,
  RotationSeal,
  Spending,
  StoredResponses,
  WalletRepo,
  WalletSettings,
  WebhookDelivery,
  WebhookEndpoints
} as const

type Services = typeof SERVICES

/** The methods a test gives, by service name: `{ KeysRepo: { update } }`. */
export type Stubs = { readonly [K in keyof Services]?: Partial<Context.Tag.Service<Services[K]>> }

/** Ana, the signed-in person of every `groupServer`: the owner of her personal account unless a test says otherwise. */
export const ANA: Account = {
  id: "acc_ana",
  issuer: "https://idp.test/",
  subject: "ana",
  email: "ana@example.com",
  suspended: false
}

/** Ana's session token: the identity provider knows this one and no other. */
export const ANA_SESSION = "session-of-ana"

/** What signing in as Ana needs; a test's own methods on these services come first. */
const signedIn = (role: Role): Stubs => ({
  IdentityProvider: {
    verify: (token) =>
      token === ANA_SESSION
        ? Effect.succeed({ issuer: ANA.issuer ?? "", subject: ANA.subject, email: ANA.email, name: null })
        : Effect.fail(new AuthenticationError({ message: "The session token is not valid." }))
  },
  AccountsRepo: { signIn: () => Effect.succeed(ANA) },
  MembersRepo: {
    membership: () =>
      Effect.succeed(Option.some({
        account: ANA,
        member: { id: "mem_ana", role, email: ANA.email, name: null, monthlySpendLimitMicroMyr: null }
      }))
  },
  IpLimits: { client: Effect.succeed("203.0.113.9"), take: () => Effect.void },
  AuditLog: { within: (change) => change }
})

export interface GroupServerOptions {
  /** Ana's role in her account (default `owner`). */
  readonly role?: Role
  /** Configuration the handlers read, over the defaults. */
  readonly config?: Parameters<typeof AppConfig.layerWith>[0]
}

/**
 * One dashboard area's handlers (`live`, its group `group`) served on a test
 * port with the real session check and request pipeline, Ana signed in, and
 * every service filled by `stubs` or dying when called. No PostgreSQL: a
 * handler test stubs the one repository method it needs
 * (docs/testing.md, "Stubbing one service method").
 */
export const groupServer = <Group extends HttpApiGroup.HttpApiGroup.Any, E, R>(
  group: Group,
  live: Layer.Layer<HttpApiGroup.ApiGroup<"nenas", HttpApiGroup.HttpApiGroup.Name<Group>>, E, R>,
  stubs: Stubs = {},
  options: GroupServerOptions = {}
) => {
  const api = HttpApi.make("nenas")
    .add(group)
    .addError(wire(InvalidRequest))
    .addError(wire(NotFound))
    .addError(wire(ContextLengthExceeded))
    .addError(wire(InternalError))
  const session = signedIn(options.role ?? "owner")
  const services = (Object.keys(SERVICES) as Array<keyof Services>).map((name) => {
    const tag = SERVICES[name] as unknown as Context.Tag<unknown, object>
    return makeTestLayer(tag)({ ...session[name], ...stubs[name] })
  })
  const served = HttpApiBuilder.serve().pipe(
    Layer.provide(PipelineLive),
    Layer.provide(HttpApiBuilder.api(api).pipe(Layer.provide(live as unknown as Layer.Layer<never>))),
    Layer.provide(DashboardAuthLive),
    Layer.provide(Layer.mergeAll(...(services as unknown as [Layer.Layer<never>]))),
    Layer.provide(AppConfig.layerWith({ dashboardUrl: "https://dash.test", ...options.config })),
    Layer.provideMerge(NodeHttpServer.layerTest)
  )
  return served as Layer.Layer<HttpClient.HttpClient, E>
}

/** One request to a `groupServer` as Ana (or with `token`), its JSON body read. */
export const asAna = (
  method: "GET" | "POST" | "PATCH" | "PUT" | "DELETE",
  path: string,
  options: { readonly json?: unknown; readonly token?: string } = {}
) =>
  Effect.gen(function*() {
    const base = HttpClientRequest.make(method)(path).pipe(HttpClientRequest.bearerToken(options.token ?? ANA_SESSION))
    const request = options.json === undefined ? base : yield* HttpClientRequest.bodyJson(base, options.json)
    const response = yield* HttpClient.execute(request)
    const text = yield* response.text
    const reply: Reply = {
      status: response.status,
      headers: new Headers(response.headers),
      body: text === "" ? undefined : JSON.parse(text),
      text
    }
    return reply
  }).pipe(Effect.orDie)
