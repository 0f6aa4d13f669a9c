import * as HttpServerError from "@effect/platform/HttpServerError"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import type * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as UrlParams from "@effect/platform/UrlParams"
import { Context, Effect, Layer, Redacted, Schema } from "effect"
import { ApiKeyAuth, type ApiKeyPrincipal, CurrentApiKey } from "../Auth/Api.js"
import { AnthropicMessagesRequest } from "../Models/Anthropic/AnthropicApi.js"
import { makeModelEndpoints } from "../Models/Http.js"
import { CallHeaders, ChatCompletionRequest, ResponsesBody } from "../Models/OpenAi/Api.js"
import { breatheAfter } from "../Request/Breathe.js"
import { provideForRequest } from "../Request/Context.js"

/**
 * A request the lane serves, from its API key to its answer, given the body the request guard read (undefined: it
 * had none to read); it fails as the router's endpoint would.
 */
export type LaneHandler = (
  text: string | undefined
) => Effect.Effect<HttpServerResponse.HttpServerResponse, unknown, HttpServerRequest.HttpServerRequest>

/**
 * The payload of a body the guard read, parsed as the platform's `request.json` parses it (and fails: a
 * `RequestError`, as a defect, as HttpApiBuilder's `requestPayload` makes it).
 */
const parsed = (request: HttpServerRequest.HttpServerRequest, text: string) =>
  Effect.orDie(Effect.try({
    try: (): unknown => text === "" ? null : JSON.parse(text),
    catch: (cause) => new HttpServerError.RequestError({ request, reason: "Decode", cause })
  }))

/**
 * The platform's own reading of a payload (HttpApiBuilder's `requestPayload`,
 * for a method with a body and no multipart Schema): JSON unless the
 * Content-Type says otherwise. The request guard has already refused a
 * multipart body and a body of another type than JSON; this reads a request
 * that has no body.
 */
const payloadOf = (request: HttpServerRequest.HttpServerRequest) => {
  const contentType = request.headers["content-type"]?.toLowerCase().trim() || "application/json"
  if (contentType.includes("application/json")) return Effect.orDie(request.json)
  if (contentType.includes("x-www-form-urlencoded")) {
    return Effect.map(Effect.orDie(request.urlParamsBody), UrlParams.toRecord)
  }
  if (contentType.startsWith("text/")) return Effect.orDie(request.text)
  return Effect.map(Effect.orDie(request.arrayBuffer), (buffer): unknown => new Uint8Array(buffer))
}

/** The endpoints the lane serves, with the payload Schema each declares in `NenasApi` (the same objects: `test/lane.test.ts`). */
export const LANE_ENDPOINTS = {
  responses: { group: "modelCalls", path: "/v1/responses", payload: ResponsesBody },
  chatCompletions: { group: "modelCalls", path: "/v1/chat/completions", payload: ChatCompletionRequest },
  messages: { group: "anthropicMessages", path: "/v1/messages", payload: AnthropicMessagesRequest }
} as const

const BEARER = "Bearer ".length
const decodeHeaders = Schema.decodeUnknown(CallHeaders)

/**
 * The model calls (`POST /v1/responses`, `/v1/chat/completions`,
 * `/v1/messages`) served in front of the router
 * (docs/performance.md, "Going around the platform"): the router's matching and
 * the API's per-endpoint wrapping (the group's whole context merged into each
 * request's, the security middleware's own fiber work) cost a plain call about
 * 8% of its CPU in A/B runs of `npm run bench:pipeline`.
 *
 * What the router's endpoint does, the lane does in the same order with the
 * same parts: the API key through `ApiKeyAuth` (as its bearer security
 * decodes it), the payload with the endpoint's own Schema (precompiled),
 * then the `Idempotency-Key` header, and the same handler (`makeModelEndpoints`),
 * interruptible as the router makes it. It runs inside the error middleware
 * (`Http/Pipeline.ts`), so the request guard, request id, error encoder,
 * access log, metrics, security headers and the shutdown drain are the ones
 * every other request has. HttpApi still declares the endpoints: OpenAPI,
 * docs and typed clients are unchanged, and a request the lane does not take
 * (another path, a query string) is the router's. `test/lane.test.ts` holds
 * the two to the same answers on a corpus of valid and invalid calls.
 */
export class ModelLane extends Context.Tag("nenas/ModelLane")<ModelLane, {
  /** The handler for a method and URL, exactly as written; none for anything else. */
  readonly route: (method: string, url: string) => LaneHandler | undefined
}>() {
  static readonly layer = Layer.effect(
    ModelLane,
    Effect.gen(function*() {
      // As the router's endpoints receive it; `ApiKeyAuthLive` reads the request only (and fiber references), not
      // the route's parameters or scope the middleware's type allows it, which the lane does not have.
      const authenticate = (yield* ApiKeyAuth).apiKey as (
        token: Redacted.Redacted
      ) => Effect.Effect<ApiKeyPrincipal, unknown, HttpServerRequest.HttpServerRequest>
      const endpoints = yield* makeModelEndpoints
      const lane = <A, I>(
        { path, payload: schema }: { readonly path: string; readonly payload: Schema.Schema<A, I> },
        handler: (
          request: { readonly headers: typeof CallHeaders.Type; readonly payload: A }
        ) => Effect.Effect<
          HttpServerResponse.HttpServerResponse,
          unknown,
          CurrentApiKey
        >
      ): readonly [string, LaneHandler] => {
        const decodePayload = Schema.decodeUnknown(schema)
        // One generator function for every call (`Effect.fnUntraced`), not one made per call
        // (docs/performance.md, "What kept a request's objects through young collections").
        const serve = Effect.fnUntraced(function*(text: string | undefined) {
          const request = yield* HttpServerRequest.HttpServerRequest
          const key = yield* authenticate(Redacted.make((request.headers["authorization"] ?? "").slice(BEARER)))
          const json = yield* (text === undefined ? payloadOf(request) : parsed(request, text))
          // A large body's parsing and decoding each end with a turn of the event loop (docs/security.md, "Bounded work per request").
          if (text !== undefined) yield* breatheAfter(text.length)
          const payload = yield* decodePayload(json)
          if (text !== undefined) yield* breatheAfter(text.length)
          const headers = yield* decodeHeaders(request.headers)
          return yield* provideForRequest(handler({ headers, payload }), CurrentApiKey, key)
        })
        // Interruptible, as the router makes its routes (the server runs the app uninterruptibly): a client gone stops the call.
        return [path, (text) => Effect.interruptible(serve(text))]
      }
      const byPath = new Map([
        lane(LANE_ENDPOINTS.responses, endpoints.responses),
        lane(LANE_ENDPOINTS.chatCompletions, endpoints.chatCompletions),
        lane(LANE_ENDPOINTS.messages, endpoints.messages)
      ])
      return { route: (method, url) => method === "POST" ? byPath.get(url) : undefined }
    })
  )
}
