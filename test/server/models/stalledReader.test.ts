import { describe, expect, layer } from "@effect/vitest"
import { Context, Effect, Fiber, Layer, Option } from "effect"
import { createServer, type ServerResponse } from "node:http"
import { type AddressInfo, connect, type Socket } from "node:net"
import { costOf, DEFAULT_PRICES } from "../../../src/Domain/Prices.js"
import { PUBLIC_MODEL } from "../../../src/Models/OpenAi/Api.js"
import { booksOf } from "../../support/Books.js"
import { alwaysClosed } from "../../support/Breakers.js"
import { caller, TestServerWithUpstream, violations, walletOf } from "../../support/Models.js"
import { realSleep } from "../../support/RealTime.js"
import { readSse } from "../../support/Sse.js"
import { webhookOverrides } from "../../support/Stripe.js"
import { query, TestServer, TestServerLive } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * A streamed call whose client stops reading (docs/architecture.md, "Streams"): the upstream
 * is read to its end whatever the client does, and the call is billed then; a
 * client that leaves its answer unread past the write-stall deadline is cut,
 * and the call billed for what was produced. A hold is renewed for as long as
 * its call runs, however long that is.
 */

const STALL_MS = 1_500

/**
 * How the big-answer upstream streams: `burst` content chunks of `piece` at once, then `chunks` more `gapMs`
 * apart, then its usage.
 */
interface BigAnswer {
  readonly piece: string
  readonly burst: number
  readonly chunks: number
  readonly gapMs: number
  readonly usage: { readonly prompt_tokens: number; readonly completion_tokens: number }
}

interface BigUpstreamServer {
  readonly baseUrl: string
  set: (answer: BigAnswer) => void
  /** The last answer: whether it was sent whole, and whether its connection closed before that. */
  readonly last: () => { readonly whole: boolean; readonly cutEarly: boolean; readonly closedAt: number | undefined }
  close: () => Promise<void>
}

const sse = (data: unknown) => `data: ${JSON.stringify(data)}\n\n`
const chunk = (delta: unknown, finish: string | null) =>
  sse({
    id: "chatcmpl-big",
    object: "chat.completion.chunk",
    created: 0,
    model: "m",
    choices: [{ index: 0, delta, finish_reason: finish }]
  })

/** An OpenAI-compatible upstream that streams a large answer in big chunks, as fast as asked, ignoring backpressure. */
const startBigUpstream = (): Promise<BigUpstreamServer> => {
  let answer: BigAnswer = {
    piece: "hello",
    burst: 10,
    chunks: 0,
    gapMs: 0,
    usage: { prompt_tokens: 10, completion_tokens: 10 }
  }
  let last = { whole: false, cutEarly: false, closedAt: undefined as number | undefined }
  const stream = async (res: ServerResponse, sent: BigAnswer) => {
    const record = { whole: false, cutEarly: false, closedAt: undefined as number | undefined }
    last = record
    res.once("close", () => {
      record.closedAt = Date.now()
      if (!record.whole) record.cutEarly = true
    })
    res.writeHead(200, { "content-type": "text/event-stream" })
    res.write(chunk({ role: "assistant", content: "" }, null))
    for (let i = 0; i < sent.burst; i++) res.write(chunk({ content: sent.piece }, null))
    for (let i = 0; i < sent.chunks; i++) {
      await new Promise((resolve) => setTimeout(resolve, sent.gapMs))
      if (res.destroyed) return
      res.write(chunk({ content: sent.piece }, null))
    }
    res.write(chunk({}, "stop"))
    res.write(sse({
      id: "chatcmpl-big",
      object: "chat.completion.chunk",
      created: 0,
      model: "m",
      choices: [],
      usage: { ...sent.usage, total_tokens: sent.usage.prompt_tokens + sent.usage.completion_tokens }
    }))
    record.whole = true
    res.end("data: [DONE]\n\n")
  }
  const server = createServer((req, res) => {
    req.resume()
    req.once("end", () => void stream(res, answer))
  })
  return new Promise((resolve) => {
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as AddressInfo // a TCP listener, never a pipe
      resolve({
        baseUrl: `http://127.0.0.1:${port}/v1`,
        set: (next) => {
          answer = next
        },
        last: () => last,
        close: () =>
          new Promise((done) => {
            server.closeAllConnections()
            server.close(() => done())
          })
      })
    })
  })
}

class BigUpstream extends Context.Tag("test/BigUpstream")<BigUpstream, BigUpstreamServer>() {}

const BigUpstreamLive = Layer.scoped(
  BigUpstream,
  Effect.acquireRelease(Effect.promise(startBigUpstream), (server) => Effect.promise(() => server.close()))
)

