import { Effect, Option, Redacted, Schema, type Stream } from "effect"
import type { IncomingHttpHeaders, IncomingMessage } from "node:http"
import type { LookupFunction } from "node:net"
import { ContextLengthExceeded, InvalidRequest, ProviderTimeout, ProviderUnavailable } from "../Domain/Errors.js"
import { dropBody, makePost, type Post, textOf } from "../Lane/Wire/KeepAlivePost.js"
import { completionOf } from "./ChatDecode.js"
import { cleanUpstreamText } from "./CleanText.js"
import { decodeEmbeddings } from "./EmbeddingVectors.js"
import { eventStreamParts } from "./EventStream.js"
import type {
  AttemptOutcome,
  Completion,
  EmbeddingAnswer,
  EmbeddingRequest,
  ProviderError,
  ProviderRequest,
  ProviderShape,
  StreamPart
} from "./Provider.js"

export interface UpstreamOptions {
  /** Ends before `/chat/completions` (and `/embeddings`), e.g. `https://api.openai.com/v1`. */
  readonly baseUrl: string
  readonly apiKey: Option.Option<Redacted.Redacted>
  readonly firstByteTimeoutMs: number
  readonly totalTimeoutMs: number
  /** Resolves the host for each new connection (a team's provider key: the address guard's lookup). */
  readonly lookup?: LookupFunction | undefined
  /** What the operator's log tells to check when the upstream refuses the key; default `UPSTREAM_API_KEY`. */
  readonly credentials?: string | undefined
}

/** Why one attempt failed: the caller's error, how the attempt counts (fallbacks, metrics), and the upstream's `Retry-After`. */
export interface AttemptFailure {
  readonly error: ProviderError
  readonly outcome: Exclude<AttemptOutcome, "ok" | "breaker_open">
  readonly retryAfterMs?: number | undefined
  /** The upstream refused the key (401 or 403): counted as its failure, and told apart for a team's own key. */
  readonly credentialsRefused?: boolean | undefined
  /** The upstream's HTTP status, when it answered one. */
  readonly status?: number | undefined
}

/** One upstream, each call with a first-byte deadline of its own (what is left of the call's budget). */
export interface UpstreamClient {
  readonly complete: (request: ProviderRequest, firstByteMs: number) => Effect.Effect<Completion, AttemptFailure>
  /** Succeeds with the answer's head; a stream that fails later fails with the caller's error alone. */
  readonly stream: (
    request: ProviderRequest,
    firstByteMs: number
  ) => Effect.Effect<Stream.Stream<StreamPart, ProviderError>, AttemptFailure>
  /** `POST /embeddings`, read whole as `complete` reads its answer. */
  readonly embed: (request: EmbeddingRequest, firstByteMs: number) => Effect.Effect<EmbeddingAnswer, AttemptFailure>
  /** Closes its idle connections; calls still running end as they would. */
  readonly close: () => void
}

const failure =
  (outcome: AttemptFailure["outcome"], retryAfterMs?: number, status?: number) =>
  (error: ProviderError): AttemptFailure => ({
    error,
    outcome,
    retryAfterMs,
    credentialsRefused: status === 401 || status === 403,
    status
  })

// eslint-disable-next-line nenas/no-spread-adding-field -- the upstream's request body, serialized at once
const requestBody = (request: ProviderRequest, stream: boolean) => ({
  model: request.model,
  messages: request.messages,
  // OpenAI's reasoning models refuse `max_tokens`; every OpenAI-compatible server takes `max_tokens`.
  [request.reasoningModel ? "max_completion_tokens" : "max_tokens"]: request.maxOutputTokens,
  ...(request.reasoningModel && request.reasoningEffort !== undefined
    ? { reasoning_effort: request.reasoningEffort }
    : {}),
  ...(request.temperature === undefined ? {} : { temperature: request.temperature }),
  ...(request.topP === undefined ? {} : { top_p: request.topP }),
  ...(request.stop === undefined || request.stop === null ? {} : { stop: request.stop }),
  ...(request.user === undefined ? {} : { user: request.user }),
  ...capabilitiesBody(request),
  ...(stream ? { stream: true, stream_options: { include_usage: true } } : {})
})

const chatBody = (request: ProviderRequest, stream: boolean): string => JSON.stringify(requestBody(request, stream))

