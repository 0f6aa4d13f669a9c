import * as HttpApi from "@effect/platform/HttpApi"
import type * as HttpApp from "@effect/platform/HttpApp"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as NodeHttpServerRequest from "@effect/platform-node/NodeHttpServerRequest"
import { Effect, Exit, FiberRef } from "effect"
import { NenasApi } from "../Api.js"
import { memoized } from "../Domain/Memo.js"
import { Metrics } from "../Observability/Metrics.js"
import { CurrentRequestFacts, type RequestFacts } from "../Request/Context.js"

interface RoutePattern {
  readonly method: string
  readonly pattern: string
  readonly regex: RegExp
}

const escapeRegex = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")

/** Every endpoint of the contract as a matcher, so metrics are labelled by pattern (`/dashboard/api-keys/:id`), never by id. */
const routePatterns: ReadonlyArray<RoutePattern> = (() => {
  const patterns: Array<RoutePattern> = []
  HttpApi.reflect(NenasApi, {
    onGroup: () => undefined,
    onEndpoint: ({ endpoint }) => {
      const source = endpoint.path.split("/").map((part) => part.startsWith(":") ? "[^/]+" : escapeRegex(part)).join("/")
      patterns.push({ method: endpoint.method, pattern: endpoint.path, regex: new RegExp(`^${source}$`) })
    }
  })
  return patterns
})()

const OTHER_ROUTES: ReadonlyArray<readonly [string, RegExp]> = [
  ["/app/*", /^\/app(\/|$)/],
  ["/docs", /^\/docs$/],
  ["/openapi.json", /^\/openapi\.json$/]
]

/** The route pattern a request matched; anything else is `other` (a scan of random paths adds no series). */
export const routeOf = (method: string, url: string): string => patternOf(`${method} ${url.split("?")[0] ?? url}`)

/** Found once per method and path: the patterns are tried one by one, and the same few paths come again and again. */
const patternOf = memoized((route) => {
  const [method, path = ""] = route.split(" ", 2)
  const endpoint = routePatterns.find((pattern) => pattern.method === method && pattern.regex.test(path))
  if (endpoint !== undefined) return endpoint.pattern
  return OTHER_ROUTES.find(([, regex]) => regex.test(path))?.[0] ?? "other"
})

/**
 * One access-log line and the request metrics per request, once the answer
 * has been sent (the platform's writer resolves when the body, streamed or
 * not, is written; an interrupted one is a client that went away). The line
 * names the route, status, duration, request id, key id and account id:
 * never a key, a token, a query string or a prompt.
 */
export const accessLog = (app: HttpApp.Default): HttpApp.Default<never, Metrics> =>
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const metrics = yield* Metrics
    const started = performance.now()
    const facts: RequestFacts = {}
    const route = routeOf(request.method, request.url)
    const response = NodeHttpServerRequest.toServerResponse(request)
    // Set, not `Effect.locally`: this fiber serves this one request and ends with it.
    yield* FiberRef.set(CurrentRequestFacts, facts)
    return yield* app.pipe(
      Effect.onExit((exit) => {
        const seconds = (performance.now() - started) / 1000
        const status = response.statusCode
        metrics.requests.inc({ route, method: request.method, status: String(status) })
        metrics.requestDuration.observe({ route }, seconds)
        return Effect.logInfo("request").pipe(Effect.annotateLogs({
          method: request.method,
          route,
          status,
          durationMs: Math.round(seconds * 10_000) / 10,
          requestId: facts.requestId ?? null,
          keyId: facts.keyId ?? null,
          accountId: facts.accountId ?? null,
          ...(Exit.isInterrupted(exit) ? { aborted: true } : {})
        }))
      })
    )
  })
