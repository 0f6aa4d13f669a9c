import { Effect } from "effect"
import { TestServer } from "./TestServer.js"

export interface Reply {
  readonly status: number
  readonly headers: Headers
  readonly body: any // arbitrary JSON: each test asserts the shape it expects
  readonly text: string
}

export interface CallOptions {
  readonly token?: string | undefined
  readonly json?: unknown
  readonly body?: string
  readonly headers?: Record<string, string>
}

/** One HTTP call to the test server: plain fetch, as any client would. */
export const call = (method: string, path: string, options: CallOptions = {}) =>
  Effect.gen(function*() {
    const { baseUrl } = yield* TestServer
    const headers: Record<string, string> = { ...options.headers }
    if (options.token !== undefined) headers["authorization"] = `Bearer ${options.token}`
    let body: string | undefined = options.body
    if (options.json !== undefined) {
      body = JSON.stringify(options.json)
      headers["content-type"] ??= "application/json"
    }
    return yield* Effect.promise(async (): Promise<Reply> => {
      const response = await fetch(`${baseUrl}${path}`, {
        method,
        headers,
        signal: AbortSignal.timeout(30_000),
        ...(body === undefined ? {} : { body })
      })
      const text = await response.text()
      let parsed: unknown
      try {
        parsed = text === "" ? undefined : JSON.parse(text)
      } catch {
        parsed = undefined
      }
      return { status: response.status, headers: response.headers, body: parsed, text }
    })
  })

/** A session token from the development identity provider. */
export const devToken = (email: string) =>
  Effect.map(call("POST", "/dev/session", { json: { email } }), (reply) => {
    if (reply.status !== 200) throw new Error(`dev session failed: ${reply.status} ${reply.text}`)
    return reply.body.token as string
  })

export const createKey = (token: string, json: Record<string, unknown> = { name: "test key" }) =>
  Effect.map(call("POST", "/dashboard/api-keys", { token, json }), (reply) => {
    if (reply.status !== 201) throw new Error(`key creation failed: ${reply.status} ${reply.text}`)
    return reply.body as { key: { id: string; prefix: string; status: string }; full_key: string; warning: string }
  })
