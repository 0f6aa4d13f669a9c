import { describe, expect, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { mkdtemp, rm } from "node:fs/promises"
import { Agent, request } from "node:http"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { createKey, devToken } from "../../support/Http.js"
import { startService, stopService } from "../../support/ServiceProcess.js"
import { freshDatabase, makeShiftableClock, TestServer } from "../../support/TestServer.js"
import { wordsOf } from "../../support/Words.js"

/**
 * No request keeps the event loop busy (docs/security.md, "Bounded work per request"):
 * for each model endpoint, the largest bodies it accepts — just under the
 * 8 MiB limit, as many long messages, many short ones, many content blocks or
 * many tools — are answered while /healthz, polled every 20 ms on a
 * connection of its own, never goes more than 250 ms without an answer (the
 * best of up to three tries: the first also compiles each path, and another
 * process on the machine may stall the service now and then). The service runs
 * in a process of its own, so the test's own loop is not measured.
 */

const MAX_GAP_MS = 250
const ATTEMPTS = 3
const PROBE_EVERY_MS = 20
/** Under the 8 MiB body limit with room for the JSON around the text. */
const BODY_BYTES = 8_100_000
/** The largest counts the endpoints accept (docs/security.md, "Bounded work per request"). */
const MESSAGES = 10_000
const BLOCKS = 20_000
const TOOLS = 512

/** Spaced words (`support/Words.ts`), so that 8 MB stay under the context window of 1,000,000 tokens and a call is accepted. */
const spacedWords = (length: number, seed: number) => wordsOf(length, seed, true)

type Shape = "long messages" | "many messages" | "many blocks" | "many tools"
type Endpoint = "/v1/chat/completions" | "/v1/responses" | "/v1/messages" | "/v1/messages/count_tokens"

const ENDPOINTS: ReadonlyArray<Endpoint> = [
  "/v1/chat/completions",
  "/v1/responses",
  "/v1/messages",
  "/v1/messages/count_tokens"
]
const SHAPES: ReadonlyArray<Shape> = ["long messages", "many messages", "many blocks", "many tools"]

const role = (i: number) => (i % 2 === 0 ? "user" : "assistant")

/** Texts of `count` items sharing `bytes`, each item's JSON framing `overhead` bytes. */
const texts = (count: number, bytes: number, overhead: number, seed: number) =>
  Array.from({ length: count }, (_, i) => spacedWords(Math.floor(bytes / count) - overhead, seed + i))

/** The conversation part of a body of `shape` for `endpoint`, in its own wire format. */
const conversation = (endpoint: Endpoint, shape: Shape): Record<string, unknown> => {
  const anthropic = endpoint.startsWith("/v1/messages")
  const responses = endpoint === "/v1/responses"
  const field = responses ? "input" : "messages"
  const message = (
    i: number,
    content: unknown
  ) => (responses ? { type: "message", role: role(i), content } : { role: role(i), content })
  switch (shape) {
    case "long messages":
      return { [field]: texts(115, BODY_BYTES, 40, 1).map((text, i) => message(i, text)) }
    case "many messages":
      return { [field]: texts(MESSAGES, BODY_BYTES, 60, 2).map((text, i) => message(i, text)) }
    case "many blocks": {
      const type = responses ? "input_text" : "text"
      return { [field]: [message(0, texts(BLOCKS, BODY_BYTES, 40, 3).map((text) => ({ type, text })))] }
    }
    case "many tools": {
      const parameters = { type: "object", properties: { q: { type: "string" } } }
      const tools = texts(TOOLS, BODY_BYTES, 160, 4).map((description, i) =>
        anthropic
          ? { name: `tool_${i}`, description, input_schema: parameters }
          : responses
          ? { type: "function", name: `tool_${i}`, description, parameters }
          : { type: "function", function: { name: `tool_${i}`, description, parameters } }
      )
      return { [field]: [message(0, "Which tool fits?")], tools }
    }
  }
}

const bodyOf = (endpoint: Endpoint, shape: Shape): string => {
  const model = "svc/nenas-flash"
  const limits = endpoint === "/v1/messages/count_tokens"
    ? {}
    : endpoint === "/v1/messages"
    ? { max_tokens: 16 }
    : endpoint === "/v1/responses"
    ? { max_output_tokens: 16, store: false }
    : { max_tokens: 16 }
  return JSON.stringify(Object.assign({ model }, limits, conversation(endpoint, shape)))
}

/** Polls /healthz on a connection of its own until `stop`; the largest time between two answers. */
const watchdog = (baseUrl: string) => {
  const agent = new Agent({ keepAlive: true, maxSockets: 1 })
  let running = true
  let largest = 0
  const probe = () =>
    new Promise<void>((resolve) => {
      const sent = request(`${baseUrl}/healthz`, { agent }, (response) => {
        response.resume()
        response.on("end", resolve)
        response.on("error", () => resolve())
      })
      sent.on("error", () => resolve())
      sent.end()
    })
  const done = (async () => {
    let last = performance.now()
    while (running) {
      await probe()
      const now = performance.now()
      largest = Math.max(largest, now - last)
      last = now
      await new Promise((resolve) => setTimeout(resolve, PROBE_EVERY_MS))
    }
  })()
  return {
    stop: async () => {
      running = false
      await done
      agent.destroy()
      return largest
    }
  }
}

/** One POST on a connection of its own; its status and the start of its answer. */
const post = (url: string, token: string, body: string) =>
  fetch(url, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body,
    signal: AbortSignal.timeout(120_000)
  }).then(async (response) => ({ status: response.status, text: (await response.text()).slice(0, 300) }))

