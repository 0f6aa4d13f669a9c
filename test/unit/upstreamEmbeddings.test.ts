import { HttpServer } from "@effect/platform"
import { NodeHttpServer } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Either, Layer, Option, Redacted, Tracer } from "effect"
import { createServer, type IncomingHttpHeaders } from "node:http"
import type { AddressInfo } from "node:net"
import OpenAI from "openai"
import { AppConfig, appConfig } from "../../src/AppConfig.js"
import { freePort } from "../../src/Database/EmbeddedPostgres.js"
import { ProviderUnavailable } from "../../src/Domain/Errors.js"
import { costOf, DEFAULT_PRICES } from "../../src/Domain/Prices.js"
import { countText } from "../../src/Domain/Tokens.js"
import { parseUpstreams, targetsFor, targetsOf } from "../../src/Domain/Upstreams.js"
import { shortened, simulatedVector } from "../../src/Providers/EmbeddingVectors.js"
import { makeFallbackProvider } from "../../src/Providers/Fallback.js"
import { makeOpenAiCompatible } from "../../src/Providers/OpenAiCompatible.js"
import type { AttemptOutcome, EmbeddingRequest, UpstreamAttempt } from "../../src/Providers/Provider.js"
import { Provider, Script, TestKeyProvider } from "../../src/Providers/Provider.js"
import { simulatedProvider, TestKeyProviderLive } from "../../src/Providers/Simulated.js"
import { makeSimulatedUpstreamRouter } from "../../src/Providers/SimulatedUpstream.js"
import { makeTestBreakers } from "../support/Breakers.js"

/**
 * The provider layer's embeddings (docs/operations.md, "Several upstreams and fallbacks"): `models.embedding`
 * in `UPSTREAMS` and `UPSTREAM_MODEL_EMBEDDING`, the real OpenAI-compatible client against embeddings
 * stand-ins on 127.0.0.1 (what it sends, how it reads the answer, a 503 falling back to the next upstream's
 * embedding model, a malformed answer, a refusal), and the simulated upstream's `POST /v1/embeddings` read by
 * that client and by the openai SDK.
 */

// --- UPSTREAMS and the embedding category ---

const OPENAI = {
  name: "openai",
  base_url: "https://api.openai.com/v1",
  models: { general: ["gpt-4.1-mini"], reasoning: ["o4-mini"], embedding: ["text-embedding-3-small"] }
}
const TEI = { name: "tei", base_url: "http://tei:8080/v1", models: { embedding: ["bge-m3", "e5-large"] } }

const parsed = (value: unknown) => parseUpstreams(JSON.stringify(value))
const problem = (value: unknown) => Either.match(parsed(value), { onLeft: (line) => line, onRight: () => undefined })

