import http from "node:http"
import https from "node:https"
import type { IncomingMessage } from "node:http"
import type { Readable } from "node:stream"
import { urlToHttpOptions } from "node:url"

/**
 * POSTs to one URL over Node's own HTTP client, on keep-alive connections of
 * its own. Node writes a request as it is made and parses the answer in
 * native code: less per call than undici's dispatcher on the loopback.
 */
export interface Post {
  /** Sends `body`; `answered` gets the answer's head (its body still to read), `failed` why none came. Returns a cancel. */
  readonly send: (
    headers: Record<string, string>,
    body: string,
    answered: (answer: IncomingMessage) => void,
    failed: (cause: Error) => void
  ) => () => void
}

export const makePost = (url: string): Post => {
  const target = new URL(url)
  // The URL read into request options once, not by Node on every request.
  const options = urlToHttpOptions(target)
  const secure = target.protocol === "https:"
  const agent = secure ? new https.Agent({ keepAlive: true }) : new http.Agent({ keepAlive: true })
  const request = secure ? https.request : http.request
  const post = { ...options, method: "POST", agent }
  return {
    send: (headers, body, answered, failed) => {
      // `Object.assign` onto new objects, not spreads that add fields: Node 20 builds those on a slow path (`npm run bench:spreads`).
      const sent = request(Object.assign({ headers: Object.assign({}, headers, { "content-length": String(Buffer.byteLength(body)) }) }, post))
      sent.on("response", answered)
      sent.on("error", failed)
      sent.end(body)
      return () => void sent.destroy()
    }
  }
}

/** Drops a body not read to its end (its connection is closed); the error that makes is nobody's. */
export const dropBody = (body: Readable): void => {
  body.on("error", () => undefined)
  body.destroy()
}

/** A body read whole as UTF-8 text. */
export const textOf = (body: Readable): Promise<string> =>
  new Promise((resolve, reject) => {
    const parts: Array<Buffer> = []
    body.on("data", (part: Buffer) => parts.push(part))
    body.on("end", () => resolve(Buffer.concat(parts).toString("utf8")))
    body.on("error", reject)
    // A connection lost midway ends the body early with `aborted`, not always with an error.
    body.on("aborted", () => reject(new Error("The answer's connection closed before its end.")))
  })
