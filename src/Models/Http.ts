import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Cause, Effect, Exit, Fiber, Schema } from "effect"
import { NenasApi } from "../Api.js"
import { AppConfig } from "../AppConfig.js"
import { CurrentApiKey } from "../Auth/Api.js"
import type { ApiError } from "../Domain/Errors.js"
import type { IdempotencyConflict } from "../Domain/Errors.js"
import { httpStatus, InvalidRequest, isApiError, ProviderTimeout, toErrorBody } from "../Domain/Errors.js"
import { breatheIfLarge } from "../Request/Breathe.js"
import { addResponseHeaders, currentRequestId } from "../Request/Context.js"
import { RETENTION_DAYS } from "../Responses/Store.js"
import { requireActiveAccount } from "./Admission/Access.js"
import { Idempotency, keptForReplay } from "./Admission/Idempotency.js"
import { CallLimits } from "./Admission/RateLimits.js"
import type { AnthropicCountTokensRequest, AnthropicMessagesRequest } from "./Anthropic/AnthropicApi.js"
import { anthropicErrorBody } from "./Anthropic/AnthropicErrors.js"
import { anthropicCallInput, anthropicConversation, requireAnthropicModel } from "./Anthropic/AnthropicInput.js"
import { anthropicEvents, anthropicMessage, anthropicTokenCount } from "./Anthropic/AnthropicWire.js"
import { cacheAskOf } from "./Call/CallCache.js"
import type { BilledEndpoint, CallInput, CallResult, Endpoint } from "./Call/CallTypes.js"
import { chatConversation, conversationInput, responsesConversation } from "./Call/Input.js"
import { ModelCalls } from "./Call/ModelCalls.js"
import type { Capability } from "./CatalogApi.js"
import type { EmbeddingsRequest } from "./Embeddings/EmbeddingsApi.js"
import { EMBEDDING_MODEL, EMBEDDING_SIZE, MAX_ITEM_TOKENS } from "./Embeddings/EmbeddingsApi.js"
import type { CallHeaders, ChatCompletionRequest, ResponsesBody } from "./OpenAi/Api.js"
import { CONTEXT_WINDOW, MAX_OUTPUT_TOKENS, PUBLIC_MODEL, WebSearchConfig } from "./OpenAi/Api.js"
import { StoredConversations } from "./OpenAi/StoredConversations.js"
import type { StreamContext } from "./OpenAi/Wire.js"
import { chatCompletion, chatEvents, type EventRenderer, responsesEvents, responsesOutput } from "./OpenAi/Wire.js"

const WEB_SEARCH_DEFAULTS = Schema.decodeSync(WebSearchConfig)({})

/** Exactly the capabilities that work end to end. */
export const CAPABILITIES: ReadonlyArray<typeof Capability.Type> = [
  "text",
  "vision",
  "reasoning",
  "web_search",
  "streaming",
  "tools",
  "structured_output"
]

const MODEL_LIST = {
  object: "list" as const,
  data: [{
    id: PUBLIC_MODEL,
    object: "model" as const,
    owned_by: "svc",
    context_window: CONTEXT_WINDOW,
    max_output_tokens: MAX_OUTPUT_TOKENS,
    capabilities: CAPABILITIES,
    endpoints: ["/v1/responses", "/v1/chat/completions", "/v1/messages"] as const,
    response_storage: {
      default_store: true,
      retention_days: RETENTION_DAYS,
      opt_out: "Send store: false with a /v1/responses call."
    }
  }, {
    id: EMBEDDING_MODEL,
    object: "model" as const,
    owned_by: "svc",
    context_window: MAX_ITEM_TOKENS,
    max_output_tokens: 0,
    capabilities: ["embeddings"] as const,
    endpoints: ["/v1/embeddings"] as const,
    dimensions: EMBEDDING_SIZE
  }]
}

