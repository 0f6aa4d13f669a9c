import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { documented, withErrorBody, withEventStream } from "../../Domain/OpenApiDocument.js"
import { SqlString } from "../../Domain/Strict.js"
import { CallHeaders, CostCapMyr, MAX_OUTPUT_TOKENS, modelCallGroup, RoutingInfo } from "../OpenAi/Api.js"

/**
 * Anthropic's Messages API as nenas takes it
 * (docs/api/anthropic.md, "Anthropic Messages API"): `POST /v1/messages` and
 * `POST /v1/messages/count_tokens`. Fields Anthropic documents that are not
 * named here (`context_management`, `container`, `mcp_servers`, `service_tier`,
 * …) are accepted and ignored.
 */

const JsonObject = Schema.Record({ key: Schema.String, value: Schema.Unknown })
const Open = Schema.Record({ key: Schema.String, value: Schema.Unknown })

/** `cache_control` on a block or tool: accepted, not acted on (the upstream caches prompts by itself). */
const CacheControl = Schema.optional(
  Schema.NullOr(Schema.Unknown).annotations({
    description: "Accepted and ignored: the upstream caches prompt prefixes by itself; cached tokens show in usage."
  })
)

export const AnthropicTextBlock = Schema.Struct({
  type: Schema.Literal("text"),
  text: Schema.String,
  cache_control: CacheControl
}).annotations({ identifier: "AnthropicTextBlock" })

export const AnthropicImageSource = Schema.Union(
  Schema.Struct({
    type: Schema.Literal("base64"),
    media_type: Schema.Literal("image/jpeg", "image/png", "image/gif", "image/webp"),
    data: Schema.String
  }),
  Schema.Struct({ type: Schema.Literal("url"), url: Schema.String }),
  Schema.Struct({ type: Schema.Literal("file"), file_id: Schema.String })
)

export const AnthropicImageBlock = Schema.Struct({
  type: Schema.Literal("image"),
  source: AnthropicImageSource,
  cache_control: CacheControl
}).annotations({ identifier: "AnthropicImageBlock" })

export const AnthropicToolUseBlock = Schema.Struct({
  type: Schema.Literal("tool_use"),
  id: Schema.String.pipe(Schema.minLength(1)),
  name: Schema.String.pipe(Schema.minLength(1)),
  input: JsonObject,
  cache_control: CacheControl
}).annotations({ identifier: "AnthropicToolUseBlock" })

/** Thinking sent back with an earlier answer: accepted, and not forwarded (the upstream reasons afresh). */
export const AnthropicThinkingBlock = Schema.Struct({
  type: Schema.Literal("thinking"),
  thinking: Schema.String,
  signature: Schema.optional(Schema.String)
})

export const AnthropicRedactedThinkingBlock = Schema.Struct({
  type: Schema.Literal("redacted_thinking"),
  data: Schema.String
})

/** The block types named above: a block of another type is read as `AnthropicOtherBlock`. */
export const KNOWN_BLOCK_TYPES: ReadonlyArray<string> = [
  "text",
  "image",
  "tool_use",
  "tool_result",
  "thinking",
  "redacted_thinking"
]

/**
 * A block of a type not named above (`document`, `search_result`, `server_tool_use`, …), read as
 * `{type: "other", block_type}`: the translation answers `unsupported_input` naming it, or drops it
 * where it records work done server-side for an earlier answer.
 */
export const AnthropicOtherBlock = Schema.transform(
  Schema.Struct(
    {
      type: Schema.String.pipe(
        Schema.filter((type) =>
          !KNOWN_BLOCK_TYPES.includes(type) || `a '${type}' block is missing a field or has a wrong one`
        )
      )
    },
    Open
  ),
  Schema.Struct({ type: Schema.Literal("other"), block_type: Schema.String }),
  {
    strict: true,
    decode: (block) => ({ type: "other" as const, block_type: block.type }),
    encode: (block) => ({ type: block.block_type })
  }
).annotations({ identifier: "AnthropicOtherBlock" })

