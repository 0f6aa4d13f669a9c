import * as HttpApi from "@effect/platform/HttpApi"
import type { ServerResponse } from "node:http"
import { NenasApi } from "../Api.js"
import { memoized } from "../Domain/Memo.js"
import type { Metrics } from "../Observability/Metrics.js"
import type { RequestFacts } from "../Request/Context.js"

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
      const source = endpoint.path.split("/").map((part) => part.startsWith(":") ? "[^/]+" : escapeRegex(part)).join(
        "/"
      )
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

/** An access-log line's fields: never a key, a token, a query string or a prompt. */
export interface AccessLine {
  readonly method: string
  readonly route: string
  readonly status: number
  readonly durationMs: number
  readonly requestId: string | null
  readonly keyId: string | null
  readonly accountId: string | null
  readonly aborted?: true
}

/**
 * One access-log line and the request metrics per request, once its answer
 * has gone out (the response's `close`; one closed before it was finished is a
 * client that went away: `aborted`). The line names the route, status,
 * duration, request id, key id and account id, which the error middleware
 * and authentication note in `facts` as they learn them.
 */
export const makeAccessLog =
  (metrics: Metrics, write: (line: AccessLine) => void) =>
  (method: string, url: string, response: ServerResponse, facts: RequestFacts): void => {
    const started = performance.now()
    const route = routeOf(method, url)
    response.once("close", () => {
      const seconds = (performance.now() - started) / 1000
      const status = response.statusCode
      metrics.requests.inc({ route, method, status: String(status) })
      metrics.requestDuration.observe({ route }, seconds)
      // eslint-disable-next-line nenas/no-spread-adding-field -- one access-log line, serialized at once
      write({
        method,
        route,
        status,
        durationMs: Math.round(seconds * 10_000) / 10,
        requestId: facts.requestId ?? null,
        keyId: facts.keyId ?? null,
        accountId: facts.accountId ?? null,
        ...(response.writableFinished ? {} : { aborted: true })
      })
    })
  }