/** OpenAI's embeddings body: floats (not base64: the vectors are read, shortened and rendered here). */
const embeddingBody = (request: EmbeddingRequest): Record<string, unknown> => {
  const body: Record<string, unknown> = { model: request.model, input: request.input, encoding_format: "float" }
  if (request.dimensions !== undefined) body["dimensions"] = request.dimensions
  if (request.user !== undefined) body["user"] = request.user
  return body
}

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
  // eslint-disable-next-line nenas/no-spread-adding-field -- an upstream failure, not a success
  new ProviderUnavailable({ message, ...extra })

/** An upstream answer's status line, as either client reads it. */
interface StatusAnswer {
  readonly status: number
  readonly retryAfter: string | undefined
  readonly text: Effect.Effect<string, unknown>
}

const retryAfterSeconds = (response: StatusAnswer): number => {
  const header = Number(response.retryAfter)
  return Number.isFinite(header) && header >= 0 ? Math.ceil(header) : 1
}

/** `Retry-After` in milliseconds from now (seconds, or an HTTP date), when the upstream sent one. */
const retryAfterMsOf = (header: string | undefined): number | undefined => {
  if (header === undefined || header.trim() === "") return undefined
  const seconds = Number(header)
  if (Number.isFinite(seconds)) return seconds >= 0 ? Math.ceil(seconds * 1000) : undefined
  const at = Date.parse(header)
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now())
}

/** How an answer's status counts: 429 is a rate limit, 5xx, 408 and our credentials refused (401/403) the upstream's failure, another 4xx the request's. */
const outcomeOfStatus = (status: number): AttemptFailure["outcome"] => {
  if (status === 429) return "rate_limited"
  if (status >= 500 || status === 408 || status < 400 || status === 401 || status === 403) return "server_error"
  return "refused"
}

const UpstreamError = Schema.parseJson(Schema.Struct({
  error: Schema.Struct({
    message: Schema.optional(Schema.NullOr(Schema.String)),
    code: Schema.optional(Schema.Unknown)
  })
}))
const decodeUpstreamError = Schema.decodeUnknownOption(UpstreamError)

/** The upstream's own words for a refusal (OpenAI's `error.message`, else the body's start), cleaned for the caller. */
const upstreamMessage = (text: string): { readonly message: string; readonly code: unknown } =>
  Option.match(decodeUpstreamError(text), {
    onNone: () => ({ message: cleanUpstreamText(text.slice(0, 2000)), code: undefined }),
    onSome: ({ error }) => ({ message: cleanUpstreamText((error.message ?? text).slice(0, 2000)), code: error.code })
  })

/**
 * Fails with `error` after logging `detail` in full: what the upstream said
 * can name internal hosts, so the caller gets generic words and the operator
 * the rest.
 */
const reported = <E>(error: E, detail: unknown) =>
  Effect.zipRight(Effect.logWarning(`model provider: ${String(detail)}`), Effect.fail(error))

const CONTEXT_TOO_LONG =
  /context.{0,20}(length|window)|maximum context|too many tokens|prompt is too long|input is too long/i

/**
 * Upstream statuses as our errors: 429, 408 and 5xx may pass on a retry; its credentials refused (401/403) are
 * ours to fix, so retryable and logged for the operator; any other 4xx is the caller's request, in the upstream's
 * words, cleaned.
 */
const statusError = (response: StatusAnswer, credentials: string) =>
  Effect.flatMap(
    Effect.orElseSucceed(response.text, () => ""),
    (text): Effect.Effect<never, ProviderError> => {
      const detail = text.length > 0 ? `: ${text.slice(0, 2000)}` : ""
      if (response.status === 429) {
        return reported(
          unavailable("The model provider is rate limiting requests (HTTP 429).", {
            retry_after_seconds: retryAfterSeconds(response)
          }),
          `HTTP 429${detail}`
        )
      }
      if (response.status >= 500 || response.status === 408 || response.status < 400) {
        return reported(
          unavailable(`The model provider failed (HTTP ${response.status}).`),
          `HTTP ${response.status}${detail}`
        )
      }
      if (response.status === 401 || response.status === 403) {
        return Effect.zipRight(
          Effect.logError(
            `The model provider refused our credentials (HTTP ${response.status}): check ${credentials}${detail}`
          ),
          Effect.fail(unavailable("The model provider is not available right now."))
        )
      }
      // The caller reads the upstream's words cleaned (CleanText.ts); the operator's log keeps them whole.
      const { code, message } = upstreamMessage(text)
      const said = message.length > 0 ? message : `HTTP ${response.status}`
      const logged = `HTTP ${response.status}${detail}`
      if (response.status === 413 || code === "context_length_exceeded" || CONTEXT_TOO_LONG.test(said)) {
        return reported(
          new ContextLengthExceeded({ message: `The model refused the input as too long: ${said}`, param: null }),
          logged
        )
      }
      return reported(new InvalidRequest({ message: `The model refused the request: ${said}`, param: null }), logged)
    }
  )