export const ModelsLive = HttpApiBuilder.group(NenasApi, "models", (handlers) =>
  Effect.map(CallLimits, (limits) =>
    // Counted against the key's rate limits like every /v1 call (its slot is held while the list is made).
    handlers.handle("list", () =>
      Effect.flatMap(
        Effect.zip(CurrentApiKey, currentRequestId),
        ([key, requestId]) => Effect.scoped(limits.admit(key.keyId, requestId))
      ).pipe(Effect.as(MODEL_LIST)))))

interface Call {
  readonly endpoint: BilledEndpoint
  readonly payload: unknown
  readonly idempotencyKey: string | undefined
  /** The body asks for a stream (known before the input is resolved, so the slot is held as long as the stream). */
  readonly stream: boolean
  readonly input: Effect.Effect<CallInput, ApiError, CurrentApiKey>
  readonly render: (result: CallResult) => unknown
  readonly renderStream: (context: StreamContext) => EventRenderer
  /** An error as this endpoint writes it: kept for an idempotent replay (the error middleware writes the live one). */
  readonly errorBody: (error: ApiError, requestId: string, dashboardUrl: string) => unknown
}

const SSE_HEADERS = { "cache-control": "no-cache", "x-accel-buffering": "no" }

/** Serves a model call, whichever endpoint it came through: admission, idempotency, the answer or its stream. */
const makeCallServing = Effect.gen(function*() {
  const calls = yield* ModelCalls
  const limits = yield* CallLimits
  const idempotency = yield* Idempotency
  const { dashboardUrl } = yield* AppConfig

  /**
   * A non-streaming call, `run` with the check it makes before it is billed (an Idempotency-Key's); with an
   * Idempotency-Key its answer is kept and replayed.
   */
  const answerWith = Effect.fnUntraced(function*(
    call: Pick<Call, "endpoint" | "payload" | "idempotencyKey" | "errorBody">,
    webSearchMode: string | undefined,
    runOf: (
      confirm: Effect.Effect<void, IdempotencyConflict> | undefined
    ) => Effect.Effect<string, ApiError, CurrentApiKey>
  ) {
    const key = yield* CurrentApiKey
    const respond = (body: string, replayed: boolean, status = 200) =>
      HttpServerResponse.text(body, {
        status,
        contentType: "application/json",
        headers: replayed ? { "idempotent-replayed": "true" } : {}
      })
    if (call.idempotencyKey === undefined) return respond(yield* runOf(undefined), false)
    const claimKey = call.idempotencyKey
    const requestId = yield* currentRequestId
    const outcome = yield* idempotency.claim({
      apiKeyId: key.keyId,
      key: claimKey,
      endpoint: call.endpoint,
      body: call.payload,
      requestId
    }).pipe(Effect.catchTag("SqlError", Effect.die))
    if (outcome._tag === "Replay") {
      // The replay answers as the first request did: its body quotes that request's id, and so does the header.
      yield* addResponseHeaders(
        call.endpoint === "/v1/messages"
          ? { "x-request-id": outcome.requestId, "request-id": outcome.requestId }
          : { "x-request-id": outcome.requestId }
      )
      return respond(outcome.body, true, outcome.status)
    }
    // A client that gives up will retry with the same key: the call runs on without it, and its answer is kept for the retry.
    const body = yield* runOf(idempotency.confirm(key.keyId, claimKey, requestId)).pipe(
      Effect.onExit((exit) => {
        if (Exit.isSuccess(exit)) return idempotency.complete(key.keyId, claimKey, requestId, 200, exit.value)
        const failure = Cause.failureOption(exit.cause)
        // A typed error is the request's answer, kept like a success, unless a retry it invites should run anew.
        if (
          failure._tag === "Some" && isApiError(failure.value) && keptForReplay(failure.value, webSearchMode)
        ) {
          const body = JSON.stringify(call.errorBody(failure.value, requestId, dashboardUrl))
          return idempotency.complete(key.keyId, claimKey, requestId, httpStatus(failure.value), body)
        }
        if (!Cause.isInterruptedOnly(exit.cause)) return idempotency.abandon(key.keyId, claimKey, requestId)
        // Cut by shutdown's deadline after it may have run (and been billed): a retry must not run it again.
        const cut = new ProviderTimeout({
          message: `The request with this Idempotency-Key was cut off when the service stopped (${requestId}); ` +
            "work already done upstream was billed.",
          retryable: false,
          guidance: "Send a new Idempotency-Key to run the request again."
        })
        return idempotency.complete(
          key.keyId,
          claimKey,
          requestId,
          httpStatus(cut),
          JSON.stringify(call.errorBody(cut, requestId, dashboardUrl))
        )
      }),
      idempotency.detach,
      Effect.flatMap(Fiber.join)
    )
    return respond(body, false)
  })

  /** A model call answered whole. */
  const answer = (call: Call, input: CallInput) =>
    answerWith(call, input.webSearch?.mode, (confirm) =>
      Effect.map(
        calls.complete(confirm === undefined ? input : Object.assign({}, input, { confirmBeforeBilling: confirm })),
        (result) => JSON.stringify(call.render(result))
      ))

  /** An embeddings call: admitted first, then what it asks of the cache, then the call (docs/api/embeddings.md). */
  const serveEmbeddings = Effect.fnUntraced(function*(
    headers: typeof CallHeaders.Type,
    payload: EmbeddingsRequest
  ) {
    yield* requireActiveAccount
    const key = yield* CurrentApiKey
    return yield* limits.admitting(
      key.keyId,
      yield* currentRequestId,
      Effect.flatMap(
        cacheAskOf(headers, key, "/v1/embeddings", payload, {
          previousResponseId: false,
          webSearch: false,
          choices: 1
        }),
        (cache) =>
          answerWith(
            { endpoint: "/v1/embeddings", payload, idempotencyKey: headers["idempotency-key"], errorBody: toErrorBody },
            undefined,
            (confirm) =>
              Effect.map(calls.embed({ payload, cache, confirmBeforeBilling: confirm }), (body) => JSON.stringify(body))
          )
      )
    )
  })

  /** A streamed call: its rate-limit slot, taken before anything else, is held until the stream ends. */
  const streamed = Effect.fnUntraced(function*(call: Call) {
    const requestId = yield* currentRequestId
    const slot = limits.slot((yield* CurrentApiKey).keyId, requestId)
    const context: StreamContext = {
      requestId,
      createdAt: Math.floor((yield* Effect.clockWith((clock) => clock.currentTimeMillis)) / 1000),
      dashboardUrl
    }
    const body = yield* Effect.onError(
      Effect.zipRight(
        slot.take,
        Effect.flatMap(call.input, (input) => calls.stream(input, call.renderStream(context), slot.giveBack))
      ),
      () => slot.giveBack
    )
    return HttpServerResponse.raw(body, { contentType: "text/event-stream", headers: SSE_HEADERS })
  })

  /** Admission first (docs/security.md, "Security"): the key's limits are taken before the input's stored responses are read. */
  const serve = Effect.fnUntraced(function*(call: Call) {
    yield* requireActiveAccount
    if (call.stream) return yield* streamed(call)
    const key = yield* CurrentApiKey
    return yield* limits.admitting(
      key.keyId,
      yield* currentRequestId,
      Effect.flatMap(call.input, (input) => answer(call, input))
    )
  })

  return { serve, serveEmbeddings, limits }
})

