import { Sse } from "@effect/experimental"
import { HttpClient, HttpClientRequest } from "@effect/platform"
import type { HttpClientError, HttpClientResponse } from "@effect/platform"
import { Duration, Effect, Option, Redacted, Schema, Stream } from "effect"
import { ContextLengthExceeded, InvalidRequest, ProviderTimeout, ProviderUnavailable } from "../Domain/Errors.js"
import type { Completion, ProviderError, ProviderRequest, ProviderShape, ProviderUsage, StreamPart } from "./Provider.js"
import { finishReasonOf } from "./Provider.js"

export interface UpstreamOptions {
  /** Ends before `/chat/completions`, e.g. `https://api.openai.com/v1`. */
  readonly baseUrl: string
  readonly apiKey: Option.Option<Redacted.Redacted>
  readonly firstByteTimeoutMs: number
  readonly totalTimeoutMs: number
}

const Usage = Schema.Struct({
  prompt_tokens: Schema.optionalWith(Schema.Number, { default: () => 0 }),
  completion_tokens: Schema.optionalWith(Schema.Number, { default: () => 0 }),
  prompt_tokens_details: Schema.optional(Schema.NullOr(Schema.Struct({ cached_tokens: Schema.optional(Schema.NullOr(Schema.Number)) }))),
  completion_tokens_details: Schema.optional(
    Schema.NullOr(Schema.Struct({ reasoning_tokens: Schema.optional(Schema.NullOr(Schema.Number)) }))
  )
})

const Logprobs = Schema.optional(Schema.NullOr(Schema.Struct({ content: Schema.optional(Schema.NullOr(Schema.Array(Schema.Unknown))) })))

const ToolCall = Schema.Struct({
  id: Schema.String,
  function: Schema.Struct({ name: Schema.String, arguments: Schema.optionalWith(Schema.String, { default: () => "" }) })
})

const Completion = Schema.Struct({
  choices: Schema.Array(Schema.Struct({
    message: Schema.Struct({
      content: Schema.optional(Schema.NullOr(Schema.String)),
      tool_calls: Schema.optional(Schema.NullOr(Schema.Array(ToolCall)))
    }),
    finish_reason: Schema.optional(Schema.NullOr(Schema.String)),
    logprobs: Logprobs
  })),
  usage: Schema.optional(Schema.NullOr(Usage))
})

const ToolCallFragment = Schema.Struct({
  index: Schema.optionalWith(Schema.Int, { default: () => 0 }),
  id: Schema.optional(Schema.NullOr(Schema.String)),
  function: Schema.optional(Schema.NullOr(Schema.Struct({
    name: Schema.optional(Schema.NullOr(Schema.String)),
    arguments: Schema.optional(Schema.NullOr(Schema.String))
  })))
})

const Chunk = Schema.Struct({
  choices: Schema.optionalWith(
    Schema.Array(Schema.Struct({
      delta: Schema.optional(Schema.NullOr(Schema.Struct({
        content: Schema.optional(Schema.NullOr(Schema.String)),
        tool_calls: Schema.optional(Schema.NullOr(Schema.Array(ToolCallFragment)))
      }))),
      finish_reason: Schema.optional(Schema.NullOr(Schema.String)),
      logprobs: Logprobs
    })),
    { default: () => [] }
  ),
  usage: Schema.optional(Schema.NullOr(Usage)),
  error: Schema.optional(Schema.Unknown)
})

const decodeCompletion = Schema.decodeUnknown(Completion)
const decodeChunk = Schema.decodeUnknown(Schema.parseJson(Chunk))

const usageOf = (usage: typeof Usage.Type): ProviderUsage => ({
  inputTokens: Math.max(0, Math.round(usage.prompt_tokens)),
  outputTokens: Math.max(0, Math.round(usage.completion_tokens)),
  cachedTokens: Math.max(0, Math.round(usage.prompt_tokens_details?.cached_tokens ?? 0)),
  reasoningTokens: Math.max(0, Math.round(usage.completion_tokens_details?.reasoning_tokens ?? 0))
})

