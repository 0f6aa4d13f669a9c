import { describe, expect, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { mkdtemp, rm } from "node:fs/promises"
import { request } from "node:http"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { expectClientError } from "../../support/ErrorBody.js"
import { createKey, devToken, type Reply } from "../../support/Http.js"
import { startService, stopService } from "../../support/ServiceProcess.js"
import { freshDatabase, makeShiftableClock, TestServer } from "../../support/TestServer.js"

/**
 * Bodies over 8 MiB sent many at once: each client, still sending when the
 * 413 is written, reads that 413 in the error shape, never a reset (EPIPE,
 * ECONNRESET) before any answer.
 */

const NINE_MIB = 9 * 1024 * 1024
const AT_ONCE = 16

/** `{"input":"xxx…"}` of `size` bytes. */
const bodyOf = (size: number): Buffer => {
  const head = "{\"input\":\""
  const tail = "\"}"
  return Buffer.from(head + "x".repeat(size - head.length - tail.length) + tail)
}

const asReply = (status: number, headers: Headers, text: string): Reply => {
  let body: unknown
  try {
    body = JSON.parse(text)
  } catch {
    body = undefined
  }
  return { status, headers, body, text }
}

const noAnswer = (error: unknown): Reply => {
  const cause = error instanceof Error && error.cause instanceof Error ? error.cause : error
  const code = (cause as NodeJS.ErrnoException | undefined)?.code ?? ""
  return asReply(0, new Headers(), `no answer: ${code} ${String(cause)}`)
}

/** Node's own HTTP client, one connection per call: `chunked` leaves out Content-Length. */
const rawPost = (url: string, token: string, body: Buffer, chunked: boolean) =>
  new Promise<Reply>((resolve) => {
    const sent = request(url, {
      method: "POST",
      agent: false,
      headers: {
        authorization: `Bearer ${token}`,
        "content-type": "application/json",
        ...(chunked ? { "transfer-encoding": "chunked" } : { "content-length": String(body.length) })
      }
    }, (response) => {
      let text = ""
      response.setEncoding("utf8")
      response.on("data", (chunk: string) => (text += chunk))
      response.on("end", () => {
        const headers = new Headers()
        for (const [name, value] of Object.entries(response.headers)) {
          if (typeof value === "string") headers.set(name, value)
        }
        resolve(asReply(response.statusCode ?? 0, headers, text))
      })
      response.on("error", (error) => resolve(noAnswer(error)))
    })
    sent.on("error", (error) => resolve(noAnswer(error)))
    // In 1 MiB writes, as a client streaming a file does.
    for (let offset = 0; offset < body.length; offset += 1024 * 1024) {
      sent.write(body.subarray(offset, offset + 1024 * 1024))
    }
    sent.end()
  })

/** `fetch` (undici), as most clients send: Content-Length known. */
const fetchPost = (url: string, token: string, body: Buffer) =>
  fetch(url, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body,
    signal: AbortSignal.timeout(60_000)
  }).then(async (response) => asReply(response.status, response.headers, await response.text()), noAnswer)

const expectAll413 = (replies: ReadonlyArray<Reply>, name: string) => {
  const unanswered = replies.filter((reply) => reply.status === 0).map((reply) => reply.text)
  expect(unanswered, `${name}: calls that saw no answer`).toEqual([])
  replies.forEach((reply, index) =>
    expectClientError(reply, { status: 413, code: "context_length_exceeded" }, `${name} #${index}`)
  )
}

/**
 * The service in a process of its own, as clients meet it: its event loop
 * does not wait for theirs, so it answers while they are still sending.
 */
const ServiceLive = Layer.scoped(
  TestServer,
  Effect.gen(function*() {
    const database = yield* freshDatabase
    const dataDir = yield* Effect.acquireRelease(
      Effect.promise(() => mkdtemp(join(tmpdir(), "nenas-bigbodies-"))),
      (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
    )
    const service = yield* Effect.acquireRelease(
      Effect.promise(() => startService({ env: { DATABASE_URL: database.url, DATA_DIR: dataDir } })),
      (started) => Effect.promise(() => stopService(started, "SIGKILL"))
    )
    return { baseUrl: service.baseUrl, databaseUrl: database.url, clock: makeShiftableClock(), settled: Effect.void }
  })
)

layer(ServiceLive, { excludeTestServices: true })("bodies over 8 MiB, sixteen at once", (it) => {
  const setup = Effect.gen(function*() {
    const { baseUrl } = yield* TestServer
    // A valid key: the answer is the body's 413 whether authentication comes before the body or after.
    const { full_key } = yield* createKey(yield* devToken("big-bodies@example.com"), { name: "big bodies" })
    return { url: `${baseUrl}/v1/responses`, token: full_key, body: bodyOf(NINE_MIB) }
  })

  describe("every client reads its 413", () => {
    it.effect("fetch, Content-Length: 16 × 9 MiB at once, every one 413 in the error shape", () =>
      Effect.gen(function*() {
        const { body, token, url } = yield* setup
        const replies = yield* Effect.promise(() =>
          Promise.all(Array.from({ length: AT_ONCE }, () => fetchPost(url, token, body)))
        )
        expectAll413(replies, "fetch")
      }))

    it.effect("http.request, Content-Length: 16 × 9 MiB at once, every one 413 in the error shape", () =>
      Effect.gen(function*() {
        const { body, token, url } = yield* setup
        const replies = yield* Effect.promise(() =>
          Promise.all(Array.from({ length: AT_ONCE }, () => rawPost(url, token, body, false)))
        )
        expectAll413(replies, "http.request")
      }))

    it.effect("http.request, chunked: 16 × 9 MiB at once, every one 413 in the error shape", () =>
      Effect.gen(function*() {
        const { body, token, url } = yield* setup
        const replies = yield* Effect.promise(() =>
          Promise.all(Array.from({ length: AT_ONCE }, () => rawPost(url, token, body, true)))
        )
        expectAll413(replies, "chunked")
      }))

    it.effect("the server still answers after them", () =>
      Effect.gen(function*() {
        const { baseUrl } = yield* TestServer
        const response = yield* Effect.promise(() => fetch(`${baseUrl}/healthz`))
        expect(response.status).toBe(200)
      }))
  })
})
