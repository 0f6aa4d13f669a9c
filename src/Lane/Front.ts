import { Cause, Effect, FiberId, FiberRef, HashMap, List, LogLevel } from "effect"
import { IncomingMessage, type OutgoingHttpHeaders, type Server, ServerResponse } from "node:http"
import { AppConfig } from "../AppConfig.js"
import { NotFound, toErrorBody } from "../Domain/Errors.js"
import { newId } from "../Domain/Ids.js"
import { Metrics } from "../Observability/Metrics.js"
import { attachRequestFacts, type RequestFacts } from "../Request/Context.js"
import { type AccessLine, makeAccessLog } from "./AccessLog.js"
import { nonCanonical } from "./PathReading.js"
import { makeSecurityHeaders } from "./SecurityHeaders.js"

const writeHead = ServerResponse.prototype.writeHead

/**
 * A Node response that writes the front's security headers over whatever
 * headers its answer has (the app's own of the same name included), however
 * the answer is written: the platform's writer, an error, a preflight.
 */
export class FrontResponse<Request extends IncomingMessage = IncomingMessage> extends ServerResponse<Request> {
  security: Record<string, string> | undefined = undefined
}

type Headers = OutgoingHttpHeaders | ReadonlyArray<unknown> | undefined

const over = (headers: Headers, security: Record<string, string>): OutgoingHttpHeaders | ReadonlyArray<unknown> => {
  if (headers === undefined) return security
  // `Object.assign`, not two spreads: Node 20 builds a spread that adds fields on a slow path (`npm run bench:spreads`).
  if (!Array.isArray(headers)) return Object.assign({}, headers as OutgoingHttpHeaders, security)
  // Raw [name, value, …] pairs (nobody here writes them): the security headers go after, and win.
  return [...headers, ...Object.entries(security).flat()]
}

FrontResponse.prototype.writeHead = function writeHeadUnder(
  this: FrontResponse,
  statusCode: number,
  message?: unknown,
  headers?: unknown
) {
  const security = this.security
  if (security === undefined) return Reflect.apply(writeHead, this, arguments) as FrontResponse
  return (typeof message === "string"
    ? Reflect.apply(writeHead, this, [statusCode, message, over(headers as Headers, security)])
    : Reflect.apply(writeHead, this, [statusCode, over(message as Headers, security)])) as FrontResponse
} as FrontResponse["writeHead"]

/**
 * The instance's loggers as they stand while the server is built (`LOG_FORMAT`'s, a test's), for a line
 * written outside any fiber: the access log's, at the level and in the format of every other line.
 */
const makeLineWriter = Effect.gen(function*() {
  const loggers = yield* FiberRef.get(FiberRef.currentLoggers)
  const minimum = yield* FiberRef.get(FiberRef.currentMinimumLogLevel)
  const context = yield* Effect.getFiberRefs
  if (LogLevel.greaterThan(minimum, LogLevel.Info)) return (_line: AccessLine) => {}
  return (line: AccessLine) => {
    const options = {
      fiberId: FiberId.none,
      logLevel: LogLevel.Info,
      message: "request",
      cause: Cause.empty,
      context,
      spans: List.empty(),
      annotations: HashMap.fromIterable(Object.entries(line)),
      date: new Date()
    }
    for (const logger of loggers) logger.log(options)
  }
})

/** A message quotes the target it refuses: never more of it than this. */
const MAX_QUOTED = 200

/**
 * The 404 for a target not in its one reading (`PathReading.ts`), in the error shape, with the headers every
 * answer has and `no-store`; the body, if any, is left for Node to read and drop.
 */
const refuseTarget = (
  response: FrontResponse,
  method: string,
  url: string,
  why: string,
  requestId: string,
  dashboardUrl: string
): void => {
  const target = url.length > MAX_QUOTED ? `${url.slice(0, MAX_QUOTED)}…` : url
  const refused = new NotFound({
    message: `No route for ${method} ${target}: ${why}.`,
    guidance: "Send the path exactly as the API reference writes it (lower-case, single slashes, no escaped letters)."
  })
  const body = JSON.stringify(toErrorBody(refused, requestId, dashboardUrl))
  response.writeHead(404, {
    "content-type": "application/json",
    "content-length": String(Buffer.byteLength(body)),
    "x-request-id": requestId,
    "cache-control": "no-store"
  })
  response.end(body)
}

/**
 * What every request meets before the Effect app, in plain code
 * (docs/performance.md, "Going around the platform": as Effect middleware these
 * two cost about a third of a `/healthz`): the path's one reading
 * (`PathReading.ts`: a target the router would read otherwise answers 404 here,
 * HEAD is served as GET), the security headers and CORS (`SecurityHeaders.ts`),
 * a preflight answered here, and the access log and request metrics
 * (`AccessLog.ts`), whose record the error middleware and authentication fill
 * in (`Request/Context.ts`). A preflight is neither logged nor counted, as
 * before.
 */
export const makeFront = Effect.gen(function*() {
  const config = yield* AppConfig
  const securityOf = makeSecurityHeaders(config)
  const accessLog = makeAccessLog(yield* Metrics, yield* makeLineWriter)
  return (server: Server): void => {
    const emit = server.emit
    server.emit = function(this: Server, event: string | symbol, ...args: Array<unknown>): boolean {
      if (event !== "request") return Reflect.apply(emit, this, [event, ...args]) as boolean
      const request = args[0] as IncomingMessage
      const response = args[1] as FrontResponse
      const method = request.method ?? "GET"
      const url = request.url ?? "/"
      const why = nonCanonical(url)
      if (why !== undefined) {
        const requestId = newId("req")
        response.security = securityOf(method, "/", request.headers).headers
        accessLog(method, url, response, { requestId })
        refuseTarget(response, method, url, why, requestId, config.dashboardUrl)
        return true
      }
      // Node made the response for a HEAD already (it sends no body); the app, the guard and the router read a GET.
      if (method === "HEAD") request.method = "GET"
      const { headers, preflight } = securityOf(method, url, request.headers)
      response.security = headers
      if (preflight !== undefined) {
        const body = preflight.body ?? ""
        response.writeHead(
          preflight.status,
          body === ""
            ? preflight.headers
            : Object.assign({}, preflight.headers, { "content-length": String(Buffer.byteLength(body)) })
        )
        response.end(body)
        return true
      }
      const facts: RequestFacts = {}
      attachRequestFacts(request, facts)
      accessLog(method, url, response, facts)
      return Reflect.apply(emit, this, [event, ...args]) as boolean
    } as typeof server.emit
  }
})