describe("models.embedding in UPSTREAMS", () => {
  it("lists embedding targets beside the routing categories; an entry may serve embeddings alone", () => {
    const upstreams = Either.getOrThrow(parsed([OPENAI, TEI]))
    expect(upstreams[1]?.models).toEqual({ general: [], reasoning: [], embedding: ["bge-m3", "e5-large"] })
    expect(targetsOf(upstreams, "embedding").map((t) => t.id)).toEqual([
      "openai/text-embedding-3-small",
      "tei/bge-m3",
      "tei/e5-large"
    ])
    expect(targetsOf(upstreams, "general").map((t) => t.id)).toEqual(["openai/gpt-4.1-mini"])
  })

  it("targetsFor(\"embedding\") is every embedding target whatever the model named; none when none is listed", () => {
    const upstreams = Either.getOrThrow(parsed([OPENAI, TEI]))
    const all = targetsOf(upstreams, "embedding")
    expect(targetsFor(upstreams, "embedding", "text-embedding-3-small")).toEqual(all)
    expect(targetsFor(upstreams, "embedding", "e5-large")).toEqual(all)
    expect(targetsFor(upstreams, "embedding", "not-listed")).toEqual(all)
    const chatOnly = Either.getOrThrow(parsed([{ ...OPENAI, models: { general: ["g"], reasoning: ["r"] } }]))
    expect(chatOnly[0]?.models.embedding).toEqual([])
    expect(targetsFor(chatOnly, "embedding", "text-embedding-3-small")).toEqual([])
    // The routing categories keep their rule: a model the category does not start with goes alone.
    expect(targetsFor(upstreams, "general", "other").map((t) => t.id)).toEqual(["openai/other"])
  })

  const refused: ReadonlyArray<readonly [string, unknown, string]> = [
    [
      "an embedding model listed twice",
      [OPENAI, { ...TEI, models: { embedding: ["bge-m3", "bge-m3"] } }],
      `UPSTREAMS entry 2 ("tei"): models.embedding: bge-m3 is listed twice`
    ],
    [
      "an empty embedding model id",
      [OPENAI, { ...TEI, models: { embedding: [""] } }],
      `UPSTREAMS entry 2 ("tei"): models.embedding.0: a model id must be a non-empty string`
    ],
    [
      "embedding not a list",
      [OPENAI, { ...TEI, models: { embedding: "bge-m3" } }],
      `UPSTREAMS entry 2 ("tei"): models.embedding: `
    ],
    [
      "no models at all",
      [OPENAI, { ...TEI, models: { embedding: [] } }],
      `UPSTREAMS entry 2 ("tei"): models: list at least one model under general or reasoning (or embedding)`
    ],
    ["embedding models alone", [TEI], "UPSTREAMS: no upstream lists a general model"]
  ]
  for (const [what, value, line] of refused) {
    it(`refuses ${what} in one line`, () => {
      const found = problem(value)
      expect(found?.startsWith(line), `${found} starts with ${line}`).toBe(true)
      expect(found?.includes("\n")).toBe(false)
    })
  }
})

const loaded = (variables: Record<string, string>) =>
  Effect.withConfigProvider(appConfig, ConfigProvider.fromMap(new Map(Object.entries(variables))))

describe("UPSTREAM_MODEL_EMBEDDING", () => {
  it.effect("is the shorthand upstream's embedding model, text-embedding-3-small by default", () =>
    Effect.gen(function*() {
      const byDefault = yield* loaded({ UPSTREAM_BASE_URL: "http://127.0.0.1:9/v1" })
      expect(byDefault.upstreamModelEmbedding).toBe("text-embedding-3-small")
      expect(byDefault.upstreams[0]?.models.embedding).toEqual(["text-embedding-3-small"])
      const set = yield* loaded({ UPSTREAM_BASE_URL: "http://127.0.0.1:9/v1", UPSTREAM_MODEL_EMBEDDING: "emb-local" })
      expect(set.upstreams[0]?.models).toEqual({
        general: ["gpt-4.1-mini"],
        reasoning: ["o4-mini"],
        embedding: ["emb-local"]
      })
      const listed = yield* loaded({ UPSTREAM_MODEL_EMBEDDING: "ignored", UPSTREAMS: JSON.stringify([OPENAI, TEI]) })
      expect(targetsOf(listed.upstreams, "embedding").map((t) => t.model)).toEqual([
        "text-embedding-3-small",
        "bge-m3",
        "e5-large"
      ])
    }))

  it.effect("given to AppConfig.layerWith, rebuilds the shorthand upstream", () =>
    Effect.gen(function*() {
      const config = yield* Effect.provide(
        AppConfig,
        AppConfig.layerWith({ upstreamBaseUrl: Option.some("http://127.0.0.1:9/v1"), upstreamModelEmbedding: "emb-2" })
      )
      expect(config.upstreams[0]?.models.embedding).toEqual(["emb-2"])
    }).pipe(Effect.withConfigProvider(ConfigProvider.fromMap(new Map()))))

  it("text-embedding-3-small is priced at OpenAI's USD 0.02 a million input tokens, RM 4.20 to the dollar", () => {
    const billed = (inputTokens: number) =>
      costOf(DEFAULT_PRICES, "text-embedding-3-small", {
        inputTokens,
        cachedTokens: 0,
        outputTokens: 0,
        searches: 0,
        pages: 0
      })
    expect(billed(1_000_000)).toBe(84_000)
    expect(billed(1_000)).toBe(84)
    // Rounded up once, to the next micro-MYR.
    expect(billed(1)).toBe(1)
  })
})

