import { describe, expect, it } from "@effect/vitest"
import { Chunk, Effect, Either, Logger, LogLevel, Option, Redacted, Stream } from "effect"
import { createServer, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { errorMeta, InvalidRequest, ProviderTimeout, ProviderUnavailable } from "../../src/Domain/Errors.js"
import type { ProviderKeyMode, ProviderKeyOutcome, ResolvedProviderKey } from "../../src/ProviderKeys/ProviderKeys.js"
import { OWN_KEY_BREAKER_PREFIX } from "../../src/Providers/BreakerTypes.js"
import { type Attempted, makeAttempts } from "../../src/Providers/Fallback.js"
import { keyTarget, makeOwnKeys, orderOf } from "../../src/Providers/OwnKeys.js"
import type {
  AttemptOutcome,
  ProviderError,
  ProviderRequest,
  ProviderShape,
  StreamPart,
  UpstreamAttempt
} from "../../src/Providers/Provider.js"
import { Provider, Script } from "../../src/Providers/Provider.js"
import { makeTestBreakers } from "../support/Breakers.js"

/**
 * The routing of a team's own provider keys around nenas's provider (src/Providers/OwnKeys.ts;
 * docs/api/provider-keys.md, "Routing") as one table of decisions: the account's keys (mode, and how each key's
 * provider answers), how nenas's upstreams answer, and what follows: who answered or the call's error, who was
 * asked in which order, and what each key's status was set to. Each key's provider is a stand-in on 127.0.0.1
 * reached by the real OpenAI-compatible client; nenas's provider is scripted. No database.
 */

// --- The account's keys and their providers ---

/** How a key's provider answers: the call, a status, nothing at all, or an answer that breaks off after its head. */
type KeyAnswers = "ok" | 400 | 401 | 403 | 404 | 503 | "hang" | "cut"

type KeyId = `k${number}`

interface KeySpec {
  readonly id: KeyId
  readonly mode: ProviderKeyMode
  readonly answers: KeyAnswers
  /** Whether the key names an embedding model (`models.embedding`); by default it does not, as on the API. */
  readonly embeds: boolean
}

const key = (
  id: KeyId,
  mode: ProviderKeyMode,
  answers: KeyAnswers,
  options: { readonly embeds?: boolean } = {}
): KeySpec => ({ id, mode, answers, embeds: options.embeds === true })

/** What a provider (a key's, or nenas's) was sent, in the order calls arrived across all of them. */
interface Received {
  readonly who: string
  readonly path: string
  readonly model: unknown
  readonly authorization: string | undefined
}

/** Each answerer's words, so that an answer tells who gave it. */
const answerText = (who: string) => `answer from ${who}`
const whoSaid = (text: string) => text.replace(/^answer from /, "")

/** Each answerer's one embedding: `[0, …]` nenas's, `[n, …]` key `kn`'s. */
const vectorOf = (who: string): ReadonlyArray<number> => [who === "nenas" ? 0 : Number(who.slice(1)), 0.5]
const whoEmbedded = (vector: ReadonlyArray<number> | undefined) => vector?.[0] === 0 ? "nenas" : `k${vector?.[0]}`

const json = (response: ServerResponse, status: number, body: unknown) =>
  response.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body))

const completionBody = (who: string, model: unknown) => ({
  id: `chatcmpl-${who}`,
  object: "chat.completion",
  created: 0,
  model,
  choices: [{ index: 0, message: { role: "assistant", content: answerText(who) }, finish_reason: "stop" }],
  usage: { prompt_tokens: 5, completion_tokens: 3 }
})

/** OpenAI's stream of the same answer: role, two content chunks, the finish, the usage chunk, `[DONE]`. */
const streamEvents = (who: string, model: unknown) => {
  const chunk = (delta: Record<string, unknown>, finish: string | null) => ({
    id: `chatcmpl-${who}`,
    object: "chat.completion.chunk",
    created: 0,
    model,
    choices: [{ index: 0, delta, finish_reason: finish }]
  })
  return [
    chunk({ role: "assistant", content: "" }, null),
    chunk({ content: "answer " }, null),
    chunk({ content: `from ${who}` }, null),
    chunk({}, "stop"),
    {
      id: `chatcmpl-${who}`,
      object: "chat.completion.chunk",
      created: 0,
      model,
      choices: [],
      usage: completionBody(who, model).usage
    }
  ].map((event) => `data: ${JSON.stringify(event)}\n\n`)
}

