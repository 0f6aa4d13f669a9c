import * as HttpApi from "@effect/platform/HttpApi"
import type * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import { Context, Effect, FiberRef, Option } from "effect"
import { AppConfig } from "../AppConfig.js"
import { ApiKeyAuth, DashboardAuth } from "../Auth/Api.js"
import { makeSessionBeforeBody } from "../Auth/Session.js"
import { InvalidRequest } from "../Domain/Errors.js"
import { memoized } from "../Domain/Memo.js"
import { AllowedRoles, type Role } from "../Domain/Roles.js"
import { jsonDeeperThan, MAX_JSON_DEPTH } from "../Domain/Strict.js"
import { makeAuthenticateBeforeBody } from "../Keys/Authentication.js"
import { CallLimits } from "../Models/Admission/RateLimits.js"
import { breathe, breatheAfter, LARGE_BODY_CHARS, LargeRequest } from "../Request/Breathe.js"
import { CurrentRequestId } from "../Request/Context.js"
import { guardDevRoutes } from "./DevRoutes.js"

const mediaType = (request: HttpServerRequest.HttpServerRequest): string | undefined =>
  request.headers["content-type"]?.split(";")[0]?.trim().toLowerCase()

/** What the platform decodes as JSON; it would read any other type's body again, raw, after this guard read it. */
const isJson = (type: string): boolean => type === "application/json"

const hasBody = (request: HttpServerRequest.HttpServerRequest): boolean =>
  request.headers["transfer-encoding"] !== undefined || Number(request.headers["content-length"] ?? "0") > 0

/** `name=%00` in a query string, or `%00` in the path: PostgreSQL's text refuses U+0000. */
const nulInUrl = (url: string): Option.Option<InvalidRequest> => {
  if (!/%00/.test(url) && !url.includes("\u0000")) return Option.none()
  const [path = "", query = ""] = url.split("?", 2)
  for (const [name, value] of new URLSearchParams(query)) {
    if (name.includes("\u0000") || value.includes("\u0000")) {
      const param = name.replaceAll("\u0000", "").slice(0, 100)
      return Option.some(
        new InvalidRequest({ message: `Invalid '${param}': must not contain the character U+0000`, param })
      )
    }
  }
  return /%00|\u0000/.test(path)
    ? Option.some(new InvalidRequest({ message: "The path must not contain the character U+0000." }))
    : Option.none()
}

interface EndpointPattern {
  readonly method: string
  readonly path: RegExp
  /** Its payload is a JSON body. */
  readonly json: boolean
  /** It takes an API key (`ApiKeyAuth`). */
  readonly apiKey: boolean
  /** It takes a dashboard session token (`DashboardAuth`). */
  readonly session: boolean
  /** The roles it allows (`allowRoles`); none: nobody. */
  readonly roles: ReadonlyArray<Role>
  /** How many path parameters it has. */
  readonly params: number
}

/** The roles an endpoint declares (`allowRoles`); one that declares none allows nobody. */
export const rolesOf = (endpoint: { readonly annotations: Context.Context<never> }): ReadonlyArray<Role> =>
  Option.getOrElse(Context.getOption(endpoint.annotations, AllowedRoles), () => [])

/** Method and path patterns of the endpoints that take a JSON body, an API key or a session token. */
const endpointsOf = (
  api: HttpApi.HttpApi<string, HttpApiGroup.HttpApiGroup.AnyWithProps>
): ReadonlyArray<EndpointPattern> => {
  const found: Array<EndpointPattern> = []
  HttpApi.reflect(api, {
    onGroup: () => {},
    onEndpoint: ({ endpoint, middleware, payloads }) => {
      const json = endpoint.method !== "GET" && payloads.size > 0
      const apiKey = [...middleware].some((tag) => tag.key === ApiKeyAuth.key)
      const session = [...middleware].some((tag) => tag.key === DashboardAuth.key)
      if (!json && !apiKey && !session) return
      const pattern = endpoint.path.replace(/[.+?^${}()|[\]\\]/g, "\\$&").replace(/:[^/]+/g, "[^/]+")
      const params = endpoint.path.split(":").length - 1
      found.push({
        method: endpoint.method,
        path: new RegExp(`^${pattern}/?$`),
        json,
        apiKey,
        session,
        roles: rolesOf(endpoint),
        params
      })
    }
  })
  // As the router does: a literal segment before a parameter (`/webhooks/event-types` before `/webhooks/:id`).
  return found.sort((a, b) => a.params - b.params)
}