// --- The real client against stand-ins ---

interface Seen {
  readonly path: string
  readonly body: Record<string, unknown>
  readonly headers: IncomingHttpHeaders
}

interface Reply {
  readonly status: number
  readonly body: unknown
}

/** OpenAI's embeddings answer to `body`: vectors `extra` longer than asked, sent in reverse order. */
const okReply = (body: Record<string, unknown>, extra = 0): Reply => {
  const input = body["input"] as ReadonlyArray<string | ReadonlyArray<number>>
  const size = (typeof body["dimensions"] === "number" ? body["dimensions"] : 1536) + extra
  return {
    status: 200,
    body: {
      object: "list",
      data: input.map((item, index) => ({ object: "embedding", index, embedding: simulatedVector(item, size) }))
        .reverse(),
      model: body["model"],
      usage: { prompt_tokens: 17, total_tokens: 17 }
    }
  }
}

/** An embeddings endpoint on 127.0.0.1 answering each request as `answer` says, recording what it was sent. */
const standIn = (answer: (body: Record<string, unknown>) => Reply) =>
  Effect.acquireRelease(
    Effect.async<{ readonly baseUrl: string; readonly seen: Array<Seen>; readonly close: () => void }>((resume) => {
      const seen: Array<Seen> = []
      const server = createServer((request, response) => {
        let text = ""
        request.setEncoding("utf8")
        request.on("data", (piece: string) => text += piece)
        request.on("end", () => {
          const body = JSON.parse(text) as Record<string, unknown>
          seen.push({ path: request.url ?? "", body, headers: request.headers })
          const reply = request.url === "/v1/embeddings"
            ? answer(body)
            : { status: 404, body: { error: { message: "no such route" } } }
          const json = JSON.stringify(reply.body)
          response.writeHead(reply.status, { "content-type": "application/json" }).end(json)
        })
      })
      server.listen(0, "127.0.0.1", () => {
        const { port } = server.address() as AddressInfo // a TCP listener, never a pipe
        resume(Effect.succeed({
          baseUrl: `http://127.0.0.1:${port}/v1`,
          seen,
          close: () => {
            server.close()
            server.closeAllConnections()
          }
        }))
      })
    }),
    (server) => Effect.sync(server.close)
  )

const request = (attempts: Array<UpstreamAttempt>, input: EmbeddingRequest["input"], dimensions?: number) => ({
  model: "e1",
  input,
  dimensions,
  user: "user-7",
  attempted: (attempt: UpstreamAttempt, amend: boolean) =>
    Effect.sync(() => {
      if (amend) attempts.pop()
      attempts.push(attempt)
    })
})

/** Two upstreams, each serving one embedding model (and chat models, as the routing categories need). */
const twoUpstreams = (first: string, second: string) =>
  Either.getOrThrow(parsed([
    {
      name: "u1",
      base_url: first,
      api_key: "sk-one",
      models: { general: ["m1"], reasoning: ["r1"], embedding: ["e1"] }
    },
    { name: "u2", base_url: second, api_key: "sk-two", models: { embedding: ["e2"] } }
  ]))

const fallbackOver = (upstreams: ReturnType<typeof twoUpstreams>) =>
  Effect.gen(function*() {
    const breakers = makeTestBreakers()
    const metrics: Array<readonly [string, AttemptOutcome]> = []
    const provider = yield* makeFallbackProvider(
      { upstreams, firstByteTimeoutMs: 2_000, totalTimeoutMs: 5_000, traced: true },
      breakers.service,
      (target, outcome) => Effect.sync(() => void metrics.push([target, outcome]))
    )
    return { provider, breakers, metrics }
  })

/** The spans `effect` starts, kept as the default tracer makes them. */
const spansOf = <A, E>(effect: Effect.Effect<A, E>) =>
  Effect.gen(function*() {
    const base = yield* Effect.tracer
    const spans: Array<Tracer.Span> = []
    const capturing = Tracer.make({
      span: (...args) => {
        const span = base.span(...args)
        spans.push(span)
        return span
      },
      context: base.context
    })
    const result = yield* Effect.either(Effect.withTracer(effect, capturing))
    return { result, spans }
  })