const StalledServer = Layer.unwrapEffect(Effect.map(BigUpstream, (upstream) =>
  TestServerLive({
    ...webhookOverrides,
    upstreamBaseUrl: Option.some(upstream.baseUrl),
    streamWriteStallMs: STALL_MS
  }, { breakers: alwaysClosed }))).pipe(Layer.provideMerge(BigUpstreamLive))

/**
 * A streamed chat call on a raw socket that reads the response's head and then nothing: its request id, and
 * `readRest` to read on again to the end of the connection (what the client then gets).
 */
const stalledCall = (apiKey: string) =>
  Effect.flatMap(
    TestServer,
    ({ baseUrl }) =>
      Effect.promise(() =>
        new Promise<{ readonly requestId: string; readonly socket: Socket; readonly readRest: () => Promise<string> }>(
          (resolve, reject) => {
            const json = JSON.stringify({
              model: PUBLIC_MODEL,
              messages: [{ role: "user", content: "Write the longest story you can." }],
              max_tokens: 32_000,
              stream: true
            })
            const { hostname, port } = new URL(baseUrl)
            const socket = connect(Number(port), hostname)
            socket.setEncoding("utf8")
            let text = ""
            let ended = false
            const onEnd = () => {
              ended = true
            }
            socket.once("end", onEnd)
            socket.once("close", onEnd)
            socket.once("error", onEnd)
            socket.on("data", (data: string) => {
              const first = text === ""
              text += data
              if (!first) return
              // The head is in: the client reads no more.
              socket.pause()
              const requestId = /x-request-id: *(\S+)/i.exec(text)?.[1]
              if (requestId === undefined) return reject(new Error(`no request id in ${text.slice(0, 300)}`))
              resolve({
                requestId,
                socket,
                readRest: () =>
                  new Promise((done) => {
                    const finish = () => done(text)
                    if (ended) return finish()
                    socket.once("end", finish)
                    socket.once("close", finish)
                    socket.resume()
                  })
              })
            })
            socket.once("connect", () => {
              socket.write(
                `POST /v1/chat/completions HTTP/1.1\r\nHost: ${hostname}:${port}\r\nAuthorization: Bearer ${apiKey}\r\n` +
                  `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(json)}\r\n\r\n${json}`
              )
            })
          }
        )
      )
  )

/** The general model's price of a usage. */
const costOfTokens = (model: string, inputTokens: number, outputTokens: number) =>
  costOf(DEFAULT_PRICES, model, { inputTokens, cachedTokens: 0, outputTokens, searches: 0, pages: 0 })

layer(StalledServer, { excludeTestServices: true, timeout: 90_000 })("a streaming client that stops reading", (it) => {
  it.effect("the call is billed its full cost once the upstream has answered, though the client never reads; the client is then cut", () =>
    Effect.gen(function*() {
      const upstream = yield* BigUpstream
      // About 5 MB of events: far more than the sockets between the service and the client hold.
      upstream.set({
        piece: "lorem ipsum ".repeat(170),
        burst: 2_500,
        chunks: 0,
        gapMs: 0,
        usage: { prompt_tokens: 1_200, completion_tokens: 20_000 }
      })
      const { accountId, apiKey } = yield* caller("stalled-whole@example.com", { sen: 1000 })
      const startedAt = Date.now()
      const client = yield* stalledCall(apiKey)
      const { hold, ledger, log } = yield* booksOf(client.requestId)
      const billedMs = Date.now() - startedAt
      expect(upstream.last().whole, "the upstream sent its whole answer").toBe(true)
      const cost = costOfTokens(log.upstream_model, 1_200, 20_000)
      expect(log).toMatchObject({
        status: "billed",
        usage_source: "provider",
        input_tokens: 1_200,
        output_tokens: 20_000,
        error_code: null,
        cost_micro_myr: String(cost)
      })
      expect(ledger).toEqual([-cost])
      expect(hold.map((h) => [h.status, h.captured])).toEqual([["captured", cost]])
      expect(billedMs, "billed without waiting for the client").toBeLessThan(10_000)
      // Unread past its deadline, the response is destroyed: the client gets what the sockets held, not the end.
      yield* realSleep(STALL_MS * 3)
      const received = yield* Effect.promise(() => client.readRest())
      expect(received).not.toContain("[DONE]")
      expect((yield* walletOf(accountId)).reserved).toBe(0)
      expect(yield* violations(accountId)).toEqual([])
    }))

  it.effect("a client that stalls past the deadline while the upstream still answers is cut, and billed for what was produced", () =>
    Effect.gen(function*() {
      const upstream = yield* BigUpstream
      // Some 8 MB of events at once (line breaks: many bytes, few tokens), then one every 20 ms for half an hour:
      // the call outlives the deadline by far unless it is cut.
      upstream.set({
        piece: "\n",
        burst: 40_000,
        chunks: 90_000,
        gapMs: 20,
        usage: { prompt_tokens: 1_200, completion_tokens: 20_000 }
      })
      const { accountId, apiKey } = yield* caller("stalled-cut@example.com", { sen: 1000 })
      const startedAt = Date.now()
      const client = yield* stalledCall(apiKey)
      const { hold, ledger, log } = yield* booksOf(client.requestId)
      const last = upstream.last()
      expect(last.cutEarly, "the upstream's answer was cut off").toBe(true)
      expect((last.closedAt ?? Infinity) - startedAt, "cut within a few deadlines").toBeLessThan(STALL_MS * 6)
      expect(log).toMatchObject({ status: "billed", usage_source: "estimated", error_code: null })
      expect(log.output_tokens, "what was produced is billed").toBeGreaterThan(100)
      expect(log.output_tokens, "not the whole answer").toBeLessThan(20_000)
      const cost = costOfTokens(log.upstream_model, log.input_tokens, log.output_tokens)
      expect(log.cost_micro_myr).toBe(String(cost))
      expect(ledger).toEqual([-cost])
      expect(hold.map((h) => [h.status, h.captured])).toEqual([["captured", cost]])
      const received = yield* Effect.promise(() => client.readRest())
      expect(received).not.toContain("[DONE]")
      expect((yield* walletOf(accountId)).reserved).toBe(0)
      expect(yield* violations(accountId)).toEqual([])
    }))
})