/**
 * Refuses, before any handler reads it, what would stall or break one: NUL in
 * the URL, a development route asked through a proxy or from afar (`DevRoutes.ts`), a multipart body (none is accepted, and an unterminated one never
 * ends), a request to an API-key endpoint without a valid key or past the key's rate limits (its token and slot
 * are taken here, `CallLimits.admitBeforeBody`), or to a
 * dashboard endpoint without a valid session token (checked before its body is read), a JSON endpoint's body of another type, and JSON nested
 * deeper than MAX_JSON_DEPTH. Every refusal is the spec's error; the body is
 * read once here, with `read` (under the caller's body size limit), kept for
 * the handler and returned: undefined when the request has no JSON body to read.
 */
export const makeRequestGuard = Effect.gen(function*() {
  const { api } = yield* HttpApi.Api
  const devRoutes = guardDevRoutes(yield* AppConfig)
  const endpoints = endpointsOf(api)
  const authenticate = endpoints.some((endpoint) => endpoint.apiKey) ? yield* makeAuthenticateBeforeBody : undefined
  // Looked up, not required: tests' small APIs have no limits.
  const limits = Option.getOrUndefined(yield* Effect.serviceOption(CallLimits))
  const signedIn = endpoints.some((endpoint) => endpoint.session) ? yield* makeSessionBeforeBody : () => Effect.void
  // Found once per method and path: the same few come again and again, and the patterns are tried one by one.
  const endpointAt = memoized((route) => {
    const [method, path] = route.split(" ", 2)
    return endpoints.find((endpoint) => endpoint.method === method && endpoint.path.test(path ?? ""))
  })
  const endpointOf = (request: HttpServerRequest.HttpServerRequest): EndpointPattern | undefined =>
    endpointAt(`${request.method} ${request.url.split("?", 1)[0] ?? ""}`)
  // One generator function for every request (`Effect.fnUntraced`), not one made per request: V8 11 (Node 20) gives
  // each new generator function a map of its own when it first runs, and that map keeps the request's objects
  // alive through young-generation collections (docs/performance.md, "What kept a request's objects through young collections").
  return Effect.fnUntraced(function*<E>(read: Effect.Effect<string, E>) {
    const request = yield* HttpServerRequest.HttpServerRequest
    const nul = nulInUrl(request.url)
    if (Option.isSome(nul)) return yield* nul.value
    yield* devRoutes
    const type = mediaType(request)
    if (type?.startsWith("multipart/")) {
      return yield* new InvalidRequest({
        message: "Multipart bodies are not accepted; send Content-Type: application/json."
      })
    }
    const endpoint = endpointOf(request)
    if (endpoint?.apiKey === true && authenticate !== undefined) {
      const key = yield* authenticate
      // Admission before the body: a key past its limits costs no reading, parsing or decoding of what it sent.
      if (limits !== undefined) yield* limits.admitBeforeBody(key, yield* FiberRef.get(CurrentRequestId))
    }
    if (endpoint?.session === true) yield* signedIn(endpoint.roles)
    if (endpoint?.json !== true || !hasBody(request)) return
    if (type !== undefined && !isJson(type)) {
      return yield* new InvalidRequest({
        message: `Content-Type ${type.slice(0, 100)} is not accepted here; send Content-Type: application/json.`
      })
    }
    const text = yield* read
    if (text.length > LARGE_BODY_CHARS) {
      yield* FiberRef.set(LargeRequest, true)
      yield* breathe
    }
    if (jsonDeeperThan(text, MAX_JSON_DEPTH)) {
      return yield* new InvalidRequest({ message: `The JSON body nests deeper than ${MAX_JSON_DEPTH} levels.` })
    }
    yield* breatheAfter(text.length)
    return text
  })
})
