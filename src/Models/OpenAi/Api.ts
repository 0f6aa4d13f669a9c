import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { ApiKeyAuth } from "../../Auth/Api.js"
import {
  BillingError,
  ContentBlocked,
  ContextLengthExceeded,
  IdempotencyConflict,
  InsufficientBalance,
  InternalError,
  InvalidRequest,
  NotFound,
  NotImplemented,
  PermissionDenied,
  ProviderKeyRefused,
  ProviderTimeout,
  ProviderUnavailable,
  RateLimitExceeded,
  SearchError,
  SpendLimitExceeded,
  UnsupportedInput,
  wire
} from "../../Domain/Errors.js"
import { withEventStream } from "../../Domain/OpenApiDocument.js"
import { SqlString, unstorable } from "../../Domain/Strict.js"

export const PUBLIC_MODEL = "svc/nenas-flash"
export const CONTEXT_WINDOW = 1_000_000
export const MAX_OUTPUT_TOKENS = 32_000

const intBetween = (min: number, max: number) => Schema.Int.pipe(Schema.between(min, max))

/** A per-request cost cap in MYR: greater than 0. */
/** Up to RM 1,000,000: far above any call, and still a safe integer in micro-MYR. */
/** OpenAI's `metadata`: up to 16 string pairs, keys up to 64 characters, values up to 512; stored on the call's log. */
export const Metadata = Schema.Record({ key: Schema.String, value: SqlString.pipe(Schema.maxLength(512)) }).pipe(
  Schema.filter((pairs) => {
    const keys = Object.keys(pairs)
    if (keys.length > 16) return "metadata has at most 16 pairs"
    const long = keys.find((key) => key.length === 0 || key.length > 64)
    if (long !== undefined) {
      return `metadata keys have 1 to 64 characters; ${JSON.stringify(long.slice(0, 70))} does not`
    }
    // Named here, not by the key's own path: a param that quotes the bad key would carry the bad character.
    const problem = keys.map(unstorable).find((found) => found !== undefined)
    return problem === undefined || `metadata keys ${problem}`
  })
).annotations({ identifier: "Metadata" })

export const CostCapMyr = Schema.Number.pipe(
  Schema.finite(),
  Schema.greaterThan(0),
  Schema.lessThanOrEqualTo(1_000_000)
)

export const ReasoningEffort = Schema.Literal("low", "medium", "high")

export const WebSearchConfig = Schema.Struct({
  mode: Schema.optionalWith(Schema.Literal("off", "auto", "on"), { default: () => "off" as const }),
  search_depth: Schema.optionalWith(Schema.Literal("instant", "fast", "balanced", "deep", "reasoning"), {
    default: () => "fast" as const
  }),
  max_results: Schema.optionalWith(intBetween(1, 25), { default: () => 5 }),
  max_searches: Schema.optionalWith(intBetween(1, 5), { default: () => 2 }),
  content: Schema.optional(Schema.Struct({
    enabled: Schema.optionalWith(Schema.Boolean, { default: () => false }),
    max_pages: Schema.optionalWith(intBetween(1, 10), { default: () => 3 })
  }))
}).annotations({ identifier: "WebSearchConfig" })

/** A content part of an input message; non-text parts are refused as `unsupported_input`. */
export const InputContentPart = Schema.Struct(
  { type: Schema.String, text: Schema.optional(Schema.String) },
  Schema.Record({ key: Schema.String, value: Schema.Unknown })
)

/** OpenAI's input item: a message with a role and text content. */
export const InputItem = Schema.Struct(
  {
    type: Schema.optional(Schema.String),
    role: Schema.optional(Schema.String),
    content: Schema.optional(Schema.Union(Schema.String, Schema.Array(InputContentPart)))
  },
  Schema.Record({ key: Schema.String, value: Schema.Unknown })
)

const JsonObject = Schema.Record({ key: Schema.String, value: Schema.Unknown })

/** OpenAI's function names: letters, digits, `_` and `-`, at most 64. */
const FunctionName = Schema.String.pipe(
  Schema.pattern(/^[A-Za-z0-9_-]{1,64}$/, { message: () => "A function name is 1 to 64 letters, digits, '_' or '-'." })
)

