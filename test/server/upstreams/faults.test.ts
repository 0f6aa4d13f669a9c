import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { toMyrString } from "../../../src/Domain/Money.js"
import type { MicroMyr } from "../../../src/Domain/Money.js"
import { costOf, DEFAULT_PRICES, withSafetyMargin } from "../../../src/Domain/Prices.js"
import type { Message } from "../../../src/Domain/Tokens.js"
import { countMessages, countText } from "../../../src/Domain/Tokens.js"
import { MAX_OUTPUT_TOKENS, PUBLIC_MODEL } from "../../../src/Models/OpenAi/Api.js"
import type { Reply } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream, violations } from "../../support/Models.js"
import { readSse, type SseEvent, sseJson } from "../../support/Sse.js"
import { query, TestServer } from "../../support/TestServer.js"
import { Upstream } from "../../support/Upstream.js"

/**
 * Upstream faults, timeouts and client disconnects
 * (docs/api/errors.md, "Errors"; docs/money.md, "The money rules";
 * docs/money.md, "Request lifecycle and logs";
 * docs/api/models.md, "Model API details"): through real HTTP to the service
 * pointed at the local upstream double, with live keys. Every call ends with
 * its reservation resolved, its log row final, the ledger exact and the money
 * invariant holding.
 */

const CHAT = "/v1/chat/completions"
const RESPONSES = "/v1/responses"
type Path = typeof CHAT | typeof RESPONSES
const PATHS: ReadonlyArray<Path> = [CHAT, RESPONSES]
const short = (path: Path) => path === CHAT ? "chat" : "responses"

/** The general model: plain prompts without multi-step signs route there. */
const GENERAL = "gpt-4.1-mini"
const PROMPT = "Say hello to the team in a friendly way"
const MESSAGES: ReadonlyArray<Message> = [{ role: "user", content: PROMPT }]

const FIRST_BYTE_MS = 400
const TOTAL_MS = 2000

const bodyFor = (path: Path, stream: boolean): Record<string, unknown> =>
  path === CHAT
    ? { model: PUBLIC_MODEL, messages: MESSAGES, stream }
    : { model: PUBLIC_MODEL, input: PROMPT, stream }

/** What a plain call with no max tokens reserves (docs/money.md, "The money rules"). */
const RESERVATION = (() => {
  const input = countMessages(MESSAGES)
  return costOf(DEFAULT_PRICES, GENERAL, {
    inputTokens: withSafetyMargin(input),
    cachedTokens: 0,
    outputTokens: Math.min(MAX_OUTPUT_TOKENS, 1_000_000 - input),
    searches: 0,
    pages: 0
  })
})()

/** The price of `text` as an answer to MESSAGES, counted with the service's tokenizer. */
const estimatedCost = (text: string): MicroMyr =>
  costOf(DEFAULT_PRICES, GENERAL, {
    inputTokens: countMessages(MESSAGES),
    cachedTokens: 0,
    outputTokens: countText(text),
    searches: 0,
    pages: 0
  })

// ---------------------------------------------------------------------------
// The database's view of a call

interface WalletState {
  readonly available: number
  readonly reserved: number
}

const walletOf = (accountId: string) =>
  Effect.map(
    query<{ available_micro_myr: string; reserved_micro_myr: string }>(
      // What credit grants hold is available money to the developer (no call holds it).
      "SELECT available_micro_myr + granted_micro_myr AS available_micro_myr, reserved_micro_myr FROM wallets WHERE account_id = $1",
      [accountId]
    ),
    (rows): WalletState => ({
      available: Number(rows[0]?.available_micro_myr),
      reserved: Number(rows[0]?.reserved_micro_myr)
    })
  )

interface LogRow {
  readonly status: string
  readonly cost: number
  readonly errorCode: string | null
  readonly usageSource: string
  readonly inputTokens: number
  readonly outputTokens: number
  readonly endpoint: string
  readonly stream: boolean
  readonly reservationId: string | null
}

const logOf = (requestId: string) =>
  Effect.map(
    query<{
      status: string
      cost_micro_myr: string
      error_code: string | null
      usage_source: string
      input_tokens: number
      output_tokens: number
      endpoint: string
      stream: boolean
      reservation_id: string | null
    }>(
      `SELECT status, cost_micro_myr, error_code, usage_source, input_tokens, output_tokens, endpoint, stream, reservation_id
       FROM request_logs WHERE request_id = $1`,
      [requestId]
    ),
    (rows): LogRow | undefined => {
      const row = rows[0]
      return row === undefined ? undefined : {
        status: row.status,
        cost: Number(row.cost_micro_myr),
        errorCode: row.error_code,
        usageSource: row.usage_source,
        inputTokens: row.input_tokens,
        outputTokens: row.output_tokens,
        endpoint: row.endpoint,
        stream: row.stream,
        reservationId: row.reservation_id
      }
    }
  )

interface ReservationRow {
  readonly status: string
  readonly amount: number
  readonly captured: number | null
}

