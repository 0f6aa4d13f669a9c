import * as HttpServerError from "@effect/platform/HttpServerError"
import type * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as NodeHttpServerRequest from "@effect/platform-node/NodeHttpServerRequest"
import { Effect } from "effect"

/**
 * A request's body as text, read at most `maxBytes` of it, failing as the
 * platform's own reading (`request.text`) fails: a `RequestError` ("Decode")
 * whose cause is "maxBytes exceeded" past the limit, or the stream's error.
 *
 * The model calls' lane reads its body so (issue 36): the platform's
 * `request.text` runs a fiber of its own for each request
 * (`Effect.runSync(Effect.cached(…))`), with its Deferred, its cache and an
 * `acquireUseRelease` around the read. As there, the request is destroyed once
 * read, failed or interrupted, unless it already closed (the error middleware
 * turns that into a pause for a chunked body, so that a 413 still goes out).
 */
export const readBodyText = (
  request: HttpServerRequest.HttpServerRequest,
  maxBytes: number
): Effect.Effect<string, HttpServerError.RequestError> =>
  Effect.async((resume) => {
    const source = NodeHttpServerRequest.toIncomingMessage(request)
    let text = ""
    let bytes = 0
    let done = false
    const end = (outcome: Effect.Effect<string, HttpServerError.RequestError>) => {
      if (done) return
      done = true
      source.off("data", onData)
      if (!source.closed) source.destroy()
      resume(outcome)
    }
    const fail = (cause: unknown) => end(Effect.fail(new HttpServerError.RequestError({ request, reason: "Decode", cause })))
    const onData = (chunk: string) => {
      text += chunk
      bytes += Buffer.byteLength(chunk)
      if (bytes > maxBytes) fail(new Error("maxBytes exceeded"))
    }
    source.setEncoding("utf8")
    source.once("error", fail)
    source.once("end", () => end(Effect.succeed(text)))
    source.on("data", onData)
    return Effect.sync(() => {
      if (done) return
      done = true
      source.off("data", onData)
      if (!source.closed) source.destroy()
    })
  })