/** A function the model may call, as chat takes it. */
export const ChatTool = Schema.Struct({
  type: Schema.Literal("function"),
  function: Schema.Struct({
    name: FunctionName,
    description: Schema.optional(Schema.NullOr(Schema.String)),
    parameters: Schema.optional(Schema.NullOr(JsonObject)),
    strict: Schema.optional(Schema.NullOr(Schema.Boolean))
  })
}).annotations({ identifier: "ChatTool" })
export type ChatTool = typeof ChatTool.Type

export const ChatToolChoice = Schema.Union(
  Schema.Literal("none", "auto", "required"),
  Schema.Struct({ type: Schema.Literal("function"), function: Schema.Struct({ name: FunctionName }) })
)
export type ChatToolChoice = typeof ChatToolChoice.Type

/** Chat's `response_format`. */
export const ChatResponseFormat = Schema.Union(
  Schema.Struct({ type: Schema.Literal("text") }),
  Schema.Struct({ type: Schema.Literal("json_object") }),
  Schema.Struct({
    type: Schema.Literal("json_schema"),
    json_schema: Schema.Struct({
      name: FunctionName,
      description: Schema.optional(Schema.NullOr(Schema.String)),
      schema: Schema.optional(Schema.NullOr(JsonObject)),
      strict: Schema.optional(Schema.NullOr(Schema.Boolean))
    })
  })
).annotations({ identifier: "ChatResponseFormat" })
export type ChatResponseFormat = typeof ChatResponseFormat.Type

/** A Responses tool: a function, or web search (which turns our web search on); other types are refused by name. */
export const ResponsesTool = Schema.Struct(
  {
    type: Schema.String,
    name: Schema.optional(Schema.String),
    description: Schema.optional(Schema.NullOr(Schema.String)),
    parameters: Schema.optional(Schema.NullOr(JsonObject)),
    strict: Schema.optional(Schema.NullOr(Schema.Boolean))
  },
  Schema.Record({ key: Schema.String, value: Schema.Unknown })
)

export const ResponsesToolChoice = Schema.Union(
  Schema.Literal("none", "auto", "required"),
  Schema.Struct({ type: Schema.Literal("function"), name: FunctionName }),
  Schema.Struct({ type: Schema.Literal("web_search", "web_search_preview") })
)

/** Responses `text.format`: chat's formats, with the schema's fields beside `type`. */
export const ResponsesTextFormat = Schema.Union(
  Schema.Struct({ type: Schema.Literal("text") }),
  Schema.Struct({ type: Schema.Literal("json_object") }),
  Schema.Struct({
    type: Schema.Literal("json_schema"),
    name: FunctionName,
    description: Schema.optional(Schema.NullOr(Schema.String)),
    schema: JsonObject,
    strict: Schema.optional(Schema.NullOr(Schema.Boolean))
  })
)

/** Fields OpenAI's APIs take that this service does not implement yet: sent, they answer `not_implemented` naming the field. */
const notImplementedFields = <const K extends ReadonlyArray<string>>(...names: K) =>
  Object.fromEntries(names.map((name) => [
    name,
    Schema.optional(Schema.Unknown).annotations({ description: "Not implemented yet: answers not_implemented." })
  ])) as { [N in K[number]]: Schema.optional<typeof Schema.Unknown> }

export const RESPONSES_NOT_IMPLEMENTED = [
  "conversation",
  "background",
  "prompt",
  "include"
] as const

export const CHAT_NOT_IMPLEMENTED = ["functions", "function_call", "audio", "prediction"] as const