/** Answers one request to a key's provider as `answers` says. */
const reply = (
  response: ServerResponse,
  who: string,
  answers: KeyAnswers,
  body: Record<string, unknown>,
  path: string
) => {
  switch (answers) {
    case "hang":
      return // the server's close ends it
    case 400:
      return json(response, 400, { error: { message: "temperature is out of range", code: null } })
    case 401:
    case 403:
      return json(response, answers, { error: { message: "Incorrect API key provided", code: "invalid_api_key" } })
    case 404:
      return json(response, 404, { error: { message: "The model `g-k1` does not exist", code: "model_not_found" } })
    case 503:
      return json(response, 503, { error: { message: "overloaded" } })
  }
  if (path === "/v1/embeddings") {
    return json(response, 200, {
      object: "list",
      data: [{ object: "embedding", index: 0, embedding: vectorOf(who) }],
      usage: { prompt_tokens: 2 }
    })
  }
  if (body["stream"] !== true) {
    const whole = JSON.stringify(completionBody(who, body["model"]))
    if (answers === "ok") return json(response, 200, completionBody(who, body["model"]))
    // "cut": the head and half the body, then the connection is lost.
    response.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(whole) })
    return response.write(whole.slice(0, whole.length / 2), () => response.socket?.destroy())
  }
  const events = streamEvents(who, body["model"])
  response.writeHead(200, { "content-type": "text/event-stream" })
  if (answers === "cut") return response.write(events.slice(0, 2).join(""), () => response.socket?.destroy())
  for (const event of events) response.write(event)
  response.end("data: [DONE]\n\n")
}

/** A key's provider on 127.0.0.1 (its base URL), recording each request in `journal`; closed with the scope. */
const keyProvider = (spec: KeySpec, journal: Array<Received>) =>
  Effect.acquireRelease(
    Effect.async<{ readonly baseUrl: string; readonly close: () => void }>((resume) => {
      const server = createServer((request, response) => {
        let text = ""
        request.setEncoding("utf8")
        request.on("data", (piece: string) => text += piece)
        request.on("end", () => {
          const body = JSON.parse(text) as Record<string, unknown>
          const path = request.url ?? ""
          journal.push({ who: spec.id, path, model: body["model"], authorization: request.headers.authorization })
          reply(response, spec.id, spec.answers, body, path)
        })
      })
      server.listen(0, "127.0.0.1", () => {
        const { port } = server.address() as AddressInfo // a TCP listener, never a pipe
        resume(Effect.succeed({
          baseUrl: `http://127.0.0.1:${port}/v1`,
          close: () => {
            server.closeAllConnections()
            server.close()
          }
        }))
      })
    }),
    (server) => Effect.sync(server.close)
  )

const resolvedKey = (spec: KeySpec, baseUrl: string, version = "v1"): ResolvedProviderKey => ({
  id: spec.id,
  accountId: "acct_routing",
  name: `key ${spec.id}`,
  baseUrl,
  apiKey: Redacted.make(`sk-${spec.id}`),
  models: { general: `g-${spec.id}`, reasoning: `r-${spec.id}`, embedding: spec.embeds ? `e-${spec.id}` : null },
  mode: spec.mode,
  version,
  lookup: undefined
})

// --- nenas's provider ---

/** How nenas's own upstreams answer; `cut`: an answer begun and lost (its attempt told `cut_short`). */
type NenasAnswers = "ok" | "unavailable" | "timeout" | "invalid" | "cut"

const NENAS_ERRORS: Record<NenasAnswers, ProviderError | undefined> = {
  ok: undefined,
  unavailable: new ProviderUnavailable({ message: "nenas: every upstream failed (HTTP 503)." }),
  timeout: new ProviderTimeout({ message: "nenas: no upstream started answering in time." }),
  invalid: new InvalidRequest({ message: "nenas: the model refused the request.", param: null }),
  cut: new ProviderUnavailable({ message: "nenas: the upstream's answer broke off." })
}

/** The attempt nenas's fallback provider would tell for each. */
const NENAS_OUTCOMES: Record<NenasAnswers, AttemptOutcome> = {
  ok: "ok",
  unavailable: "server_error",
  timeout: "first_byte_timeout",
  invalid: "refused",
  cut: "cut_short"
}

