/**
 * The built-in simulated model behind an OpenAI-compatible
 * `POST /v1/chat/completions` (plain and streamed) and `POST /v1/embeddings`, so that instances in
 * production mode (compose.yaml) run their real upstream client against it.
 * `node dist/src/Providers/SimulatedUpstream.js`, listening on `HOST:PORT`.
 * A flaky upstream, to show fallbacks and circuit breakers:
 * `SIMULATED_UPSTREAM_FAILURE_RATE` (0–1) of the calls answer 503, and
 * `SIMULATED_UPSTREAM_RATE_LIMIT_RATE` (0–1) answer 429 with `Retry-After:
 * SIMULATED_UPSTREAM_RETRY_AFTER_SECONDS` (default 2), both as OpenAI answers them.
 */
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import type * as HttpBody from "@effect/platform/HttpBody"
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServer from "@effect/platform/HttpServer"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Config, Effect, Layer, Option, Random, Schema, Stream } from "effect"
import { createServer } from "node:http"
import { countText } from "../Domain/Tokens.js"
import { simulatedVectors, toBase64 } from "./EmbeddingVectors.js"
import type {
  Completion,
  ProviderRequest,
  ResponseFormat,
  StreamPart,
  ToolChoice,
  ToolDefinition,
  UpstreamMessage
} from "./Provider.js"
import { simulatedProvider } from "./Simulated.js"

/** The chat-completions fields the simulated model honours; the rest of OpenAI's body is accepted and ignored. */
const ChatBody = Schema.Struct({
  model: Schema.String,
  messages: Schema.Array(Schema.Record({ key: Schema.String, value: Schema.Unknown })),
  stream: Schema.optional(Schema.Boolean),
  max_tokens: Schema.optional(Schema.Int),
  max_completion_tokens: Schema.optional(Schema.Int),
  tools: Schema.optional(Schema.Array(Schema.Record({ key: Schema.String, value: Schema.Unknown }))),
  tool_choice: Schema.optional(Schema.Unknown),
  response_format: Schema.optional(Schema.Record({ key: Schema.String, value: Schema.Unknown })),
  logprobs: Schema.optional(Schema.Boolean),
  top_logprobs: Schema.optional(Schema.Int)
})

const toRequest = (body: typeof ChatBody.Type): ProviderRequest => ({
  model: body.model,
  // Forwarded as our own client sent them: the simulated model reads roles, text, images and tool turns.
  messages: body.messages as unknown as ReadonlyArray<UpstreamMessage>,
  maxOutputTokens: body.max_completion_tokens ?? body.max_tokens ?? 32_000,
  reasoningEffort: undefined,
  reasoningModel: body.max_completion_tokens !== undefined,
  tools: body.tools as unknown as ReadonlyArray<ToolDefinition> | undefined,
  toolChoice: body.tool_choice as ToolChoice | undefined,
  responseFormat: body.response_format as ResponseFormat | undefined,
  logprobs: body.logprobs,
  topLogprobs: body.top_logprobs
})

const usageOf = (completion: Pick<Completion, "usage">) =>
  Option.match(completion.usage, {
    onNone: () => undefined,
    onSome: (usage) => ({
      prompt_tokens: usage.inputTokens,
      completion_tokens: usage.outputTokens,
      total_tokens: usage.inputTokens + usage.outputTokens,
      prompt_tokens_details: { cached_tokens: usage.cachedTokens },
      completion_tokens_details: { reasoning_tokens: usage.reasoningTokens }
    })
  })

const chunkOf = (id: string, model: string, part: StreamPart) => {
  const base = { id, object: "chat.completion.chunk", created: Math.floor(Date.now() / 1000), model }
  switch (part._tag) {
    case "Delta":
      return { ...base, choices: [{ index: 0, delta: { content: part.text }, finish_reason: null }] }
    case "ToolCallDelta":
      return {
        ...base,
        choices: [{
          index: 0,
          delta: {
            tool_calls: [{
              index: part.index,
              ...(part.id === undefined ? {} : { id: part.id, type: "function" }),
              function: { ...(part.name === undefined ? {} : { name: part.name }), arguments: part.arguments }
            }]
          },
          finish_reason: null
        }]
      }
    case "Finish":
      return { ...base, choices: [{ index: 0, delta: {}, finish_reason: part.finishReason }] }
    case "Usage":
      return { ...base, choices: [], usage: usageOf({ usage: Option.some(part.usage) }) }
  }
}

