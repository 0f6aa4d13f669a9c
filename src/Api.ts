import * as HttpApi from "@effect/platform/HttpApi"
import * as OpenApi from "@effect/platform/OpenApi"
import { AccountsApi } from "./Accounts/Api.js"
import { AlertsApi, DevMailboxApi } from "./Alerts/Api.js"
import { AuditApi } from "./Audit/Api.js"
import { DevIdentityApi } from "./Auth/Api.js"
import { BillingApi, DevCheckoutApi, StripeWebhookApi } from "./Billing/Api.js"
import { CacheApi } from "./Cache/Api.js"
import { ContextLengthExceeded, InternalError, InvalidRequest, NotFound, wire } from "./Domain/Errors.js"
import { withHeader } from "./Domain/OpenApiDocument.js"
import { GuardrailsApi } from "./Guardrails/Api.js"
import { HealthApi } from "./Health/Api.js"
import { DevEInvoicesApi, InvoicesApi } from "./Invoices/Api.js"
import { KeysApi } from "./Keys/Api.js"
import { LogsApi } from "./Logs/Api.js"
import { MembersApi } from "./Members/Api.js"
import { AnthropicErrorBody, AnthropicMessagesApi } from "./Models/Anthropic/AnthropicApi.js"
import { ModelsApi } from "./Models/CatalogApi.js"
import { EmbeddingsApi } from "./Models/Embeddings/EmbeddingsApi.js"
import { ModelCallsApi } from "./Models/OpenAi/Api.js"
import { ProviderKeysApi } from "./ProviderKeys/Api.js"
import { StoredResponsesApi } from "./Responses/Api.js"
import { UsageApi } from "./Usage/Api.js"
import { WebhooksApi } from "./Webhooks/Api.js"

type Json = Record<string, unknown>
type Operation = Json & { readonly security?: ReadonlyArray<Json> }

/** Anthropic's header for the API key: the key middleware reads it when there is no Bearer token. */
const X_API_KEY = "xApiKey"
const SECURITY_SCHEMES: Json = {
  apiKey: {
    type: "http",
    scheme: "bearer",
    description: "An API key (`nns_live_…` or `nns_test_…`) as `Authorization: Bearer`."
  },
  [X_API_KEY]: {
    type: "apiKey",
    in: "header",
    name: "x-api-key",
    description: "An API key in Anthropic's header, on every `/v1` path."
  },
  sessionToken: { type: "http", scheme: "bearer", description: "A dashboard session token from the identity provider." }
}

const nenasAccount = withHeader({
  name: "Nenas-Account",
  required: false,
  description: "The account (team) the request acts on: an id from `GET /dashboard/accounts`; default the person's own."
})

const secures = (operation: Operation, scheme: string) => (operation.security ?? []).some((s) => scheme in s)

/**
 * What the middlewares read by hand: an API key may come as `x-api-key`, and a dashboard session names its
 * account with `Nenas-Account`.
 */
const documentSecurity = (spec: Json): Json => {
  const paths: Json = {}
  for (const [path, methods] of Object.entries(spec["paths"] as Record<string, Record<string, Operation>>)) {
    const out: Json = {}
    for (const [method, operation] of Object.entries(methods)) {
      out[method] = secures(operation, "apiKey")
        ? Object.assign({}, operation, { security: [...(operation.security ?? []), { [X_API_KEY]: [] }] })
        : secures(operation, "sessionToken")
        ? nenasAccount(operation)
        : operation
    }
    paths[path] = out
  }
  const components = spec["components"] as Json
  const securitySchemes = Object.assign({}, components["securitySchemes"] as Json, SECURITY_SCHEMES)
  return Object.assign({}, spec, { paths, components: Object.assign({}, components, { securitySchemes }) })
}

/** The whole contract of the service; OpenAPI and typed clients are derived from it. */
export class NenasApi extends HttpApi.make("nenas")
  .add(ModelCallsApi)
  .add(EmbeddingsApi)
  .add(CacheApi)
  .add(AnthropicMessagesApi)
  .add(ModelsApi)
  .add(StoredResponsesApi)
  .add(KeysApi)
  .add(BillingApi)
  .add(InvoicesApi)
  .add(GuardrailsApi)
  .add(ProviderKeysApi)
  .add(LogsApi)
  .add(UsageApi)
  .add(StripeWebhookApi)
  .add(WebhooksApi)
  .add(MembersApi)
  .add(AccountsApi)
  .add(AuditApi)
  .add(AlertsApi)
  .add(DevMailboxApi)
  .add(DevIdentityApi)
  .add(DevCheckoutApi)
  .add(DevEInvoicesApi)
  .add(HealthApi)
  .addError(wire(InvalidRequest))
  .addError(wire(NotFound))
  .addError(wire(ContextLengthExceeded))
  .addError(wire(InternalError))
  .annotate(HttpApi.AdditionalSchemas, [AnthropicErrorBody])
  .annotate(OpenApi.Transform, documentSecurity)
  .annotate(OpenApi.Title, "nenas")
  .annotate(OpenApi.Version, "1.0.0")
  .annotate(
    OpenApi.Description,
    "Model routing with prepaid billing in Malaysian ringgit. Every error body is `{type: \"error\", error: {...}}`; " +
      "on `/v1/messages` it is Anthropic's (AnthropicErrorBody)."
  )
{}