/** nenas's provider, scripted: each call recorded in `journal` and its attempt told, as src/Providers/Fallback.ts tells it. */
const nenasProvider = (answers: NenasAnswers, journal: Array<Received>): ProviderShape => {
  const error = NENAS_ERRORS[answers]
  const scripted = Provider.scripted(
    () =>
      error === undefined ? Script.answer(answerText("nenas"), { usage: Script.usage(5, 3) }) : Script.refuse(error),
    (request) =>
      error === undefined
        ? Effect.succeed({ vectors: request.input.map(() => vectorOf("nenas")), inputTokens: Option.none() })
        : Effect.fail(error)
  )
  const asked = <R extends Attempted, A>(request: R, call: (request: R) => Effect.Effect<A, ProviderError>) =>
    Effect.suspend(() => {
      journal.push({ who: "nenas", path: "", model: request.model, authorization: undefined })
      const attempt = {
        target: `nenas/${request.model}`,
        model: request.model,
        outcome: NENAS_OUTCOMES[answers],
        latencyMs: 0
      }
      return Effect.ensuring(call(request), request.attempted?.(attempt, false) ?? Effect.void)
    })
  return {
    complete: (request) => asked(request, scripted.complete),
    stream: (request) => asked(request, scripted.stream),
    embed: (request) => asked(request, scripted.embed)
  }
}

// --- One call routed ---

/** What the call is: a chat call (whole, streamed, or to the reasoning model) or embeddings. */
type Call = "complete" | "stream" | "reasoning" | "embed"

const NENAS_MODEL = {
  complete: "gpt-4.1-mini",
  stream: "gpt-4.1-mini",
  reasoning: "o4-mini",
  embed: "text-embedding-3-small"
}

const modelAt = (key: ResolvedProviderKey, call: Call) =>
  call === "embed" ? key.models.embedding : call === "reasoning" ? key.models.reasoning : key.models.general

const OPTIONS = { firstByteTimeoutMs: 2_000, totalTimeoutMs: 5_000 }

interface Routed {
  readonly keys: ReadonlyArray<ResolvedProviderKey>
  readonly journal: ReadonlyArray<Received>
  /** Each key's status as set, `id:Outcome`. */
  readonly reports: ReadonlyArray<string>
  /** The attempts told to the request, `amend` applied. */
  readonly told: ReadonlyArray<UpstreamAttempt>
  /** The metrics recorded: target label and outcome. */
  readonly metrics: ReadonlyArray<readonly [string, AttemptOutcome]>
  readonly breakers: ReturnType<typeof makeTestBreakers>
  /** The call made on `provider`: who answered, or the error. */
  readonly call: (
    call: Call
  ) => Effect.Effect<{ readonly who: string; readonly parts: ReadonlyArray<string> }, ProviderError>
}

/** An account's keys (each with its provider started) around nenas's provider; breakers open for `open` (key ids). */
const routedOver = (
  specs: ReadonlyArray<KeySpec>,
  nenasAnswers: NenasAnswers,
  open: ReadonlyArray<string> = [],
  call: Call = "complete"
) =>
  Effect.gen(function*() {
    const journal: Array<Received> = []
    const started = (spec: KeySpec) =>
      Effect.map(keyProvider(spec, journal), ({ baseUrl }) => resolvedKey(spec, baseUrl))
    const keys = yield* Effect.forEach(specs, started)
    const breakers = makeTestBreakers()
    for (const opened of keys.filter((k) => open.includes(k.id))) {
      const model = modelAt(opened, call)
      if (model !== null) breakers.open(`${OWN_KEY_BREAKER_PREFIX}${keyTarget(opened, model)}`, Date.now() + 60_000)
    }
    const metrics: Array<readonly [string, AttemptOutcome]> = []
    const attempts = yield* makeAttempts(
      breakers.service,
      (target, outcome) => Effect.sync(() => void metrics.push([target, outcome])),
      false
    )
    const reports: Array<string> = []
    const report = (id: string, outcome: ProviderKeyOutcome) =>
      Effect.sync(() => void reports.push(`${id}:${outcome._tag}`))
    const own = makeOwnKeys(attempts, OPTIONS, report)
    const nenas = nenasProvider(nenasAnswers, journal)
    const provider = own.around(keys, nenas)
    const told: Array<UpstreamAttempt> = []
    const attempted = (attempt: UpstreamAttempt, amend: boolean) =>
      Effect.sync(() => {
        if (amend) told.pop()
        told.push(attempt)
      })
    const chat = (reasoning: boolean): ProviderRequest => ({
      model: reasoning ? NENAS_MODEL.reasoning : NENAS_MODEL.complete,
      messages: [{ role: "user", content: "hello" }],
      maxOutputTokens: 64,
      reasoningEffort: reasoning ? "low" : undefined,
      reasoningModel: reasoning,
      attempted
    })
    const made = (which: Call) => {
      switch (which) {
        case "complete":
        case "reasoning":
          return Effect.map(
            provider.complete(chat(which === "reasoning")),
            (c) => ({ who: whoSaid(c.text), parts: [] })
          )
        case "stream":
          return provider.stream(chat(false)).pipe(
            Effect.flatMap(Stream.runCollect),
            Effect.map((collected) => {
              const parts: ReadonlyArray<StreamPart> = Chunk.toReadonlyArray(collected)
              const text = parts.map((part) => part._tag === "Delta" ? part.text : "").join("")
              return { who: whoSaid(text), parts: parts.map((part) => part._tag) }
            })
          )
        case "embed":
          return Effect.map(
            provider.embed({ model: NENAS_MODEL.embed, input: ["hello"], attempted }),
            (answer) => ({ who: whoEmbedded(answer.vectors[0]), parts: [] })
          )
      }
    }
    return { keys, journal, reports, told, metrics, breakers, call: made } satisfies Routed
  })