const sse = (data: unknown) =>
  new TextEncoder().encode(`data: ${typeof data === "string" ? data : JSON.stringify(data)}\n\n`)

const completions = Effect.gen(function*() {
  const body = yield* HttpServerRequest.schemaBodyJson(ChatBody)
  const request = toRequest(body)
  const id = `chatcmpl-sim${Date.now().toString(36)}`
  if (body.stream === true) {
    const parts = yield* simulatedProvider.stream(request)
    const events = Stream.concat(
      Stream.map(parts, (part) => sse(chunkOf(id, body.model, part))),
      Stream.succeed(sse("[DONE]"))
    )
    return HttpServerResponse.stream(events, {
      contentType: "text/event-stream",
      headers: { "cache-control": "no-cache" }
    })
  }
  const completion = yield* simulatedProvider.complete(request)
  return yield* HttpServerResponse.json({
    id,
    object: "chat.completion",
    created: Math.floor(Date.now() / 1000),
    model: body.model,
    choices: [{
      index: 0,
      message: {
        role: "assistant",
        content: completion.toolCalls.length > 0 && completion.text === "" ? null : completion.text,
        ...(completion.toolCalls.length > 0 ? { tool_calls: completion.toolCalls } : {})
      },
      logprobs: completion.logprobs === undefined ? null : { content: completion.logprobs },
      finish_reason: completion.finishReason
    }],
    usage: usageOf(completion)
  })
}).pipe(
  Effect.catchTag("ParseError", "RequestError", () =>
    HttpServerResponse.json(
      { error: { message: "The body is not a chat completions request.", type: "invalid_request_error" } },
      { status: 400 }
    ))
)

const TokenArray = Schema.Array(Schema.Int.pipe(Schema.nonNegative()))

/** OpenAI's embeddings body: one text, texts, one token array or token arrays. */
const EmbeddingsBody = Schema.Struct({
  model: Schema.String,
  input: Schema.Union(Schema.String, Schema.Array(Schema.String), TokenArray, Schema.Array(TokenArray)),
  encoding_format: Schema.optional(Schema.Literal("float", "base64")),
  dimensions: Schema.optional(Schema.Int.pipe(Schema.between(1, 65_536))),
  user: Schema.optional(Schema.String)
})

/** The items of `input`, in order: a lone text or token array is one item. */
const itemsOf = (input: typeof EmbeddingsBody.Type["input"]): ReadonlyArray<string | ReadonlyArray<number>> =>
  typeof input === "string" || typeof input[0] === "number"
    ? [input as string | ReadonlyArray<number>]
    : input as ReadonlyArray<string | ReadonlyArray<number>>

/** OpenAI's embeddings answer: the simulated vectors, and the items' tokens counted as the service counts them. */
const embeddings = Effect.gen(function*() {
  const body = yield* HttpServerRequest.schemaBodyJson(EmbeddingsBody)
  const items = itemsOf(body.input)
  const vectors = simulatedVectors(items, body.dimensions)
  let tokens = 0
  for (const item of items) tokens += typeof item === "string" ? countText(item) : item.length
  return yield* HttpServerResponse.json({
    object: "list",
    data: vectors.map((vector, index) => ({
      object: "embedding",
      index,
      embedding: body.encoding_format === "base64" ? toBase64(vector) : vector
    })),
    model: body.model,
    usage: { prompt_tokens: tokens, total_tokens: tokens }
  })
}).pipe(
  Effect.catchTag("ParseError", "RequestError", () =>
    HttpServerResponse.json(
      { error: { message: "The body is not an embeddings request.", type: "invalid_request_error" } },
      { status: 400 }
    ))
)

