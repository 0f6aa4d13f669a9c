import * as Cookies from "@effect/platform/Cookies"
import type * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import type * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as NodeHttpServerRequest from "@effect/platform-node/NodeHttpServerRequest"
import { Readable } from "node:stream"
import { Effect } from "effect"

/**
 * Writes a response whose body is a Node `Readable` (a streamed model call's
 * events, `StreamRelay.ts`) with `pipe`, where the platform would use
 * `stream/promises.pipeline` (issue 36). A pipeline makes an AbortController
 * for each response and aborts it when the response ends; that abort's
 * DOMException (its stack captured) and the pipeline's own listeners were
 * about 5% of a streamed call's CPU in the profile of `npm run bench:pipeline`.
 *
 * What the pipeline did for this body is kept: the body is destroyed when the
 * response closes before it finished (the client went away: the relay bills
 * what was produced), and the response when the body fails. The effect ends
 * once the response finishes or closes, and leaves it ended, so that the
 * platform, which writes the response next, finds nothing more to write.
 * Undefined for any other response (the platform writes it), for `HEAD` and
 * for a response with cookies.
 */
export const writeReadableBody = (
  request: HttpServerRequest.HttpServerRequest,
  response: HttpServerResponse.HttpServerResponse
): Effect.Effect<HttpServerResponse.HttpServerResponse> | undefined => {
  const { body } = response
  if (body._tag !== "Raw" || !(body.body instanceof Readable) || request.method === "HEAD" || !Cookies.isEmpty(response.cookies)) {
    return undefined
  }
  const source = body.body
  return Effect.async<HttpServerResponse.HttpServerResponse>((resume) => {
    const nodeResponse = NodeHttpServerRequest.toServerResponse(request)
    let ended = false
    const end = () => {
      if (ended) return
      ended = true
      if (!nodeResponse.writableFinished) {
        source.destroy()
        // A response the client closed: ended, so that nothing writes to it again.
        if (!nodeResponse.writableEnded) nodeResponse.end()
      }
      resume(Effect.succeed(response))
    }
    nodeResponse.once("finish", end)
    nodeResponse.once("close", end)
    source.once("error", (error) => nodeResponse.destroy(error))
    nodeResponse.writeHead(response.status, response.headers)
    source.pipe(nodeResponse)
    return Effect.sync(end)
  })
}