const reservationOf = (requestId: string) =>
  Effect.map(
    query<{ status: string; amount_micro_myr: string; captured_micro_myr: string | null }>(
      "SELECT status, amount_micro_myr, captured_micro_myr FROM reservations WHERE request_id = $1",
      [requestId]
    ),
    (rows): ReadonlyArray<ReservationRow> =>
      rows.map((row) => ({
        status: row.status,
        amount: Number(row.amount_micro_myr),
        captured: row.captured_micro_myr === null ? null : Number(row.captured_micro_myr)
      }))
  )

const openReservations = (accountId: string) =>
  Effect.map(
    query<{ n: string }>("SELECT count(*) AS n FROM reservations WHERE account_id = $1 AND status = 'open'", [
      accountId
    ]),
    (rows) => Number(rows[0]?.n)
  )

const usageEntries = (requestId: string) =>
  Effect.map(
    query<{ amount_micro_myr: string; account_id: string }>(
      "SELECT amount_micro_myr, account_id FROM ledger_entries WHERE type = 'usage' AND request_id = $1",
      [requestId]
    ),
    (rows) => rows.map((row) => ({ amount: Number(row.amount_micro_myr), accountId: row.account_id }))
  )

/** Polls until `done` holds for what `read` returns, for up to `ms`. */
const eventually = <A>(read: Effect.Effect<A, never, TestServer>, done: (a: A) => boolean, ms = 5000) =>
  Effect.gen(function*() {
    const until = Date.now() + ms
    let value = yield* read
    while (!done(value) && Date.now() < until) {
      yield* Effect.sleep("50 millis")
      value = yield* read
    }
    return value
  })

/** The call failed with `code`: its log `failed` at cost 0, its reservation released, no usage, the wallet as before. */
const expectNothingBilled = (
  name: string,
  accountId: string,
  requestId: string,
  code: string,
  before: WalletState
) =>
  Effect.gen(function*() {
    const log = yield* logOf(requestId)
    expect(log, `${name}: a log row for ${requestId}`).toBeDefined()
    expect(log?.status, `${name}: log status`).toBe("failed")
    expect(log?.cost, `${name}: log cost`).toBe(0)
    expect(log?.errorCode, `${name}: log error_code`).toBe(code)
    const reservations = yield* reservationOf(requestId)
    // Held by a reservation of its own (released now), or in memory from the instance's credit grant (no row).
    expect(reservations.map((r) => r.status), `${name}: the reservation`).toEqual(
      log?.reservationId === null ? [] : ["released"]
    )
    if (reservations.length > 0) expect(reservations[0]?.amount, `${name}: reserved amount`).toBe(RESERVATION)
    expect(yield* openReservations(accountId), `${name}: open reservations`).toBe(0)
    expect(yield* usageEntries(requestId), `${name}: usage ledger entries`).toEqual([])
    expect(yield* walletOf(accountId), `${name}: wallet`).toEqual({ available: before.available, reserved: 0 })
    expect(yield* violations(accountId), `${name}: invariant`).toEqual([])
  })

/**
 * The call was billed `cost` once: log `billed` with `source`, reservation captured, one usage entry, the wallet down by `cost`.
 * `errorCode`: a stream cut short after its output is billed with its error's code
 * (docs/money.md, "Request lifecycle and logs"), a whole answer without.
 */
const expectBilledOnce = (
  name: string,
  accountId: string,
  requestId: string,
  source: "provider" | "estimated",
  cost: number,
  before: WalletState,
  errorCode: string | null = null
) =>
  Effect.gen(function*() {
    expect(cost, `${name}: cost > 0`).toBeGreaterThan(0)
    const log = yield* logOf(requestId)
    expect(log?.status, `${name}: log status`).toBe("billed")
    expect(log?.usageSource, `${name}: usage_source`).toBe(source)
    expect(log?.cost, `${name}: log cost`).toBe(cost)
    expect(log?.errorCode, `${name}: error_code`).toBe(errorCode)
    const reservations = yield* reservationOf(requestId)
    expect(reservations, `${name}: the reservation`).toEqual(
      log?.reservationId === null ? [] : [{ status: "captured", amount: RESERVATION, captured: cost }]
    )
    expect(yield* openReservations(accountId), `${name}: open reservations`).toBe(0)
    expect(yield* usageEntries(requestId), `${name}: one usage entry`).toEqual([{ amount: -cost, accountId }])
    expect(yield* walletOf(accountId), `${name}: wallet`).toEqual({ available: before.available - cost, reserved: 0 })
    expect(yield* violations(accountId), `${name}: invariant`).toEqual([])
  })

// ---------------------------------------------------------------------------
// Errors on the wire

interface WireError {
  readonly message: string
  readonly type: string
  readonly code: string
  readonly param: string | null
  readonly request_id: string
  readonly guidance: string
  readonly retryable: boolean
  readonly retry_after_seconds?: number
}

