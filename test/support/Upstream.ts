import { Context, Effect, Layer } from "effect"
import { createServer, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from "node:http"
import type { AddressInfo, Socket } from "node:net"
import { countText } from "../../src/Domain/Tokens.js"
import { simulatedVectors } from "../../src/Providers/EmbeddingVectors.js"

/**
 * A local OpenAI-compatible chat-completions upstream. Plain Node (no Effect
 * inside) so the benchmark can drive it at thousands of requests per second;
 * `Upstream.layer` wraps it for tests.
 */

export interface UsageNumbers {
  readonly prompt_tokens: number
  readonly completion_tokens: number
  readonly cached_tokens: number
  readonly reasoning_tokens: number
}

export type Behaviour =
  | {
    readonly kind: "ok"
    /** The answer; a function answers each request from its parsed JSON body. */
    readonly text?: string | ((body: Record<string, unknown>) => string)
    readonly usage?: Partial<UsageNumbers> | "none"
    /** Wait before sending the response headers. */
    readonly delayMs?: number
    /** Wait between stream chunks (default `DEFAULT_CHUNK_DELAY_MS`): each chunk is its own write, as from a real upstream. */
    readonly chunkDelayMs?: number
    /** Streaming: silence after the role chunk, before the first content, as a reasoning model thinks. */
    readonly thinkMs?: number
    readonly finishReason?: string
    /**
     * Function calls in the answer (finish reason `tool_calls`), streamed as OpenAI streams them; none once the
     * last message is a tool result, so a client's tool loop ends.
     */
    readonly toolCalls?: ReadonlyArray<{ readonly id?: string; readonly name: string; readonly arguments: string }>
  }
  /** An OpenAI-style error body (a string `body` is sent verbatim), optionally with `retry-after`. */
  | { readonly kind: "status"; readonly status: number; readonly body?: unknown; readonly retryAfter?: string }
  /** Reads the request and never answers. */
  | { readonly kind: "hang" }
  /** Streaming: headers, the role chunk and the first content chunk, then silence. */
  | { readonly kind: "hangAfterFirstChunk" }
  /**
   * Streaming: `afterChunks` (default 3) content chunks (after `thinkMs` of silence past the role chunk), then the
   * socket is destroyed; non-streaming: half the JSON.
   */
  | { readonly kind: "resetMidStream"; readonly afterChunks?: number; readonly thinkMs?: number }
  /** The next `times` (default 1) requests get their socket destroyed before any byte; later ones are answered `ok`. */
  | { readonly kind: "resetBeforeResponse"; readonly times?: number }
  /** Each request as `choose` says from its parsed body (e.g. web search's planning calls one way, the answer another). */
  | {
    readonly kind: "perRequest"
    readonly choose: (body: unknown) => Exclude<Behaviour, { readonly kind: "perRequest" | "resetBeforeResponse" }>
  }

export interface RecordedRequest {
  readonly method: string
  readonly path: string
  /** Parsed JSON; `undefined` when the body is empty or not JSON. Tests cast to what they expect. */
  readonly body: unknown
  readonly headers: IncomingHttpHeaders
}

export interface UpstreamServer {
  /** `http://127.0.0.1:<port>/v1`; clients POST `${baseUrl}/chat/completions`. */
  readonly baseUrl: string
  /** Every request received, in order; a live array, emptied by `reset()`. */
  readonly requests: ReadonlyArray<RecordedRequest>
  /** Applies to requests arriving from now on. */
  setBehaviour(behaviour: Behaviour): void
  /** Behaviour back to `{ kind: "ok" }`, recorded requests cleared. */
  reset(): void
  /** Closes the server and destroys every open socket, hanging ones included. */
  close(): Promise<void>
}

export interface UpstreamOptions {
  /** Default 0: a free port. */
  readonly port?: number
  /** Default true; the benchmark turns it off to keep the hot path lean. */
  readonly record?: boolean
}

type OkBehaviour = Extract<Behaviour, { readonly kind: "ok" }>

const OK: OkBehaviour = { kind: "ok" }

/** Streams arrive chunk by chunk, the usage chunk in a write of its own after the finish chunk, as from OpenAI. */
export const DEFAULT_CHUNK_DELAY_MS = 3
const CHUNK_CHARS = /[\s\S]{1,8}/gu

type Json = Record<string, unknown>

const isRecord = (value: unknown): value is Json => typeof value === "object" && value !== null && !Array.isArray(value)

const errorBody = (message: string, type: string) => JSON.stringify({ error: { message, type } })

const sendJson = (res: ServerResponse, status: number, body: string, extra: Record<string, string> = {}) => {
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(body),
    ...extra
  })
  res.end(body)
}

