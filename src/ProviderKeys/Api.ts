import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as HttpApiSchema from "@effect/platform/HttpApiSchema"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import { InvalidRequest, NotFound, RateLimitExceeded, wire } from "../Domain/Errors.js"
import { ADMINS, allowRoles, EVERY_ROLE } from "../Domain/Roles.js"
import { NoUrlParams, SqlString } from "../Domain/Strict.js"

/** A team's own provider keys (docs/api/provider-keys.md, "Adding a key"). */

const strict = { parseOptions: { onExcessProperty: "error" as const } }

export const ProviderKeyMode = Schema.Literal("first", "fallback", "only")
export const ProviderKeyStatus = Schema.Literal("unchecked", "ok", "refused", "failing")

const Name = Schema.compose(Schema.Trim, SqlString).pipe(Schema.minLength(1), Schema.maxLength(100))
const BaseUrl = Schema.compose(Schema.Trim, SqlString).pipe(Schema.minLength(1), Schema.maxLength(2048))
/** A model id at the provider (`gpt-4.1-mini`, `meta-llama/Llama-3.3-70B-Instruct`, `qwen2.5:7b`). */
const ModelId = Schema.compose(Schema.Trim, SqlString).pipe(Schema.minLength(1), Schema.maxLength(200))

/** The most characters of an API key; what it is made of is checked without quoting it back. */
export const API_KEY_MAX = 1000
/** Printable ASCII without spaces: what an `Authorization` header carries. */
const API_KEY_CHARACTERS = /^[\x21-\x7e]+$/

/** Its refusal never quotes the value: the secret stays out of every answer. */
const ApiKey = Schema.String.pipe(
  Schema.filter((key) => key.length <= API_KEY_MAX && API_KEY_CHARACTERS.test(key), {
    message: () => `must be the provider's API key: 1 to ${API_KEY_MAX} printable ASCII characters, no spaces`
  })
)

/** The model asked at the provider for each routing category; without `embedding`, embeddings never go there. */
export const ProviderKeyModels = Schema.Struct({
  general: ModelId,
  reasoning: ModelId,
  embedding: Schema.optionalWith(Schema.NullOr(ModelId), { default: () => null })
}).annotations({ identifier: "ProviderKeyModels", ...strict })

export const ProviderKeyRecord = Schema.Struct({
  id: Schema.String,
  name: Schema.String,
  /** OpenAI-compatible, without a trailing slash: calls go to `{base_url}/chat/completions`. */
  base_url: Schema.String,
  models: Schema.Struct({ general: Schema.String, reasoning: Schema.String, embedding: Schema.NullOr(Schema.String) }),
  mode: ProviderKeyMode,
  /** The API key's last four characters (empty for a key of 8 or fewer); the key itself is never answered. */
  last4: Schema.String,
  /** `ok` once the provider accepted the key; `refused` (401 or 403) or `failing` from the latest calls. */
  status: ProviderKeyStatus,
  last_error: Schema.NullOr(Schema.String),
  created_at: Schema.String
}).annotations({
  identifier: "ProviderKey",
  examples: [{
    id: "pk_01JD4Q8Z7K3M9X2V5B6N8R1T0Y",
    name: "our OpenAI account",
    base_url: "https://api.openai.com/v1",
    models: { general: "gpt-4.1-mini", reasoning: "o4-mini", embedding: "text-embedding-3-small" },
    mode: "first",
    last4: "x9Qa",
    status: "ok",
    last_error: null,
    created_at: "2026-11-24T21:14:03.000Z"
  }]
})
export type ProviderKeyRecord = typeof ProviderKeyRecord.Type

export const CreateProviderKeyRequest = Schema.Struct({
  name: Name,
  base_url: BaseUrl,
  api_key: ApiKey,
  models: ProviderKeyModels,
  mode: ProviderKeyMode
}).annotations({
  identifier: "CreateProviderKeyRequest",
  ...strict,
  examples: [{
    name: "our OpenAI account",
    base_url: "https://api.openai.com/v1",
    api_key: "sk-…",
    models: { general: "gpt-4.1-mini", reasoning: "o4-mini", embedding: "text-embedding-3-small" },
    mode: "first"
  }]
})

/** Every field optional: an absent one stays as it is; `models` is replaced whole. */
export const UpdateProviderKeyRequest = Schema.Struct({
  name: Schema.optional(Name),
  base_url: Schema.optional(BaseUrl),
  api_key: Schema.optional(ApiKey),
  models: Schema.optional(ProviderKeyModels),
  mode: Schema.optional(ProviderKeyMode)
}).annotations({ identifier: "UpdateProviderKeyRequest", ...strict, examples: [{ mode: "fallback" }] })

export const ProviderKeyResponse = Schema.Struct({ provider_key: ProviderKeyRecord })

const Id = HttpApiSchema.param("id", SqlString)

export class ProviderKeysApi extends HttpApiGroup.make("providerKeys")
  .add(
    HttpApiEndpoint.get("list", "/dashboard/provider-keys").setUrlParams(NoUrlParams)
      .addSuccess(Schema.Struct({ provider_keys: Schema.Array(ProviderKeyRecord) }))
      .annotate(OpenApi.Description, "The account's provider keys, oldest first; never their API keys.")
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.post("create", "/dashboard/provider-keys")
      .setPayload(CreateProviderKeyRequest)
      .addSuccess(ProviderKeyResponse, { status: 201 })
      .addError(wire(RateLimitExceeded))
      .annotate(
        OpenApi.Description,
        "Adds a provider key: its base URL passes the address guard, then one `GET {base_url}/models` with the " +
          "key checks it. Every instance uses it within a second; it is audited (never the API key)."
      )
      .pipe(allowRoles(...ADMINS))
  )
  .add(
    HttpApiEndpoint.patch("update")`/dashboard/provider-keys/${Id}`
      .setPayload(UpdateProviderKeyRequest)
      .addSuccess(ProviderKeyResponse)
      .addError(wire(NotFound))
      .addError(wire(RateLimitExceeded))
      .annotate(
        OpenApi.Description,
        "Changes a provider key in place; a new base URL or API key is checked as on creation."
      )
      .pipe(allowRoles(...ADMINS))
  )
  .add(
    HttpApiEndpoint.post("check")`/dashboard/provider-keys/${Id}/check`
      .addSuccess(ProviderKeyResponse)
      .addError(wire(NotFound))
      .addError(wire(RateLimitExceeded))
      .annotate(
        OpenApi.Description,
        "Checks the stored key again with one `GET {base_url}/models`; the record's `status` and `last_error` " +
          "say how it went (`ok`, `refused`, `failing`)."
      )
      .pipe(allowRoles(...ADMINS))
  )
  .add(
    HttpApiEndpoint.del("delete")`/dashboard/provider-keys/${Id}`
      .addError(wire(NotFound))
      .annotate(OpenApi.Description, "Deletes a provider key; calls stop using it within a second.")
      .pipe(allowRoles(...ADMINS))
  )
  .addError(wire(InvalidRequest))
  .middleware(DashboardAuth)
  .annotate(
    OpenApi.Description,
    "A team's own OpenAI-compatible provider accounts, which its calls are routed to (bring your own key)."
  )
{}
