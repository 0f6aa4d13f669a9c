import { HttpApi, type HttpApiGroup, HttpServerRequest } from "@effect/platform"
import { Effect, Option } from "effect"
import { InvalidRequest } from "../Domain/Errors.js"
import { jsonDeeperThan, MAX_JSON_DEPTH } from "../Domain/Strict.js"

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
      return Option.some(new InvalidRequest({ message: `Invalid '${param}': must not contain the character U+0000`, param }))
    }
  }
  return /%00|\u0000/.test(path)
    ? Option.some(new InvalidRequest({ message: "The path must not contain the character U+0000." }))
    : Option.none()
}

/** Method and path patterns of the endpoints whose payload is a JSON body. */
const jsonEndpoints = (api: HttpApi.HttpApi<string, HttpApiGroup.HttpApiGroup.AnyWithProps>): ReadonlyArray<{ readonly method: string; readonly path: RegExp }> => {
  const found: Array<{ method: string; path: RegExp }> = []
  HttpApi.reflect(api, {
    onGroup: () => {},
    onEndpoint: ({ endpoint, payloads }) => {
      if (endpoint.method === "GET" || payloads.size === 0) return
      const pattern = endpoint.path.replace(/[.+?^${}()|[\]\\]/g, "\\$&").replace(/:[^/]+/g, "[^/]+")
      found.push({ method: endpoint.method, path: new RegExp(`^${pattern}/?$`) })
    }
  })
  return found
}

/**
 * Refuses, before any handler reads it, what would stall or break one: NUL in
 * the URL, a multipart body (none is accepted, and an unterminated one never
 * ends), a JSON endpoint's body of another type, and JSON nested deeper than
 * MAX_JSON_DEPTH. Every refusal is an `invalid_request`; the body is read once
 * here (under the caller's body size limit) and kept for the handler.
 */
export const makeRequestGuard = Effect.gen(function*() {
  const { api } = yield* HttpApi.Api
  const endpoints = jsonEndpoints(api)
  const takesJson = (request: HttpServerRequest.HttpServerRequest): boolean => {
    const path = request.url.split("?", 1)[0] ?? ""
    return endpoints.some((endpoint) => endpoint.method === request.method && endpoint.path.test(path))
  }
  return Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const nul = nulInUrl(request.url)
    if (Option.isSome(nul)) return yield* nul.value
    const type = mediaType(request)
    if (type?.startsWith("multipart/")) {
      return yield* new InvalidRequest({ message: "Multipart bodies are not accepted; send Content-Type: application/json." })
    }
    if (!takesJson(request) || !hasBody(request)) return
    if (type !== undefined && !isJson(type)) {
      return yield* new InvalidRequest({
        message: `Content-Type ${type.slice(0, 100)} is not accepted here; send Content-Type: application/json.`
      })
    }
    const text = yield* request.text
    if (jsonDeeperThan(text, MAX_JSON_DEPTH)) {
      return yield* new InvalidRequest({ message: `The JSON body nests deeper than ${MAX_JSON_DEPTH} levels.` })
    }
  })
})