const requestBody = (request: ProviderRequest, stream: boolean) => ({
  model: request.model,
  messages: request.messages,
  // OpenAI's reasoning models refuse `max_tokens`; every OpenAI-compatible server takes `max_tokens`.
  [request.reasoningModel ? "max_completion_tokens" : "max_tokens"]: request.maxOutputTokens,
  ...(request.reasoningModel && request.reasoningEffort !== undefined ? { reasoning_effort: request.reasoningEffort } : {}),
  ...(request.temperature === undefined ? {} : { temperature: request.temperature }),
  ...(request.topP === undefined ? {} : { top_p: request.topP }),
  ...(request.stop === undefined || request.stop === null ? {} : { stop: request.stop }),
  ...(request.user === undefined ? {} : { user: request.user }),
  ...capabilitiesBody(request),
  ...(stream ? { stream: true, stream_options: { include_usage: true } } : {})
})

/** The caller's tools, format and sampling fields in chat's names; tool fields only with tools, as OpenAI requires. */
const capabilitiesBody = (request: ProviderRequest): Record<string, unknown> => {
  const body: Record<string, unknown> = {}
  const set = (name: string, value: unknown) => {
    if (value !== undefined) body[name] = value
  }
  if (request.tools !== undefined && request.tools.length > 0) {
    body["tools"] = request.tools
    set("tool_choice", request.toolChoice)
    set("parallel_tool_calls", request.parallelToolCalls)
  }
  set("response_format", request.responseFormat)
  set("presence_penalty", request.presencePenalty)
  set("frequency_penalty", request.frequencyPenalty)
  set("logit_bias", request.logitBias)
  set("seed", request.seed)
  if (request.logprobs === true) {
    body["logprobs"] = true
    set("top_logprobs", request.topLogprobs)
  }
  return body
}

const unavailable = (message: string, extra: { retryable?: boolean; retry_after_seconds?: number } = {}) =>
  new ProviderUnavailable({ message, ...extra })

const retryAfterSeconds = (response: HttpClientResponse.HttpClientResponse): number => {
  const header = Number(response.headers["retry-after"])
  return Number.isFinite(header) && header >= 0 ? Math.ceil(header) : 1
}

const UpstreamError = Schema.parseJson(Schema.Struct({
  error: Schema.Struct({ message: Schema.optional(Schema.NullOr(Schema.String)), code: Schema.optional(Schema.Unknown) })
}))
const decodeUpstreamError = Schema.decodeUnknownOption(UpstreamError)

