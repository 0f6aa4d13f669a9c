import * as HttpApp from "@effect/platform/HttpApp"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Effect } from "effect"
import type { AppConfigShape } from "../AppConfig.js"
import { PermissionDenied } from "../Domain/Errors.js"
import { newId } from "../Domain/Ids.js"
import { memoized } from "../Domain/Memo.js"
import { errorResponse } from "./ErrorMiddleware.js"

/**
 * The dashboard's policy: its own scripts, styles and API only; never framed. Images may
 * also be `data:` (index.html's empty favicon). React and Recharts set inline styles
 * through the CSSOM, which `style-src` does not govern (checked in Chromium: no violation).
 */
export const APP_CSP =
  "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; object-src 'none'; base-uri 'none'; form-action 'self'"

/**
 * The API reference (Scalar, a large third-party bundle inline): sandboxed without
 * `allow-same-origin`, so it runs in an opaque origin and cannot read the
 * dashboard's sessionStorage; it may still call the API (`/v1` answers any origin).
 */
export const DOCS_CSP = [
  "sandbox allow-scripts allow-popups allow-popups-to-escape-sandbox",
  "default-src 'none'",
  // Scalar compiles WebAssembly; 'wasm-unsafe-eval' allows that and no JavaScript eval.
  "script-src 'unsafe-inline' 'wasm-unsafe-eval'",
  "style-src 'unsafe-inline'",
  "img-src 'self' data:",
  "font-src 'self' data:",
  "connect-src 'self'",
  "frame-ancestors 'none'",
  "base-uri 'none'",
  "form-action 'none'"
].join("; ")

/** Every other answer (JSON, the development checkout's page) may not be framed either. */
const DEFAULT_CSP = "frame-ancestors 'none'"

/** What a browser script may read of an answer beyond the simple headers. */
const EXPOSED_HEADERS = [
  "x-request-id",
  "retry-after",
  "idempotent-replayed",
  "x-ratelimit-limit-requests",
  "x-ratelimit-remaining-requests",
  "x-ratelimit-reset-requests",
  "x-ratelimit-limit-concurrent",
  "x-ratelimit-remaining-concurrent"
].join(",")

/** Who may call a path from a script on another origin. */
export type CorsPolicy = "any" | "dashboard" | "none"

const under = (pathname: string, prefix: string) => pathname === prefix || pathname.startsWith(`${prefix}/`)

/**
 * `/v1` is called with API keys from anywhere; the dashboard's API (and the development
 * sign-in it calls) only from the dashboard's origin; nothing else (`/metrics`, docs, health).
 */
export const corsPolicy = (pathname: string): CorsPolicy =>
  under(pathname, "/v1") ? "any" : under(pathname, "/dashboard") || pathname === "/dev/session" ? "dashboard" : "none"

/**
 * Answers no cache may keep: the dashboard API's (one account's data, new and
 * rotated key and webhook secrets among them), a development session token,
 * and `/v1/responses`' (a stored conversation), streamed or not, errors included.
 */
export const isNoStore = (pathname: string): boolean =>
  under(pathname, "/dashboard") || pathname === "/dev/session" || under(pathname, "/v1/responses")

const contentSecurityPolicy = (pathname: string): string =>
  under(pathname, "/app") ? APP_CSP : under(pathname, "/docs") ? DOCS_CSP : DEFAULT_CSP

/**
 * A request URL's path, as the WHATWG URL parser reads it (dot segments resolved), remembered by the part before
 * its query (which the path does not depend on, and which varies: a cache-busting parameter would churn the memo).
 */
const parsedPath = memoized((path) => new URL(path, "http://localhost").pathname)
const pathnameOf = (url: string): string => parsedPath(url.split("?", 1)[0] ?? "")

const originOf = (url: string): string | null => {
  try {
    return new URL(url).origin
  } catch {
    return null
  }
}

/**
 * The outermost middleware: security headers on every answer (`nosniff`,
 * `no-referrer`, the path's CSP, `no-store` where `isNoStore`) and CORS by path. A preflight CORS does not
 * allow answers 403 `permission_denied`, with no `Access-Control-Allow-*`.
 */
export const securityHeaders = (config: Pick<AppConfigShape, "dashboardUrl">) => {
  const dashboardOrigin = originOf(config.dashboardUrl)
  return <E, R>(app: HttpApp.Default<E, R>): HttpApp.Default<E, R> =>
    Effect.gen(function*() {
      const request = yield* HttpServerRequest.HttpServerRequest
      const pathname = pathnameOf(request.url)
      const origin = request.headers["origin"]
      const policy = corsPolicy(pathname)
      const allowedOrigin = policy === "any"
        ? "*"
        : policy === "dashboard" && origin !== undefined && origin === dashboardOrigin
        ? origin
        : null
      const cors: Record<string, string> = allowedOrigin === null ? {} : {
        "access-control-allow-origin": allowedOrigin,
        "access-control-expose-headers": EXPOSED_HEADERS
      }
      // The answer differs by Origin: a shared cache must not hand one origin's answer to another.
      if (policy === "dashboard") cors["vary"] = "Origin"
      const headers: Record<string, string> = {
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        "content-security-policy": contentSecurityPolicy(pathname),
        ...(isNoStore(pathname) ? { "cache-control": "no-store" } : {}),
        ...cors
      }
      const preflight = request.method === "OPTIONS" && origin !== undefined &&
        request.headers["access-control-request-method"] !== undefined
      if (!preflight) {
        // A pre-response handler: the headers reach every answer the app makes, error answers included.
        yield* HttpApp.appendPreResponseHandler((_request, response) =>
          Effect.succeed(HttpServerResponse.setHeaders(response, headers))
        )
        return yield* app
      }
      if (allowedOrigin === null) {
        const requestId = newId("req")
        const refused = new PermissionDenied({
          message: `Cross-origin requests to ${pathname} are not allowed from ${origin}.`,
          guidance: policy === "dashboard"
            ? "Only the dashboard's own origin (DASHBOARD_URL) may call /dashboard from a browser; use the dashboard, or call from a server."
            : "This path answers no cross-origin requests from a browser; call it from a server."
        })
        return HttpServerResponse.setHeaders(errorResponse(refused, requestId, config.dashboardUrl), {
          ...headers,
          "x-request-id": requestId
        })
      }
      const requested = request.headers["access-control-request-headers"]
      return HttpServerResponse.empty({
        status: 204,
        headers: {
          ...headers,
          "access-control-allow-methods": policy === "any" ? "GET, POST, DELETE, OPTIONS" : "GET, POST, PATCH, PUT, DELETE, OPTIONS",
          ...(requested === undefined ? {} : { "access-control-allow-headers": requested }),
          "access-control-max-age": "600"
        }
      })
    })
}
