import { expect, layer } from "@effect/vitest"
import { Effect, Layer, Option } from "effect"
import { caller, modelCall, TestServerWithUpstream } from "../../support/Models.js"
import { OtlpReceiver, type ReceivedSpan } from "../../support/OtlpReceiver.js"
import { parseSse } from "../../support/Sse.js"
import { query } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * The spans LLM observability tools read (OpenTelemetry's GenAI conventions),
 * exported over OTLP/HTTP to a collector on loopback, as Langfuse's or
 * Phoenix's would receive them: the call's span with what was asked, what
 * answered, the tokens and the cost; each upstream attempt a child span; never
 * the prompt or the answer.
 */

const server = Layer.unwrapEffect(
  Effect.map(OtlpReceiver, (receiver) => TestServerWithUpstream({ otlpEndpoint: Option.some(receiver.endpoint) }))
).pipe(Layer.provideMerge(OtlpReceiver.layer))

/** The call span of `requestId`, once the tracer's batch (every second) has reached the collector. */
const callSpanOf = (requestId: string) =>
  Effect.gen(function*() {
    const receiver = yield* OtlpReceiver
    for (let tries = 0; tries < 100; tries++) {
      const span = receiver.spans.find((s) =>
        s.name === "chat svc/nenas-flash" && s.attributes["nenas.request_id"] === requestId
      )
      if (span !== undefined) return span
      yield* Effect.sleep("100 millis")
    }
    return yield* Effect.dieMessage(
      `no call span for ${requestId} among ${receiver.spans.map((s) => s.name).join(", ")}`
    )
  })

/** The upstream attempts under a call's span (the provider's own span, `provider.complete`, sits between). */
const attemptsOf = (call: ReceivedSpan) =>
  Effect.map(OtlpReceiver, (receiver) => {
    const under = (span: ReceivedSpan): boolean => {
      const parent = receiver.spans.find((s) => s.spanId === span.parentSpanId && s.traceId === span.traceId)
      return parent !== undefined && (parent.spanId === call.spanId || under(parent))
    }
    return receiver.spans.filter((s) => s.attributes["nenas.attempt"] !== undefined && under(s))
  })

const logOf = (requestId: string) =>
  Effect.map(
    query<{ input_tokens: number; output_tokens: number; cost_micro_myr: string; routing_category: string }>(
      "SELECT input_tokens, output_tokens, cost_micro_myr, routing_category FROM request_logs WHERE request_id = $1",
      [requestId]
    ),
    (rows) => rows[0]
  )

/** Nothing the caller wrote or the model answered is in any export. */
const exportsNothingOf = (...texts: ReadonlyArray<string>) =>
  Effect.map(OtlpReceiver, (receiver) => {
    for (const text of texts) {
      expect(receiver.bodies.some((body) => body.includes(text)), `"${text}" was exported`).toBe(false)
    }
  })

layer(server, { excludeTestServices: true, timeout: 60_000 })("GenAI spans of model calls", (it) => {
  it.effect("a chat completion's span: request, response, usage and cost as logged; its upstream attempt a child span", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({
        kind: "ok",
        text: "Answer-kept-private-7731",
        usage: { prompt_tokens: 21, completion_tokens: 9 }
      })
      const { apiKey } = yield* caller("spans-chat@example.com", { sen: 1000 })
      const reply = yield* modelCall(apiKey, "/v1/chat/completions", {
        model: "svc/nenas-flash",
        messages: [{ role: "user", content: "Prompt-kept-private-5519" }],
        max_tokens: 64,
        temperature: 0.5
      })
      expect(reply.status, reply.text).toBe(200)
      const requestId = reply.headers.get("x-request-id") ?? ""
      const span = yield* callSpanOf(requestId)
      const log = yield* logOf(requestId)
      expect(span.attributes).toMatchObject({
        "gen_ai.operation.name": "chat",
        "gen_ai.system": "nenas",
        "gen_ai.request.model": "svc/nenas-flash",
        "gen_ai.request.max_tokens": 64,
        "gen_ai.request.temperature": 0.5,
        "gen_ai.response.model": "gpt-4.1-mini",
        "gen_ai.response.id": reply.body.id,
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.usage.input_tokens": 21,
        "gen_ai.usage.output_tokens": 9,
        "nenas.cost_micro_myr": Number(log?.cost_micro_myr),
        "nenas.routing.category": log?.routing_category,
        "nenas.endpoint": "/v1/chat/completions"
      })
      expect(log).toMatchObject({ input_tokens: 21, output_tokens: 9 })
      const attempts = yield* attemptsOf(span)
      expect(attempts.map((a) => [a.name, a.attributes["nenas.attempt.outcome"], a.attributes["gen_ai.request.model"]]))
        .toEqual([["chat gpt-4.1-mini", "ok", "gpt-4.1-mini"]])
      yield* exportsNothingOf("Prompt-kept-private-5519", "Answer-kept-private-7731")
    }))

  it.effect("a streamed Responses call's span ends with the stream, with its response id and usage", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({
        kind: "ok",
        text: "Streamed-private-answer",
        usage: { prompt_tokens: 12, completion_tokens: 5 }
      })
      const { apiKey } = yield* caller("spans-stream@example.com", { sen: 1000 })
      const reply = yield* modelCall(apiKey, "/v1/responses", {
        model: "svc/nenas-flash",
        input: "Streamed-private-prompt",
        stream: true
      })
      expect(reply.status, reply.text).toBe(200)
      const completed = parseSse(reply.text).find((event) => event.event === "response.completed")
      const response = JSON.parse(completed?.data ?? "{}").response
      const span = yield* callSpanOf(reply.headers.get("x-request-id") ?? "")
      expect(span.attributes).toMatchObject({
        "gen_ai.response.id": response.id,
        "gen_ai.response.model": "gpt-4.1-mini",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 5,
        "nenas.stream": true,
        "nenas.endpoint": "/v1/responses"
      })
      expect((yield* attemptsOf(span)).map((a) => a.name)).toEqual(["chat gpt-4.1-mini"])
      yield* exportsNothingOf("Streamed-private-prompt", "Streamed-private-answer")
    }))

  it.effect("a /v1/messages call's span: Anthropic's message id, the same usage and cost", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({
        kind: "ok",
        text: "Messages-private-answer",
        usage: { prompt_tokens: 15, completion_tokens: 4 }
      })
      const { apiKey } = yield* caller("spans-messages@example.com", { sen: 1000 })
      const reply = yield* modelCall(apiKey, "/v1/messages", {
        model: "svc/nenas-flash",
        max_tokens: 40,
        messages: [{ role: "user", content: "Messages-private-prompt" }]
      })
      expect(reply.status, reply.text).toBe(200)
      const requestId = reply.headers.get("x-request-id") ?? ""
      const span = yield* callSpanOf(requestId)
      expect(span.attributes).toMatchObject({
        "gen_ai.request.max_tokens": 40,
        "gen_ai.response.id": reply.body.id,
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.usage.input_tokens": 15,
        "gen_ai.usage.output_tokens": 4,
        "nenas.cost_micro_myr": Number((yield* logOf(requestId))?.cost_micro_myr),
        "nenas.endpoint": "/v1/messages"
      })
      expect(reply.body.id).toMatch(/^msg_/)
      expect((yield* attemptsOf(span)).map((a) => a.name)).toEqual(["chat gpt-4.1-mini"])
      yield* exportsNothingOf("Messages-private-prompt", "Messages-private-answer")
    }))

  it.effect("a refused call's span names the error; a failing upstream attempt is a child span that says how it failed", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour({ kind: "status", status: 500 })
      const { apiKey } = yield* caller("spans-failure@example.com", { sen: 1000 })
      const reply = yield* modelCall(apiKey, "/v1/chat/completions", {
        model: "svc/nenas-flash",
        messages: [{ role: "user", content: "hello" }]
      })
      expect(reply.status, reply.text).toBe(503)
      const receiver = yield* OtlpReceiver
      const requestId = reply.headers.get("x-request-id") ?? ""
      // A failed call has no result: its span is found by its failed attempt's parent.
      let span: ReceivedSpan | undefined
      for (let tries = 0; tries < 100 && span === undefined; tries++) {
        span = receiver.spans.find((s) =>
          s.name === "chat svc/nenas-flash" && s.attributes["error.type"] === reply.body.error.code
        )
        if (span === undefined) yield* Effect.sleep("100 millis")
      }
      expect(span, `a span for ${requestId}`).toBeDefined()
      const attempts = yield* attemptsOf(span!)
      // The same outcome the call's log row records for the attempt.
      const [row] = yield* query<{ attempts: ReadonlyArray<{ outcome: string }> }>(
        "SELECT attempts FROM request_logs WHERE request_id = $1",
        [requestId]
      )
      expect(row?.attempts.map((a) => a.outcome)).toEqual(["server_error"])
      expect(attempts.map((a) => a.attributes["nenas.attempt.outcome"])).toEqual(["server_error"])
    }))
})