const expectWireError = (
  name: string,
  error: WireError | undefined,
  expected: {
    readonly code: string
    readonly retryable: boolean
    readonly requestId: string
    readonly retryAfter?: number
  }
) => {
  expect(error, `${name}: an error object`).toBeDefined()
  expect(error?.code, `${name}: code`).toBe(expected.code)
  expect(error?.type, `${name}: type`).toBe(
    expected.code === "invalid_request" || expected.code === "context_length_exceeded"
      ? "invalid_request_error"
      : "provider_error"
  )
  expect(error?.retryable, `${name}: retryable`).toBe(expected.retryable)
  expect(error?.request_id, `${name}: request_id`).toBe(expected.requestId)
  expect(error?.param, `${name}: param`).toBeNull()
  expect(typeof error?.message === "string" && error.message.length > 0, `${name}: a message`).toBe(true)
  expect(typeof error?.guidance === "string" && error.guidance.length > 0, `${name}: guidance`).toBe(true)
  expect(error?.retry_after_seconds, `${name}: retry_after_seconds`).toBe(expected.retryAfter)
}

const STATUS_OF: Record<string, number> = {
  provider_unavailable: 503,
  provider_timeout: 504,
  invalid_request: 400,
  context_length_exceeded: 413
}

/** A non-streaming call answered with the spec's error body; returns the request id. */
const expectErrorReply = (
  name: string,
  reply: Reply,
  expected: { readonly code: string; readonly retryable: boolean; readonly retryAfter?: number }
): string => {
  expect(reply.status, `${name}: status (${reply.text})`).toBe(STATUS_OF[expected.code])
  expect(reply.headers.get("content-type") ?? "", `${name}: content-type`).toContain("application/json")
  expect(reply.body?.type, `${name}: body.type`).toBe("error")
  const requestId = reply.headers.get("x-request-id") ?? ""
  expect(requestId, `${name}: x-request-id`).toMatch(/^req_/)
  expectWireError(name, reply.body?.error, { ...expected, requestId })
  expect(reply.headers.get("retry-after"), `${name}: Retry-After header`).toBe(
    expected.retryAfter === undefined ? null : String(expected.retryAfter)
  )
  return requestId
}

// ---------------------------------------------------------------------------
// Streams

interface StreamReply {
  readonly status: number
  readonly headers: Headers
  readonly requestId: string
  readonly events: ReadonlyArray<SseEvent>
}

/**
 * A streamed call read with fetch. With `abortAfter`, the client reads until
 * that many events have arrived, then aborts: it has gone away.
 */
const streamCall = (
  apiKey: string,
  path: Path,
  json: unknown,
  abortAfter?: (events: ReadonlyArray<SseEvent>) => boolean
) =>
  Effect.gen(function*() {
    const { baseUrl } = yield* TestServer
    return yield* Effect.promise(async (): Promise<StreamReply> => {
      const controller = new AbortController()
      const timer = setTimeout(() => controller.abort(), 30_000)
      try {
        const response = await fetch(`${baseUrl}${path}`, {
          method: "POST",
          headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
          body: JSON.stringify(json),
          signal: controller.signal
        })
        const requestId = response.headers.get("x-request-id") ?? ""
        const events = await readSse(response, abortAfter)
        return { status: response.status, headers: response.headers, requestId, events }
      } finally {
        clearTimeout(timer)
        // The client goes away, if it has not read to the end.
        controller.abort()
      }
    })
  })

interface Usage {
  readonly prompt_tokens?: number
  readonly completion_tokens?: number
  readonly input_tokens?: number
  readonly output_tokens?: number
  readonly cost_myr?: string
}

interface ChatChunk {
  readonly object?: string
  readonly choices?: ReadonlyArray<
    { readonly delta?: { readonly content?: string }; readonly finish_reason?: string | null }
  >
  readonly usage?: Usage
  readonly cost_myr?: string
  readonly error?: WireError
}

interface ResponsesEvent {
  readonly type: string
  readonly sequence_number: number
  readonly delta?: string
  readonly response?: {
    readonly status: string
    readonly error?: WireError
    readonly usage?: Usage
    readonly output_text?: string
  }
}

const chatChunks = (events: ReadonlyArray<SseEvent>) => sseJson<ChatChunk>(events)

const responsesEvents = (events: ReadonlyArray<SseEvent>): Array<ResponsesEvent> =>
  events.map((e) => JSON.parse(e.data) as ResponsesEvent)

const deltaCount = (path: Path, events: ReadonlyArray<SseEvent>): number =>
  path === CHAT
    ? chatChunks(events).filter((c) =>
      c !== "[DONE]" && typeof c.choices?.[0]?.delta?.content === "string" && c.choices[0].delta.content.length > 0
    ).length
    : responsesEvents(events).filter((e) => e.type === "response.output_text.delta").length

const streamedText = (path: Path, events: ReadonlyArray<SseEvent>): string =>
  path === CHAT
    ? chatChunks(events).map((c) => c === "[DONE]" ? "" : c.choices?.[0]?.delta?.content ?? "").join("")
    : responsesEvents(events).map((e) => e.type === "response.output_text.delta" ? e.delta ?? "" : "").join("")