/** The request as a model endpoint's handler reads it: its decoded headers and payload. */
interface CallRequest<Payload> {
  readonly headers: typeof CallHeaders.Type
  readonly payload: Payload
}

/**
 * The call's input with what it asks of the response cache (docs/api/cache.md, "Turning it on"), from its
 * headers, its key and its body; unchanged when it asks nothing.
 */
const withCacheAsk = (
  input: Effect.Effect<CallInput, ApiError, CurrentApiKey>,
  endpoint: Endpoint,
  headers: typeof CallHeaders.Type,
  payload: {
    readonly previous_response_id?: string | null | undefined
    readonly n?: number | null | undefined
  }
): Effect.Effect<CallInput, ApiError, CurrentApiKey> =>
  Effect.flatMap(input, (given) =>
    Effect.flatMap(CurrentApiKey, (key) =>
      Effect.map(
        cacheAskOf(headers, key, endpoint, payload, {
          previousResponseId: payload.previous_response_id != null,
          webSearch: given.webSearch !== undefined && given.webSearch.mode !== "off",
          choices: payload.n ?? 1
        }),
        (cache) => cache === undefined ? given : Object.assign({}, given, { cache })
      )))

/** What every model endpoint's call takes from its request: the body, and its Idempotency-Key unless it streams. */
const requested = <
  Payload extends {
    readonly stream?: boolean | null | undefined
    readonly previous_response_id?: string | null | undefined
    readonly n?: number | null | undefined
  }