/** Resolves true after `ms`, or false as soon as the response is closed (client gone, server closed). */
const wait = (ms: number, res: ServerResponse): Promise<boolean> =>
  new Promise((resolve) => {
    if (res.destroyed) return resolve(false)
    const onClose = () => {
      clearTimeout(timer)
      resolve(false)
    }
    const timer = setTimeout(() => {
      res.off("close", onClose)
      resolve(true)
    }, ms)
    res.once("close", onClose)
  })

/** Writes `data`, then destroys the socket once it has been handed to the kernel. */
const writeThenDestroy = (res: ServerResponse, data: string) => {
  res.write(data, () => res.socket?.destroy())
}

const contentText = (content: unknown): string => {
  if (typeof content === "string") return content
  if (!Array.isArray(content)) return ""
  return content.map((part) => isRecord(part) && typeof part["text"] === "string" ? part["text"] : "").join("")
}

/** What an `ok` answer to one request is made of. */
interface Completion {
  readonly id: string
  readonly created: number
  readonly model: string
  readonly text: string
  readonly toolCalls: ReadonlyArray<Json>
  readonly finishReason: string
  readonly usage: Json | undefined
  /** The request asked for logprobs: each piece of text comes with its entry. */
  readonly logprobs: boolean
  readonly stream: boolean
  readonly includeUsage: boolean
}

const usageOf = (promptChars: number, text: string, override: Partial<UsageNumbers>): Json => {
  const prompt = override.prompt_tokens ?? Math.max(1, Math.ceil(promptChars / 4))
  const completion = override.completion_tokens ?? Math.max(1, Math.ceil(text.length / 4))
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
    prompt_tokens_details: { cached_tokens: override.cached_tokens ?? 0 },
    completion_tokens_details: { reasoning_tokens: override.reasoning_tokens ?? 0 }
  }
}

const completionOf = (id: string, body: Json, behaviour: OkBehaviour): Completion => {
  const messages = Array.isArray(body["messages"]) ? body["messages"] : []
  let promptChars = 0
  let last = ""
  for (const message of messages) {
    last = isRecord(message) ? contentText(message["content"]) : ""
    promptChars += last.length
  }
  const lastMessage: unknown = messages[messages.length - 1]
  const afterToolResult = isRecord(lastMessage) && lastMessage["role"] === "tool"
  const toolCalls = afterToolResult ? [] : (behaviour.toolCalls ?? []).map((call, i) => ({
    id: call.id ?? `call_${id}_${i}`,
    type: "function",
    function: { name: call.name, arguments: call.arguments }
  }))
  const text = typeof behaviour.text === "function"
    ? behaviour.text(body)
    : behaviour.text ?? (toolCalls.length > 0 ? "" : `Upstream answer to: ${last.slice(0, 200)}`)
  const streamOptions = body["stream_options"]
  return {
    id,
    created: Math.floor(Date.now() / 1000),
    model: typeof body["model"] === "string" ? body["model"] : "",
    text,
    toolCalls,
    logprobs: body["logprobs"] === true,
    finishReason: behaviour.finishReason ?? (toolCalls.length > 0 ? "tool_calls" : "stop"),
    usage: behaviour.usage === "none" ? undefined : usageOf(promptChars, text, behaviour.usage ?? {}),
    stream: body["stream"] === true,
    includeUsage: isRecord(streamOptions) && streamOptions["include_usage"] === true
  }
}

/** OpenAI's logprobs of a piece of text: one entry, a fixed log probability. */
const logprobsOf = (text: string) => ({
  content: [{ token: text, logprob: -0.25, bytes: [...Buffer.from(text, "utf8")], top_logprobs: [] }],
  refusal: null
})

const completionJson = (c: Completion): string =>
  JSON.stringify({
    id: c.id,
    object: "chat.completion",
    created: c.created,
    model: c.model,
    choices: [{
      index: 0,
      message: {
        role: "assistant",
        content: c.text === "" && c.toolCalls.length > 0 ? null : c.text,
        refusal: null,
        ...(c.toolCalls.length > 0 ? { tool_calls: c.toolCalls } : {})
      },
      logprobs: c.logprobs ? logprobsOf(c.text) : null,
      finish_reason: c.finishReason
    }],
    ...(c.usage === undefined ? {} : { usage: c.usage })
  })

const sse = (data: unknown) => `data: ${JSON.stringify(data)}\n\n`

