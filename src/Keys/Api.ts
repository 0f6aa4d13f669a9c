import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema, OpenApi } from "@effect/platform"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import { InvalidRequest, NotFound, wire } from "../Domain/Errors.js"
import { Rfc3339DateTime, SqlString } from "../Domain/Strict.js"

export const Environment = Schema.Literal("live", "test")
export type Environment = typeof Environment.Type

export const ApiKeyStatus = Schema.Literal("active", "expired")

export const ApiKeyRecord = Schema.Struct({
  id: Schema.String,
  name: Schema.String,
  prefix: Schema.String,
  environment: Environment,
  status: ApiKeyStatus,
  created_at: Schema.String,
  last_used_at: Schema.NullOr(Schema.String),
  monthly_spend_limit_micro_myr: Schema.NullOr(Schema.Int),
  expires_at: Schema.NullOr(Schema.String)
}).annotations({ identifier: "ApiKey" })
export type ApiKeyRecord = typeof ApiKeyRecord.Type

/** Upper bound of a monthly spend limit: 1 billion MYR keeps micro-MYR a safe integer. */
const MAX_LIMIT_MYR = 1_000_000_000

export const CreateApiKeyRequest = Schema.Struct({
  name: Schema.compose(Schema.Trim, SqlString).pipe(Schema.minLength(1), Schema.maxLength(100)),
  environment: Schema.optionalWith(Environment, { default: () => "live" as const }),
  monthly_spend_limit_myr: Schema.optional(
    Schema.Number.pipe(Schema.finite(), Schema.between(0, MAX_LIMIT_MYR))
  ),
  expires_at: Schema.optional(Rfc3339DateTime)
}).annotations({ identifier: "CreateApiKeyRequest" })

export const CreateApiKeyResponse = Schema.Struct({
  key: ApiKeyRecord,
  full_key: Schema.String,
  warning: Schema.String
})

export const ApiKeyList = Schema.Struct({ keys: Schema.Array(ApiKeyRecord) })

export const Ok = Schema.Struct({ ok: Schema.Literal(true) })

export class KeysApi extends HttpApiGroup.make("apiKeys")
  .add(
    HttpApiEndpoint.post("create", "/dashboard/api-keys")
      .setPayload(CreateApiKeyRequest)
      .addSuccess(CreateApiKeyResponse, { status: 201 })
      .addError(wire(InvalidRequest))
  )
  .add(HttpApiEndpoint.get("list", "/dashboard/api-keys").addSuccess(ApiKeyList))
  .add(
    HttpApiEndpoint.del("delete")`/dashboard/api-keys/${HttpApiSchema.param("id", SqlString)}`
      .addSuccess(Ok)
      .addError(wire(NotFound))
  )
  .middleware(DashboardAuth)
  .annotate(OpenApi.Description, "API keys of the signed-in developer.")
{}
