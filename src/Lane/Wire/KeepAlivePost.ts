import http from "node:http"
import type { IncomingMessage } from "node:http"
import https from "node:https"
import type { LookupFunction, Socket } from "node:net"
import type { Readable } from "node:stream"
import { urlToHttpOptions } from "node:url"
import { doneWith, ignoreLateError } from "./DoneWith.js"

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
  /** Closes the idle keep-alive connections now, and each busy one once its answer ends (none is cut). */
  readonly close: () => void
}

/** `lookup`, when given, resolves the host for every new connection (the address guard's, for a team's own provider). */
export const makePost = (url: string, lookup?: LookupFunction): Post => {
  const target = new URL(url)
  // The URL read into request options once, not by Node on every request.
  const options = urlToHttpOptions(target)
  const secure = target.protocol === "https:"
  const agentOptions = lookup === undefined ? { keepAlive: true } : { keepAlive: true, lookup }
  const agent = secure ? new https.Agent(agentOptions) : new http.Agent(agentOptions)
  const request = secure ? https.request : http.request
  const post = lookup === undefined
    ? { ...options, method: "POST", agent }
    : { ...options, method: "POST", agent, lookup }
  return {
    send: (headers, body, answered, failed) => {
      // `Object.assign` onto new objects, not spreads that add fields: Node 20 builds those on a slow path (`npm run bench:spreads`).
      const sent = request(
        Object.assign(
          { headers: Object.assign({}, headers, { "content-length": String(Buffer.byteLength(body)) }) },
          post
        )
      )
      // Once its answer is closed, the request keeps none of this call's listeners (`doneWith`).
      sent.once("response", (answer: IncomingMessage) => {
        answer.once("close", () => doneWith(sent, { error: failed }))
        answered(answer)
      })
      sent.on("error", failed)
      sent.end(body)
      return () => void sent.destroy()
    },
    close: () => {
      agent.on("free", (socket: Socket) => socket.destroy())
      for (const idle of Object.values(agent.freeSockets)) for (const socket of idle ?? []) socket.destroy()
    }
  }
}

/** Drops a body not read to its end (its connection is closed); the error that makes is nobody's. */
export const dropBody = (body: Readable): void => {
  body.on("error", ignoreLateError)
  body.destroy()
}

/** A body read whole as UTF-8 text; once read (or failed), its listeners are taken off (`doneWith`). */
export const textOf = (body: Readable): Promise<string> =>
  new Promise((resolve, reject) => {
    const parts: Array<Buffer> = []
    const onData = (part: Buffer) => void parts.push(part)
    const done = () => doneWith(body, { data: onData, end: onEnd, error: onError, aborted: onAborted })
    const onEnd = () => {
      done()
      resolve(Buffer.concat(parts).toString("utf8"))
    }
    const onError = (cause: Error) => {
      done()
      reject(cause)
    }
    // A connection lost midway ends the body early with `aborted`, not always with an error.
    const onAborted = () => onError(new Error("The answer's connection closed before its end."))
    body.on("data", onData)
    body.on("end", onEnd)
    body.on("error", onError)
    body.on("aborted", onAborted)
  })