/** The stream's events: role chunk, content chunks, finish chunk, and the usage chunk plus `[DONE]` as `tail`. */
const streamEvents = (c: Completion) => {
  const chunk = (delta: Json, finishReason: string | null, logprobs: Json | null = null) =>
    sse({
      id: c.id,
      object: "chat.completion.chunk",
      created: c.created,
      model: c.model,
      choices: [{ index: 0, delta, logprobs, finish_reason: finishReason }]
    })
  // As OpenAI streams a call: index, id, type and name with empty arguments, then the arguments in fragments.
  const calls = c.toolCalls.flatMap((call, index) => {
    const fn = call["function"] as { readonly name: string; readonly arguments: string }
    return [
      chunk(
        { tool_calls: [{ index, id: call["id"], type: "function", function: { name: fn.name, arguments: "" } }] },
        null
      ),
      ...(fn.arguments.match(CHUNK_CHARS) ?? []).map((piece) =>
        chunk({ tool_calls: [{ index, function: { arguments: piece } }] }, null)
      )
    ]
  })
  const tail = [chunk({}, c.finishReason)]
  if (c.includeUsage && c.usage !== undefined) {
    tail.push(sse({
      id: c.id,
      object: "chat.completion.chunk",
      created: c.created,
      model: c.model,
      choices: [],
      usage: c.usage
    }))
  }
  tail.push("data: [DONE]\n\n")
  return {
    role: chunk({ role: "assistant", content: "" }, null),
    content: [
      ...(c.text.match(CHUNK_CHARS) ?? []).map((piece) =>
        chunk({ content: piece }, null, c.logprobs ? logprobsOf(piece) : null)
      ),
      ...calls
    ],
    tail
  }
}

const startStream = (res: ServerResponse) =>
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" })

const answerOk = async (res: ServerResponse, c: Completion, behaviour: OkBehaviour) => {
  if (behaviour.delayMs !== undefined && behaviour.delayMs > 0 && !(await wait(behaviour.delayMs, res))) return
  if (!c.stream) return sendJson(res, 200, completionJson(c))
  const events = streamEvents(c)
  const all = [events.role, ...events.content, ...events.tail]
  startStream(res)
  const gap = behaviour.chunkDelayMs ?? DEFAULT_CHUNK_DELAY_MS
  for (const [i, event] of all.entries()) {
    if (i > 0 && !(await wait(i === 1 && behaviour.thinkMs !== undefined ? behaviour.thinkMs : gap, res))) return
    res.write(event)
  }
  res.end()
}

const answerBroken = async (res: ServerResponse, c: Completion, behaviour: Behaviour) => {
  if (!c.stream) {
    const json = completionJson(c)
    if (behaviour.kind === "hangAfterFirstChunk") return res.flushHeaders()
    res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(json) })
    return writeThenDestroy(res, json.slice(0, Math.floor(json.length / 2)))
  }
  const events = streamEvents(c)
  startStream(res)
  if (behaviour.kind === "hangAfterFirstChunk") return res.write(events.role + (events.content[0] ?? ""))
  const afterChunks = behaviour.kind === "resetMidStream" ? behaviour.afterChunks ?? 3 : 0
  const thinkMs = behaviour.kind === "resetMidStream" ? behaviour.thinkMs ?? 0 : 0
  if (thinkMs > 0) {
    res.write(events.role)
    if (!(await wait(thinkMs, res))) return
    return writeThenDestroy(res, events.content.slice(0, afterChunks).join(""))
  }
  writeThenDestroy(res, events.role + events.content.slice(0, afterChunks).join(""))
}

const answerStatus = (res: ServerResponse, behaviour: Extract<Behaviour, { readonly kind: "status" }>) => {
  const extra: Record<string, string> = behaviour.retryAfter === undefined
    ? {}
    : { "retry-after": behaviour.retryAfter }
  if (typeof behaviour.body === "string") {
    res.writeHead(behaviour.status, { "content-type": "text/plain", ...extra })
    return res.end(behaviour.body)
  }
  const body = behaviour.body === undefined
    ? errorBody("upstream failure", "server_error")
    : JSON.stringify(behaviour.body)
  sendJson(res, behaviour.status, body, extra)
}

const readBody = (req: IncomingMessage): Promise<string> =>
  new Promise((resolve, reject) => {
    let text = ""
    req.setEncoding("utf8")
    req.on("data", (piece: string) => {
      text += piece
    })
    req.once("end", () => resolve(text))
    req.once("error", reject)
  })

const parseJson = (text: string): unknown => {
  if (text === "") return undefined
  try {
    return JSON.parse(text)
  } catch {
    return undefined
  }
}