export const ResponsesBody = Schema.Struct({
  model: Schema.optionalWith(Schema.String, { default: () => PUBLIC_MODEL }),
  input: Schema.Union(Schema.String, Schema.Array(InputItem)),
  instructions: Schema.optional(Schema.NullOr(Schema.String)),
  /** Keep the response 30 days, to read or continue (OpenAI's default); `false` keeps nothing. */
  store: Schema.optional(
    Schema.NullOr(Schema.Boolean).annotations({
      description: "Default true: the response is kept 30 days (GET/DELETE /v1/responses/{id}); false keeps nothing."
    })
  ),
  /** Continue from a stored response: its input and output items come before `input` (its instructions do not). */
  previous_response_id: Schema.optional(
    Schema.NullOr(SqlString.pipe(Schema.minLength(1), Schema.maxLength(200))).annotations({
      description: "A stored response of this account: its input and output items come first, billed as input."
    })
  ),
  reasoning: Schema.optional(Schema.Struct({
    effort: Schema.optionalWith(ReasoningEffort, { default: () => "medium" as const })
  })),
  web_search: Schema.optional(WebSearchConfig),
  max_output_tokens: Schema.optional(intBetween(1, MAX_OUTPUT_TOKENS)),
  max_total_cost_myr: Schema.optional(CostCapMyr),
  stream: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  temperature: Schema.optional(Schema.NullOr(Schema.Number.pipe(Schema.between(0, 2)))),
  top_p: Schema.optional(Schema.NullOr(Schema.Number.pipe(Schema.between(0, 1)))),
  user: Schema.optional(SqlString),
  metadata: Schema.optional(Schema.NullOr(Metadata)),
  tools: Schema.optional(Schema.NullOr(Schema.Array(ResponsesTool))),
  tool_choice: Schema.optional(Schema.NullOr(ResponsesToolChoice)),
  parallel_tool_calls: Schema.optional(Schema.NullOr(Schema.Boolean)),
  text: Schema.optional(Schema.NullOr(Schema.Struct(
    { format: Schema.optional(Schema.NullOr(ResponsesTextFormat)) },
    Schema.Record({ key: Schema.String, value: Schema.Unknown })
  ))),
  ...notImplementedFields(...RESPONSES_NOT_IMPLEMENTED)
}).annotations({ identifier: "ResponsesBody" })
export type ResponsesBody = typeof ResponsesBody.Type

export const UsageInfo = Schema.Struct({
  input_tokens: Schema.Int,
  output_tokens: Schema.Int,
  reasoning_tokens: Schema.Int,
  cached_tokens: Schema.Int,
  total_tokens: Schema.Int,
  input_tokens_details: Schema.Struct({ cached_tokens: Schema.Int }),
  output_tokens_details: Schema.Struct({ reasoning_tokens: Schema.Int }),
  cost_myr: Schema.String,
  latency_ms: Schema.Int
})

export const RoutingInfo = Schema.Struct({
  category: Schema.String,
  upstream_model: Schema.String,
  reasoning: Schema.String,
  /** Whether a fallback answered (the category's first upstream target failed or was skipped); `upstream_model` names it. */
  fallback: Schema.optional(Schema.Boolean)
})

export const Citation = Schema.Struct({
  index: Schema.Int,
  title: Schema.String,
  url: Schema.String,
  published_at: Schema.NullOr(Schema.String),
  accessed_at: Schema.String
})

export const OutputMessage = Schema.Struct({
  type: Schema.Literal("message"),
  id: Schema.String,
  status: Schema.String,
  role: Schema.Literal("assistant"),
  content: Schema.Array(Schema.Struct({
    type: Schema.Literal("output_text"),
    text: Schema.String,
    annotations: Schema.Array(Schema.Unknown)
  }))
})

/** A call of one of the request's functions: run it, and send its result back as a `function_call_output` item. */
export const FunctionCallItem = Schema.Struct({
  type: Schema.Literal("function_call"),
  id: Schema.String,
  call_id: Schema.String,
  name: Schema.String,
  arguments: Schema.String,
  status: Schema.String
})

export const ResponsesOutput = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("response"),
  created_at: Schema.Int,
  status: Schema.String,
  model: Schema.String,
  output_text: Schema.String,
  output: Schema.Array(Schema.Union(OutputMessage, FunctionCallItem)),
  usage: UsageInfo,
  request_id: Schema.String,
  routing: RoutingInfo,
  citations: Schema.Array(Citation),
  /** Why the answer is cut short: null when it is whole. */
  incomplete_details: Schema.NullOr(Schema.Struct({ reason: Schema.Literal("max_output_tokens") })),
  /** Whether this response is kept (30 days) for `previous_response_id`, `item_reference` and `GET /v1/responses/{id}`. */
  store: Schema.Boolean,
  previous_response_id: Schema.NullOr(Schema.String)
}).annotations({ identifier: "ResponsesOutput" })

