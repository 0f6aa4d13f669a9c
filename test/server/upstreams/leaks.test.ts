import { describe, expect, it, layer } from "@effect/vitest"
import { Effect, Logger, Option } from "effect"
import { PUBLIC_MODEL } from "../../../src/Models/OpenAi/Api.js"
import { cleanUpstreamText } from "../../../src/Providers/CleanText.js"
import { makeOpenAiCompatible } from "../../../src/Providers/OpenAiCompatible.js"
import { booksOf } from "../../support/Books.js"
import { caller, modelCall, TestServerWithUpstream } from "../../support/Models.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * What an upstream says when it refuses reaches the caller cleaned: no URL, address, host name, path or
 * credential; the operator's log keeps the whole text.
 */

const SAID = "backend https://internal.example:8443/v1?api_key=sk-123 refused; replica 10.0.0.5 at db.corp.internal " +
  "wrote /var/lib/x (Bearer abcdef123456, token=tok_secret, fe80::1, [::ffff:127.0.0.1])"
const SECRETS = [
  "internal.example",
  "8443",
  "api_key",
  "sk-123",
  "10.0.0.5",
  "db.corp.internal",
  "/var/lib/x",
  "abcdef123456",
  "tok_secret",
  "fe80::1",
  "127.0.0.1"
]
const naming = (text: string) => SECRETS.filter((secret) => text.includes(secret))

const PROMPT = "Say hello"
const bodies: ReadonlyArray<readonly [string, (stream: boolean) => Record<string, unknown>]> = [
  [
    "/v1/chat/completions",
    (stream) => ({ model: PUBLIC_MODEL, messages: [{ role: "user", content: PROMPT }], stream })
  ],
  ["/v1/responses", (stream) => ({ model: PUBLIC_MODEL, input: PROMPT, stream })],
  [
    "/v1/messages",
    (stream) => ({ model: PUBLIC_MODEL, max_tokens: 64, messages: [{ role: "user", content: PROMPT }], stream })
  ]
]

describe("the cleaning", () => {
  layer(TestServerWithUpstream(), { timeout: 90_000 })("upstream refusals through the real server", (it) => {
    it.effect("a 400 or 500 naming hosts, addresses, paths and keys reaches no caller with them, on every endpoint, plain and streamed", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        const { apiKey } = yield* caller("leaks-refusal@example.com", { sen: 1000 })
        for (const status of [400, 500]) {
          upstream.reset()
          upstream.setBehaviour({
            kind: "status",
            status,
            body: { error: { message: SAID, type: "invalid_request_error" } }
          })
          for (const [path, body] of bodies) {
            for (const stream of [false, true]) {
              const reply = yield* modelCall(apiKey, path, body(stream))
              const name = `${status} ${path} stream=${stream}`
              expect(reply.status, `${name}: ${reply.text}`).toBe(status === 400 ? 400 : 503)
              expect(naming(reply.text), `${name}: ${reply.text}`).toEqual([])
              if (status === 400) expect(reply.text, name).toContain("refused")
              const requestId = reply.headers.get("x-request-id")
              expect(requestId, name).not.toBeNull()
              const books = yield* booksOf(requestId ?? "")
              expect(books.log.status, name).toBe("failed")
              expect(books.ledger, name).toEqual([])
              expect(books.hold.map((hold) => hold.status), name).toEqual(books.hold.length === 0 ? [] : ["released"])
            }
          }
        }
      }))
  })

  layer(TestServerWithUpstream(), { timeout: 60_000 })("the operator's log", (it) => {
    it.effect("keeps the upstream's whole text for a refusal", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({ kind: "status", status: 400, body: { error: { message: SAID } } })
        const lines: Array<string> = []
        const logger = Logger.make(({ message }) =>
          void lines.push(String(Array.isArray(message) ? message.join(" ") : message))
        )
        const client = yield* makeOpenAiCompatible({
          baseUrl: upstream.baseUrl,
          apiKey: Option.none(),
          firstByteTimeoutMs: 5_000,
          totalTimeoutMs: 10_000
        })
        const failed = yield* Effect.flip(client.complete({
          model: "gpt-test",
          messages: [{ role: "user", content: "hello" }],
          maxOutputTokens: 16,
          reasoningEffort: undefined,
          reasoningModel: false
        })).pipe(Effect.provide(Logger.replace(Logger.defaultLogger, logger)))
        expect(naming(failed.message)).toEqual([])
        expect(lines.join("\n")).toContain("https://internal.example:8443/v1?api_key=sk-123")
        expect(lines.join("\n")).toContain("/var/lib/x")
      }))
  })

  it("keeps the words a caller needs to fix a request: parameter names, model names, versions and times", () => {
    const said =
      "Invalid value for 'messages[0].content': tools.function.parameters must be an object; gpt-4.1-mini at 12:30:45, v1.2"
    expect(cleanUpstreamText(said)).toBe(said)
    expect(naming(cleanUpstreamText(SAID))).toEqual([])
    expect(cleanUpstreamText("x".repeat(1000)).length).toBeLessThanOrEqual(300)
  })
})
