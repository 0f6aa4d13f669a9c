import * as NodeHttpServerRequest from "@effect/platform-node/NodeHttpServerRequest"
import * as Cookies from "@effect/platform/Cookies"
import type * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import type * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Effect } from "effect"
import { isSelfWriting } from "./SelfWritingBody.js"

/**
 * Writes a response whose body writes itself (`HttpServerResponse.raw` of a
 * `SelfWritingBody`), where the platform would pipe a Node `Readable` through
 * `stream/promises.pipeline`
 * (docs/performance.md, "Going around the platform"). A pipeline makes an
 * AbortController for each response and aborts it when the response ends; that
 * abort's DOMException (its stack captured), the pipeline's listeners and the
 * `Readable` in between were about a tenth of a streamed call's CPU in A/B runs
 * of `npm run bench:pipeline`, and the last events went out apart from the
 * response's end.
 *
 * The effect ends once the response finishes or closes, and leaves it ended,
 * so that the platform, which writes the response next, finds nothing more to
 * write. Undefined for any other response (the platform writes it), for
 * `HEAD` and for a response with cookies.
 */
export const writeNodeBody = (
  request: HttpServerRequest.HttpServerRequest,
  response: HttpServerResponse.HttpServerResponse
): Effect.Effect<HttpServerResponse.HttpServerResponse> | undefined => {
  const { body } = response
  if (
    body._tag !== "Raw" || !isSelfWriting(body.body) || request.method === "HEAD" || !Cookies.isEmpty(response.cookies)
  ) {
    return undefined
  }
  const source = body.body
  return Effect.async<HttpServerResponse.HttpServerResponse>((resume) => {
    const nodeResponse = NodeHttpServerRequest.toServerResponse(request)
    let ended = false
    const end = () => {
      if (ended) return
      ended = true
      // A response the client closed: ended, so that nothing writes to it again.
      if (!nodeResponse.writableEnded) nodeResponse.end()
      resume(Effect.succeed(response))
    }
    const closedAlready = nodeResponse.closed
    if (!closedAlready) {
      nodeResponse.once("finish", end)
      nodeResponse.once("close", end)
      nodeResponse.writeHead(response.status, response.headers)
    }
    source.writeTo(nodeResponse)
    if (closedAlready) end()
  })
}
