import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import * as HttpMiddleware from "@effect/platform/HttpMiddleware"
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServer from "@effect/platform/HttpServer"
import type { SqlClient } from "@effect/sql"
import { type Clock, Effect, Layer, Option } from "effect"
import { createServer } from "node:http"
import { AccountsLive } from "../Accounts/Http.js"
import { AccountsRepo } from "../Accounts/Repo.js"
import { IpLimits } from "../Addresses/IpLimits.js"
import { AlertsLive, DevMailboxLive } from "../Alerts/Http.js"
import { NenasApi } from "../Api.js"
import { AppConfig } from "../AppConfig.js"
import { AuditLive } from "../Audit/Http.js"
import { AuditLog } from "../Audit/Repo.js"
import { ApiKeyAuth } from "../Auth/Api.js"
import { DashboardAuthLive, DevIdentityLive } from "../Auth/Http.js"
import { IdentityProviderLive } from "../Auth/IdentityProvider.js"
import { BillingLive, DevCheckoutLive, PaymentsServicesLive, StripeWebhookLive } from "../Billing/Http.js"
import { type PaymentProcessor, PaymentProcessorLive } from "../Billing/PaymentProcessor.js"
import { CacheLive } from "../Cache/Http.js"
import { CACHE_CHANNEL, ResponseCache } from "../Cache/ResponseCache.js"
import { DatabaseLive } from "../Database/Database.js"
import { Listener } from "../Database/Listener.js"
import { type EInvoicing, EInvoicingLive } from "../EInvoicing/MyInvois.js"
import { GuardrailsLive } from "../Guardrails/Http.js"
import { GuardrailsRepo } from "../Guardrails/Repo.js"
import { HealthLive } from "../Health/Http.js"
import { Consolidation } from "../Invoices/Consolidation.js"
import { EInvoiceRepo } from "../Invoices/EInvoiceRepo.js"
import { EInvoiceWorker } from "../Invoices/EInvoiceWorker.js"
import { DevEInvoicesLive, InvoicesLive } from "../Invoices/Http.js"
import { InvoicesRepo } from "../Invoices/Repo.js"
import { ApiKeyAuthLive } from "../Keys/Authentication.js"
import { KeyExpiry } from "../Keys/Expiring.js"
import { KeysLive } from "../Keys/Http.js"
import { KeyCache, KEYS_CHANNEL } from "../Keys/KeyCache.js"
import { KeyLastUsed } from "../Keys/LastUsed.js"
import { KeyLimitReached } from "../Keys/LimitReached.js"
import { KeysRepo } from "../Keys/Repo.js"
import { RotationSeal } from "../Keys/RotationSeal.js"
import { FrontResponse, makeFront } from "../Lane/Front.js"
import { ModelLane } from "../Lane/ModelLane.js"
import { LogsLive } from "../Logs/Http.js"
import { RequestLogReads } from "../Logs/Reads.js"
import { RequestLogs } from "../Logs/RequestLogs.js"
import { MembersLive } from "../Members/Http.js"
import { MembersRepo } from "../Members/Repo.js"
import { Idempotency } from "../Models/Admission/Idempotency.js"
import { CallLimits } from "../Models/Admission/RateLimits.js"
import { ModelCalls } from "../Models/Call/ModelCalls.js"
import { WebSearch } from "../Models/Call/WebSearch.js"
import { AnthropicMessagesLive, EmbeddingsLive, ModelCallsLive, ModelsLive } from "../Models/Http.js"
import { StoredConversations } from "../Models/OpenAi/StoredConversations.js"
import { LoggingLive } from "../Observability/Logging.js"
import { Metrics } from "../Observability/Metrics.js"
import { TracingLive } from "../Observability/Tracing.js"
import { Mail } from "../Outbox/Mail.js"
import { ProviderKeysLive } from "../ProviderKeys/Http.js"
import { PROVIDER_KEYS_CHANNEL, ProviderKeys } from "../ProviderKeys/ProviderKeys.js"
import { ProviderKeysRepo } from "../ProviderKeys/Repo.js"
import { ProviderKeySecrets } from "../ProviderKeys/SecretBox.js"
import { Breakers } from "../Providers/Breakers.js"
import { instrumentedProvider, traced } from "../Providers/Instrumented.js"
import { OwnKeyRoutingLive, ProviderLive } from "../Providers/Live.js"
import type { Provider, TestKeyProvider } from "../Providers/Provider.js"
import { TestKeyProviderLive } from "../Providers/Simulated.js"
import { StoredResponsesLive } from "../Responses/Http.js"
import { StoredResponses } from "../Responses/Store.js"
import { Router } from "../Routing/Router.js"
import { ImageFetcher } from "../Search/ImageFetch.js"
import { type Search, SearchLive } from "../Search/Search.js"
import { UsageLive } from "../Usage/Http.js"
import { GRANT_CHANNEL, KEY_LIMIT_CHANNEL } from "../Wallet/Grants/GrantRows.js"
import { ReservationLeases } from "../Wallet/Instances/Leases.js"
import { ReservationSweeper } from "../Wallet/Instances/Sweeper.js"
import { WalletRepo } from "../Wallet/Repo.js"
import { WalletSettings } from "../Wallet/Settings.js"
import { Spending } from "../Wallet/Spending.js"
import { WebhookDelivery } from "../Webhooks/Delivery.js"
import { WebhookEndpoints } from "../Webhooks/Endpoints.js"
import { WebhooksLive } from "../Webhooks/Http.js"
import { DashboardLive } from "./Dashboard.js"
import { DocsLive } from "./Docs.js"
import { answerParserErrors, PipelineLive } from "./Pipeline.js"
import { drainDeadline } from "./Shutdown.js"