/** Any URL in an upstream's words: its own, or one inside the network, is not the caller's to see. */
const URLS = /\b[a-z][a-z0-9+.-]*:\/\/[^\s"'<>)\]]*/gi

/** The upstream's own words for a refusal (OpenAI's `error.message`, else the body's start), without URLs. */
const upstreamMessage = (text: string): { readonly message: string; readonly code: unknown } =>
  Option.match(decodeUpstreamError(text), {
    onNone: () => ({ message: text.slice(0, 500).replace(URLS, "[url]"), code: undefined }),
    onSome: ({ error }) => ({ message: (error.message ?? text).slice(0, 500).replace(URLS, "[url]"), code: error.code })
  })

/**
 * Fails with `error` after logging `detail` in full: what the upstream said
 * can name internal hosts, so the caller gets generic words and the operator
 * the rest.
 */
const reported = <E>(error: E, detail: unknown) =>
  Effect.zipRight(Effect.logWarning(`model provider: ${String(detail)}`), Effect.fail(error))

const CONTEXT_TOO_LONG = /context.{0,20}(length|window)|maximum context|too many tokens|prompt is too long|input is too long/i

/**
 * Upstream statuses as our errors: 429, 408 and 5xx may pass on a retry; its credentials refused (401/403) are
 * ours to fix, so retryable and logged for the operator; any other 4xx is the caller's request, in the upstream's words.
 */
const statusError = (response: HttpClientResponse.HttpClientResponse) =>
  Effect.flatMap(
    Effect.orElseSucceed(response.text, () => ""),
    (text): Effect.Effect<never, ProviderError> => {
      const detail = text.length > 0 ? `: ${text.slice(0, 2000)}` : ""
      if (response.status === 429) {
        return reported(
          unavailable("The model provider is rate limiting requests (HTTP 429).", { retry_after_seconds: retryAfterSeconds(response) }),
          `HTTP 429${detail}`
        )
      }
      if (response.status >= 500 || response.status === 408 || response.status < 400) {
        return reported(unavailable(`The model provider failed (HTTP ${response.status}).`), `HTTP ${response.status}${detail}`)
      }
      if (response.status === 401 || response.status === 403) {
        return Effect.zipRight(
          Effect.logError(`The model provider refused our credentials (HTTP ${response.status}): check UPSTREAM_API_KEY${detail}`),
          Effect.fail(unavailable("The model provider is not available right now."))
        )
      }
      const { code, message } = upstreamMessage(text)
      const said = message.length > 0 ? message : `HTTP ${response.status}`
      if (response.status === 413 || code === "context_length_exceeded" || CONTEXT_TOO_LONG.test(said)) {
        return Effect.fail(new ContextLengthExceeded({ message: `The model refused the input as too long: ${said}`, param: null }))
      }
      return Effect.fail(new InvalidRequest({ message: `The model refused the request: ${said}`, param: null }))
    }
  )

const isConnectFailure = (error: HttpClientError.HttpClientError): boolean =>
  error._tag === "RequestError" && error.reason === "Transport"

/**
 * An OpenAI-compatible chat-completions upstream (OpenAI, Gemini's OpenAI
 * endpoint, OpenRouter, vLLM, Ollama, llama.cpp) over `HttpClient`.
 */
export const makeOpenAiCompatible = (options: UpstreamOptions) =>
  Effect.map(HttpClient.HttpClient, (client): ProviderShape => {
    const url = `${options.baseUrl.replace(/\/+$/, "")}/chat/completions`
    const firstByte = Duration.millis(options.firstByteTimeoutMs)
    const total = Duration.millis(options.totalTimeoutMs)
    const timedOut = (phase: string) => new ProviderTimeout({ message: `The model provider did not ${phase} in time.` })

    /** Sends the request; resolves with the response headers. A connection that fails before any byte is tried once more. */
    const send = (request: ProviderRequest, stream: boolean) => {
      const base = HttpClientRequest.post(url).pipe(
        HttpClientRequest.bodyUnsafeJson(requestBody(request, stream)),
        HttpClientRequest.acceptJson
      )
      const authorized = Option.match(options.apiKey, {
        onNone: () => base,
        onSome: (key) => HttpClientRequest.bearerToken(base, Redacted.value(key))
      })
      return client.execute(authorized).pipe(
        Effect.retry({ times: 1, while: isConnectFailure }),
        Effect.timeoutFail({ duration: firstByte, onTimeout: () => timedOut("start answering") }),
        Effect.catchTag("RequestError", (error) =>
          reported(unavailable("The model provider could not be reached."), error.message)),
        Effect.catchTag("ResponseError", (error) =>
          reported(unavailable("The model provider answered badly."), error.message)),
        Effect.flatMap((response) => response.status >= 200 && response.status < 300 ? Effect.succeed(response) : statusError(response))
      )
    }

    const complete = (request: ProviderRequest): Effect.Effect<Completion, ProviderError> =>
      send(request, false).pipe(
        Effect.flatMap((response) => response.json),
        Effect.flatMap(decodeCompletion),
        Effect.map((body): Completion => {
          const choice = body.choices[0]
          return {
            text: choice?.message.content ?? "",
            toolCalls: (choice?.message.tool_calls ?? []).map((call) => ({
              id: call.id,
              type: "function" as const,
              function: { name: call.function.name, arguments: call.function.arguments }
            })),
            logprobs: choice?.logprobs?.content ?? undefined,
            finishReason: finishReasonOf(choice?.finish_reason),
            usage: body.usage === undefined || body.usage === null ? Option.none() : Option.some(usageOf(body.usage))
          }
        }),
        Effect.catchTags({
          ResponseError: (error) => reported(unavailable("The model provider's answer broke off."), error.message),
          ParseError: () => Effect.fail(unavailable("The model provider's answer was not a chat completion."))
        }),
        Effect.timeoutFail({ duration: total, onTimeout: () => timedOut("finish") })
      )

    const partsOf = (data: string): Effect.Effect<ReadonlyArray<StreamPart>, ProviderError> =>
      Effect.flatMap(
        Effect.mapError(decodeChunk(data), () => unavailable("The model provider sent a malformed stream chunk.")),
        (chunk): Effect.Effect<ReadonlyArray<StreamPart>, ProviderError> => {
          if (chunk.error !== undefined && chunk.error !== null) {
            return reported(unavailable("The model provider failed mid-stream."), `error chunk: ${JSON.stringify(chunk.error).slice(0, 2000)}`)
          }
          const parts: Array<StreamPart> = []
          for (const choice of chunk.choices) {
            const text = choice.delta?.content
            const logprobs = choice.logprobs?.content ?? undefined
            if (typeof text === "string" && text.length > 0) parts.push({ _tag: "Delta", text, logprobs })
            for (const call of choice.delta?.tool_calls ?? []) {
              parts.push({
                _tag: "ToolCallDelta",
                index: call.index,
                id: call.id ?? undefined,
                name: call.function?.name ?? undefined,
                arguments: call.function?.arguments ?? ""
              })
            }
            if (typeof choice.finish_reason === "string") parts.push({ _tag: "Finish", finishReason: finishReasonOf(choice.finish_reason) })
          }
          if (chunk.usage !== undefined && chunk.usage !== null) parts.push({ _tag: "Usage", usage: usageOf(chunk.usage) })
          return Effect.succeed(parts)
        }
      )

    const events = (response: HttpClientResponse.HttpClientResponse): Stream.Stream<Sse.Event, ProviderError> =>
      response.stream.pipe(
        Stream.decodeText(),
        Stream.pipeThroughChannel(Sse.makeChannel<HttpClientError.ResponseError, unknown>()),
        Stream.catchAll((error) => Stream.fromEffect(reported(unavailable("The model provider's stream broke off."), error.message)))
      )

    /**
     * The parts of an event stream, read to `[DONE]` or the stream's end: OpenAI sends usage in a chunk after the
     * finish reason (`choices: []`), often in a later read. A stream that stops before any finish reason was cut off.
     */
    const parts = (response: HttpClientResponse.HttpClientResponse): Stream.Stream<StreamPart, ProviderError> =>
      Stream.suspend(() => {
        let finished = false
        return events(response).pipe(
          Stream.takeWhile((event) => event.data !== "[DONE]"),
          // One stage per event (a stream stage costs more than the event's own work).
          Stream.mapConcatEffect((event) =>
            Effect.map(partsOf(event.data), (parts) => {
              if (parts.some((part) => part._tag === "Finish")) finished = true
              return parts
            })
          ),
          // After the finish reason the answer is whole: a connection lost before `[DONE]` costs nothing but the usage chunk.
          Stream.catchAll((error) => finished ? Stream.empty : Stream.fail(error)),
          Stream.concat(Stream.suspend(() =>
            finished ? Stream.empty : Stream.fail(unavailable("The model provider's stream ended before the answer was finished."))
          ))
        )
      })

    const isEventStream = (response: HttpClientResponse.HttpClientResponse): boolean =>
      (response.headers["content-type"] ?? "").toLowerCase().startsWith("text/event-stream")

    const stream = (request: ProviderRequest): Effect.Effect<Stream.Stream<StreamPart, ProviderError>, ProviderError> =>
      Effect.gen(function*() {
        const deadline = Effect.zipRight(Effect.sleep(total), Effect.failSync(() => timedOut("finish")))
        const response = yield* send(request, true)
        if (!isEventStream(response)) {
          return yield* unavailable(
            `The model provider answered a stream request with ${response.headers["content-type"] ?? "no content type"}, not an event stream.`
          )
        }
        return parts(response).pipe(Stream.interruptWhen(deadline))
      })

    return { complete, stream }
  })
