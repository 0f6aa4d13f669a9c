import * as NodeHttpServerRequest from "@effect/platform-node/NodeHttpServerRequest"
import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import * as HttpApiError from "@effect/platform/HttpApiError"
import * as HttpIncomingMessage from "@effect/platform/HttpIncomingMessage"
import * as HttpServerError from "@effect/platform/HttpServerError"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Cause, Effect, FiberRefs, Option, ParseResult } from "effect"
import type { Server } from "node:http"
import type { Socket } from "node:net"
import type { Duplex } from "node:stream"
import { AppConfig } from "../AppConfig.js"
import {
  type ApiError,
  ContextLengthExceeded,
  CurrentDashboardUrl,
  httpStatus,
  InternalError,
  InvalidRequest,
  isApiError,
  NotFound,
  toErrorBody
} from "../Domain/Errors.js"
import { newId } from "../Domain/Ids.js"
import { ModelLane } from "../Lane/ModelLane.js"
import { readBodyText } from "../Lane/Wire/BodyText.js"
import { writeNodeBody } from "../Lane/Wire/NodeBody.js"
import { CallLimits } from "../Models/Admission/RateLimits.js"
import { anthropicErrorBody } from "../Models/Anthropic/AnthropicErrors.js"
import {
  CurrentRequestFacts,
  CurrentRequestId,
  CurrentResponseHeaders,
  type RequestFacts,
  requestFactsOf
} from "../Request/Context.js"
import { makeRequestGuard } from "./RequestGuard.js"

export const MAX_BODY_BYTES = 8 * 1024 * 1024
const OVERSIZE_MESSAGE = "The request body exceeds 8 MiB."

/** `messages[0].role` from a parse issue's path. */
const paramOf = (path: ReadonlyArray<PropertyKey>): string | null =>
  path.length === 0
    ? null
    : path.reduce<string>(
      (acc, key) => typeof key === "number" ? `${acc}[${key}]` : acc === "" ? String(key) : `${acc}.${String(key)}`,
      ""
    )

type Issue = { readonly path: ReadonlyArray<PropertyKey>; readonly message: string }

const EXPECTED = /^Expected (.+), actual (.+)$/s

/** `Expected "live", actual "x"` and `Expected "test", actual "x"` read as one: `Expected "live" or "test", actual "x"`. */
const mergeAlternatives = (messages: ReadonlyArray<string>): string => {
  const parts = messages.map((message) => EXPECTED.exec(message))
  const actual = parts[0]?.[2]
  if (parts.length < 2 || parts.some((p) => p === null || p[2] !== actual)) return messages[0] ?? ""
  const expected = [...new Set(parts.map((p) => p?.[1] ?? ""))]
  return `Expected ${expected.join(" or ")}, actual ${actual}`
}

/**
 * Schema names of the request's own shape mean nothing to a client. At the
 * root, a body is always an object, so a named body schema reads as one.
 */
const plain = (message: string, path: ReadonlyArray<PropertyKey>): string => {
  const unnamed = message
    .replace(/^Expected [A-Za-z]*\s*\(Encoded side\)|^Expected \{ readonly .*\}(?=, actual)/s, "Expected a JSON object")
    .replace(/^Expected ReadonlyArray<.*>(?=, actual)/s, "Expected an array")
  return path.length === 0 ? unnamed.replace(/^Expected [A-Z][A-Za-z]*(?=, actual)/, "Expected a JSON object") : unnamed
}

/**
 * One problem per field: an optional field's "Expected undefined" adds
 * nothing, and a union's alternatives are merged into one message.
 */
const distinctIssues = (issues: ReadonlyArray<Issue>): ReadonlyArray<Issue> => {
  const byPath = new Map<string, { path: ReadonlyArray<PropertyKey>; messages: Array<string> }>()
  for (const issue of issues) {
    if (issue.message.startsWith("Expected undefined")) continue
    const key = JSON.stringify(issue.path.map(String))
    const entry = byPath.get(key) ?? { path: issue.path, messages: [] }
    entry.messages.push(plain(issue.message, issue.path))
    byPath.set(key, entry)
  }
  if (byPath.size === 0) {
    return issues.slice(0, 1).map((issue) => ({ ...issue, message: plain(issue.message, issue.path) }))
  }
  // The deepest problem is the most precise one (inside a union: the field of the alternative that nearly fit).
  return [...byPath.values()]
    .map(({ path, messages }) => ({ path, message: mergeAlternatives(messages) }))
    .sort((a, b) => b.path.length - a.path.length)
}