// --- The table ---

/** The call's error as the caller sees it. */
interface Failed {
  readonly code: string
  readonly status: number
  readonly retryable: boolean
  /** A part of its message: whose error it is. */
  readonly saying?: string
}

const failedAs = (error: ProviderError): Omit<Failed, "saying"> => {
  const meta = errorMeta(error)
  return { code: meta.code, status: meta.status, retryable: error.retryable ?? meta.retryable }
}

/** What the account has and how each provider answers. */
interface Given {
  /** The account's keys, oldest first. */
  readonly keys: ReadonlyArray<KeySpec>
  readonly nenas: NenasAnswers
  /** A chat call (`complete`) by default. */
  readonly call?: Call
  /** Keys whose breaker is open. */
  readonly open?: ReadonlyArray<KeyId>
}

/** What follows. */
type Then =
  & (
    /** Who answered: a key's id, or `nenas`. */
    | { readonly answered: string }
    /** The call's error. */
    | { readonly fails: Failed }
  )
  & {
    /** Who received a request, in order. */
    readonly asked: ReadonlyArray<string>
    /** Each key's status as set, in order: `id:Ok`, `id:Refused`, `id:Failing`. */
    readonly reports: ReadonlyArray<string>
    /** When given, the attempts told to the request, as `target:outcome`. */
    readonly told?: ReadonlyArray<string>
  }

interface Case {
  readonly name: string
  readonly given: Given
  readonly then: Then
}

const fails = (code: string, status: number, retryable: boolean, saying?: string): Failed =>
  saying === undefined ? { code, status, retryable } : { code, status, retryable, saying }

const KEY_REFUSED = fails("provider_key_refused", 502, false, "Your provider refused your provider key")
const KEY_503 = fails("provider_unavailable", 503, true, "The model provider failed (HTTP 503)")
const UNAVAILABLE = fails("provider_unavailable", 503, true)
const REFUSED_BY_KEY = fails("invalid_request", 400, false, "temperature is out of range")
const REFUSED_BY_NENAS = fails("invalid_request", 400, false, "nenas:")