/**
 * Parts a test may replace with a Layer of its own (a scripted provider, a
 * fixed router, canned search, an in-memory checkout); absent ones are chosen
 * from configuration as in production. `clock` replaces the server's `Clock`.
 */
export interface ServerOverrides {
  readonly provider?: Layer.Layer<Provider>
  /** The model test keys call (the simulated model unless replaced). */
  readonly testKeyProvider?: Layer.Layer<TestKeyProvider>
  readonly router?: Layer.Layer<Router>
  /** The upstream targets' circuit breakers (`Breakers.memory(...)`, or test/support/Breakers.ts's, opened by hand); else from configuration. */
  readonly breakers?: Layer.Layer<Breakers>
  readonly search?: Layer.Layer<Search>
  readonly paymentProcessor?: Layer.Layer<PaymentProcessor>
  /**
   * Calls settle through `Spending`'s own SQL (`Wallet/Settlement/Settle.ts`), so a
   * replacement must keep the SQL tables (a wrapper around `WalletRepo.layer`
   * that injects faults, say).
   */
  readonly walletRepo?: Layer.Layer<WalletRepo, never, Layer.Layer.Context<typeof WalletRepo.layer>>
  readonly clock?: Clock.Clock
  /** The stored-response store (a wrapper around `StoredResponses.layer` that counts its reads, say). */
  readonly storedResponses?: Layer.Layer<StoredResponses, never, SqlClient.SqlClient>
  /** MyInvois (`simulatedLayer({validateAfterMs})`, say); else from configuration. */
  readonly eInvoicing?: Layer.Layer<EInvoicing, never, AppConfig>
}

/** The instance's one LISTEN connection, on every channel it listens on, its state in the metrics. */
const ListenerLive = Layer.unwrapEffect(Effect.map(Metrics, (metrics) =>
  Listener.layer({
    channels: [KEYS_CHANNEL, GRANT_CHANNEL, KEY_LIMIT_CHANNEL, CACHE_CHANNEL, PROVIDER_KEYS_CHANNEL],
    onConnected: (connected) => metrics.listenConnected.set(connected ? 1 : 0),
    onReconnect: () => metrics.listenReconnects.inc()
  })))

/** Every service the handlers use; each real part is chosen from configuration in its own layer, unless overridden. */
export const makeServices = (overrides: ServerOverrides = {}) =>
  Layer.mergeAll(
    DashboardAuthLive,
    traced(ApiKeyAuth, "auth", ApiKeyAuthLive),
    PaymentsServicesLive,
    ReservationSweeper.layerRunning,
    // A team's own provider keys around the provider, for its live calls.
    ModelCalls.layer.pipe(Layer.provide(OwnKeyRoutingLive)),
    Idempotency.layer,
    CallLimits.layer,
    StoredConversations.layer,
    WebhookEndpoints.layer,
    WebhookDelivery.layerRunning,
    Mail.layerRunning,
    KeyExpiry.layerRunning,
    RotationSeal.layer,
    WalletSettings.layer,
    // E-invoices are submitted, polled, cancelled and consolidated in the background.
    EInvoiceWorker.layerRunning.pipe(
      Layer.provideMerge(Layer.merge(EInvoiceWorker.layer, Consolidation.layer)),
      Layer.provide(overrides.eInvoicing ?? EInvoicingLive)
    )
  ).pipe(
    // Accounts open their wallets through WalletRepo; Stripe's events and the handlers write the audit log.
    Layer.provideMerge(
      Layer.mergeAll(traced(Spending, "spending", Spending.layer), AccountsRepo.layer, AuditLog.layerRunning)
    ),
    Layer.provideMerge(Layer.mergeAll(
      KeyLastUsed.layer(),
      KeyCache.layer(),
      KeyLimitReached.layer,
      ResponseCache.layer,
      // A team's own provider keys, in memory on every instance (the call path and the handlers).
      ProviderKeys.layer,
      traced(WalletRepo, "wallet", overrides.walletRepo ?? WalletRepo.layer),
      overrides.router ?? Router.layer,
      instrumentedProvider(overrides.provider ?? ProviderLive),
      overrides.testKeyProvider ?? TestKeyProviderLive,
      ImageFetcher.layer,
      traced(WebSearch, "search", WebSearch.layer.pipe(Layer.provide(overrides.search ?? SearchLive)))
    )),
    // The provider tries targets through them; /readyz and /metrics list them.
    Layer.provideMerge(overrides.breakers ?? Breakers.layer),
    // The key cache and the grant pool hear the database through it.
    Layer.provideMerge(ListenerLive),
    Layer.provideMerge(Layer.mergeAll(
      IpLimits.layer,
      KeysRepo.layer,
      GuardrailsRepo.layer,
      ProviderKeysRepo.layer,
      ProviderKeySecrets.layer,
      InvoicesRepo.layer,
      EInvoiceRepo.layer,
      MembersRepo.layer,
      RequestLogReads.layer,
      IdentityProviderLive,
      overrides.paymentProcessor ?? PaymentProcessorLive,
      Metrics.Default
    )),
    Layer.provideMerge(
      Layer.mergeAll(RequestLogs.layer, overrides.storedResponses ?? StoredResponses.layer, ReservationLeases.layer())
    ),
    Layer.provideMerge(DatabaseLive)
  )

