import { Duration, Effect } from "effect"
import * as http from "node:http"
import * as https from "node:https"
import type { LookupFunction } from "node:net"
import { admitUrl, type HostResolver, readCapped } from "../Search/Fetch.js"

/** At most this much of an answer is read; the rest is cut off unread. */
export const ANSWER_MAX_BYTES = 16 * 1024
/** What the attempt log keeps of an answer. */
export const EXCERPT_CHARS = 500

/** One POST's outcome: an HTTP status (any: redirects are not followed), or why there was none. */
export interface PostOutcome {
  readonly statusCode: number | null
  /** A 2xx answer. */
  readonly ok: boolean
  readonly error: string | null
  readonly excerpt: string
  readonly latencyMs: number
}

const postOnce = (
  url: URL,
  lookup: LookupFunction | undefined,
  headers: Record<string, string>,
  body: string,
  signal: AbortSignal
) =>
  new Promise<{ readonly statusCode: number; readonly excerpt: string }>((resolve, reject) => {
    const client = url.protocol === "https:" ? https : http
    const request = client.request(url, {
      method: "POST",
      agent: false,
      signal,
      headers: { ...headers, "content-type": "application/json", "content-length": String(Buffer.byteLength(body)) },
      ...(lookup === undefined ? {} : { lookup })
    }, (response) => {
      readCapped(response, ANSWER_MAX_BYTES).then(
        ({ bytes }) =>
          resolve({ statusCode: response.statusCode ?? 0, excerpt: bytes.toString("utf8").slice(0, EXCERPT_CHARS) }),
        reject
      )
    })
    request.once("error", reject)
    request.end(body)
  })

/** What the developer is told of a URL the guard refused: never the addresses its host resolves to. */
export const NOT_ALLOWED =
  "the URL is not allowed: a webhook reaches only https URLs on public addresses, without credentials"

/**
 * POSTs a signed event through the address guard of page fetching (`admitUrl`,
 * https outside `WEBHOOK_ALLOWED_HOSTS`, any port), to the addresses checked,
 * within `timeout` (headers and answer included); a redirect is an answer like
 * any other, not followed. Never fails: the outcome says what happened.
 */
export const postEvent = (
  resolver: HostResolver["Type"],
  allowedHosts: ReadonlySet<string>,
  timeout: Duration.Duration,
  target: string,
  headers: Record<string, string>,
  body: string
): Effect.Effect<PostOutcome> => {
  const started = performance.now()
  const latency = () => Math.round(performance.now() - started)
  return Effect.gen(function*() {
    const url = yield* Effect.try(() => new URL(target))
    const lookup = yield* admitUrl(resolver, { allowedHosts, webPortsOnly: false, httpsOnly: true }, url)
    const answer = yield* Effect.tryPromise((signal) => postOnce(url, lookup, headers, body, signal)).pipe(
      Effect.timeoutFail({
        duration: timeout,
        onTimeout: () => new Error(`no answer within ${Duration.format(timeout)}`)
      })
    )
    const ok = answer.statusCode >= 200 && answer.statusCode < 300
    return {
      statusCode: answer.statusCode,
      ok,
      error: ok ? null : answer.statusCode >= 300 && answer.statusCode < 400 ? "redirects are not followed" : null,
      excerpt: answer.excerpt,
      latencyMs: latency()
    } satisfies PostOutcome
  }).pipe(
    Effect.catchAll((error) =>
      Effect.as(
        Effect.logInfo(`webhook to ${target.slice(0, 300)} got no answer: ${detailOf(error)}`),
        {
          statusCode: null,
          ok: false,
          error: reasonOf(error).slice(0, 300),
          excerpt: "",
          latencyMs: latency()
        } satisfies PostOutcome
      )
    )
  )
}

/** The whole story for the log: the guard's reason (addresses included) or the network's message. */
const detailOf = (error: unknown): string => {
  if (typeof error !== "object" || error === null) return String(error)
  if ("reason" in error) return String(error.reason)
  const inner = "error" in error ? error.error : error
  return inner instanceof Error ? inner.message : String(inner)
}

/**
 * Why a POST got no answer, in a line the developer sees: the guard refused it,
 * the name did not resolve, the deadline, or the network's error code. Never
 * an address: Node's messages name the address connected to.
 */
const reasonOf = (error: unknown): string => {
  if (typeof error !== "object" || error === null) return "no answer"
  if ("_tag" in error && error._tag === "PageRefused") return NOT_ALLOWED
  if ("_tag" in error && error._tag === "PageFailed") return "the host name did not resolve"
  const inner = "error" in error ? error.error : error
  if (inner instanceof Error) return "code" in inner ? `the connection failed (${String(inner.code)})` : inner.message
  return "no answer"
}

/**
 * Why a webhook URL may not be registered (the address guard, as deliveries
 * apply it; `allowedHosts` is `WEBHOOK_ALLOWED_HOSTS`), for the log only, or
 * `undefined`. A name that does not resolve now is accepted: it is checked
 * again at every delivery.
 */
export const refusedWebhookUrl = (resolver: HostResolver["Type"], allowedHosts: ReadonlySet<string>, raw: string) =>
  Effect.gen(function*() {
    const url = yield* Effect.option(Effect.try(() => new URL(raw)))
    if (url._tag === "None") return "it is not an absolute URL"
    return yield* admitUrl(resolver, { allowedHosts, webPortsOnly: false, httpsOnly: true }, url.value).pipe(
      Effect.as(undefined),
      Effect.catchTags({
        PageRefused: (refused) => Effect.succeed(refused.reason),
        PageFailed: () => Effect.succeed(undefined)
      })
    )
  })