const outcomes = (attempts: ReadonlyArray<UpstreamAttempt>) => attempts.map((a) => [a.target, a.outcome])

describe("the OpenAI-compatible client's embeddings", () => {
  it.scopedLive("POSTs {model, input, encoding_format: float, dimensions, user} with the key; vectors placed by index and shortened", () =>
    Effect.gen(function*() {
      const upstream = yield* standIn((body) => okReply(body, 4))
      const provider = yield* makeOpenAiCompatible({
        baseUrl: `${upstream.baseUrl}/`,
        apiKey: Option.some(Redacted.make("sk-embed")),
        firstByteTimeoutMs: 2_000,
        totalTimeoutMs: 5_000
      })
      const answer = yield* provider.embed({
        model: "text-embedding-3-small",
        input: ["alpha", [1, 2, 3]],
        dimensions: 8,
        user: "u-1"
      })
      expect(upstream.seen).toHaveLength(1)
      expect(upstream.seen[0]?.path).toBe("/v1/embeddings")
      expect(upstream.seen[0]?.headers.authorization).toBe("Bearer sk-embed")
      expect(upstream.seen[0]?.body).toEqual({
        model: "text-embedding-3-small",
        input: ["alpha", [1, 2, 3]],
        encoding_format: "float",
        dimensions: 8,
        user: "u-1"
      })
      // Sent in reverse order, 12 long: read in input order, shortened to 8 and renormalised.
      expect(answer.vectors).toEqual([
        shortened(simulatedVector("alpha", 12), 8),
        shortened(simulatedVector([1, 2, 3], 12), 8)
      ])
      expect(answer.inputTokens).toEqual(Option.some(17))
      // Without dimensions, none is sent and the vectors are the upstream's own size (here 1536 + 4), as they came.
      const plain = yield* provider.embed({ model: "m", input: ["beta"] })
      expect(upstream.seen[1]?.body).toEqual({ model: "m", input: ["beta"], encoding_format: "float" })
      expect(plain.vectors).toEqual([simulatedVector("beta", 1540)])
    }))

  it.scopedLive("a 503 falls back to the next upstream's embedding model: attempts, breakers, metrics and spans as a chat call's", () =>
    Effect.gen(function*() {
      const down = yield* standIn(() => ({ status: 503, body: { error: { message: "overloaded" } } }))
      const up = yield* standIn((body) => okReply(body))
      const { breakers, metrics, provider } = yield* fallbackOver(twoUpstreams(down.baseUrl, up.baseUrl))
      const attempts: Array<UpstreamAttempt> = []
      const { result, spans } = yield* spansOf(provider.embed(request(attempts, ["one", "two"], 16)))
      const answer = Either.getOrThrow(result)
      expect(answer.vectors).toEqual([simulatedVector("one", 16), simulatedVector("two", 16)])
      expect(outcomes(attempts)).toEqual([["u1/e1", "server_error"], ["u2/e2", "ok"]])
      expect(metrics).toEqual(outcomes(attempts))
      expect(breakers.recorded.map((r) => [r.target, r.outcome._tag])).toEqual([["u1/e1", "Failure"], [
        "u2/e2",
        "Success"
      ]])
      expect(down.seen.map((s) => s.body["model"])).toEqual(["e1"])
      expect(up.seen.map((s) => [s.body["model"], s.headers.authorization])).toEqual([["e2", "Bearer sk-two"]])
      expect(spans.map((span) => span.name)).toEqual(["embeddings e1", "embeddings e2"])
      expect(spans.map((span) => span.attributes.get("gen_ai.operation.name"))).toEqual(["embeddings", "embeddings"])
      expect(spans.map((span) => span.attributes.get("nenas.attempt.outcome"))).toEqual(["server_error", "ok"])
    }))

  it.scopedLive("an open breaker skips its target without a request", () =>
    Effect.gen(function*() {
      const first = yield* standIn((body) => okReply(body))
      const second = yield* standIn((body) => okReply(body))
      const { breakers, provider } = yield* fallbackOver(twoUpstreams(first.baseUrl, second.baseUrl))
      breakers.open("u1/e1", Date.now() + 60_000)
      const attempts: Array<UpstreamAttempt> = []
      yield* provider.embed(request(attempts, ["x"]))
      expect(outcomes(attempts)).toEqual([["u1/e1", "breaker_open"], ["u2/e2", "ok"]])
      expect(first.seen).toHaveLength(0)
    }))

  const malformed: ReadonlyArray<readonly [string, (body: Record<string, unknown>) => Reply]> = [
    ["one vector too few", (body) => {
      const reply = okReply(body).body as { data: Array<unknown> }
      return { status: 200, body: { ...reply, data: reply.data.slice(1) } }
    }],
    ["a vector with a null", () => ({
      status: 200,
      body: { object: "list", data: [{ object: "embedding", index: 0, embedding: [0.5, null] }] }
    })],
    ["no JSON", () => ({ status: 200, body: "not json" })]
  ]
  for (const [what, answer] of malformed) {
    it.scopedLive(`an answer with ${what} is provider_unavailable, and the call stays with its target`, () =>
      Effect.gen(function*() {
        const broken = yield* standIn(answer)
        const other = yield* standIn((body) => okReply(body))
        const { provider } = yield* fallbackOver(twoUpstreams(broken.baseUrl, other.baseUrl))
        const attempts: Array<UpstreamAttempt> = []
        const error = yield* Effect.flip(
          provider.embed(request(attempts, what === "one vector too few" ? ["a", "b"] : ["a"]))
        )
        expect(error._tag).toBe("ProviderUnavailable")
        expect(error.message).toBe("The model provider's answer was not one embedding per input item.")
        expect(outcomes(attempts)).toEqual([["u1/e1", "cut_short"]])
        expect(other.seen).toHaveLength(0)
      }))
  }

  it.scopedLive("a refusal of the request (400) is the caller's, in the upstream's words, never tried elsewhere", () =>
    Effect.gen(function*() {
      const refusing = yield* standIn(() => ({
        status: 400,
        body: {
          error: { message: "This model does not support specifying dimensions.", type: "invalid_request_error" }
        }
      }))
      const other = yield* standIn((body) => okReply(body))
      const { provider } = yield* fallbackOver(twoUpstreams(refusing.baseUrl, other.baseUrl))
      const attempts: Array<UpstreamAttempt> = []
      const error = yield* Effect.flip(provider.embed(request(attempts, ["a"], 64)))
      expect(error._tag).toBe("InvalidRequest")
      expect(error.message).toBe("The model refused the request: This model does not support specifying dimensions.")
      expect(outcomes(attempts)).toEqual([["u1/e1", "refused"]])
      expect(other.seen).toHaveLength(0)
    }))

  it.scopedLive("with no embedding model in UPSTREAMS, an embeddings call fails at once, naming models.embedding", () =>
    Effect.gen(function*() {
      const upstream = yield* standIn((body) => okReply(body))
      const upstreams = Either.getOrThrow(
        parsed([{ name: "u1", base_url: upstream.baseUrl, models: { general: ["m1"], reasoning: ["r1"] } }])
      )
      const { metrics, provider } = yield* fallbackOver(upstreams)
      const attempts: Array<UpstreamAttempt> = []
      const error = yield* Effect.flip(provider.embed(request(attempts, ["a"])))
      expect(error._tag).toBe("ProviderUnavailable")
      expect(error.message).toContain("models.embedding in UPSTREAMS")
      expect(error._tag === "ProviderUnavailable" ? error.retryable : undefined).toBe(false)
      expect(attempts).toEqual([])
      expect(metrics).toEqual([])
      expect(upstream.seen).toHaveLength(0)
    }))
})