/** A message quotes the offending value: never more of it than this (a field may hold megabytes). */
const MAX_MESSAGE = 300
const bounded = (message: string): string =>
  message.length > MAX_MESSAGE ? `${message.slice(0, MAX_MESSAGE)}…` : message

const fromIssues = (all: ReadonlyArray<Issue>) => {
  const issues = distinctIssues(all)
  const first = issues[0]
  if (first === undefined) return new InvalidRequest({ message: "The request is invalid." })
  const param = paramOf(first.path)
  const rest = issues.length - 1
  const more = rest > 0 ? ` (and ${rest} more problem${rest > 1 ? "s" : ""})` : ""
  return new InvalidRequest({
    message: param === null
      ? `Invalid request: ${bounded(first.message)}${more}`
      : `Invalid '${bounded(param)}': ${bounded(first.message)}${more}`,
    param
  })
}

const isMaxBytes = (error: HttpServerError.RequestError): boolean =>
  error.cause instanceof Error && error.cause.message === "maxBytes exceeded"

/** Every failure a request can end in, as one of the error codes (docs/api/errors.md, "Errors"). */
export const toApiError = (cause: Cause.Cause<unknown>): Option.Option<ApiError> => {
  const failure = Option.orElse(Cause.failureOption(cause), () => Cause.dieOption(cause))
  if (Option.isNone(failure)) return Option.none()
  const error = failure.value
  if (isApiError(error)) return Option.some(error)
  if (error instanceof HttpApiError.HttpApiDecodeError) return Option.some(fromIssues(error.issues))
  if (ParseResult.isParseError(error)) return Option.some(fromIssues(ParseResult.ArrayFormatter.formatErrorSync(error)))
  if (error instanceof HttpServerError.RouteNotFound) {
    return Option.some(new NotFound({ message: `No route for ${error.request.method} ${error.request.url}.` }))
  }
  if (error instanceof HttpServerError.RequestError && error.reason === "Decode") {
    return Option.some(
      isMaxBytes(error)
        ? new ContextLengthExceeded({ message: OVERSIZE_MESSAGE })
        : new InvalidRequest({ message: "The request body is not valid JSON." })
    )
  }
  return Option.none()
}

/** Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`, with any query): its errors in Anthropic's body. */
const ANTHROPIC_PATH = /^\/v1\/messages(?:\/|\?|$)/

export const errorResponse = (error: ApiError, requestId: string, dashboardUrl: string, url = "") => {
  const body = ANTHROPIC_PATH.test(url)
    ? anthropicErrorBody(error, requestId, dashboardUrl)
    : toErrorBody(error, requestId, dashboardUrl)
  const retryAfter = body.error.retry_after_seconds
  return HttpServerResponse.unsafeJson(body, {
    status: httpStatus(error),
    headers: retryAfter === undefined ? {} : { "retry-after": String(retryAfter) }
  })
}

const contentLengthOver = (request: HttpServerRequest.HttpServerRequest): boolean => {
  const length = Number(request.headers["content-length"] ?? "0")
  return Number.isFinite(length) && length > MAX_BODY_BYTES
}

/**
 * A body without Content-Length is only found too large while it is read, and
 * the platform then destroys the request — and with it the socket, before the
 * 413 is written. Pausing instead lets the answer go out; `Connection: close`
 * then ends the connection.
 */
const pauseInsteadOfDestroy = (request: HttpServerRequest.HttpServerRequest): void => {
  if (request.headers["content-length"] !== undefined || request.headers["transfer-encoding"] === undefined) return
  const incoming = NodeHttpServerRequest.toIncomingMessage(request)
  incoming.destroy = function(this: typeof incoming) {
    this.pause()
    return this
  }
}