const CASES: ReadonlyArray<Case> = [
  // mode `first`: the key, then nenas's upstreams.
  {
    name: "first, key ok: the key answers; nenas is not asked",
    given: { keys: [key("k1", "first", "ok")], nenas: "ok" },
    then: { answered: "k1", asked: ["k1"], reports: ["k1:Ok"] }
  },
  {
    name: "first, key 401: nenas answers",
    given: { keys: [key("k1", "first", 401)], nenas: "ok" },
    then: { answered: "nenas", asked: ["k1", "nenas"], reports: ["k1:Refused"] }
  },
  {
    name: "first, key 403: nenas answers",
    given: { keys: [key("k1", "first", 403)], nenas: "ok" },
    then: { answered: "nenas", asked: ["k1", "nenas"], reports: ["k1:Refused"] }
  },
  {
    name: "first, key 503: nenas answers",
    given: { keys: [key("k1", "first", 503)], nenas: "ok" },
    then: { answered: "nenas", asked: ["k1", "nenas"], reports: ["k1:Failing"] }
  },
  {
    name: "first, key silent past its share of the first-byte budget: nenas answers",
    given: { keys: [key("k1", "first", "hang")], nenas: "ok" },
    then: {
      answered: "nenas",
      asked: ["k1", "nenas"],
      reports: ["k1:Failing"],
      told: ["k1/g-k1:first_byte_timeout", "nenas/gpt-4.1-mini:ok"]
    }
  },
  {
    name: "first, key 400 (the request refused): the call ends there, the key is working",
    given: { keys: [key("k1", "first", 400)], nenas: "ok" },
    then: { fails: REFUSED_BY_KEY, asked: ["k1"], reports: ["k1:Ok"], told: ["k1/g-k1:refused"] }
  },
  {
    name: "first, key 404 (a model the provider does not have): the key's failure, nenas answers",
    given: { keys: [key("k1", "first", 404)], nenas: "ok" },
    then: {
      answered: "nenas",
      asked: ["k1", "nenas"],
      reports: ["k1:Failing"],
      told: ["k1/g-k1:server_error", "nenas/gpt-4.1-mini:ok"]
    }
  },
  {
    name: "first, key's answer broke off after its head: the call ends there",
    given: { keys: [key("k1", "first", "cut")], nenas: "ok" },
    then: { fails: UNAVAILABLE, asked: ["k1"], reports: ["k1:Failing"], told: ["k1/g-k1:cut_short"] }
  },
  // mode `fallback`: nenas's upstreams, then the key when they are down or silent.
  {
    name: "fallback, nenas ok: nenas answers; the key is not asked",
    given: { keys: [key("k1", "fallback", "ok")], nenas: "ok" },
    then: { answered: "nenas", asked: ["nenas"], reports: [] }
  },
  {
    name: "fallback, nenas unavailable: the key answers",
    given: { keys: [key("k1", "fallback", "ok")], nenas: "unavailable" },
    then: { answered: "k1", asked: ["nenas", "k1"], reports: ["k1:Ok"] }
  },
  {
    name: "fallback, nenas timed out: the key answers",
    given: { keys: [key("k1", "fallback", "ok")], nenas: "timeout" },
    then: { answered: "k1", asked: ["nenas", "k1"], reports: ["k1:Ok"] }
  },
  {
    name: "fallback, nenas refused the request: the key is not asked",
    given: { keys: [key("k1", "fallback", "ok")], nenas: "invalid" },
    then: { fails: REFUSED_BY_NENAS, asked: ["nenas"], reports: [] }
  },
  {
    name: "fallback, nenas's answer began and broke off: the key is not asked",
    given: { keys: [key("k1", "fallback", "ok")], nenas: "cut" },
    then: { fails: fails("provider_unavailable", 503, true, "nenas:"), asked: ["nenas"], reports: [] }
  },
  {
    name: "fallback, nenas timed out, key 503: the key's error",
    given: { keys: [key("k1", "fallback", 503)], nenas: "timeout" },
    then: { fails: KEY_503, asked: ["nenas", "k1"], reports: ["k1:Failing"] }
  },
  {
    name: "fallback, nenas unavailable, key 401: nenas was used, so not provider_key_refused",
    given: { keys: [key("k1", "fallback", 401)], nenas: "unavailable" },
    then: { fails: UNAVAILABLE, asked: ["nenas", "k1"], reports: ["k1:Refused"] }
  },
  // mode `only`: nenas's upstreams never, even ready to answer.
  {
    name: "only, key ok: the key answers",
    given: { keys: [key("k1", "only", "ok")], nenas: "ok" },
    then: { answered: "k1", asked: ["k1"], reports: ["k1:Ok"] }
  },
  {
    name: "only, key 401: provider_key_refused",
    given: { keys: [key("k1", "only", 401)], nenas: "ok" },
    then: { fails: KEY_REFUSED, asked: ["k1"], reports: ["k1:Refused"] }
  },
  {
    name: "only, key 503: provider_unavailable",
    given: { keys: [key("k1", "only", 503)], nenas: "ok" },
    then: { fails: KEY_503, asked: ["k1"], reports: ["k1:Failing"] }
  },
  {
    name: "only, key 400: the request refused",
    given: { keys: [key("k1", "only", 400)], nenas: "ok" },
    then: { fails: REFUSED_BY_KEY, asked: ["k1"], reports: ["k1:Ok"] }
  },
  // Several keys.
  {
    name: "first + first, the first 401: the second answers",
    given: { keys: [key("k1", "first", 401), key("k2", "first", "ok")], nenas: "ok" },
    then: { answered: "k2", asked: ["k1", "k2"], reports: ["k1:Refused", "k2:Ok"] }
  },
  {
    name: "first 503 + fallback ok (the older), nenas unavailable: the fallback key answers, last",
    given: { keys: [key("k2", "fallback", "ok"), key("k1", "first", 503)], nenas: "unavailable" },
    then: { answered: "k2", asked: ["k1", "nenas", "k2"], reports: ["k1:Failing", "k2:Ok"] }
  },
  {
    name: "only 401 + fallback ok: the fallback key answers; nenas never",
    given: { keys: [key("k1", "only", 401), key("k2", "fallback", "ok")], nenas: "ok" },
    then: { answered: "k2", asked: ["k1", "k2"], reports: ["k1:Refused", "k2:Ok"] }
  },
  {
    name: "only 503 + fallback 401: the last key tried refused its key: provider_key_refused",
    given: { keys: [key("k1", "only", 503), key("k2", "fallback", 401)], nenas: "ok" },
    then: { fails: KEY_REFUSED, asked: ["k1", "k2"], reports: ["k1:Failing", "k2:Refused"] }
  },
  {
    name: "only 401 + fallback 503: the last key tried failed: provider_unavailable",
    given: { keys: [key("k1", "only", 401), key("k2", "fallback", 503)], nenas: "ok" },
    then: { fails: KEY_503, asked: ["k1", "k2"], reports: ["k1:Refused", "k2:Failing"] }
  },
  {
    name: "first 503 + only 401: nenas skipped for the `only` key; provider_key_refused",
    given: { keys: [key("k1", "first", 503), key("k2", "only", 401)], nenas: "ok" },
    then: { fails: KEY_REFUSED, asked: ["k1", "k2"], reports: ["k1:Failing", "k2:Refused"] }
  },
  // Breakers.
  {
    name: "first, the key's breaker open: skipped without a request; nenas answers",
    given: { keys: [key("k1", "first", "ok")], nenas: "ok", open: ["k1"] },
    then: { answered: "nenas", asked: ["nenas"], reports: [], told: ["k1/g-k1:breaker_open", "nenas/gpt-4.1-mini:ok"] }
  },
  {
    name: "only, the key's breaker open: provider_unavailable until it half-opens",
    given: { keys: [key("k1", "only", "ok")], nenas: "ok", open: ["k1"] },
    then: {
      fails: fails("provider_unavailable", 503, true, "cool-down"),
      asked: [],
      reports: [],
      told: ["k1/g-k1:breaker_open"]
    }
  },
  // Categories: each asks the key's model for it.
  {
    name: "reasoning, first: the key's reasoning model is asked",
    given: { keys: [key("k1", "first", "ok")], nenas: "ok", call: "reasoning" },
    then: { answered: "k1", asked: ["k1"], reports: ["k1:Ok"], told: ["k1/r-k1:ok"] }
  },
  {
    name: "embeddings, first without an embedding model: nenas embeds",
    given: { keys: [key("k1", "first", "ok")], nenas: "ok", call: "embed" },
    then: { answered: "nenas", asked: ["nenas"], reports: [] }
  },
  {
    name: "embeddings, only without an embedding model: provider_unavailable, not retryable",
    given: { keys: [key("k1", "only", "ok")], nenas: "ok", call: "embed" },
    then: { fails: fails("provider_unavailable", 503, false, "models.embedding"), asked: [], reports: [] }
  },
  {
    name: "embeddings, first with an embedding model: the key embeds with it",
    given: { keys: [key("k1", "first", "ok", { embeds: true })], nenas: "ok", call: "embed" },
    then: { answered: "k1", asked: ["k1"], reports: ["k1:Ok"], told: ["k1/e-k1:ok"] }
  },
  {
    name: "embeddings, first without + fallback with, nenas unavailable: the fallback key embeds",
    given: {
      keys: [key("k1", "first", "ok"), key("k2", "fallback", "ok", { embeds: true })],
      nenas: "unavailable",
      call: "embed"
    },
    then: { answered: "k2", asked: ["nenas", "k2"], reports: ["k2:Ok"] }
  },
  {
    name: "embeddings, only with an embedding model, 401: provider_key_refused",
    given: { keys: [key("k1", "only", 401, { embeds: true })], nenas: "ok", call: "embed" },
    then: { fails: KEY_REFUSED, asked: ["k1"], reports: ["k1:Refused"] }
  },
  // Streams: the head decides; after it, the call stays where it is.
  {
    name: "stream, first, key ok: the key's parts",
    given: { keys: [key("k1", "first", "ok")], nenas: "ok", call: "stream" },
    then: { answered: "k1", asked: ["k1"], reports: ["k1:Ok"] }
  },
  {
    name: "stream, first, key 503 before its head: nenas's stream",
    given: { keys: [key("k1", "first", 503)], nenas: "ok", call: "stream" },
    then: { answered: "nenas", asked: ["k1", "nenas"], reports: ["k1:Failing"] }
  },
  {
    name: "stream, first, key's stream cut after its head: the call's error; nenas not asked",
    given: { keys: [key("k1", "first", "cut")], nenas: "ok", call: "stream" },
    then: { fails: UNAVAILABLE, asked: ["k1"], reports: ["k1:Ok", "k1:Failing"], told: ["k1/g-k1:cut_short"] }
  }
]

