import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { ApiKeyAuth } from "../Auth/Api.js"
import { RateLimitExceeded, wire } from "../Domain/Errors.js"

/** The model catalog, `GET /v1/models`: the one public model and what it can do. */

export const Capability = Schema.Literal(
  "text",
  "vision",
  "reasoning",
  "web_search",
  "streaming",
  "tools",
  "structured_output",
  "embeddings"
)

export const ModelRecord = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("model"),
  owned_by: Schema.String,
  context_window: Schema.Int,
  max_output_tokens: Schema.Int,
  capabilities: Schema.Array(Capability),
  /** The endpoints that call it: OpenAI's two and Anthropic's Messages API. */
  endpoints: Schema.optional(
    Schema.Array(Schema.Literal("/v1/responses", "/v1/chat/completions", "/v1/messages", "/v1/embeddings"))
  ),
  /** How `/v1/responses` keeps what it answers: stored by default, for `retention_days`; `store: false` opts out. */
  response_storage: Schema.optional(
    Schema.Struct({ default_store: Schema.Boolean, retention_days: Schema.Int, opt_out: Schema.String })
  ),
  /** An embedding model's vector size (`dimensions` may shorten it). */
  dimensions: Schema.optional(Schema.Int)
})

export const ModelList = Schema.Struct({ object: Schema.Literal("list"), data: Schema.Array(ModelRecord) })

export class ModelsApi extends HttpApiGroup.make("models")
  .add(HttpApiEndpoint.get("list", "/v1/models").addSuccess(ModelList).addError(wire(RateLimitExceeded)))
  .middleware(ApiKeyAuth)
  .annotate(OpenApi.Description, "The models this service offers.")
{}
