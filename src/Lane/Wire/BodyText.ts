import * as NodeHttpServerRequest from "@effect/platform-node/NodeHttpServerRequest"
import * as HttpServerError from "@effect/platform/HttpServerError"
import type * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import { Effect } from "effect"
import { doneWith } from "./DoneWith.js"

/**
 * A request's body as text, read at most `maxBytes` of it, failing as the
 * platform's own reading (`request.text`) fails: a `RequestError` ("Decode")
 * whose cause is "maxBytes exceeded" past the limit, or the stream's error.
 *
 * The model calls' lane reads its body so
 * (docs/performance.md, "Going around the platform"): the platform's
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
    /** Done reading: every listener off the request (`doneWith`), then the request destroyed. */
    const stop = (): boolean => {
      if (done) return false
      done = true
      doneWith(source, { data: onData, end: onEnd, error: fail })
      if (!source.closed) source.destroy()
      return true
    }
    const end = (outcome: Effect.Effect<string, HttpServerError.RequestError>) => {
      if (stop()) resume(outcome)
    }
    const fail = (cause: unknown) =>
      end(Effect.fail(new HttpServerError.RequestError({ request, reason: "Decode", cause })))
    const onEnd = () => end(Effect.succeed(text))
    const onData = (chunk: string) => {
      text += chunk
      bytes += Buffer.byteLength(chunk)
      if (bytes > maxBytes) fail(new Error("maxBytes exceeded"))
    }
    source.setEncoding("utf8")
    source.on("error", fail)
    source.on("end", onEnd)
    source.on("data", onData)
    return Effect.sync(() => void stop())
  })