const whoOf = (attempt: UpstreamAttempt) => attempt.providerKeyId ?? "nenas"

describe("a team's own provider keys around nenas's provider", () => {
  for (const { given, name, then } of CASES) {
    it.scopedLive(name, () =>
      Effect.gen(function*() {
        const call = given.call ?? "complete"
        const routed = yield* routedOver(given.keys, given.nenas, given.open, call)
        const result = yield* Effect.either(routed.call(call))
        const outcome = Either.match(result, {
          onLeft: (error) => ({ ...failedAs(error), saying: error.message }),
          onRight: (answer) => answer.who
        })
        if ("answered" in then) expect(outcome).toBe(then.answered)
        else {
          const { saying, ...failed } = then.fails
          expect(outcome).toMatchObject(failed)
          if (saying !== undefined) expect(outcome).toMatchObject({ saying: expect.stringContaining(saying) })
        }
        expect(routed.journal.map((r) => r.who)).toEqual(then.asked)
        expect(routed.reports).toEqual(then.reports)
        if (then.told !== undefined) expect(routed.told.map((a) => `${a.target}:${a.outcome}`)).toEqual(then.told)

        // Each key is sent its own model for the category, at its base URL, with its own API key; nenas the caller's.
        for (const received of routed.journal) {
          if (received.who === "nenas") {
            expect(received.model).toBe(NENAS_MODEL[call])
            continue
          }
          const asked = routed.keys.find((k) => k.id === received.who)
          expect(asked === undefined ? undefined : modelAt(asked, call)).toBe(received.model)
          expect(received.path).toBe(call === "embed" ? "/v1/embeddings" : "/v1/chat/completions")
          expect(received.authorization).toBe(`Bearer sk-${received.who}`)
        }
        // Each attempt on a key is told as its target `key/model` with the key's id; nenas's without one.
        expect(routed.told.filter((a) => a.outcome !== "breaker_open").map(whoOf)).toEqual(then.asked)
        for (const attempt of routed.told) {
          if (attempt.providerKeyId === undefined) expect(attempt.target).toBe(`nenas/${NENAS_MODEL[call]}`)
          else expect(attempt.target).toBe(`${attempt.providerKeyId}/${attempt.model}`)
        }
        // A stream arrives whole: the key's in its two chunks, nenas's in one; each with its finish and usage.
        if (call === "stream" && "answered" in then) {
          const parts = then.answered === "nenas" ? ["Delta", "Finish", "Usage"] : ["Delta", "Delta", "Finish", "Usage"]
          expect(Either.map(result, (answer) => answer.parts)).toEqual(Either.right(parts))
        }
      }).pipe(Logger.withMinimumLogLevel(LogLevel.None)))
  }
})