export const ServicesLive = makeServices()

const ApiLive = HttpApiBuilder.api(NenasApi).pipe(
  Layer.provide([
    ModelCallsLive,
    EmbeddingsLive,
    CacheLive,
    AnthropicMessagesLive,
    ModelsLive,
    StoredResponsesLive,
    KeysLive,
    BillingLive,
    InvoicesLive,
    GuardrailsLive,
    ProviderKeysLive,
    StripeWebhookLive,
    WebhooksLive,
    MembersLive,
    AccountsLive,
    AuditLive,
    AlertsLive,
    DevMailboxLive,
    LogsLive,
    UsageLive,
    DevIdentityLive,
    DevCheckoutLive,
    DevEInvoicesLive,
    HealthLive
  ])
)

/**
 * The HTTP application: the API, its docs (`/docs`, `/openapi.json`), the web dashboard (`/app/`)
 * and the error encoder; security headers, CORS and the access log are the server's front (`Lane/Front.ts`).
 */
const HttpAppLive = Layer.unwrapEffect(Effect.map(AppConfig, (config) => {
  const app = HttpApiBuilder.serve().pipe(
    Layer.provide([
      DocsLive,
      HttpApiBuilder.middlewareOpenApi({ path: "/openapi.json" }),
      DashboardLive,
      PipelineLive.pipe(Layer.provide(ModelLane.layer))
    ]),
    Layer.provide(ApiLive),
    // The router reads the path as sent, as every check before it does (`Lane/PathReading.ts`): no folded case, no merged slashes.
    Layer.locally(HttpRouter.currentRouterConfig, { caseSensitive: true, ignoreDuplicateSlashes: false })
  )
  // The platform's server span, made for every request even with no tracer (a URL parse, the headers redacted
  // and read for a parent, a span and a context copy): only while traces are exported.
  return Option.isNone(config.otlpEndpoint) ? HttpMiddleware.withTracerDisabledWhen(app, () => true) : app
}))

/** A whole request, body included, must arrive within this; Node's default is 300 s. */
export const REQUEST_TIMEOUT_MS = 60_000
/** Its headers within this; Node's default is 60 s. */
export const HEADERS_TIMEOUT_MS = 10_000

/**
 * A Node HTTP server that drops clients sending too slowly (holding a
 * connection open costs us, not them). Node checks these every
 * `connectionsCheckingInterval`, 30 s by default: once a second keeps them close to their values.
 */
export const makeNodeServer = () =>
  createServer({
    requestTimeout: REQUEST_TIMEOUT_MS,
    headersTimeout: HEADERS_TIMEOUT_MS,
    connectionsCheckingInterval: 1_000,
    ServerResponse: FrontResponse
  })

/** The Node HTTP server on `HOST:PORT`, its front before the app; stopping, it drains in-flight calls up to a deadline. */
export const NodeServerLive = Layer.unwrapEffect(
  Effect.gen(function*() {
    const { dashboardUrl, host, port } = yield* AppConfig
    const server = makeNodeServer()
    answerParserErrors(server, dashboardUrl)
    ;(yield* makeFront)(server)
    return Layer.provideMerge(drainDeadline(server), NodeHttpServer.layer(() => server, { port, host }))
  })
)

/**
 * The whole service, with `overrides` in place of the parts they name. The
 * services (and so the database and its migrations) are built before the
 * server listens: a request accepted earlier would wait for the app with no
 * answer.
 */
export const makeServer = (overrides: ServerOverrides = {}) => {
  const server = HttpAppLive.pipe(
    HttpServer.withLogAddress,
    Layer.provide(NodeServerLive),
    // The services stay visible to whoever runs the server: a test reads through them as a handler does.
    Layer.provideMerge(makeServices(overrides)),
    // Unless OTEL_EXPORTER_OTLP_ENDPOINT is set, no tracer runs: spans nobody reads would only cost CPU.
    Layer.provide(TracingLive),
    Layer.provide(LoggingLive)
  )
  return overrides.clock === undefined ? server : Layer.provide(server, Layer.setClock(overrides.clock))
}

/** The whole service as production runs it. */
export const ServerLive = makeServer()
