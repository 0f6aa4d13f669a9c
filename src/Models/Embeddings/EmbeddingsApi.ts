import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { CallHeaders, modelCallGroup } from "../OpenAi/Api.js"

/** `POST /v1/embeddings` in OpenAI's shape (docs/api/embeddings.md). */

export const EMBEDDING_MODEL = "svc/nenas-embed"
/** The embedding model's size, and the most tokens one item may have. */
export const EMBEDDING_SIZE = 1536
export const MAX_ITEM_TOKENS = 8192
export const MAX_ITEMS = 2048

/** A token id, as OpenAI's token-array inputs carry them. */
const TokenId = Schema.Int.pipe(Schema.between(0, 10_000_000))

/**
 * One text, texts, one token array, or token arrays. The items' bounds (count, tokens, characters) are
 * checked by the call, which names the item (`input[3]`).
 */
export const EmbeddingInput = Schema.Union(
  Schema.String,
  Schema.Array(Schema.String),
  Schema.Array(TokenId),
  Schema.Array(Schema.Array(TokenId))
)

export const EmbeddingsRequest = Schema.Struct({
  model: Schema.Literal(EMBEDDING_MODEL),
  input: EmbeddingInput,
  encoding_format: Schema.optionalWith(Schema.Literal("float", "base64"), { default: () => "float" as const }),
  dimensions: Schema.optional(Schema.Int.pipe(Schema.between(1, EMBEDDING_SIZE))),
  user: Schema.optional(Schema.String.pipe(Schema.maxLength(256)))
}).annotations({
  identifier: "EmbeddingsRequest",
  examples: [{ model: EMBEDDING_MODEL, input: ["Kuala Lumpur", "Johor Bahru"], encoding_format: "float" }]
})
export type EmbeddingsRequest = typeof EmbeddingsRequest.Type

export const EmbeddingsResponse = Schema.Struct({
  object: Schema.Literal("list"),
  data: Schema.Array(Schema.Struct({
    object: Schema.Literal("embedding"),
    index: Schema.Int,
    /** Floats, or with `encoding_format: base64` their little-endian float32 bytes in base64. */
    embedding: Schema.Union(Schema.Array(Schema.Number), Schema.String)
  })),
  model: Schema.String,
  usage: Schema.Struct({ prompt_tokens: Schema.Int, total_tokens: Schema.Int }),
  cost_myr: Schema.String
}).annotations({ identifier: "EmbeddingsResponse" })
export type EmbeddingsResponse = typeof EmbeddingsResponse.Type

export class EmbeddingsApi extends HttpApiGroup.make("embeddings")
  .add(
    HttpApiEndpoint.post("embeddings", "/v1/embeddings")
      .setPayload(EmbeddingsRequest)
      .setHeaders(CallHeaders)
      .addSuccess(EmbeddingsResponse)
  )
  .pipe(modelCallGroup)
  .annotate(OpenApi.Description, "Embeddings of texts or token arrays, billed per input token.")
{}