/** OpenAI's embeddings answer: the built-in model's vectors, and the items' tokens as the tokenizer counts them. */
const answerEmbeddings = (res: ServerResponse, body: unknown) => {
  const request = body as {
    model?: string
    input?: string | ReadonlyArray<string | ReadonlyArray<number>>
    dimensions?: number
  }
  const input = request.input ?? []
  const items: ReadonlyArray<string | ReadonlyArray<number>> = typeof input === "string" || typeof input[0] === "number"
    ? [input as string]
    : input as ReadonlyArray<string>
  const tokens = items.reduce((sum, item) => sum + (typeof item === "string" ? countText(item) : item.length), 0)
  sendJson(
    res,
    200,
    JSON.stringify({
      object: "list",
      data: simulatedVectors(items, request.dimensions).map((embedding, index) => ({
        object: "embedding",
        index,
        embedding
      })),
      model: request.model,
      usage: { prompt_tokens: tokens, total_tokens: tokens }
    })
  )
}

const isChatCompletions = (path: string) => path === "/v1/chat/completions" || path === "/chat/completions"

export const startUpstream = (options: UpstreamOptions = {}): Promise<UpstreamServer> => {
  const record = options.record ?? true
  const requests: Array<RecordedRequest> = []
  const sockets = new Set<Socket>()
  const idPrefix = `chatcmpl-${Math.random().toString(36).slice(2, 10)}`
  let served = 0
  let behaviour: Behaviour = OK
  let resetsLeft = 0

  /** The behaviour for a request arriving now; counts down `resetBeforeResponse`. */
  const take = (): Behaviour => {
    if (behaviour.kind !== "resetBeforeResponse") return behaviour
    if (resetsLeft <= 0) return OK
    resetsLeft -= 1
    return behaviour
  }

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const url = req.url ?? "/"
    const query = url.indexOf("?")
    const path = query === -1 ? url : url.slice(0, query)
    const route = req.method === "POST" && isChatCompletions(path)
    const taken = route ? take() : OK
    const body = parseJson(await readBody(req))
    const current = taken.kind === "perRequest" ? taken.choose(body) : taken
    if (record) requests.push({ method: req.method ?? "", path, body, headers: req.headers })
    if (req.method === "POST" && (path === "/v1/embeddings" || path === "/embeddings")) {
      if (current.kind === "status") return answerStatus(res, current)
      return answerEmbeddings(res, body)
    }
    // A team's provider is checked on save with its models list (docs/api/provider-keys.md, "Adding a key").
    if (req.method === "GET" && (path === "/v1/models" || path === "/models")) {
      return sendJson(res, 200, JSON.stringify({ object: "list", data: [{ id: "stand-in", object: "model" }] }))
    }
    if (!route) return sendJson(res, 404, errorBody(`Unknown route: ${req.method} ${path}`, "invalid_request_error"))
    switch (current.kind) {
      case "hang":
        return
      case "resetBeforeResponse":
        return req.socket.destroy()
      case "status":
        return answerStatus(res, current)
    }
    if (!isRecord(body)) {
      return sendJson(res, 400, errorBody("Request body must be a JSON object", "invalid_request_error"))
    }
    served += 1
    const id = `${idPrefix}${served.toString(36)}`
    if (current.kind === "ok") return answerOk(res, completionOf(id, body, current), current)
    return answerBroken(res, completionOf(id, body, OK), current)
  }

  const server = createServer((req, res) => {
    handle(req, res).catch(() => res.socket?.destroy())
  })
  // As a hosted API's load balancer keeps idle connections (about a minute), not Node's 5 s: a kept-alive socket
  // closed by the server just as the service reuses it is a reset no test here is about.
  server.keepAliveTimeout = 65_000
  server.on("connection", (socket) => {
    sockets.add(socket)
    socket.once("close", () => sockets.delete(socket))
  })

  let closing: Promise<void> | undefined
  const close = () =>
    closing ??= new Promise<void>((resolve) => {
      server.close(() => resolve())
      server.closeAllConnections()
      for (const socket of sockets) socket.destroy()
    })

  return new Promise((resolve, reject) => {
    server.once("error", reject)
    server.listen(options.port ?? 0, "127.0.0.1", () => {
      server.off("error", reject)
      const { port } = server.address() as AddressInfo // listening on a TCP host, so never a pipe name
      resolve({
        baseUrl: `http://127.0.0.1:${port}/v1`,
        requests,
        setBehaviour: (next) => {
          behaviour = next
          resetsLeft = next.kind === "resetBeforeResponse" ? next.times ?? 1 : 0
        },
        reset: () => {
          behaviour = OK
          resetsLeft = 0
          requests.length = 0
        },
        close
      })
    })
  })
}

/** The upstream for tests: started with the layer, closed (sockets destroyed) with its scope. */
export class Upstream extends Context.Tag("test/Upstream")<Upstream, UpstreamServer>() {
  static readonly layer: Layer.Layer<Upstream> = Layer.scoped(
    Upstream,
    Effect.acquireRelease(
      Effect.promise(() => startUpstream()),
      (server) => Effect.promise(() => server.close())
    )
  )
}
