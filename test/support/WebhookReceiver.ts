import { Context, Effect, Layer } from "effect"
import { createServer, type IncomingHttpHeaders, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { realSleep } from "./RealTime.js"
import { TwoInstancesLive } from "./TwoInstances.js"

/** What the receiver does with one request. */
export type Answer = "200" | "500" | "hang" | "redirect" | "huge"

export interface Received {
  readonly path: string
  readonly headers: IncomingHttpHeaders
  readonly body: string
  readonly answer: Answer
  /** When its body had arrived (`Date.now()`). */
  readonly at: number
}

/**
 * A developer's webhook receiver on 127.0.0.1: answers each request as the
 * next entry of `script` says (then `200`), and keeps every request. It
 * counts each path's requests in flight (from the first byte until it answers
 * or the sender hangs up) and the most there ever were at once.
 */
export class WebhookReceiver extends Context.Tag("test/WebhookReceiver")<WebhookReceiver, {
  readonly port: number
  readonly url: (path: string) => string
  readonly received: () => ReadonlyArray<Received>
  readonly script: (path: string, answers: ReadonlyArray<Answer>) => void
  /** The most requests to `path` that were in flight at once. */
  readonly mostAtOnce: (path: string) => number
}>() {}

const respond = (answer: Answer, response: ServerResponse) => {
  switch (answer) {
    case "200":
      return response.writeHead(200, { "content-type": "text/plain" }).end("thanks")
    case "500":
      return response.writeHead(500, { "content-type": "text/plain" }).end("receiver is down")
    case "redirect":
      return response.writeHead(302, { location: "/elsewhere" }).end()
    case "huge":
      return response.writeHead(200, { "content-type": "text/plain" }).end("x".repeat(2 * 1024 * 1024))
    case "hang":
      return // never answers; the connection is dropped when the server closes
  }
}

export const WebhookReceiverLive = Layer.scoped(
  WebhookReceiver,
  Effect.gen(function*() {
    const received: Array<Received> = []
    const scripts = new Map<string, Array<Answer>>()
    const inFlight = new Map<string, number>()
    const most = new Map<string, number>()
    const server = createServer((request, response) => {
      const path = request.url ?? "/"
      const now = (inFlight.get(path) ?? 0) + 1
      inFlight.set(path, now)
      most.set(path, Math.max(most.get(path) ?? 0, now))
      response.once("close", () => inFlight.set(path, (inFlight.get(path) ?? 1) - 1))
      const chunks: Array<Buffer> = []
      request.on("data", (chunk: Buffer) => chunks.push(chunk))
      request.on("end", () => {
        const answer = scripts.get(path)?.shift() ?? "200"
        received.push({
          path,
          headers: request.headers,
          body: Buffer.concat(chunks).toString("utf8"),
          answer,
          at: Date.now()
        })
        respond(answer, response)
      })
    })
    yield* Effect.acquireRelease(
      Effect.async<void>((resume) => {
        server.listen(0, "127.0.0.1", () => resume(Effect.void))
      }),
      () =>
        Effect.async<void>((resume) => {
          server.closeAllConnections()
          server.close(() => resume(Effect.void))
        })
    )
    const port = (server.address() as AddressInfo).port
    return {
      port,
      url: (path) => `http://127.0.0.1:${port}${path}`,
      received: () => received,
      script: (path, answers) => void scripts.set(path, [...answers]),
      mostAtOnce: (path) => most.get(path) ?? 0
    }
  })
)

/** Polls until `probe` answers something `done` accepts (every 50 ms, at most `limitMs`); dies naming `what` and the last answer. */
export const eventually = <A, R>(
  what: string,
  probe: Effect.Effect<A, never, R>,
  done: (a: A) => boolean,
  limitMs = 15_000
) =>
  Effect.gen(function*() {
    const until = Date.now() + limitMs
    while (true) {
      const answer = yield* probe
      if (done(answer)) return answer
      if (Date.now() > until) {
        return yield* Effect.dieMessage(`${what}: not seen; last ${JSON.stringify(answer).slice(0, 400)}`)
      }
      yield* realSleep(50)
    }
  })

/** Two instances (`TwoInstancesLive`) that may deliver to the receiver (its port in `WEBHOOK_ALLOWED_HOSTS`), polling the outbox every 50 ms. */
export const TwoInstancesWithReceiver = (name: string) =>
  Layer.unwrapEffect(
    Effect.map(WebhookReceiver, (receiver) =>
      TwoInstancesLive(name, { webhookAllowedHosts: new Set([`127.0.0.1:${receiver.port}`]), outboxPollMs: 50 }))
  )
    .pipe(Layer.provideMerge(WebhookReceiverLive))