export const ChatMessage = Schema.Struct(
  {
    role: Schema.Literal("system", "developer", "user", "assistant", "tool", "function"),
    content: Schema.optional(Schema.NullOr(Schema.Union(Schema.String, Schema.Array(InputContentPart)))),
    name: Schema.optional(Schema.String)
  },
  Schema.Record({ key: Schema.String, value: Schema.Unknown })
)

export const ChatCompletionRequest = Schema.Struct({
  model: Schema.Literal(PUBLIC_MODEL),
  messages: Schema.Array(ChatMessage).pipe(Schema.minItems(1)),
  // OpenAI's chat takes null for these as for absent: so does ours (the decoded request has no nulls to tell apart).
  temperature: Schema.optionalWith(Schema.Number.pipe(Schema.between(0, 2)), { nullable: true }),
  max_tokens: Schema.optionalWith(intBetween(1, MAX_OUTPUT_TOKENS), { nullable: true }),
  max_completion_tokens: Schema.optionalWith(intBetween(1, MAX_OUTPUT_TOKENS), { nullable: true }),
  max_total_cost_myr: Schema.optional(CostCapMyr),
  stream: Schema.optionalWith(Schema.Boolean, { default: () => false, nullable: true }),
  stream_options: Schema.optional(Schema.NullOr(Schema.Struct({ include_usage: Schema.optional(Schema.Boolean) }))),
  top_p: Schema.optionalWith(Schema.Number.pipe(Schema.between(0, 1)), { nullable: true }),
  stop: Schema.optional(
    Schema.NullOr(Schema.Union(Schema.String, Schema.Array(Schema.String).pipe(Schema.maxItems(4))))
  ),
  user: Schema.optional(SqlString),
  reasoning_effort: Schema.optionalWith(ReasoningEffort, { nullable: true }),
  n: Schema.optionalWith(Schema.Literal(1), { nullable: true }),
  seed: Schema.optional(Schema.NullOr(Schema.Int)),
  store: Schema.optional(Schema.NullOr(Schema.Boolean)),
  metadata: Schema.optional(Schema.NullOr(Metadata)),
  service_tier: Schema.optional(Schema.NullOr(Schema.String)),
  /** This service's web search, as on responses (an extension of OpenAI's chat). */
  web_search: Schema.optional(WebSearchConfig),
  tools: Schema.optional(Schema.NullOr(Schema.Array(ChatTool))),
  tool_choice: Schema.optional(Schema.NullOr(ChatToolChoice)),
  parallel_tool_calls: Schema.optional(Schema.NullOr(Schema.Boolean)),
  response_format: Schema.optional(Schema.NullOr(ChatResponseFormat)),
  presence_penalty: Schema.optional(Schema.NullOr(Schema.Number.pipe(Schema.between(-2, 2)))),
  frequency_penalty: Schema.optional(Schema.NullOr(Schema.Number.pipe(Schema.between(-2, 2)))),
  logit_bias: Schema.optional(
    Schema.NullOr(Schema.Record({ key: Schema.String, value: Schema.Number.pipe(Schema.between(-100, 100)) }))
  ),
  logprobs: Schema.optional(Schema.NullOr(Schema.Boolean)),
  top_logprobs: Schema.optional(Schema.NullOr(intBetween(0, 20))),
  modalities: Schema.optional(Schema.NullOr(Schema.Array(Schema.Literal("text")))),
  ...notImplementedFields(...CHAT_NOT_IMPLEMENTED)
}).annotations({ identifier: "ChatCompletionRequest" })
export type ChatCompletionRequest = typeof ChatCompletionRequest.Type

export const FinishReason = Schema.Literal("stop", "length", "tool_calls", "content_filter")