/** After an early refusal, how long the connection is still read (nginx's `lingering_time`), how long it may be silent, and how much is read. */
const LINGER_MS = 30_000
const LINGER_IDLE_MS = 5_000
const LINGER_MAX_BYTES = 64 * 1024 * 1024

/**
 * A 413 (or a refused API key) is answered before the body is read. Closing the socket then, with
 * the body still arriving, makes the kernel reset the connection, and a client
 * still sending sees EPIPE or ECONNRESET instead of the answer. So, as
 * nginx's lingering close does, the answer is followed by our FIN only, and
 * what the client still sends is read and dropped until it closes its side,
 * falls silent, or passes the bounds above; then the socket is closed.
 */
const lingerAfterAnswer = (request: HttpServerRequest.HttpServerRequest): void => {
  const incoming = NodeHttpServerRequest.toIncomingMessage(request)
  // Node closes a `Connection: close` connection with `destroySoon` once the answer is written.
  incoming.socket.destroySoon = function(this: Socket) {
    let discarded = 0
    const close = () => {
      clearTimeout(deadline)
      this.destroy()
    }
    const deadline = setTimeout(close, LINGER_MS).unref()
    this.setTimeout(LINGER_IDLE_MS, close)
    this.once("end", close)
    this.once("close", () => clearTimeout(deadline))
    incoming.on("data", (chunk: Buffer) => {
      discarded += chunk.length
      if (discarded > LINGER_MAX_BYTES) close()
    })
    incoming.resume()
    this.end()
  }
}

/**
 * The request pipeline, as an API-level middleware: every request the front
 * (`Lane/Front.ts`) hands on passes here. It gives the request its id
 * (`X-Request-Id`), runs the request guard (`RequestGuard.ts`: admission before
 * the body), hands a model call to the lane (`Lane/ModelLane.ts`) and anything
 * else to the HttpApi router, caps bodies at 8 MiB, and turns every failure — typed errors, schema decode
 * failures, malformed JSON, oversize bodies, unknown routes and defects —
 * into the spec's error body. A defect's details go to the log, never to the client.
 */