describe("around the table", () => {
  it.effect("an account without keys is served by nenas's provider itself", () =>
    Effect.gen(function*() {
      const attempts = yield* makeAttempts(makeTestBreakers().service, () => Effect.void, false)
      const own = makeOwnKeys(attempts, OPTIONS, () => Effect.die("no key to report"))
      const nenas = nenasProvider("ok", [])
      expect(own.around([], nenas)).toBe(nenas)
    }))

  it("orderOf: `first` and `only` before nenas, `fallback` after, each oldest first; nenas skipped for any `only`", () => {
    const at = (spec: KeySpec) => resolvedKey(spec, "http://127.0.0.1:9/v1")
    const [f1, a1, o1, a2] = [
      at(key("k1", "fallback", "ok")),
      at(key("k2", "first", "ok")),
      at(key("k3", "only", "ok")),
      at(key("k4", "first", "ok"))
    ]
    const ids = (order: ReturnType<typeof orderOf>) => ({
      before: order.before.map((k) => k.id),
      nenas: order.nenas,
      after: order.after.map((k) => k.id)
    })
    expect(ids(orderOf([f1, a1, a2]))).toEqual({ before: ["k2", "k4"], nenas: true, after: ["k1"] })
    expect(ids(orderOf([f1, a1, o1, a2]))).toEqual({ before: ["k2", "k3", "k4"], nenas: false, after: ["k1"] })
    expect(ids(orderOf([f1]))).toEqual({ before: [], nenas: true, after: ["k1"] })
    expect(keyTarget(a1, "g-k2")).toBe("k2/g-k2")
  })

  it.scopedLive("attempts: keys' named `key/model` with providerKeyId, counted under `provider_key`, on the key's breaker", () =>
    Effect.gen(function*() {
      const routed = yield* routedOver([key("k1", "first", 503), key("k2", "fallback", "ok")], "unavailable")
      const answer = yield* routed.call("complete")
      expect(answer.who).toBe("k2")
      expect(routed.told.map(({ latencyMs: _, ...attempt }) => attempt)).toEqual([
        { target: "k1/g-k1", model: "g-k1", outcome: "server_error", providerKeyId: "k1" },
        { target: "nenas/gpt-4.1-mini", model: "gpt-4.1-mini", outcome: "server_error" },
        { target: "k2/g-k2", model: "g-k2", outcome: "ok", providerKeyId: "k2" }
      ])
      expect("providerKeyId" in (routed.told[1] ?? {})).toBe(false)
      // Metrics name no key (one label for all of them); nenas's own attempts are its provider's to count.
      expect(routed.metrics).toEqual([["provider_key", "server_error"], ["provider_key", "ok"]])
      expect(routed.breakers.recorded.map((r) => [r.target, r.outcome._tag])).toEqual([
        ["provider_key:k1/g-k1", "Failure"],
        ["provider_key:k2/g-k2", "Success"]
      ])
    }).pipe(Logger.withMinimumLogLevel(LogLevel.None)))

  it.scopedLive("a key's 401 is logged naming the key, never its secret", () =>
    Effect.gen(function*() {
      const lines: Array<string> = []
      const capture = Logger.make(({ message }) =>
        void lines.push(Array.isArray(message) ? message.map(String).join(" ") : String(message))
      )
      const routed = yield* routedOver([key("k1", "first", 401)], "ok")
      const answer = yield* routed.call("complete").pipe(Effect.provide(Logger.replace(Logger.defaultLogger, capture)))
      expect(answer.who).toBe("nenas")
      expect(lines.some((line) => line.includes("check provider key k1"))).toBe(true)
      expect(lines.some((line) => line.includes("sk-k1"))).toBe(false)
    }))

  it.scopedLive("a key's client is made again when its version changes, not before", () =>
    Effect.gen(function*() {
      const journal: Array<Received> = []
      const spec = key("k1", "only", "ok")
      const first = yield* keyProvider(spec, journal)
      const second = yield* keyProvider({ ...spec, id: "k2" }, journal)
      const attempts = yield* makeAttempts(makeTestBreakers().service, () => Effect.void, false)
      const own = makeOwnKeys(attempts, OPTIONS, () => Effect.void)
      const nenas = nenasProvider("ok", journal)
      const ask = (k: ResolvedProviderKey) =>
        own.around([k], nenas).complete({
          model: NENAS_MODEL.complete,
          messages: [{ role: "user", content: "hello" }],
          maxOutputTokens: 16,
          reasoningEffort: undefined,
          reasoningModel: false
        })
      yield* ask(resolvedKey(spec, first.baseUrl, "v1"))
      // The same version with another base URL is the client already made (a PATCH always changes the version).
      yield* ask(resolvedKey(spec, second.baseUrl, "v1"))
      yield* ask(resolvedKey(spec, second.baseUrl, "v2"))
      // The stand-in named k2 records its requests as "k2": the third call went to it.
      expect(journal.map((r) => r.who)).toEqual(["k1", "k1", "k2"])
    }))
})