export const AnthropicToolResultBlock = Schema.Struct({
  type: Schema.Literal("tool_result"),
  tool_use_id: Schema.String.pipe(Schema.minLength(1)),
  content: Schema.optional(Schema.Union(
    Schema.String,
    Schema.Array(Schema.Union(AnthropicTextBlock, AnthropicImageBlock, AnthropicOtherBlock))
  )),
  is_error: Schema.optional(Schema.NullOr(Schema.Boolean)),
  cache_control: CacheControl
}).annotations({ identifier: "AnthropicToolResultBlock" })

export const AnthropicContentBlock = Schema.Union(
  AnthropicTextBlock,
  AnthropicImageBlock,
  AnthropicToolUseBlock,
  AnthropicToolResultBlock,
  AnthropicThinkingBlock,
  AnthropicRedactedThinkingBlock,
  AnthropicOtherBlock
)
export type AnthropicContentBlock = typeof AnthropicContentBlock.Type

/** A turn: `user` and `assistant`, and `system` as Claude Code sends it inside `messages`. */
export const AnthropicMessageParam = Schema.Struct({
  role: Schema.Literal("user", "assistant", "system"),
  content: Schema.Union(Schema.String, Schema.Array(AnthropicContentBlock))
}).annotations({ identifier: "AnthropicMessageParam" })
export type AnthropicMessageParam = typeof AnthropicMessageParam.Type

/** Anthropic's tool names; OpenAI-style upstreams take at most 64 characters. */
const ToolName = Schema.String.pipe(
  Schema.pattern(/^[A-Za-z0-9_-]{1,128}$/, { message: () => "A tool name is 1 to 128 letters, digits, '_' or '-'." })
)

/** A tool the caller runs: the model answers with `tool_use` blocks for it. */
export const AnthropicCustomTool = Schema.Struct({
  type: Schema.optional(Schema.NullOr(Schema.Literal("custom"))),
  name: ToolName,
  description: Schema.optional(Schema.NullOr(Schema.String)),
  input_schema: JsonObject,
  strict: Schema.optional(Schema.NullOr(Schema.Boolean)),
  cache_control: CacheControl
}).annotations({ identifier: "AnthropicCustomTool" })

/**
 * A tool Anthropic defines (`web_search_20250305`, `bash_20250124`, …), read as `{type: "server",
 * tool_type, max_uses}`: `web_search_*` turns nenas's web search on (`max_uses` caps its searches,
 * up to 5); other types answer `unsupported_input`.
 */
export const AnthropicServerTool = Schema.transform(
  Schema.Struct(
    {
      type: Schema.String.pipe(
        Schema.filter((type) => type !== "custom" || "a custom tool needs 'name' and 'input_schema'")
      ),
      name: Schema.optional(Schema.String),
      max_uses: Schema.optional(Schema.NullOr(Schema.Int.pipe(Schema.positive())))
    },
    Open
  ),
  Schema.Struct({ type: Schema.Literal("server"), tool_type: Schema.String, max_uses: Schema.NullOr(Schema.Int) }),
  {
    strict: true,
    decode: (tool) => ({ type: "server" as const, tool_type: tool.type, max_uses: tool.max_uses ?? null }),
    encode: (tool) => ({ type: tool.tool_type, max_uses: tool.max_uses })
  }
).annotations({ identifier: "AnthropicServerTool" })

export const AnthropicTool = Schema.Union(AnthropicCustomTool, AnthropicServerTool)

export const AnthropicToolChoice = Schema.Union(
  Schema.Struct({
    type: Schema.Literal("auto"),
    disable_parallel_tool_use: Schema.optional(Schema.NullOr(Schema.Boolean))
  }),
  Schema.Struct({
    type: Schema.Literal("any"),
    disable_parallel_tool_use: Schema.optional(Schema.NullOr(Schema.Boolean))
  }),
  Schema.Struct({
    type: Schema.Literal("tool"),
    name: ToolName,
    disable_parallel_tool_use: Schema.optional(Schema.NullOr(Schema.Boolean))
  }),
  Schema.Struct({ type: Schema.Literal("none") })
).annotations({ identifier: "AnthropicToolChoice" })
export type AnthropicToolChoice = typeof AnthropicToolChoice.Type

