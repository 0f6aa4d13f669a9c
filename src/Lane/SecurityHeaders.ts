import type { AppConfigShape } from "../AppConfig.js"
import { httpStatus, PermissionDenied, toErrorBody } from "../Domain/Errors.js"
import { newId } from "../Domain/Ids.js"
import { pathOf } from "./PathReading.js"

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

const originOf = (url: string): string | null => {
  try {
    return new URL(url).origin
  } catch {
    return null
  }
}

/** What the front answers a request with before the app sees it: a preflight's answer, or nothing. */
export interface Preflight {
  readonly status: number
  readonly headers: Record<string, string>
  readonly body?: string
}

/**
 * The outermost layer, in plain code at the Node server (`Front.ts`): security
 * headers on every answer (`nosniff`, `no-referrer`, the path's CSP,
 * `no-store` where `isNoStore`) and CORS by path; they override a header of
 * the same name the app set. A preflight is answered here: 204, or 403
 * `permission_denied` with no `Access-Control-Allow-*` where CORS does not allow it.
 */
export const makeSecurityHeaders = (config: Pick<AppConfigShape, "dashboardUrl">) => {
  const dashboardOrigin = originOf(config.dashboardUrl)
  return (method: string, url: string, headers: Readonly<Record<string, string | Array<string> | undefined>>): {
    readonly headers: Record<string, string>
    readonly preflight: Preflight | undefined
  } => {
    // The front let only a target in its one reading this far (`PathReading.ts`): its path is read as the router reads it.
    const pathname = pathOf(url)
    const origin = typeof headers["origin"] === "string" ? headers["origin"] : undefined
    const policy = corsPolicy(pathname)
    const allowedOrigin = policy === "any"
      ? "*"
      : policy === "dashboard" && origin !== undefined && origin === dashboardOrigin
      ? origin
      : null
    const security: Record<string, string> = {
      "x-content-type-options": "nosniff",
      "referrer-policy": "no-referrer",
      "content-security-policy": contentSecurityPolicy(pathname)
    }
    if (isNoStore(pathname)) security["cache-control"] = "no-store"
    if (allowedOrigin !== null) {
      security["access-control-allow-origin"] = allowedOrigin
      security["access-control-expose-headers"] = EXPOSED_HEADERS
    }
    // The answer differs by Origin: a shared cache must not hand one origin's answer to another.
    if (policy === "dashboard") security["vary"] = "Origin"
    const isPreflight = method === "OPTIONS" && origin !== undefined &&
      headers["access-control-request-method"] !== undefined
    if (!isPreflight) return { headers: security, preflight: undefined }
    if (allowedOrigin === null) {
      const requestId = newId("req")
      const refused = new PermissionDenied({
        message: `Cross-origin requests to ${pathname} are not allowed from ${origin}.`,
        guidance: policy === "dashboard"
          ? "Only the dashboard's own origin (DASHBOARD_URL) may call /dashboard from a browser; use the dashboard, or call from a server."
          : "This path answers no cross-origin requests from a browser; call it from a server."
      })
      return {
        headers: security,
        preflight: {
          status: httpStatus(refused),
          headers: { "content-type": "application/json", "x-request-id": requestId },
          body: JSON.stringify(toErrorBody(refused, requestId, config.dashboardUrl))
        }
      }
    }
    const requested = headers["access-control-request-headers"]
    // Every answer carries an id, an allowed preflight too, so that a failing browser call can be quoted.
    const allowed: Record<string, string> = {
      "x-request-id": newId("req"),
      "access-control-allow-methods": policy === "any"
        ? "GET, POST, DELETE, OPTIONS"
        : "GET, POST, PATCH, PUT, DELETE, OPTIONS",
      "access-control-max-age": "600"
    }
    if (typeof requested === "string") allowed["access-control-allow-headers"] = requested
    return { headers: security, preflight: { status: 204, headers: allowed } }
  }
}
