import { createServer, type Server, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { ApiError, send } from "../../web/src/transport.js"

/**
 * The dashboard's fetch client (web/src/transport.ts, under web/src/api.ts) against a small HTTP server, with
 * the browser's relative URLs sent to it. A page that switches account or route
 * aborts its reads; an aborted read must not come back as an empty answer (a page
 * then read `undefined.banners` and went blank), and a 200 without a JSON body is
 * not an answer either.
 */
describe("the dashboard's client", () => {
  let server: Server
  let base = ""
  const held: Array<ServerResponse> = []
  const realFetch = globalThis.fetch
  let headersArrived: () => void = () => {}

  beforeAll(async () => {
    server = createServer((request, response) => {
      if (request.url === "/dashboard/alerts") {
        // The head and half of the body; the rest never comes.
        response.writeHead(200, { "content-type": "application/json" })
        response.write("{\"banners\":")
        held.push(response)
        return
      }
      response.writeHead(200, { "content-type": "text/html" }).end("<html>not the API</html>")
    })
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
    globalThis.fetch = async (input, init) => {
      const response = await realFetch(`${base}${String(input)}`, init)
      headersArrived()
      return response
    }
  })

  afterAll(async () => {
    globalThis.fetch = realFetch
    for (const response of held) response.destroy()
    await new Promise<void>((resolve) => server.close(() => resolve()))
  })

  it("rejects a read aborted while its body arrives, instead of answering undefined", async () => {
    const controller = new AbortController()
    const arrived = new Promise<void>((resolve) => {
      headersArrived = resolve
    })
    const read = send("GET", "/dashboard/alerts", { caller: { token: "t", account: null }, signal: controller.signal })
    const outcome = read.then((data) => ({ data }), (error: unknown) => ({ error }))
    await arrived
    controller.abort()
    const settled = await outcome
    expect(settled).not.toHaveProperty("data")
    expect((settled as { error: unknown }).error).toMatchObject({ name: "AbortError" })
  })

  it("rejects a 200 whose body is not JSON, in the error shape", async () => {
    const failure = await send("GET", "/dashboard/billing/balance", { caller: { token: "t", account: null } })
      .then(() => undefined, (error: unknown) => error)
    expect(failure).toBeInstanceOf(ApiError)
    expect((failure as ApiError).status).toBe(200)
    expect((failure as ApiError).body).toMatchObject({ code: "unexpected_response", retryable: true })
  })
})