/** How often the simulated upstream fails on purpose (each a share of calls, 0–1; together at most 1). */
export interface SimulatedFaults {
  readonly failureRate: number
  readonly rateLimitRate: number
  readonly retryAfterSeconds: number
}

export const NO_FAULTS: SimulatedFaults = { failureRate: 0, rateLimitRate: 0, retryAfterSeconds: 2 }

/** An answer, or the fault drawn instead. */
type Answered<E, R> = Effect.Effect<HttpServerResponse.HttpServerResponse, E | HttpBody.HttpBodyError, R>

/** One draw per call, before its body is read (as an overloaded upstream refuses): 503, 429, or the answer. */
const withFaults = <E, R>(faults: SimulatedFaults, answer: Answered<E, R>): Answered<E, R> =>
  faults.failureRate === 0 && faults.rateLimitRate === 0 ?
    answer :
    Effect.flatMap(Random.next, (draw): Answered<E, R> => {
      if (draw < faults.failureRate) {
        return HttpServerResponse.json(
          {
            error: {
              message: "The simulated upstream is overloaded (SIMULATED_UPSTREAM_FAILURE_RATE).",
              type: "server_error",
              code: null
            }
          },
          { status: 503 }
        )
      }
      if (draw < faults.failureRate + faults.rateLimitRate) {
        return HttpServerResponse.json(
          {
            error: {
              message: "Rate limit reached on the simulated upstream (SIMULATED_UPSTREAM_RATE_LIMIT_RATE).",
              type: "requests",
              code: "rate_limit_exceeded"
            }
          },
          { status: 429, headers: { "retry-after": String(faults.retryAfterSeconds) } }
        )
      }
      return answer
    })

export const makeSimulatedUpstreamRouter = (faults: SimulatedFaults = NO_FAULTS) =>
  HttpRouter.empty.pipe(
    HttpRouter.post("/v1/chat/completions", withFaults(faults, completions)),
    HttpRouter.post("/v1/embeddings", withFaults(faults, embeddings)),
    HttpRouter.get("/healthz", HttpServerResponse.json({ status: "ok" }))
  )

export const SimulatedUpstreamRouter = makeSimulatedUpstreamRouter()

const share = (name: string) =>
  Config.number(name).pipe(
    Config.withDefault(0),
    Config.validate({
      message: `${name} must be a number from 0 to 1 (a share of calls)`,
      validation: (rate) => rate >= 0 && rate <= 1
    })
  )

/** `SIMULATED_UPSTREAM_*`: the faults the simulated upstream answers with; none by default. */
export const simulatedFaults: Config.Config<SimulatedFaults> = Config.all({
  failureRate: share("SIMULATED_UPSTREAM_FAILURE_RATE"),
  rateLimitRate: share("SIMULATED_UPSTREAM_RATE_LIMIT_RATE"),
  retryAfterSeconds: Config.integer("SIMULATED_UPSTREAM_RETRY_AFTER_SECONDS").pipe(
    Config.withDefault(2),
    Config.validate({
      message: "SIMULATED_UPSTREAM_RETRY_AFTER_SECONDS must be an integer from 0 to 3600",
      validation: (s) => s >= 0 && s <= 3_600
    })
  )
}).pipe(Config.validate({
  message: "SIMULATED_UPSTREAM_FAILURE_RATE and SIMULATED_UPSTREAM_RATE_LIMIT_RATE together must be at most 1",
  validation: (faults) => faults.failureRate + faults.rateLimitRate <= 1
}))

export const SimulatedUpstreamLive = Layer.unwrapEffect(Effect.gen(function*() {
  const port = yield* Config.port("PORT").pipe(Config.withDefault(8090))
  const host = yield* Config.string("HOST").pipe(Config.withDefault("127.0.0.1"))
  const faults = yield* simulatedFaults
  return HttpServer.serve(makeSimulatedUpstreamRouter(faults)).pipe(
    HttpServer.withLogAddress,
    Layer.provide(NodeHttpServer.layer(createServer, { port, host }))
  )
}))

if (import.meta.url === `file://${process.argv[1]}`) {
  Layer.launch(SimulatedUpstreamLive).pipe(NodeRuntime.runMain)
}
