import { describe, expect, it, layer } from "@effect/vitest"
import { Context, Effect, Either, Layer, Option } from "effect"
import { connect } from "node:net"
import { clientAddress, IpLimits, parseRanges } from "../../../src/Addresses/IpLimits.js"
import { AppConfig } from "../../../src/AppConfig.js"
import { randomBase62 } from "../../../src/Domain/Ids.js"
import { HEADERS_TIMEOUT_MS, makeNodeServer, REQUEST_TIMEOUT_MS } from "../../../src/Http/Server.js"
import { expectClientError } from "../../support/ErrorBody.js"
import { call, createKey, devToken } from "../../support/Http.js"
import { TestServer, TestServerLive } from "../../support/TestServer.js"

const EIGHT_MIB = 8 * 1024 * 1024
const FAILURES_PER_MINUTE = 60

/**
 * Sends a request's headers announcing an 8 MiB body and only `sentBytes` of
 * it, then waits for the answer without sending more. Resolves with the
 * status line, the answer's text and how many body bytes had been sent.
 */
const partialPost = (baseUrl: string, path: string, authorization: string, sentBytes: number) =>
  new Promise<{ readonly statusLine: string; readonly text: string; readonly bodyBytesSent: number }>(
    (resolve, reject) => {
      const { hostname, port } = new URL(baseUrl)
      const socket = connect(Number(port), hostname)
      let received = Buffer.alloc(0)
      const timer = setTimeout(() => {
        socket.destroy()
        reject(new Error(`no answer within 15 s with ${sentBytes} of ${EIGHT_MIB} body bytes sent`))
      }, 15_000)
      socket.on("data", (chunk: Buffer) => {
        received = Buffer.concat([received, chunk])
        const end = received.indexOf("\r\n\r\n")
        if (end < 0) return
        const head = received.subarray(0, end).toString("latin1")
        const length = Number(/content-length:\s*(\d+)/i.exec(head)?.[1] ?? "0")
        if (received.length - end - 4 < length) return
        clearTimeout(timer)
        socket.destroy()
        resolve({
          statusLine: head.slice(0, head.indexOf("\r\n")),
          text: received.subarray(end + 4).toString("utf8"),
          bodyBytesSent: sentBytes
        })
      })
      socket.on("error", (error) => {
        clearTimeout(timer)
        reject(error)
      })
      socket.write(
        `POST ${path} HTTP/1.1\r\nhost: ${hostname}:${port}\r\ncontent-type: application/json\r\n` +
          `authorization: ${authorization}\r\ncontent-length: ${EIGHT_MIB}\r\n\r\n`
      )
      socket.write(Buffer.alloc(sentBytes, " "))
    }
  )

describe("the Node server's timeouts", () => {
  it("drops a request whose body takes over 60 s, or whose headers take over 10 s", () => {
    const server = makeNodeServer()
    expect(REQUEST_TIMEOUT_MS).toBe(60_000)
    expect(HEADERS_TIMEOUT_MS).toBe(10_000)
    expect(server.requestTimeout).toBe(60_000)
    expect(server.headersTimeout).toBe(10_000)
  })
})

describe("the client address behind proxies", () => {
  const trusted = parseRanges(["10.0.0.0/8", "::1"])
  if (!Array.isArray(trusted)) throw new Error("the test's ranges are valid")
  it("is the socket's peer unless that peer is a trusted proxy, then the nearest untrusted X-Forwarded-For entry", () => {
    expect(clientAddress("203.0.113.9", "1.2.3.4", trusted)).toBe("203.0.113.9")
    expect(clientAddress("::ffff:203.0.113.9", undefined, trusted)).toBe("203.0.113.9")
    // The client wrote "1.2.3.4" itself; the proxy appended the address it saw.
    expect(clientAddress("10.0.0.2", "1.2.3.4, 198.51.100.7", trusted)).toBe("198.51.100.7")
    expect(clientAddress("::1", "198.51.100.7, 10.0.0.3", trusted)).toBe("198.51.100.7")
    expect(clientAddress("10.0.0.2", "garbage", trusted)).toBe("10.0.0.2")
    expect(parseRanges(["10.0.0.0/8", "not-an-address"])).toEqual({ invalid: "not-an-address" })
  })
})

describe("per-address limits in Redis", () => {
  it.effect("two instances count one address together: the third checkout of two allowed is refused by either", () =>
    Effect.gen(function*() {
      const config = AppConfig.layerWith({
        redisUrl: Option.some("redis://127.0.0.1:6379"),
        ipCheckoutsPerMinute: 2,
        ipAuthFailuresPerMinute: 1
      })
      const instance = IpLimits.layer.pipe(Layer.provide(config))
      const first = yield* Layer.build(instance).pipe(Effect.map((context) => Context.get(context, IpLimits)))
      const second = yield* Layer.build(instance).pipe(Effect.map((context) => Context.get(context, IpLimits)))
      // An address of its own: runs of this test do not share a window.
      const address = `test-${randomBase62(12)}`
      yield* first.take("checkouts", address)
      yield* second.take("checkouts", address)
      const refused = yield* Effect.either(first.take("checkouts", address))
      expect(Either.isLeft(refused) && refused.left).toMatchObject({ _tag: "RateLimitExceeded" })
      expect(Either.isLeft(refused) && refused.left.retry_after_seconds).toBeGreaterThanOrEqual(1)
      // Checking counts nothing; counting a failure on one instance refuses on the other.
      yield* second.check("authFailures", address)
      yield* second.check("authFailures", address)
      yield* first.count("authFailures", address)
      expect(Either.isLeft(yield* Effect.either(second.check("authFailures", address)))).toBe(true)
    }).pipe(Effect.scoped))
})

