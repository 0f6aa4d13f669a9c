import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as HttpApiSchema from "@effect/platform/HttpApiSchema"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import { IdempotencyConflict, InvalidRequest, NotFound, wire } from "../Domain/Errors.js"
import { allowRoles, EVERY_ROLE, KEY_MAKERS } from "../Domain/Roles.js"
import { NoUrlParams, Rfc3339DateTime, SqlString } from "../Domain/Strict.js"
import { GuardrailOverride } from "../Guardrails/Api.js"

export const Environment = Schema.Literal("live", "test")
export type Environment = typeof Environment.Type

export const ApiKeyStatus = Schema.Literal("active", "expired", "disabled")

export const ApiKeyRecord = Schema.Struct({
  id: Schema.String,
  name: Schema.String,
  prefix: Schema.String,
  environment: Environment,
  status: ApiKeyStatus,
  created_at: Schema.String,
  last_used_at: Schema.NullOr(Schema.String),
  monthly_spend_limit_micro_myr: Schema.NullOr(Schema.Int),
  /** Billed to the key this month (in `BUSINESS_TIMEZONE`) as written: settled calls (other instances' within moments), not calls in flight. */
  month_to_date_spend_micro_myr: Schema.Int,
  expires_at: Schema.NullOr(Schema.String),
  /** What the key is held to now: its own limit, else the operator's default, never above the ceiling. */
  rate_limit_rpm: Schema.Int,
  rate_limit_concurrent: Schema.Int,
  /** The member who created the key (or was given it): its budget caps the key's spend; a developer changes only its own. */
  member_id: Schema.NullOr(Schema.String),
  /** The key's guardrail override (docs/api/guardrails.md, "Policies"); null: the account's policy. */
  guardrails: Schema.NullOr(GuardrailOverride),
  /** Its calls are cached for this long (docs/api/cache.md, "Turning it on"); null: only when a request asks. */
  cache_ttl_seconds: Schema.NullOr(Schema.Int)
}).annotations({
  identifier: "ApiKey",
  examples: [{
    id: "key_01JD4Q8Z7K3M9X2V5B6N8R1T0Y",
    name: "production backend",
    prefix: "nns_live_a1B",
    environment: "live",
    status: "disabled",
    created_at: "2026-11-01T08:00:00.000Z",
    last_used_at: "2026-11-24T21:14:03.000Z",
    monthly_spend_limit_micro_myr: 50_000_000,
    month_to_date_spend_micro_myr: 12_345_678,
    expires_at: null,
    rate_limit_rpm: 120,
    rate_limit_concurrent: 5,
    member_id: "mem_01JD4Q8Z7K3M9X2V5B6N8R1T0Z",
    guardrails: null,
    cache_ttl_seconds: null
  }]
})
export type ApiKeyRecord = typeof ApiKeyRecord.Type

/** Upper bound of a monthly spend limit: 1 billion MYR keeps micro-MYR a safe integer. */
const MAX_LIMIT_MYR = 1_000_000_000

const Name = Schema.compose(Schema.Trim, SqlString).pipe(Schema.minLength(1), Schema.maxLength(100))
const LimitMyr = Schema.Number.pipe(Schema.finite(), Schema.between(0, MAX_LIMIT_MYR))
/** Bounded by the operator's ceiling (`RATE_LIMIT_RPM_MAX`), checked by the handler. */
const Rpm = Schema.Int.pipe(Schema.between(1, 1_000_000_000))
/** Bounded by the operator's ceiling (`RATE_LIMIT_CONCURRENT_MAX`), checked by the handler. */
const Concurrent = Schema.Int.pipe(Schema.between(1, 1_000_000_000))
/** How long the response cache keeps a key's answers (docs/api/cache.md, "Turning it on"). */
export const CacheTtlSeconds = Schema.Int.pipe(Schema.between(60, 86_400))

export const CreateApiKeyRequest = Schema.Struct({
  name: Name,
  environment: Schema.optionalWith(Environment, { default: () => "live" as const }),
  monthly_spend_limit_myr: Schema.optional(LimitMyr),
  expires_at: Schema.optional(Rfc3339DateTime),
  rate_limit_rpm: Schema.optional(Rpm),
  rate_limit_concurrent: Schema.optional(Concurrent),
  cache_ttl_seconds: Schema.optional(CacheTtlSeconds)
}).annotations({ identifier: "CreateApiKeyRequest" })