/**
 * A stream that ended with the error event of its format: chat, a last chunk
 * with a top-level `error` and no `[DONE]`; responses, `response.failed`.
 */
const expectStreamError = (
  name: string,
  path: Path,
  reply: StreamReply,
  expected: { readonly code: string; readonly retryable: boolean; readonly retryAfter?: number }
) => {
  expect(reply.status, `${name}: status (headers already sent)`).toBe(200)
  expect(reply.headers.get("content-type") ?? "", `${name}: content-type`).toContain("text/event-stream")
  expect(reply.requestId, `${name}: x-request-id`).toMatch(/^req_/)
  expect(reply.events.length, `${name}: events`).toBeGreaterThan(0)
  if (path === CHAT) {
    const chunks = chatChunks(reply.events)
    const last = chunks[chunks.length - 1]
    expect(last, `${name}: the stream ends with an error chunk, not [DONE]`).not.toBe("[DONE]")
    expect(chunks.filter((c) => c !== "[DONE]" && c.error !== undefined), `${name}: one error chunk`).toHaveLength(1)
    expect(chunks.some((c) => c !== "[DONE]" && c.usage !== undefined), `${name}: no usage chunk`).toBe(false)
    expectWireError(name, last === "[DONE]" ? undefined : last?.error, { ...expected, requestId: reply.requestId })
  } else {
    const events = responsesEvents(reply.events)
    const last = events[events.length - 1]
    expect(events.map((e) => e.sequence_number), `${name}: sequence numbers`).toEqual(events.map((_, i) => i))
    expect(last?.type, `${name}: the last event`).toBe("response.failed")
    expect(reply.events[reply.events.length - 1]?.event, `${name}: the SSE event name`).toBe("response.failed")
    expect(events.some((e) => e.type === "response.completed"), `${name}: no response.completed`).toBe(false)
    expect(last?.response?.status, `${name}: response.status`).toBe("failed")
    expectWireError(name, last?.response?.error, { ...expected, requestId: reply.requestId })
  }
}

/**
 * Every endpoint, plain (`false`) and streamed (`true`) as `streams` lists,
 * answers the HTTP error `expected` (a refusal before the first byte) and
 * bills nothing; with `upstream`, each call made exactly one upstream request.
 */
const expectRefusals = (
  accountId: string,
  apiKey: string,
  streams: ReadonlyArray<boolean>,
  expected: { readonly code: string; readonly retryable: boolean; readonly retryAfter?: number },
  upstream?: Upstream["Type"]
) =>
  Effect.gen(function*() {
    for (const stream of streams) {
      for (const path of PATHS) {
        const name = `${short(path)}, ${stream ? "streamed" : "not streamed"}`
        const before = yield* walletOf(accountId)
        const sent = upstream?.requests.length ?? 0
        const reply = yield* modelCall(apiKey, path, bodyFor(path, stream))
        const requestId = expectErrorReply(name, reply, expected)
        if (upstream !== undefined) expect(upstream.requests.length - sent, `${name}: one upstream request`).toBe(1)
        yield* expectNothingBilled(name, accountId, requestId, expected.code, before)
      }
    }
  })

// ---------------------------------------------------------------------------