>(
  endpoint: Endpoint,
  { headers, payload }: CallRequest<Payload>,
  serving: Pick<Call, "input" | "render" | "renderStream" | "errorBody">
): Call => ({
  endpoint,
  payload,
  idempotencyKey: payload.stream ? undefined : headers["idempotency-key"],
  stream: payload.stream === true,
  // Field by field: a spread of these onto the fields above would take Node 20's slow path (`npm run bench:spreads`).
  input: withCacheAsk(serving.input, endpoint, headers, payload),
  render: serving.render,
  renderStream: serving.renderStream,
  errorBody: serving.errorBody
})

/**
 * The model endpoints' handlers, one implementation of each: the HttpApi
 * groups below serve them through the router, and the lane (`Lane/ModelLane.ts`)
 * serves the same functions in front of it.
 */
export const makeModelEndpoints = Effect.gen(function*() {
  const { limits, serve, serveEmbeddings } = yield* makeCallServing
  const stored = yield* StoredConversations
  // One generator function for every call (`Effect.fnUntraced`), not one made per call
  // (docs/performance.md, "What kept a request's objects through young collections").
  const responsesInput = Effect.fnUntraced(function*(payload: ResponsesBody) {
    if (payload.model !== PUBLIC_MODEL) {
      return yield* new InvalidRequest({
        message: `The model '${payload.model}' does not exist; the model is '${PUBLIC_MODEL}'.`,
        param: "model"
      })
    }
    const key = yield* CurrentApiKey
    const state = yield* stored.resolve(key.accountId, yield* currentRequestId, payload)
    const conversation = yield* responsesConversation({ ...payload, input: state.input }, state.history)
    // eslint-disable-next-line nenas/no-spread-adding-field -- once per call, not per chunk
    return {
      endpoint: "/v1/responses",
      ...conversationInput(conversation),
      effort: payload.reasoning?.effort ?? "medium",
      maxOutputTokens: payload.max_output_tokens,
      maxTotalCostMyr: payload.max_total_cost_myr,
      // OpenAI's web search tool turns our web search on, with the request's settings if it has them.
      webSearch: conversation.webSearchTool
        ? { ...(payload.web_search ?? WEB_SEARCH_DEFAULTS), mode: "on" }
        : payload.web_search,
      temperature: payload.temperature,
      topP: payload.top_p,
      user: payload.user,
      metadata: payload.metadata,
      stream: payload.stream,
      inputParam: "input",
      store: state.store
    } satisfies CallInput
  })
  return {
    responses: ({ headers, payload }: CallRequest<ResponsesBody>) =>
      serve(requested("/v1/responses", { headers, payload }, {
        input: responsesInput(payload),
        render: responsesOutput,
        renderStream: responsesEvents,
        errorBody: toErrorBody
      })),
    chatCompletions: ({ headers, payload }: CallRequest<ChatCompletionRequest>) =>
      serve(requested("/v1/chat/completions", { headers, payload }, {
        // eslint-disable-next-line nenas/no-spread-adding-field -- once per call, not per chunk
        input: Effect.map(chatConversation(payload), (conversation) => ({
          endpoint: "/v1/chat/completions",
          ...conversationInput(conversation),
          effort: payload.reasoning_effort ?? "medium",
          maxOutputTokens: payload.max_completion_tokens ?? payload.max_tokens,
          maxTotalCostMyr: payload.max_total_cost_myr,
          webSearch: payload.web_search,
          temperature: payload.temperature,
          topP: payload.top_p,
          stop: payload.stop,
          user: payload.user,
          metadata: payload.metadata,
          stream: payload.stream,
          inputParam: "messages"
        } satisfies CallInput)),
        render: chatCompletion,
        renderStream: chatEvents,
        errorBody: toErrorBody
      })),
    /** Anthropic's Messages API: the same call, in Anthropic's shapes (`Anthropic/AnthropicInput.ts`, `Anthropic/AnthropicWire.ts`). */
    messages: ({ headers, payload }: CallRequest<AnthropicMessagesRequest>) =>
      serve(requested("/v1/messages", { headers, payload }, {
        input: anthropicCallInput(payload),
        render: (result) => anthropicMessage(result, payload.stop_sequences),
        renderStream: (context) => anthropicEvents(context, payload.stop_sequences),
        errorBody: anthropicErrorBody
      })),
    /** `POST /v1/embeddings`: admitted, idempotent and cached as the model calls are (docs/api/embeddings.md). */
    embeddings: ({ headers, payload }: CallRequest<EmbeddingsRequest>) => serveEmbeddings(headers, payload),
    /** Free and not logged as a call, but counted against the key's rate limits as every /v1 request is. */
    countTokens: Effect.fnUntraced(function*({ payload }: { readonly payload: AnthropicCountTokensRequest }) {
      yield* requireActiveAccount
      const key = yield* CurrentApiKey
      return yield* Effect.scoped(Effect.zipRight(
        limits.admit(key.keyId, yield* currentRequestId),
        Effect.zipRight(
          requireAnthropicModel(payload.model),
          Effect.flatMap(
            anthropicConversation(payload),
            (conversation) => Effect.zipRight(breatheIfLarge, Effect.sync(() => anthropicTokenCount(conversation)))
          )
        )
      ))
    })
  }
})

