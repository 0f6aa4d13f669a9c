import * as HttpApi from "@effect/platform/HttpApi"
import * as OpenApi from "@effect/platform/OpenApi"
import { AlertsApi, DevMailboxApi } from "./Alerts/Api.js"
import { AuditApi } from "./Audit/Api.js"
import { DevIdentityApi } from "./Auth/Api.js"
import { BillingApi, DevCheckoutApi, StripeWebhookApi } from "./Billing/Api.js"
import { ContextLengthExceeded, InternalError, InvalidRequest, NotFound, wire } from "./Domain/Errors.js"
import { HealthApi } from "./Health/Api.js"
import { KeysApi } from "./Keys/Api.js"
import { LogsApi } from "./Logs/Api.js"
import { AccountsApi, MembersApi } from "./Members/Api.js"
import { AnthropicMessagesApi } from "./Models/AnthropicApi.js"
import { ModelCallsApi } from "./Models/Api.js"
import { ModelsApi } from "./Models/CatalogApi.js"
import { StoredResponsesApi } from "./Responses/Api.js"
import { UsageApi } from "./Usage/Api.js"
import { WebhooksApi } from "./Webhooks/Api.js"

/** The whole contract of the service; OpenAPI and typed clients are derived from it. */
export class NenasApi extends HttpApi.make("nenas")
  .add(ModelCallsApi)
  .add(AnthropicMessagesApi)
  .add(ModelsApi)
  .add(StoredResponsesApi)
  .add(KeysApi)
  .add(BillingApi)
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
  .add(HealthApi)
  .addError(wire(InvalidRequest))
  .addError(wire(NotFound))
  .addError(wire(ContextLengthExceeded))
  .addError(wire(InternalError))
  .annotate(OpenApi.Title, "nenas")
  .annotate(OpenApi.Version, "1.0.0")
  .annotate(
    OpenApi.Description,
    "Model routing with prepaid billing in Malaysian ringgit. Every error body is `{type: \"error\", error: {...}}`."
  )
{}
