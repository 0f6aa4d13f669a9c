import { Context, Effect, Layer } from "effect"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"

/** What the stand-in answers `GET /v1/models`: by the key it is sent, or a 500 whatever the key. */
export type StandInMode = "byKey" | "down"

export interface StandInRequest {
  readonly method: string
  readonly path: string
  readonly authorization: string | undefined
}

/**
 * A team's own OpenAI-compatible provider on 127.0.0.1: `GET /v1/models` (or `/alt/v1/models`) answers 200 with a models list to a
 * key it accepts (`accept`), 401 to any other (or 500 while `down`). It keeps every request, and counts
 * connections, so a test sees that a refused base URL was never connected to.
 */
export class ProviderStandIn extends Context.Tag("test/ProviderStandIn")<ProviderStandIn, {
  readonly port: number
  /** `http://127.0.0.1:{port}/v1`. */
  readonly baseUrl: string
  readonly accept: (apiKey: string) => void
  /** The key revoked at the provider: refused from now on. */
  readonly revoke: (apiKey: string) => void
  readonly setMode: (mode: StandInMode) => void
  readonly requests: () => ReadonlyArray<StandInRequest>
  readonly connections: () => number
}>() {}

/** Where it serves its models list: its API's root is `/v1`, or `/alt/v1` (a second root, for a moved base URL). */
const MODELS_PATHS: ReadonlySet<string> = new Set(["/v1/models", "/alt/v1/models"])

export const makeProviderStandIn = Effect.gen(function*() {
  const accepted = new Set<string>()
  const requests: Array<StandInRequest> = []
  let mode: StandInMode = "byKey"
  let connections = 0
  const server = createServer((request, response) => {
    const authorization = request.headers.authorization
    requests.push({ method: request.method ?? "", path: request.url ?? "/", authorization })
    request.resume()
    const json = (status: number, body: unknown) =>
      response.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body))
    if (request.method !== "GET" || !MODELS_PATHS.has(request.url ?? "")) {
      return json(404, { error: { message: "not found" } })
    }
    if (mode === "down") return json(500, { error: { message: "the provider is down" } })
    const key = authorization?.startsWith("Bearer ") === true ? authorization.slice("Bearer ".length) : ""
    if (!accepted.has(key)) {
      return json(401, { error: { message: "Incorrect API key provided", code: "invalid_api_key" } })
    }
    return json(200, { object: "list", data: [{ id: "stand-in-general", object: "model", owned_by: "team" }] })
  })
  server.on("connection", () => connections++)
  yield* Effect.acquireRelease(
    Effect.async<void>((resume) => void server.listen(0, "127.0.0.1", () => resume(Effect.void))),
    () =>
      Effect.async<void>((resume) => {
        server.closeAllConnections()
        server.close(() => resume(Effect.void))
      })
  )
  const port = (server.address() as AddressInfo).port
  return ProviderStandIn.of({
    port,
    baseUrl: `http://127.0.0.1:${port}/v1`,
    accept: (apiKey) => void accepted.add(apiKey),
    revoke: (apiKey) => void accepted.delete(apiKey),
    setMode: (next) => {
      mode = next
    },
    requests: () => requests,
    connections: () => connections
  })
})

export const ProviderStandInLive = Layer.scoped(ProviderStandIn, makeProviderStandIn)