/**
 * `POST /v1/responses` and `POST /v1/chat/completions` on the HttpApi router.
 * Production traffic does not come this way: the request pipeline
 * (`Http/Pipeline.ts`) hands both to the lane (`Lane/ModelLane.ts`), which
 * calls the same `makeModelEndpoints` functions. The router serves them only
 * for a request the lane leaves alone (a query string) and for tests' small
 * APIs; `test/server/http/lane.test.ts` holds both roads to the same answers.
 */
export const ModelCallsLive = HttpApiBuilder.group(
  NenasApi,
  "modelCalls",
  (handlers) =>
    Effect.map(makeModelEndpoints, (endpoints) =>
      handlers
        .handle("responses", endpoints.responses)
        .handle("chatCompletions", endpoints.chatCompletions))
)

/**
 * `POST /v1/messages` and `POST /v1/messages/count_tokens` on the HttpApi
 * router. Production traffic to `/v1/messages` takes the lane
 * (`Lane/ModelLane.ts`, from `Http/Pipeline.ts`) to the same `messages`
 * function; `count_tokens`, which moves no money, always comes this way.
 */
export const AnthropicMessagesLive = HttpApiBuilder.group(
  NenasApi,
  "anthropicMessages",
  (handlers) =>
    Effect.map(makeModelEndpoints, (endpoints) =>
      handlers
        .handle("messages", endpoints.messages)
        .handle("countTokens", endpoints.countTokens))
)

/** `POST /v1/embeddings` on the HttpApi router. */
export const EmbeddingsLive = HttpApiBuilder.group(
  NenasApi,
  "embeddings",
  (handlers) => Effect.map(makeModelEndpoints, (endpoints) => handlers.handle("embeddings", endpoints.embeddings))
)
