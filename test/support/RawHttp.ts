import { Effect } from "effect"
import { request } from "node:http"
import { TestServer } from "./TestServer.js"

/** An answer read by Node's own client, its body parsed as JSON when it is JSON. */
export interface RawReply {
  readonly status: number
  readonly headers: Readonly<Record<string, string | Array<string> | undefined>>
  readonly text: string
  readonly body: any // arbitrary JSON: each test asserts the shape it expects
}

export interface RawOptions {
  readonly headers?: Record<string, string>
  readonly body?: string
}

/**
 * One request with its target sent exactly as written (`//dev/session`, `/dev/%73ession`, an absolute-form
 * `http://host/path`): fetch would normalise these before they left the client.
 */
export const rawCall = (method: string, target: string, options: RawOptions = {}) =>
  Effect.flatMap(TestServer, ({ baseUrl }) =>
    Effect.promise(() =>
      new Promise<RawReply>((resolve, reject) => {
        const { hostname, port } = new URL(baseUrl)
        const headers: Record<string, string> = Object.assign({ connection: "close" }, options.headers)
        if (options.body !== undefined) headers["content-length"] = String(Buffer.byteLength(options.body))
        const sent = request({ host: hostname, port: Number(port), method, path: target, headers }, (response) => {
          let text = ""
          response.setEncoding("utf8")
          response.on("data", (chunk: string) => (text += chunk))
          response.on("end", () => {
            let body: unknown
            try {
              body = text === "" ? undefined : JSON.parse(text)
            } catch {
              body = undefined
            }
            resolve({ status: response.statusCode ?? 0, headers: response.headers, text, body })
          })
        })
        sent.on("error", reject)
        sent.setTimeout(30_000, () => sent.destroy(new Error(`no answer to ${method} ${target} in 30 s`)))
        sent.end(options.body)
      })
    ))