export const ChatCompletion = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("chat.completion"),
  created: Schema.Int,
  model: Schema.String,
  choices: Schema.Array(Schema.Struct({
    index: Schema.Int,
    message: Schema.Struct({
      role: Schema.Literal("assistant"),
      content: Schema.NullOr(Schema.String),
      /** OpenAI's refusal text: always null here (a refusal ends with `finish_reason: "content_filter"`). */
      refusal: Schema.NullOr(Schema.String),
      annotations: Schema.optional(Schema.Array(Schema.Unknown)),
      tool_calls: Schema.optional(Schema.Array(Schema.Struct({
        id: Schema.String,
        type: Schema.Literal("function"),
        function: Schema.Struct({ name: Schema.String, arguments: Schema.String })
      })))
    }),
    logprobs: Schema.optional(
      Schema.NullOr(Schema.Struct({ content: Schema.Array(Schema.Unknown), refusal: Schema.Null }))
    ),
    finish_reason: FinishReason
  })),
  usage: Schema.Struct({
    prompt_tokens: Schema.Int,
    completion_tokens: Schema.Int,
    reasoning_tokens: Schema.Int,
    cached_tokens: Schema.Int,
    total_tokens: Schema.Int,
    prompt_tokens_details: Schema.Struct({ cached_tokens: Schema.Int }),
    completion_tokens_details: Schema.Struct({ reasoning_tokens: Schema.Int })
  }),
  cost_myr: Schema.String
}).annotations({ identifier: "ChatCompletion" })

/**
 * The headers a model call reads: `Idempotency-Key`, and the response cache's `Nenas-Cache` and
 * `Nenas-Cache-TTL` (docs/api/cache.md, "Turning it on"), read as given and checked by the call, which names
 * the header when one is wrong.
 */
export const CallHeaders = Schema.Struct({
  "idempotency-key": Schema.optional(Schema.String.pipe(Schema.minLength(1), Schema.maxLength(255))),
  "nenas-cache": Schema.optional(Schema.String),
  "nenas-cache-ttl": Schema.optional(Schema.String)
})

/** Every error a model call can end in, declared once for each group of model calls, behind the API key. */
export const modelCallGroup = <Id extends string, Endpoints extends HttpApiEndpoint.HttpApiEndpoint.Any, E, R>(
  group: HttpApiGroup.HttpApiGroup<Id, Endpoints, E, R>
) =>
  group
    .addError(wire(InvalidRequest))
    .addError(wire(UnsupportedInput))
    .addError(wire(ContentBlocked))
    .addError(wire(NotImplemented))
    .addError(wire(ContextLengthExceeded))
    .addError(wire(NotFound))
    .addError(wire(PermissionDenied))
    .addError(wire(InsufficientBalance))
    .addError(wire(SpendLimitExceeded))
    .addError(wire(BillingError))
    .addError(wire(IdempotencyConflict))
    .addError(wire(RateLimitExceeded))
    .addError(wire(ProviderUnavailable))
    .addError(wire(ProviderKeyRefused))
    .addError(wire(ProviderTimeout))
    .addError(wire(SearchError))
    .addError(wire(InternalError))
    .middleware(ApiKeyAuth)

/** OpenAI's two model calls. */
export class ModelCallsApi extends HttpApiGroup.make("modelCalls")
  .add(
    HttpApiEndpoint.post("responses", "/v1/responses")
      .setPayload(ResponsesBody)
      .setHeaders(CallHeaders)
      .addSuccess(ResponsesOutput)
      .annotate(
        OpenApi.Transform,
        withEventStream(
          "With `stream: true`: OpenAI's Responses events (`response.created`, `response.output_text.delta`, … " +
            "`response.completed` carrying the ResponsesOutput); a failure after the first byte is a `response.failed` event."
        )
      )
  )
  .add(
    HttpApiEndpoint.post("chatCompletions", "/v1/chat/completions")
      .setPayload(ChatCompletionRequest)
      .setHeaders(CallHeaders)
      .addSuccess(ChatCompletion)
      .annotate(
        OpenApi.Transform,
        withEventStream(
          "With `stream: true`: `chat.completion.chunk` objects as `data:` lines, a last chunk with `choices: []`, " +
            "`usage` and `cost_myr`, then `data: [DONE]`; a failure after the first byte is a chunk with a top-level `error`."
        )
      )
  )
  .pipe(modelCallGroup)
  .annotate(OpenApi.Description, "Model calls: responses and OpenAI-compatible chat completions.")
{}