export const PipelineLive = HttpApiBuilder.middleware(
  Effect.gen(function*() {
    const { dashboardUrl } = yield* AppConfig
    const guard = yield* makeRequestGuard
    // The model calls' lane (`Lane/ModelLane.ts`), where the service has one; tests' small APIs have none.
    const lane = yield* Effect.serviceOption(ModelLane)
    // The slot the guard took before the body, given back when no handler took it over; tests' small APIs have no limits.
    const limits = yield* Effect.serviceOption(CallLimits)
    const release = limits._tag === "Some" ? limits.value.releaseUnclaimed : undefined
    return (router) =>
      // eslint-disable-next-line nenas/no-gen-in-arrow -- applied once, to the app; the Effect runs per request
      Effect.gen(function*() {
        const request = yield* HttpServerRequest.HttpServerRequest
        const laneHandler = lane._tag === "Some" ? lane.value.route(request.method, request.url) : undefined
        const requestId = newId("req")
        // The access log's record for this request (`Lane/Front.ts`); a server without the front gets one of its own.
        const facts: RequestFacts = requestFactsOf(NodeHttpServerRequest.toIncomingMessage(request)) ?? {}
        facts.requestId = requestId
        const extraHeaders: Record<string, string> = {}
        // Set, not `Effect.locally`: this fiber serves this one request and ends with it, so nothing needs them back;
        // all in one update (one copy of the fiber's references, not one a reference).
        yield* Effect.updateFiberRefs((fiberId, refs) =>
          FiberRefs.updateManyAs(refs, {
            entries: [
              [CurrentRequestFacts, [[fiberId, facts]]],
              [CurrentRequestId, [[fiberId, requestId]]],
              [CurrentDashboardUrl, [[fiberId, dashboardUrl]]],
              [CurrentResponseHeaders, [[fiberId, extraHeaders]]]
            ]
          })
        )
        const respond = (error: ApiError) => errorResponse(error, requestId, dashboardUrl, request.url)
        pauseInsteadOfDestroy(request)
        let refused = false
        const refuse = () => Effect.sync(() => refused = true)
        // The lane reads the body itself (`Lane/Wire/BodyText.ts`), the router through the platform under the same limit. The
        // platform's reader is made only for a body the guard reads: `request.text` builds a cached effect on a fiber
        // of its own (a Deferred), whose objects outlive a request on Node 20
        // (docs/performance.md, "What kept a request's objects through young collections").
        const guarded = laneHandler === undefined
          ? Effect.zipRight(Effect.tapError(guard(Effect.suspend(() => request.text)), refuse), router).pipe(
            HttpIncomingMessage.withMaxBodySize(Option.some(MAX_BODY_BYTES))
          )
          : Effect.flatMap(Effect.tapError(guard(readBodyText(request, MAX_BODY_BYTES)), refuse), laneHandler)
        const served = release === undefined ? guarded : Effect.ensuring(guarded, release)
        const response = contentLengthOver(request)
          ? respond(new ContextLengthExceeded({ message: OVERSIZE_MESSAGE }))
          : yield* served.pipe(
            Effect.catchAllCause((cause) =>
              Option.match(toApiError(cause), {
                onSome: (error) => Effect.succeed(respond(error)),
                onNone: () =>
                  Cause.isInterruptedOnly(cause)
                    ? Effect.interrupt
                    : Effect.logError("unhandled failure", cause).pipe(
                      Effect.annotateLogs({ requestId }),
                      Effect.as(respond(new InternalError({ message: "Internal server error." })))
                    )
              })
            )
          )
        // Anthropic's SDKs read `request-id` (`message._request_id`); the other paths name it `x-request-id` only.
        const ids = ANTHROPIC_PATH.test(request.url)
          ? { "x-request-id": requestId, "request-id": requestId }
          : { "x-request-id": requestId }
        const withId = withHeaders(response, Object.assign(ids, extraHeaders))
        // An oversize or refused body may be left unread: the connection cannot carry another request.
        const unread = response.status === 413 || refused
        // A refusal before the body (a bad API key, an oversize body) must reach a client still sending it.
        if (unread) lingerAfterAnswer(request)
        if (unread) return HttpServerResponse.setHeader(withId, "connection", "close")
        return yield* writeNodeBody(request, withId) ?? Effect.succeed(withId)
      })
  })
)

/**
 * `response` with `headers` added, a header at a time: the platform's `setHeaders` spreads the response's
 * headers into a new object, which Node 20 builds on its slow path (docs/performance.md, "Headers added a
 * header at a time"): about 3 µs a response against 0.4.
 */
const withHeaders = (
  response: HttpServerResponse.HttpServerResponse,
  headers: Record<string, string>
): HttpServerResponse.HttpServerResponse => {
  let out = response
  for (const name in headers) out = HttpServerResponse.setHeader(out, name, headers[name]!)
  return out
}

/**
 * What Node's HTTP parser refuses before any handler runs (headers or URL
 * over 16 KiB, a malformed request line) it would answer with a bare status
 * and no body; this answers in the error shape, with an `X-Request-Id`.
 */
export const answerParserErrors = (server: Server, dashboardUrl: string): void => {
  server.on("clientError", (error: NodeJS.ErrnoException, socket: Duplex) => {
    if (!socket.writable || (error.code !== undefined && !error.code.startsWith("HPE_"))) return void socket.destroy()
    const requestId = newId("req")
    const message = error.code === "HPE_HEADER_OVERFLOW"
      ? "The request's headers and URL exceed 16 KiB."
      : "The request is not valid HTTP/1.1."
    const error400 = new InvalidRequest({ message })
    const body = JSON.stringify(toErrorBody(error400, requestId, dashboardUrl))
    socket.end(
      `HTTP/1.1 ${httpStatus(error400)} Bad Request\r\ncontent-type: application/json\r\n` +
        `content-length: ${Buffer.byteLength(body)}\r\nx-request-id: ${requestId}\r\nconnection: close\r\n\r\n${body}`
    )
  })
}