const headerOf = (headers: IncomingHttpHeaders, name: string): string | undefined => {
  const value = headers[name]
  return typeof value === "string" ? value : value?.[0]
}

/**
 * An OpenAI-compatible chat-completions upstream (OpenAI, Gemini's OpenAI
 * endpoint, OpenRouter, vLLM, Ollama, llama.cpp), alone: its failures as the caller's errors.
 */
export const makeOpenAiCompatible = (options: UpstreamOptions) =>
  Effect.map(makeUpstreamClient(options), (client): ProviderShape => ({
    complete: (request) =>
      Effect.mapError(client.complete(request, options.firstByteTimeoutMs), (failed) => failed.error),
    stream: (request) => Effect.mapError(client.stream(request, options.firstByteTimeoutMs), (failed) => failed.error),
    embed: (request) => Effect.mapError(client.embed(request, options.firstByteTimeoutMs), (failed) => failed.error)
  }))

/** One OpenAI-compatible upstream, its failures told apart for fallbacks (`AttemptFailure`). */
export const makeUpstreamClient = (options: Omit<UpstreamOptions, "firstByteTimeoutMs">) =>
  Effect.sync(() => upstreamClient(options))

/** `makeUpstreamClient`'s client, made at once (a team's provider key, on the call that first uses it). */
export const upstreamClient = (options: Omit<UpstreamOptions, "firstByteTimeoutMs">): UpstreamClient => {
  const base = options.baseUrl.replace(/\/+$/, "")
  const timedOut = (phase: string) => new ProviderTimeout({ message: `The model provider did not ${phase} in time.` })

  /**
   * Requests go out on Node's HTTP client (`Lane/Wire/KeepAlivePost.ts`), and answers are read by hand (`ChatDecode.ts`,
   * `EventStream.ts`): nothing is aborted once a body has ended (HttpClient's stream aborts every request at its
   * end, building an error each time), and each deadline is one timer, not a fiber racing a sleep.
   */
  const chat = makePost(`${base}/chat/completions`, options.lookup)
  const embeddings = makePost(`${base}/embeddings`, options.lookup)
  const credentials = options.credentials ?? "UPSTREAM_API_KEY"
  // eslint-disable-next-line nenas/no-spread-adding-field -- once per upstream request
  const headers = (): Record<string, string> => ({
    "content-type": "application/json",
    accept: "application/json",
    ...Option.match(options.apiKey, {
      onNone: () => ({}),
      onSome: (key) => ({ authorization: `Bearer ${Redacted.value(key)}` })
    })
  })
  /**
   * The answer's headers, or why there are none: one timer for the first byte, and a connection that fails
   * before any byte tried once more, in plain code (no fiber races a sleep).
   */
  const open = (post: Post, body: string, firstByteMs: number, phase: string) =>
    Effect.async<IncomingMessage, ProviderError | { readonly unreachable: unknown }>((resume) => {
      let settled = false
      let cancel = () => {}
      const timer = setTimeout(() => {
        settled = true
        cancel()
        resume(Effect.fail(timedOut(phase)))
      }, firstByteMs)
      const attempt = (retries: number): void => {
        cancel = post.send(headers(), body, (answer) => {
          if (settled) return dropBody(answer)
          settled = true
          clearTimeout(timer)
          resume(Effect.succeed(answer))
        }, (cause) => {
          if (settled) return
          if (retries > 0) return attempt(retries - 1)
          settled = true
          clearTimeout(timer)
          resume(Effect.fail({ unreachable: cause }))
        })
      }
      attempt(1)
      // Interrupted (the client went away, or shutdown): the request is dropped.
      return Effect.sync(() => {
        settled = true
        clearTimeout(timer)
        cancel()
      })
    })
  /** The answer's headers, its status refused as our errors. */
  const send = (post: Post, body: string, firstByteMs: number, phase: string) =>
    open(post, body, Math.max(1, firstByteMs), phase).pipe(
      Effect.catchAll((error) =>
        "unreachable" in error
          ? Effect.mapError(
            reported(
              unavailable("The model provider could not be reached."),
              error.unreachable instanceof Error ? error.unreachable.message : String(error.unreachable)
            ),
            failure("connection_error")
          )
          : Effect.fail(failure("first_byte_timeout")(error))
      ),
      Effect.flatMap((answer) => {
        const status = answer.statusCode ?? 0
        if (status >= 200 && status < 300) return Effect.succeed(answer)
        const text = Effect.tryPromise(() => textOf(answer))
        const retryAfter = headerOf(answer.headers, "retry-after")
        return Effect.mapError(
          statusError({ status, retryAfter, text }, credentials),
          failure(outcomeOfStatus(status), retryAfterMsOf(retryAfter), status)
        )
      })
    )

  /** The whole body by `deadline` (epoch ms), or why not. */
  const bodyOf = (answer: IncomingMessage, deadline: number) =>
    Effect.async<string, ProviderError>((resume) => {
      let settled = false
      const timer = setTimeout(() => {
        settled = true
        dropBody(answer)
        resume(Effect.fail(timedOut("finish")))
      }, Math.max(0, deadline - Date.now()))
      textOf(answer).then(
        (text) => {
          if (settled) return
          settled = true
          clearTimeout(timer)
          resume(Effect.succeed(text))
        },
        (cause) => {
          if (settled) return
          settled = true
          clearTimeout(timer)
          resume(
            reported(
              unavailable("The model provider's answer broke off."),
              cause instanceof Error ? cause.message : String(cause)
            )
          )
        }
      )
      return Effect.sync(() => {
        settled = true
        clearTimeout(timer)
        dropBody(answer)
      })
    })

  /**
   * A whole answer read as `decode` says: one deadline for all of it, the first byte's own when it comes first.
   * Once the answer's head came, a body that breaks off or that `decode` refuses (`undefined`, `what` it was
   * not) is cut short: the call does not move on.
   */
  const whole = <A>(
    post: Post,
    body: string,
    firstByteBudgetMs: number,
    decode: (text: string) => A | undefined,
    what: string
  ): Effect.Effect<A, AttemptFailure> =>
    Effect.suspend(() => {
      const deadline = Date.now() + options.totalTimeoutMs
      const [firstByteMs, phase] = firstByteBudgetMs < options.totalTimeoutMs
        ? [firstByteBudgetMs, "start answering"]
        : [options.totalTimeoutMs, "finish"]
      return send(post, body, firstByteMs, phase).pipe(
        Effect.flatMap((answer) => Effect.mapError(bodyOf(answer, deadline), failure("cut_short"))),
        Effect.flatMap((text) => {
          const decoded = decode(text)
          return decoded === undefined
            ? Effect.fail(failure("cut_short")(unavailable(`The model provider's answer was not ${what}.`)))
            : Effect.succeed(decoded)
        })
      )
    })

  const complete = (request: ProviderRequest, firstByteMs: number): Effect.Effect<Completion, AttemptFailure> =>
    whole(chat, chatBody(request, false), firstByteMs, completionOf, "a chat completion")

  const embed = (request: EmbeddingRequest, firstByteMs: number): Effect.Effect<EmbeddingAnswer, AttemptFailure> =>
    whole(
      embeddings,
      JSON.stringify(embeddingBody(request)),
      firstByteMs,
      (text) => decodeEmbeddings(text, request.input.length, request.dimensions),
      "one embedding per input item"
    )

  const stream = (
    request: ProviderRequest,
    firstByteMs: number
  ): Effect.Effect<Stream.Stream<StreamPart, ProviderError>, AttemptFailure> =>
    Effect.flatMap(send(chat, chatBody(request, true), firstByteMs, "start answering"), (answer) => {
      const contentType = headerOf(answer.headers, "content-type")
      if (!(contentType ?? "").toLowerCase().startsWith("text/event-stream")) {
        dropBody(answer)
        return Effect.fail(
          failure("server_error")(unavailable(
            `The model provider answered a stream request with ${
              contentType ?? "no content type"
            }, not an event stream.`
          ))
        )
      }
      return Effect.succeed(eventStreamParts(answer, options.totalTimeoutMs, {
        malformed: () => unavailable("The model provider sent a malformed stream chunk."),
        errorChunk: () => unavailable("The model provider failed mid-stream."),
        brokeOff: () => unavailable("The model provider's stream broke off."),
        cutShort: () => unavailable("The model provider's stream ended before the answer was finished."),
        timedOut: () => timedOut("finish")
      }))
    })

  const close = () => {
    chat.close()
    embeddings.close()
  }

  return { complete, stream, embed, close }
}