/** Every field optional: an absent one stays as it is; `null` removes a limit, an expiry, or returns to a default. */
export const UpdateApiKeyRequest = Schema.Struct({
  name: Schema.optional(Name),
  monthly_spend_limit_myr: Schema.optional(Schema.NullOr(LimitMyr)),
  expires_at: Schema.optional(Schema.NullOr(Rfc3339DateTime)),
  disabled: Schema.optional(Schema.Boolean),
  rate_limit_rpm: Schema.optional(Schema.NullOr(Rpm)),
  rate_limit_concurrent: Schema.optional(Schema.NullOr(Concurrent)),
  /** The parts of the account's guardrail policy this key replaces; null: the account's policy whole. */
  guardrails: Schema.optional(Schema.NullOr(GuardrailOverride)),
  /** Null: the key's calls are cached only when a request asks (`Nenas-Cache: on`). */
  cache_ttl_seconds: Schema.optional(Schema.NullOr(CacheTtlSeconds))
}).annotations({
  identifier: "UpdateApiKeyRequest",
  examples: [
    { monthly_spend_limit_myr: 50, disabled: false },
    { disabled: true },
    { name: "production backend", expires_at: null, rate_limit_rpm: 120, rate_limit_concurrent: 5 }
  ]
})

export const RotateApiKeyRequest = Schema.Struct({
  /** How long the replaced secret keeps working. */
  grace_seconds: Schema.optionalWith(Schema.Int.pipe(Schema.between(0, 86_400)), { default: () => 0 })
}).annotations({ identifier: "RotateApiKeyRequest", examples: [{ grace_seconds: 3_600 }] })

export const RotateApiKeyResponse = Schema.Struct({
  key: ApiKeyRecord,
  full_key: Schema.String,
  /** Until when the replaced secret still works; null when it stopped at once. */
  previous_key_valid_until: Schema.NullOr(Schema.String),
  warning: Schema.String
}).annotations({ identifier: "RotateApiKeyResponse" })

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
      .pipe(allowRoles(...KEY_MAKERS))
  )
  .add(
    HttpApiEndpoint.get("list", "/dashboard/api-keys").setUrlParams(NoUrlParams).addSuccess(ApiKeyList)
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.patch("update")`/dashboard/api-keys/${HttpApiSchema.param("id", SqlString)}`
      .setPayload(UpdateApiKeyRequest)
      .addSuccess(ApiKeyRecord)
      .addError(wire(InvalidRequest))
      .addError(wire(NotFound))
      .annotate(
        OpenApi.Description,
        "Changes a key in place: name, monthly spend limit, expiry, rate limits, disabled. Every instance applies the change within a second."
      ).pipe(allowRoles(...KEY_MAKERS))
  )
  .add(
    HttpApiEndpoint.post("rotate")`/dashboard/api-keys/${HttpApiSchema.param("id", SqlString)}/rotate`
      .setPayload(RotateApiKeyRequest)
      .setHeaders(
        Schema.Struct({
          "idempotency-key": Schema.optional(SqlString.pipe(Schema.minLength(1), Schema.maxLength(255)))
        })
      )
      .addSuccess(RotateApiKeyResponse)
      .addError(wire(InvalidRequest))
      .addError(wire(NotFound))
      .addError(wire(IdempotencyConflict))
      .annotate(
        OpenApi.Description,
        "Replaces the key's secret; id, name, limits and history stay. The old secret works for `grace_seconds`, then answers revoked_api_key. Repeated with the same `Idempotency-Key` (16 to 255 characters; within a day), it returns the same new secret."
      ).pipe(allowRoles(...KEY_MAKERS))
  )
  .add(
    HttpApiEndpoint.del("delete")`/dashboard/api-keys/${HttpApiSchema.param("id", SqlString)}`
      .addSuccess(Ok)
      .addError(wire(NotFound))
      .pipe(allowRoles(...KEY_MAKERS))
  )
  .middleware(DashboardAuth)
  .annotate(OpenApi.Description, "API keys of the signed-in developer.")
{}