/** The service in a process of its own: what it does is measured from outside its event loop. */
const ServiceLive = Layer.scoped(
  TestServer,
  Effect.gen(function*() {
    const database = yield* freshDatabase
    const dataDir = yield* Effect.acquireRelease(
      Effect.promise(() => mkdtemp(join(tmpdir(), "nenas-eventloop-"))),
      (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
    )
    const service = yield* Effect.acquireRelease(
      Effect.promise(() =>
        startService({ env: { DATABASE_URL: database.url, DATA_DIR: dataDir, RATE_LIMIT_RPM: "10000" } })
      ),
      (started) => Effect.promise(() => stopService(started, "SIGKILL"))
    )
    return { baseUrl: service.baseUrl, databaseUrl: database.url, clock: makeShiftableClock(), settled: Effect.void }
  })
)

layer(ServiceLive, { excludeTestServices: true, timeout: 600_000 })("no request keeps the event loop busy", (it) => {
  describe.each(ENDPOINTS)("%s", (endpoint) => {
    it.effect.each(SHAPES)(
      `the largest body of %s it accepts leaves /healthz answering within ${MAX_GAP_MS} ms`,
      (shape) =>
        Effect.gen(function*() {
          const { baseUrl } = yield* TestServer
          // A test key: the whole call runs (count, estimate, the simulated model, the log) without a wallet.
          const { full_key } = yield* createKey(yield* devToken("event-loop@example.com"), {
            name: "big",
            environment: "test"
          })
          const body = bodyOf(endpoint, shape)
          expect(Buffer.byteLength(body), "the body is under 8 MiB").toBeLessThan(8 * 1024 * 1024)
          // Up to three tries, the best counted: a request that blocks the loop does so every time (count_tokens used
          // to block it 13-15 s), while another process on this 2-core machine (a browser test beside this file)
          // stalls the service only now and then.
          const gaps: Array<number> = []
          for (
            let attempt = 0;
            attempt < ATTEMPTS && (gaps.length === 0 || Math.min(...gaps) >= MAX_GAP_MS);
            attempt++
          ) {
            const dog = watchdog(baseUrl)
            // The watchdog's first answers come before the big body is sent.
            yield* Effect.sleep(100)
            const started = performance.now()
            const reply = yield* Effect.promise(() => post(`${baseUrl}${endpoint}`, full_key, body))
            const took = performance.now() - started
            gaps.push(yield* Effect.promise(dog.stop))
            console.log(
              `${endpoint} ${shape}: ${reply.status} in ${Math.round(took)} ms; largest /healthz gap ${
                Math.round(gaps.at(-1) ?? 0)
              } ms`
            )
            expect(reply.status, reply.text).toBe(200)
          }
          expect(
            Math.min(...gaps),
            `${endpoint} ${shape}: the largest gap between /healthz answers, best of ${gaps.length}`
          )
            .toBeLessThan(MAX_GAP_MS)
        })
    )
  })
})