// --- The simulated upstream's POST /v1/embeddings ---

const simulatedUpstream = Effect.gen(function*() {
  const port = yield* Effect.promise(freePort)
  yield* Layer.buildWithScope(
    HttpServer.serve(makeSimulatedUpstreamRouter()).pipe(
      Layer.provide(NodeHttpServer.layer(createServer, { port, host: "127.0.0.1" }))
    ),
    yield* Effect.scope
  )
  return `http://127.0.0.1:${port}/v1`
})

describe("the simulated upstream's embeddings", () => {
  it.scopedLive("answer the real client with the simulated vectors, and prompt_tokens counted as the service counts", () =>
    Effect.gen(function*() {
      const baseUrl = yield* simulatedUpstream
      const provider = yield* makeOpenAiCompatible({
        baseUrl,
        apiKey: Option.none(),
        firstByteTimeoutMs: 2_000,
        totalTimeoutMs: 5_000
      })
      const texts = ["Kuala Lumpur is the capital.", "Nasi lemak"]
      const answer = yield* provider.embed({ model: "text-embedding-3-small", input: texts })
      expect(answer.vectors).toEqual(texts.map((text) => simulatedVector(text)))
      expect(answer.inputTokens).toEqual(Option.some(countText(texts[0] ?? "") + countText(texts[1] ?? "")))
      const tokens = yield* provider.embed({ model: "m", input: [[10, 20, 30], [40]], dimensions: 32 })
      expect(tokens.vectors).toEqual([simulatedVector([10, 20, 30], 32), simulatedVector([40], 32)])
      expect(tokens.inputTokens).toEqual(Option.some(4))
    }))

  it.scopedLive("answer in OpenAI's exact shape, and the openai SDK (base64 by default) decodes the same vectors", () =>
    Effect.gen(function*() {
      const baseUrl = yield* simulatedUpstream
      const raw = yield* Effect.promise(() =>
        fetch(`${baseUrl}/embeddings`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: "text-embedding-3-small", input: "Ipoh", dimensions: 4 })
        }).then((response) => response.json())
      )
      expect(raw).toEqual({
        object: "list",
        data: [{ object: "embedding", index: 0, embedding: simulatedVector("Ipoh", 4) }],
        model: "text-embedding-3-small",
        usage: { prompt_tokens: countText("Ipoh"), total_tokens: countText("Ipoh") }
      })
      const client = new OpenAI({ baseURL: baseUrl, apiKey: "unused" })
      const sdk = yield* Effect.promise(() =>
        client.embeddings.create({ model: "text-embedding-3-small", input: ["Ipoh", "Melaka"] })
      )
      expect(sdk.data.map((d) => d.embedding)).toEqual([simulatedVector("Ipoh"), simulatedVector("Melaka")])
      const refused = yield* Effect.promise(() =>
        fetch(`${baseUrl}/embeddings`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" })
      )
      expect(refused.status).toBe(400)
    }))
})