/** `enabled` and `adaptive` route to `reasoning` (effort high); `budget_tokens` is accepted, not forwarded. */
export const AnthropicThinking = Schema.Union(
  Schema.Struct({ type: Schema.Literal("enabled"), budget_tokens: Schema.Int.pipe(Schema.nonNegative()) }, Open),
  Schema.Struct({ type: Schema.Literal("disabled") }, Open),
  Schema.Struct({ type: Schema.Literal("adaptive") }, Open),
  // Types Anthropic adds later (`between_tools`, …) are accepted and leave the effort to the router.
  Schema.Struct({
    type: Schema.String.pipe(
      Schema.filter((type) =>
        !["enabled", "disabled", "adaptive"].includes(type) ||
        `a '${type}' thinking setting is missing a field or has a wrong one`
      )
    )
  }, Open)
).annotations({ identifier: "AnthropicThinking" })

/**
 * `output_config`: `effort` (`low`, `medium`, `high`; `xhigh` and `max` read as `high`) sets the
 * routing effort, `format` `json_schema` is forwarded as structured output; other values are ignored.
 */
export const AnthropicOutputConfig = Schema.Struct(
  {
    effort: Schema.optional(Schema.NullOr(Schema.String)),
    format: Schema.optional(
      Schema.NullOr(Schema.Struct({ type: Schema.String, schema: Schema.optional(JsonObject) }, Open))
    )
  },
  Open
)

/** `metadata.user_id`: logged as the call's `user`, and kept as its tag `user_id`. */
export const AnthropicMetadata = Schema.Struct(
  { user_id: Schema.optional(Schema.NullOr(SqlString.pipe(Schema.maxLength(512)))) },
  Open
)

export const AnthropicSystem = Schema.Union(Schema.String, Schema.Array(AnthropicTextBlock))

/** What a conversation is made of: shared by a call and by `count_tokens`. */
const conversationFields = {
  model: Schema.String,
  messages: Schema.Array(AnthropicMessageParam).pipe(Schema.minItems(1)),
  system: Schema.optional(Schema.NullOr(AnthropicSystem)),
  tools: Schema.optional(Schema.NullOr(Schema.Array(AnthropicTool))),
  tool_choice: Schema.optional(Schema.NullOr(AnthropicToolChoice)),
  thinking: Schema.optional(Schema.NullOr(AnthropicThinking)),
  output_config: Schema.optional(Schema.NullOr(AnthropicOutputConfig))
}

export const AnthropicMessagesRequest = Schema.Struct({
  ...conversationFields,
  max_tokens: Schema.Int.pipe(Schema.between(1, MAX_OUTPUT_TOKENS)),
  stop_sequences: Schema.optional(Schema.NullOr(Schema.Array(Schema.String))),
  stream: Schema.optionalWith(Schema.Boolean, { default: () => false, nullable: true }),
  temperature: Schema.optional(Schema.NullOr(Schema.Number.pipe(Schema.between(0, 1)))),
  top_p: Schema.optional(Schema.NullOr(Schema.Number.pipe(Schema.between(0, 1)))),
  top_k: Schema.optional(
    Schema.NullOr(Schema.Int.pipe(Schema.nonNegative())).annotations({
      description: "Accepted, not forwarded: OpenAI-style upstreams have no top_k."
    })
  ),
  metadata: Schema.optional(Schema.NullOr(AnthropicMetadata)),
  /** nenas's per-request cost cap, as on the other model endpoints. */
  max_total_cost_myr: Schema.optional(CostCapMyr)
}).annotations({ identifier: "AnthropicMessagesRequest" })
export type AnthropicMessagesRequest = typeof AnthropicMessagesRequest.Type

export const AnthropicCountTokensRequest = Schema.Struct(conversationFields).annotations({
  identifier: "AnthropicCountTokensRequest"
})
export type AnthropicCountTokensRequest = typeof AnthropicCountTokensRequest.Type

/** A web search source the text cites; `cited_text` is the answer's sentence that cites it. */
export const AnthropicWebSearchCitation = Schema.Struct({
  type: Schema.Literal("web_search_result_location"),
  url: Schema.String,
  title: Schema.String,
  cited_text: Schema.String,
  /** Opaque, as Anthropic's: the source's number in the answer. */
  encrypted_index: Schema.String
})

export const AnthropicTextOutput = Schema.Struct({
  type: Schema.Literal("text"),
  text: Schema.String,
  citations: Schema.optional(Schema.Array(AnthropicWebSearchCitation))
})