/** The reservation's lease deadline, epoch ms. */
const leaseOf = (requestId: string) =>
  Effect.map(
    query<{ expires: string }>(
      "SELECT (extract(epoch FROM expires_at) * 1000)::bigint AS expires FROM reservations WHERE request_id = $1",
      [requestId]
    ),
    (rows) => rows[0] === undefined ? undefined : Number(rows[0].expires)
  )

describe("a call that runs longer than the longest hold used to be renewed", () => {
  layer(TestServerWithUpstream(), { excludeTestServices: true, timeout: 90_000 })((it) => {
    it.effect("its reservation's lease is still renewed past 15 minutes on the service's clock, and the call is billed at its end", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        const { clock } = yield* TestServer
        // 28 chunks 600 ms apart: a stream of about 17 s.
        upstream.setBehaviour({
          kind: "ok",
          text: "a".repeat(8 * 28),
          chunkDelayMs: 600,
          usage: { prompt_tokens: 40, completion_tokens: 60 }
        })
        const { accountId, apiKey } = yield* caller("long-hold@example.com", { sen: 1000 })
        const { baseUrl } = yield* TestServer
        const reply = yield* Effect.fork(Effect.promise(async () => {
          const response = await fetch(`${baseUrl}/v1/chat/completions`, {
            method: "POST",
            headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
            body: JSON.stringify({
              model: PUBLIC_MODEL,
              messages: [{ role: "user", content: "Hello" }],
              max_tokens: 200,
              stream: true
            })
          })
          const requestId = response.headers.get("x-request-id") ?? ""
          await readSse(response)
          return requestId
        }))
        // The call's reservation, once taken.
        let requestId: string | undefined
        for (let tries = 0; tries < 100 && requestId === undefined; tries++) {
          const rows = yield* query<{ request_id: string }>(
            "SELECT r.request_id FROM reservations r JOIN api_keys k ON k.account_id = r.account_id WHERE k.account_id = $1 AND r.status = 'open'",
            [accountId]
          )
          requestId = rows[0]?.request_id
          if (requestId === undefined) yield* realSleep(50)
        }
        expect(requestId, "the call holds a reservation").toBeDefined()
        const first = yield* leaseOf(requestId ?? "")
        // The call has run 16 minutes as the service tells time.
        clock.advance("16 minutes")
        let renewed = first
        const since = Date.now()
        while (renewed === first && Date.now() - since < 14_000) {
          yield* realSleep(250)
          renewed = yield* leaseOf(requestId ?? "")
        }
        expect(renewed ?? 0, "the lease was renewed").toBeGreaterThan(first ?? Infinity)
        expect(yield* Fiber.join(reply)).toBe(requestId)
        const { hold, ledger, log } = yield* booksOf(requestId ?? "")
        const cost = costOfTokens(log.upstream_model, 40, 60)
        expect(log).toMatchObject({ status: "billed", usage_source: "provider", cost_micro_myr: String(cost) })
        expect(ledger).toEqual([-cost])
        expect(hold.map((h) => [h.status, h.captured])).toEqual([["captured", cost]])
        expect(yield* violations(accountId)).toEqual([])
      }))
  })
})