layer(TestServerLive({ ipAuthFailuresPerMinute: FAILURES_PER_MINUTE, ipCheckoutsPerMinute: 3 }), {
  excludeTestServices: true,
  timeout: 120_000
})("cheap refusals", (it) => {
  it.effect("an invalid key with an 8 MiB body answers 401 before the body is sent, and the connection is closed", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      // 64 KiB of 8 MiB sent: a server that read the body first would still be waiting.
      const answer = yield* Effect.promise(() =>
        partialPost(
          baseUrl,
          "/v1/chat/completions",
          "Bearer nns_live_notarealkey0000000000000000000000000000",
          64 * 1024
        )
      )
      expect(answer.statusLine).toMatch(/^HTTP\/1\.1 401 /)
      expect(JSON.parse(answer.text)).toMatchObject({ error: { code: "invalid_api_key" } })
      expect(answer.bodyBytesSent).toBeLessThan(EIGHT_MIB)
      const missing = yield* Effect.promise(() => partialPost(baseUrl, "/v1/responses", "", 1024))
      expect(missing.statusLine).toMatch(/^HTTP\/1\.1 401 /)
    }))

  it.effect("a valid key still reaches its handler, with its body", () =>
    Effect.gen(function*() {
      const session = yield* devToken("valid-key@example.com")
      const key = (yield* createKey(session, { name: "test", environment: "test" })).full_key
      const reply = yield* call("POST", "/v1/chat/completions", {
        token: key,
        json: { model: "svc/nenas-flash", messages: [{ role: "user", content: "hello" }] }
      })
      expect(reply.status, reply.text).toBe(200)
      expect(reply.body.choices[0].message.content.length).toBeGreaterThan(0)
    }))

  it.effect("100 failed authentications from one address: 401 up to the limit, then 429 with retry_after_seconds; a valid key still works", () =>
    Effect.gen(function*() {
      const session = yield* devToken("limited@example.com")
      const valid = (yield* createKey(session, { name: "valid", environment: "test" })).full_key
      const statuses: Array<number> = []
      for (let attempt = 0; attempt < 100; attempt++) {
        const reply = yield* call("GET", "/v1/models", { token: `nns_live_guess${attempt}` })
        statuses.push(reply.status)
        if (reply.status === 429) {
          expectClientError(reply, { status: 429, code: "rate_limit_exceeded" })
          expect(reply.body.error.retry_after_seconds).toBeGreaterThanOrEqual(1)
          expect(reply.body.error.retry_after_seconds).toBeLessThanOrEqual(60)
          expect(reply.headers.get("retry-after")).toBe(String(reply.body.error.retry_after_seconds))
        }
      }
      expect(statuses.at(-1)).toBe(429)
      // Earlier tests in this file failed twice from this address.
      const firstRefused = statuses.indexOf(429)
      expect(firstRefused).toBeGreaterThan(FAILURES_PER_MINUTE - 5)
      expect(firstRefused).toBeLessThanOrEqual(FAILURES_PER_MINUTE)
      expect(statuses.slice(0, firstRefused).every((status) => status === 401)).toBe(true)
      expect(statuses.slice(firstRefused).every((status) => status === 429)).toBe(true)
      // A valid key is never refused by the limit; guesses shaped like keys still are.
      const served = yield* call("GET", "/v1/models", { token: valid })
      expect(served.status, served.text).toBe(200)
      const model = yield* call("POST", "/v1/chat/completions", {
        token: valid,
        json: { model: "svc/nenas-flash", messages: [{ role: "user", content: "hello" }] }
      })
      expect(model.status, model.text).toBe(200)
      expectClientError(yield* call("GET", "/v1/models", { token: `nns_live_${randomBase62(40)}` }), {
        status: 429,
        code: "rate_limit_exceeded"
      })
      expect(
        (yield* call("GET", "/v1/models", { token: `${valid.slice(0, -1)}${valid.endsWith("x") ? "y" : "x"}` })).status
      ).toBe(429)
      // Dashboard routes are not API-key routes.
      expect((yield* call("GET", "/dashboard/api-keys", { token: session })).status).toBe(200)
    }))

  it.effect("checkout sessions are limited per address", () =>
    Effect.gen(function*() {
      const session = yield* devToken("checkout@example.com")
      const statuses: Array<number> = []
      for (let attempt = 0; attempt < 5; attempt++) {
        const reply = yield* call("POST", "/dashboard/billing/checkout", { token: session, json: { amount_sen: 1000 } })
        statuses.push(reply.status)
        if (reply.status === 429) expectClientError(reply, { status: 429, code: "rate_limit_exceeded" })
      }
      expect(statuses).toEqual([200, 200, 200, 429, 429])
    }))
})

layer(TestServerLive(), { excludeTestServices: true, timeout: 60_000 })("dashboard refusals before the body", (it) => {
  it.effect("a dashboard request without a valid session, announcing an 8 MiB body, answers 401 before the body is sent", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      // 64 KiB of 8 MiB sent: a server that read the body first would still be waiting.
      for (
        const [path, authorization] of [["/dashboard/api-keys", "Bearer not-a-session-token"], [
          "/dashboard/webhooks",
          ""
        ]] as const
      ) {
        const answer = yield* Effect.promise(() => partialPost(baseUrl, path, authorization, 64 * 1024))
        expect(answer.statusLine, path).toMatch(/^HTTP\/1\.1 401 /)
        expect(JSON.parse(answer.text), path).toMatchObject({ error: { code: "authentication_error" } })
      }
      // A valid session still reaches the handler, with its body.
      const session = yield* devToken("dashboard-body@example.com")
      expect((yield* createKey(session, { name: "after refusals", environment: "test" })).full_key).toMatch(
        /^nns_test_/
      )
    }))
})
