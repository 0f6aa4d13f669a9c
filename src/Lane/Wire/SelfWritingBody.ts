import type { ServerResponse } from "node:http"

const SelfWriting: unique symbol = Symbol.for("nenas/SelfWritingBody")

/**
 * A response body that writes itself to the Node response, its head already
 * written, and ends it (a streamed model call's events, `Models/Call/StreamRelay.ts`;
 * `Lane/Wire/NodeBody.ts` hands it the response). It watches the response's
 * `close` itself: a response that closes before it ended (the client went
 * away) stops it, and so does one closed already.
 */
export interface SelfWritingBody {
  readonly [SelfWriting]: true
  readonly writeTo: (response: ServerResponse) => void
}

/** `writeTo` as a response body (`HttpServerResponse.raw`). */
export const selfWriting = (writeTo: (response: ServerResponse) => void): SelfWritingBody => ({
  [SelfWriting]: true,
  writeTo
})

/** Whether a raw response body writes itself. */
export const isSelfWriting = (body: unknown): body is SelfWritingBody =>
  typeof body === "object" && body !== null && (body as { [SelfWriting]?: unknown })[SelfWriting] === true