// --- The simulated and scripted providers ---

describe("the simulated providers' embeddings", () => {
  it.effect("the simulated model answers its vectors at the size asked, with no usage (the call counts)", () =>
    Effect.gen(function*() {
      const answer = yield* simulatedProvider.embed({ model: "any", input: ["a", [1, 2]], dimensions: 12 })
      expect(answer).toEqual({
        vectors: [simulatedVector("a", 12), simulatedVector([1, 2], 12)],
        inputTokens: Option.none()
      })
      const testKeys = yield* Effect.provide(TestKeyProvider, TestKeyProviderLive)
      expect((yield* testKeys.embed({ model: "x", input: ["a"] })).vectors).toEqual([simulatedVector("a")])
    }))

  it.effect("Provider.scripted answers the simulated vectors and records each embed request apart", () =>
    Effect.gen(function*() {
      const scripted = Provider.scripted([Script.answer("chat")])
      const provider = yield* Effect.provide(Provider, Provider.Test(scripted))
      const answer = yield* provider.embed({ model: "e", input: ["hello"] })
      expect(answer.vectors).toEqual([simulatedVector("hello")])
      expect(scripted.embeddingRequests.map((r) => r.input)).toEqual([["hello"]])
      expect(scripted.requests).toEqual([])
      const failing = Provider.scripted(
        [],
        (_, index) => Effect.fail(new ProviderUnavailable({ message: `embed call ${index + 1} refused` }))
      )
      expect((yield* Effect.flip(failing.embed({ model: "e", input: ["x"] }))).message).toBe("embed call 1 refused")
      expect(failing.embeddingRequests).toHaveLength(1)
    }))
})