export const AnthropicToolUseOutput = Schema.Struct({
  type: Schema.Literal("tool_use"),
  id: Schema.String,
  name: Schema.String,
  input: JsonObject
})

export const AnthropicStopReason = Schema.Literal("end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal")

/** `input_tokens + cache_read_input_tokens + cache_creation_input_tokens` = the upstream's prompt tokens. */
export const AnthropicUsage = Schema.Struct({
  input_tokens: Schema.Int,
  output_tokens: Schema.Int,
  cache_read_input_tokens: Schema.Int,
  cache_creation_input_tokens: Schema.Int
})

/** The 200 body of `POST /v1/messages`, with nenas's `routing` and `cost_myr` beside Anthropic's fields. */
export const AnthropicMessage = Schema.Struct({
  id: Schema.String,
  type: Schema.Literal("message"),
  role: Schema.Literal("assistant"),
  model: Schema.String,
  content: Schema.Array(Schema.Union(AnthropicTextOutput, AnthropicToolUseOutput)),
  stop_reason: AnthropicStopReason,
  stop_sequence: Schema.NullOr(Schema.String),
  usage: AnthropicUsage,
  routing: RoutingInfo,
  cost_myr: Schema.String
}).annotations({ identifier: "AnthropicMessage" })

/** The 200 body of `POST /v1/messages/count_tokens`. */
export const AnthropicTokenCount = Schema.Struct({ input_tokens: Schema.Int }).annotations({
  identifier: "AnthropicTokenCount"
})

/** Anthropic's error types, one per HTTP status (`billing_error` for 402). */
export const AnthropicErrorType = Schema.Literal(
  "invalid_request_error",
  "authentication_error",
  "billing_error",
  "permission_error",
  "not_found_error",
  "request_too_large",
  "rate_limit_error",
  "api_error",
  "overloaded_error"
)

/** Anthropic's error body, with nenas's fields (docs/api/errors.md, "Errors") inside `error`. */
export const AnthropicErrorBody = Schema.Struct({
  type: Schema.Literal("error"),
  error: Schema.Struct({
    type: AnthropicErrorType,
    message: Schema.String,
    code: Schema.String,
    param: Schema.NullOr(Schema.String),
    guidance: Schema.String,
    action_url: Schema.NullOr(Schema.String),
    retryable: Schema.Boolean,
    retry_after_seconds: Schema.optional(Schema.Int.pipe(Schema.nonNegative()))
  }),
  request_id: Schema.String
}).annotations({ identifier: "AnthropicErrorBody" })
export type AnthropicErrorBody = typeof AnthropicErrorBody.Type

/**
 * `POST /v1/messages` and `POST /v1/messages/count_tokens` (`?beta=true`, as Claude Code sends, is accepted).
 * Every error of these paths is written in Anthropic's body (`AnthropicErrorBody`), `error.type` from its list
 * and nenas's code, guidance and action inside `error`: the error middleware picks the body by path.
 */
export class AnthropicMessagesApi extends HttpApiGroup.make("anthropicMessages")
  .add(
    HttpApiEndpoint.post("messages", "/v1/messages")
      .setPayload(AnthropicMessagesRequest)
      .setHeaders(CallHeaders)
      .addSuccess(AnthropicMessage)
      .annotate(
        OpenApi.Transform,
        documented(
          withEventStream(
            "With `stream: true`: Anthropic's events (`message_start`, `content_block_start`, `ping`, " +
              "`content_block_delta`, `content_block_stop`, `message_delta` with `stop_reason`, `stop_sequence`, usage, " +
              "`routing` and `cost_myr`, `message_stop`); a failure after the first byte is an `error` event."
          ),
          withErrorBody("AnthropicErrorBody")
        )
      )
  )
  .add(
    HttpApiEndpoint.post("countTokens", "/v1/messages/count_tokens")
      .setPayload(AnthropicCountTokensRequest)
      .addSuccess(AnthropicTokenCount)
      .annotate(OpenApi.Transform, withErrorBody("AnthropicErrorBody"))
  )
  .pipe(modelCallGroup)
  .annotate(
    OpenApi.Description,
    "Anthropic's Messages API over the same model, keys and wallet (for Claude Code and Anthropic's SDKs). " +
      "Errors are written as AnthropicErrorBody: {type: \"error\", error: {type, message, code, guidance, ...}, request_id}."
  )
{}