layer(TestServerWithUpstream({ upstreamFirstByteTimeoutMs: FIRST_BYTE_MS, upstreamTotalTimeoutMs: TOTAL_MS }), {
  excludeTestServices: true
})("upstream faults", (it) => {
  /** A refusal from the upstream, through both endpoints, streaming and not. */
  const refusalCase = (
    email: string,
    behaviour: Parameters<Upstream["Type"]["setBehaviour"]>[0],
    expected: { readonly code: string; readonly retryable: boolean; readonly retryAfter?: number }
  ) =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      upstream.reset()
      upstream.setBehaviour(behaviour)
      const { accountId, apiKey } = yield* caller(email, { sen: 1000 })
      // The upstream refused before the first byte went out: a streamed call gets the HTTP error too, as from OpenAI.
      yield* expectRefusals(accountId, apiKey, [false, true], expected, upstream)
    })

  describe("upstream refusals", () => {
    it.effect("an upstream 500 answers 503 provider_unavailable, retryable; nothing is billed", () =>
      refusalCase("faults-500@example.com", { kind: "status", status: 500 }, {
        code: "provider_unavailable",
        retryable: true
      }))

    it.effect("an upstream 429 with retry-after: 7 answers 503 provider_unavailable with retry_after_seconds 7 and Retry-After: 7", () =>
      refusalCase(
        "faults-429@example.com",
        { kind: "status", status: 429, retryAfter: "7" },
        { code: "provider_unavailable", retryable: true, retryAfter: 7 }
      ))

    it.effect("an upstream 400 is the caller's: 400 invalid_request with the upstream's message; nothing is billed", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const said = "Invalid schema for function 'get_weather': 'object' is not valid under any of the given schemas."
        upstream.setBehaviour({
          kind: "status",
          status: 400,
          body: { error: { message: said, type: "invalid_request_error" } }
        })
        const { accountId, apiKey } = yield* caller("faults-400@example.com", { sen: 1000 })
        yield* expectRefusals(accountId, apiKey, [false, true], { code: "invalid_request", retryable: false }, upstream)
        const reply = yield* modelCall(apiKey, CHAT, bodyFor(CHAT, false))
        expect(reply.body.error.message, "the upstream's words").toContain(said)
      }))

    it.effect("an upstream 400 that says the context is too long answers 413 context_length_exceeded; nothing is billed", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({
          kind: "status",
          status: 400,
          body: {
            error: {
              message: "This model's maximum context length is 128000 tokens.",
              type: "invalid_request_error",
              code: "context_length_exceeded"
            }
          }
        })
        const { accountId, apiKey } = yield* caller("faults-400-context@example.com", { sen: 1000 })
        yield* expectRefusals(
          accountId,
          apiKey,
          [false, true],
          { code: "context_length_exceeded", retryable: false },
          upstream
        )
      }))

    it.effect("an upstream 401 or 403 (our credentials) answers 503 provider_unavailable, retryable; nothing is billed", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        const { accountId, apiKey } = yield* caller("faults-401@example.com", { sen: 1000 })
        for (const status of [401, 403]) {
          upstream.reset()
          upstream.setBehaviour({
            kind: "status",
            status,
            body: { error: { message: "Incorrect API key provided", type: "invalid_request_error" } }
          })
          yield* expectRefusals(
            accountId,
            apiKey,
            [false, true],
            { code: "provider_unavailable", retryable: true },
            upstream
          )
          const reply = yield* modelCall(apiKey, CHAT, bodyFor(CHAT, false))
          expect(reply.body.error.message, "the upstream's key problem is not the caller's to read").not.toContain(
            "API key"
          )
        }
      }))

    it.effect("an upstream 200 whose body is not JSON (or not an event stream) answers provider_unavailable; nothing is billed", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({ kind: "status", status: 200, body: "not json" })
        const { accountId, apiKey } = yield* caller("faults-not-json@example.com", { sen: 1000 })
        // Streamed, it is not an event stream at all: it must not pass for an empty answer.
        yield* expectRefusals(accountId, apiKey, [false, true], { code: "provider_unavailable", retryable: true })
      }))

    it.effect("a non-streaming answer cut off halfway answers 503 provider_unavailable; nothing is billed", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({ kind: "resetMidStream" })
        const { accountId, apiKey } = yield* caller("faults-half-json@example.com", { sen: 1000 })
        yield* expectRefusals(accountId, apiKey, [false], { code: "provider_unavailable", retryable: true })
      }))
  })

  describe("timeouts", () => {
    it.effect("an upstream that never answers: 504 provider_timeout, retryable; nothing is billed", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({ kind: "hang" })
        const { accountId, apiKey } = yield* caller("faults-hang@example.com", { sen: 1000 })
        // Streamed: no first byte from the upstream, none to the client, so the HTTP error.
        yield* expectRefusals(accountId, apiKey, [false, true], { code: "provider_timeout", retryable: true })
      }))

    it.effect("a stream that stops after its first chunk: an error event with provider_timeout after the total timeout; the chunk is billed (estimated), the log billed with error_code provider_timeout", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({ kind: "hangAfterFirstChunk" })
        const { accountId, apiKey } = yield* caller("faults-hang-after-first@example.com", { sen: 1000 })
        for (const path of PATHS) {
          const name = `${short(path)}, streamed`
          const before = yield* walletOf(accountId)
          const reply = yield* streamCall(apiKey, path, bodyFor(path, true))
          expectStreamError(name, path, reply, { code: "provider_timeout", retryable: true })
          // The first content chunk got through before the silence.
          expect(deltaCount(path, reply.events), `${name}: the first chunk's text`).toBe(1)
          // What the upstream produced before it went silent was paid for upstream: billed as produced, not 0.
          const produced = streamedText(path, reply.events)
          expect(produced, `${name}: the first chunk`).toBe(`Upstream answer to: ${PROMPT}`.slice(0, 8))
          yield* expectBilledOnce(
            name,
            accountId,
            reply.requestId,
            "estimated",
            estimatedCost(produced),
            before,
            "provider_timeout"
          )
        }
        // Not streamed: headers, then silence until the total timeout.
        yield* expectRefusals(accountId, apiKey, [false], { code: "provider_timeout", retryable: true })
      }))
  })

  describe("connection resets", () => {
    it.effect("a connection reset before any byte is retried once: 200, two upstream requests, billed once", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        const { accountId, apiKey } = yield* caller("faults-reset-once@example.com", { sen: 1000 })
        for (const path of PATHS) {
          for (const stream of [false, true]) {
            const name = `${short(path)}, ${stream ? "streamed" : "not streamed"}`
            upstream.reset()
            upstream.setBehaviour({ kind: "resetBeforeResponse", times: 1 })
            const before = yield* walletOf(accountId)
            let requestId: string
            let cost: number
            if (stream) {
              const reply = yield* streamCall(apiKey, path, bodyFor(path, true))
              expect(reply.status, name).toBe(200)
              requestId = reply.requestId
              if (path === CHAT) {
                const chunks = chatChunks(reply.events)
                expect(chunks[chunks.length - 1], `${name}: [DONE]`).toBe("[DONE]")
                const usage = chunks.find((c) => c !== "[DONE]" && c.usage !== undefined)
                cost = Number((usage === "[DONE]" ? undefined : usage?.cost_myr) ?? NaN) * 1_000_000
              } else {
                const events = responsesEvents(reply.events)
                const last = events[events.length - 1]
                expect(last?.type, `${name}: response.completed`).toBe("response.completed")
                cost = Number(last?.response?.usage?.cost_myr ?? NaN) * 1_000_000
              }
            } else {
              const reply = yield* modelCall(apiKey, path, bodyFor(path, false))
              expect(reply.status, `${name}: ${reply.text}`).toBe(200)
              requestId = reply.headers.get("x-request-id") ?? ""
              cost = Number(path === CHAT ? reply.body.cost_myr : reply.body.usage.cost_myr) * 1_000_000
            }
            cost = Math.round(cost)
            expect(upstream.requests, `${name}: the first attempt and its retry`).toHaveLength(2)
            expect(upstream.requests[1]?.body, `${name}: the retry is the same request`).toEqual(
              upstream.requests[0]?.body
            )
            yield* expectBilledOnce(name, accountId, requestId, "provider", cost, before)
          }
        }
      }))

    it.effect("two resets before any byte: 503 provider_unavailable after exactly one retry, streamed or not; nothing is billed", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        const { accountId, apiKey } = yield* caller("faults-reset-twice@example.com", { sen: 1000 })
        for (const path of PATHS) {
          for (const stream of [false, true]) {
            const name = `${short(path)}, ${stream ? "streamed" : "not streamed"}`
            upstream.reset()
            upstream.setBehaviour({ kind: "resetBeforeResponse", times: 2 })
            const before = yield* walletOf(accountId)
            const reply = yield* modelCall(apiKey, path, bodyFor(path, stream))
            const requestId = expectErrorReply(name, reply, { code: "provider_unavailable", retryable: true })
            expect(upstream.requests, `${name}: one attempt and one retry`).toHaveLength(2)
            yield* expectNothingBilled(name, accountId, requestId, "provider_unavailable", before)
          }
        }
      }))

    it.effect("a stream reset after 3 chunks: 200, an error event with provider_unavailable; billed for the three chunks (estimated), the log billed with error_code provider_unavailable", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        upstream.setBehaviour({ kind: "resetMidStream", afterChunks: 3 })
        const { accountId, apiKey } = yield* caller("faults-reset-mid-stream@example.com", { sen: 1000 })
        for (const path of PATHS) {
          const name = `${short(path)}, streamed`
          const before = yield* walletOf(accountId)
          const sent = upstream.requests.length
          const reply = yield* streamCall(apiKey, path, bodyFor(path, true))
          expectStreamError(name, path, reply, { code: "provider_unavailable", retryable: true })
          // Text that arrived before the reset is not retried: one request.
          expect(upstream.requests.length - sent, `${name}: one upstream request`).toBe(1)
          expect(deltaCount(path, reply.events), `${name}: the three chunks got through`).toBe(3)
          const produced = streamedText(path, reply.events)
          expect(produced, `${name}: their text`).toBe(`Upstream answer to: ${PROMPT}`.slice(0, 24))
          yield* expectBilledOnce(
            name,
            accountId,
            reply.requestId,
            "estimated",
            estimatedCost(produced),
            before,
            "provider_unavailable"
          )
        }
      }))
  })

  describe("streamed billing", () => {
    it.effect("usage sent after the finish chunk, chunks 30 ms apart: billed exactly the upstream's usage, reasoning tokens included", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const usage = { prompt_tokens: 5000, completion_tokens: 3000, reasoning_tokens: 2500, cached_tokens: 0 }
        upstream.setBehaviour({ kind: "ok", text: "Hello team, have a good day.", usage, chunkDelayMs: 30 })
        const { accountId, apiKey } = yield* caller("faults-stream-usage@example.com", { sen: 1000 })
        const expected = costOf(DEFAULT_PRICES, GENERAL, {
          inputTokens: 5000,
          cachedTokens: 0,
          outputTokens: 3000,
          searches: 0,
          pages: 0
        })
        for (const path of PATHS) {
          const name = `${short(path)}, streamed`
          const before = yield* walletOf(accountId)
          const reply = yield* streamCall(apiKey, path, bodyFor(path, true))
          expect(reply.status, name).toBe(200)
          if (path === CHAT) {
            const chunks = chatChunks(reply.events)
            const last = chunks.filter((c) => c !== "[DONE]" && c.usage !== undefined)[0]
            expect(last === "[DONE]" ? undefined : last?.usage, `${name}: usage`).toMatchObject({
              prompt_tokens: 5000,
              completion_tokens: 3000,
              reasoning_tokens: 2500
            })
          } else {
            const events = responsesEvents(reply.events)
            expect(events[events.length - 1]?.response?.usage, `${name}: usage`).toMatchObject({
              input_tokens: 5000,
              output_tokens: 3000,
              reasoning_tokens: 2500
            })
          }
          yield* expectBilledOnce(name, accountId, reply.requestId, "provider", expected, before)
          const rows = yield* query<{ reasoning_tokens: number; output_tokens: number; input_tokens: number }>(
            "SELECT input_tokens, output_tokens, reasoning_tokens FROM request_logs WHERE request_id = $1",
            [reply.requestId]
          )
          expect(rows[0], `${name}: logged usage`).toEqual({
            input_tokens: 5000,
            output_tokens: 3000,
            reasoning_tokens: 2500
          })
        }
      }))
  })

  describe("no usage from the upstream", () => {
    it.effect("an answer without usage is billed as estimated: the tokenizer's count of the input and of the text", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        upstream.reset()
        const text = "Hello team! Wishing you all a wonderful and productive day ahead."
        upstream.setBehaviour({ kind: "ok", text, usage: "none" })
        const { accountId, apiKey } = yield* caller("faults-no-usage@example.com", { sen: 1000 })
        const expected = estimatedCost(text)
        expect(expected).toBeGreaterThan(0)
        const inputTokens = countMessages(MESSAGES)
        const outputTokens = countText(text)
        for (const path of PATHS) {
          for (const stream of [false, true]) {
            const name = `${short(path)}, ${stream ? "streamed" : "not streamed"}`
            const before = yield* walletOf(accountId)
            let requestId: string
            if (stream) {
              const reply = yield* streamCall(apiKey, path, bodyFor(path, true))
              expect(reply.status, name).toBe(200)
              requestId = reply.requestId
              expect(streamedText(path, reply.events), `${name}: text`).toBe(text)
              if (path === CHAT) {
                const chunks = chatChunks(reply.events)
                expect(chunks[chunks.length - 1], `${name}: [DONE]`).toBe("[DONE]")
                const usageChunks = chunks.filter((c) => c !== "[DONE]" && c.usage !== undefined)
                expect(usageChunks, `${name}: the usage chunk is still sent`).toHaveLength(1)
                const usageChunk = usageChunks[0] === "[DONE]" ? undefined : usageChunks[0]
                expect(usageChunk?.choices, `${name}: usage chunk choices`).toEqual([])
                expect(usageChunk?.cost_myr, `${name}: cost_myr`).toBe(toMyrString(expected))
                expect(usageChunk?.usage?.prompt_tokens, `${name}: prompt_tokens`).toBe(inputTokens)
                expect(usageChunk?.usage?.completion_tokens, `${name}: completion_tokens`).toBe(outputTokens)
              } else {
                const events = responsesEvents(reply.events)
                const last = events[events.length - 1]
                expect(last?.type, `${name}: response.completed`).toBe("response.completed")
                expect(last?.response?.usage?.cost_myr, `${name}: cost_myr`).toBe(toMyrString(expected))
                expect(last?.response?.usage?.input_tokens, `${name}: input_tokens`).toBe(inputTokens)
                expect(last?.response?.usage?.output_tokens, `${name}: output_tokens`).toBe(outputTokens)
              }
            } else {
              const reply = yield* modelCall(apiKey, path, bodyFor(path, false))
              expect(reply.status, `${name}: ${reply.text}`).toBe(200)
              requestId = reply.headers.get("x-request-id") ?? ""
              if (path === CHAT) {
                expect(reply.body.choices[0].message.content, `${name}: text`).toBe(text)
                expect(reply.body.cost_myr, `${name}: cost_myr`).toBe(toMyrString(expected))
                expect(reply.body.usage.prompt_tokens, `${name}: prompt_tokens`).toBe(inputTokens)
                expect(reply.body.usage.completion_tokens, `${name}: completion_tokens`).toBe(outputTokens)
              } else {
                expect(reply.body.output_text, `${name}: text`).toBe(text)
                expect(reply.body.usage.cost_myr, `${name}: cost_myr`).toBe(toMyrString(expected))
                expect(reply.body.usage.input_tokens, `${name}: input_tokens`).toBe(inputTokens)
                expect(reply.body.usage.output_tokens, `${name}: output_tokens`).toBe(outputTokens)
              }
            }
            const log = yield* logOf(requestId)
            expect(log?.inputTokens, `${name}: logged input tokens`).toBe(inputTokens)
            expect(log?.outputTokens, `${name}: logged output tokens`).toBe(outputTokens)
            yield* expectBilledOnce(name, accountId, requestId, "estimated", expected, before)
          }
        }
      }))
  })

  describe("client disconnects", () => {
    const LONG_TEXT = Array.from({ length: 60 }, (_, i) => `Sentence number ${i + 1} of a long answer.`).join(" ")

    it.effect("a client gone mid-stream is billed once for what was produced (estimated), within the reservation", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        const { accountId, apiKey } = yield* caller("faults-disconnect-stream@example.com", { sen: 1000 })
        for (const path of PATHS) {
          const name = `${short(path)}, streamed`
          upstream.reset()
          upstream.setBehaviour({ kind: "ok", text: LONG_TEXT, chunkDelayMs: 100 })
          const before = yield* walletOf(accountId)
          const reply = yield* streamCall(apiKey, path, bodyFor(path, true), (events) => deltaCount(path, events) >= 3)
          expect(reply.status, name).toBe(200)
          expect(reply.requestId, `${name}: x-request-id`).toMatch(/^req_/)
          const log = yield* eventually(logOf(reply.requestId), (row) => row !== undefined && row.status !== "pending")
          expect(log?.status, `${name}: log status`).toBe("billed")
          expect(log?.usageSource, `${name}: usage_source`).toBe("estimated")
          const cost = log?.cost ?? 0
          expect(cost, `${name}: cost > 0`).toBeGreaterThan(0)
          expect(cost, `${name}: cost within the reservation`).toBeLessThanOrEqual(RESERVATION)
          // Billed for the input and the text produced before the client left, not for the whole answer.
          expect(log?.inputTokens, `${name}: input tokens`).toBe(countMessages(MESSAGES))
          const outputTokens = log?.outputTokens ?? 0
          expect(outputTokens, `${name}: some output`).toBeGreaterThan(0)
          expect(outputTokens, `${name}: less than the whole answer`).toBeLessThan(countText(LONG_TEXT))
          expect(cost, `${name}: the price of the logged tokens`).toBe(costOf(DEFAULT_PRICES, GENERAL, {
            inputTokens: countMessages(MESSAGES),
            cachedTokens: 0,
            outputTokens,
            searches: 0,
            pages: 0
          }))
          yield* expectBilledOnce(name, accountId, reply.requestId, "estimated", cost, before)
          expect(upstream.requests, `${name}: one upstream request`).toHaveLength(1)
        }
      }))

    it.effect("a client gone during a non-streaming call: the reservation ends resolved, charged at most once", () =>
      Effect.gen(function*() {
        const upstream = yield* Upstream
        const { baseUrl } = yield* TestServer
        const { accountId, apiKey } = yield* caller("faults-disconnect-complete@example.com", { sen: 1000 })
        for (const path of PATHS) {
          const name = `${short(path)}, not streamed`
          upstream.reset()
          upstream.setBehaviour({ kind: "ok", text: "A late answer.", delayMs: 1500 })
          const before = yield* walletOf(accountId)
          const outcome = yield* Effect.promise(async () => {
            const controller = new AbortController()
            const timer = setTimeout(() => controller.abort(), 200)
            try {
              const response = await fetch(`${baseUrl}${path}`, {
                method: "POST",
                headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
                body: JSON.stringify(bodyFor(path, false)),
                signal: controller.signal
              })
              return `answered ${response.status}`
            } catch (error) {
              return error instanceof Error ? error.name : "failed"
            } finally {
              clearTimeout(timer)
            }
          })
          expect(outcome, `${name}: the client aborted before any answer`).toBe("AbortError")
          // The request id was never seen by the client: find the call by its account.
          const rows = yield* eventually(
            query<{ request_id: string; status: string }>(
              "SELECT request_id, status FROM request_logs WHERE account_id = $1 AND endpoint = $2 ORDER BY created_at",
              [accountId, path]
            ),
            (found) => found.length === 1 && found[0]?.status !== "pending"
          )
          expect(rows, `${name}: one log row`).toHaveLength(1)
          const requestId = rows[0]?.request_id ?? ""
          expect(yield* eventually(openReservations(accountId), (n) => n === 0), `${name}: no open reservation`).toBe(0)
          const log = yield* logOf(requestId)
          const reservations = yield* reservationOf(requestId)
          const entries = yield* usageEntries(requestId)
          expect(reservations, `${name}: one reservation`).toHaveLength(1)
          expect(entries.length, `${name}: at most one usage entry`).toBeLessThanOrEqual(1)
          // What the service does: the upstream had started, so the input is billed as estimated.
          expect(log?.status, `${name}: log status`).toBe("billed")
          expect(log?.usageSource, `${name}: usage_source`).toBe("estimated")
          expect(log?.outputTokens, `${name}: no output was produced`).toBe(0)
          expect(log?.inputTokens, `${name}: input tokens`).toBe(countMessages(MESSAGES))
          const cost = estimatedCost("")
          expect(log?.cost, `${name}: the input's price`).toBe(cost)
          yield* expectBilledOnce(name, accountId, requestId, "estimated", cost, before)
        }
      }))
  })
})
