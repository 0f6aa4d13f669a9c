import { Context, Duration, Effect, Layer, Schema } from "effect"
import { lookup as systemLookup } from "node:dns/promises"
import type { IncomingMessage } from "node:http"
import * as http from "node:http"
import * as https from "node:https"
import type { LookupFunction } from "node:net"
import { AppConfig } from "../AppConfig.js"
import { isIpLiteral, refusedAddress } from "./Address.js"

export interface ResolvedAddress {
  readonly address: string
  readonly family: 4 | 6
}

/**
 * How host names become addresses for page fetching. The system resolver in
 * production; tests provide their own to make a name resolve to a private
 * address without real DNS. Every connection uses exactly the addresses this
 * returned and that were checked, so a second DNS answer cannot slip in.
 */
export class HostResolver extends Context.Tag("nenas/HostResolver")<HostResolver, {
  readonly lookup: (hostname: string) => Promise<ReadonlyArray<ResolvedAddress>>
}>() {
  static readonly system = Layer.succeed(HostResolver, {
    lookup: async (hostname) =>
      (await systemLookup(hostname, { all: true, verbatim: true })).map((entry) => ({
        address: entry.address,
        family: entry.family === 6 ? 6 as const : 4 as const
      }))
  })
}

/** A page that may not be fetched: its scheme, its address, or what it is. */
export class PageRefused extends Schema.TaggedError<PageRefused>()("PageRefused", {
  url: Schema.String,
  reason: Schema.String
}) {}

/** A page that could not be fetched: an HTTP error, a network error, or its deadline. */
export class PageFailed extends Schema.TaggedError<PageFailed>()("PageFailed", {
  url: Schema.String,
  reason: Schema.String
}) {}

export type PageError = PageRefused | PageFailed

export interface FetchedPage {
  /** Where the page was read from, after redirects. */
  readonly url: string
  readonly kind: "html" | "text"
  readonly body: string
  /** The body was longer than the cap; `body` is its start. */
  readonly truncated: boolean
}

export interface FetchLimits {
  /** `FETCH_ALLOWED_HOSTS`: `host` (any port) or `host:port`, lower case. */
  readonly allowedHosts: ReadonlySet<string>
  /** One page's deadline, redirects and body included. */
  readonly timeout: Duration.DurationInput
  readonly maxBytes: number
  readonly maxRedirects: number
}

export const PAGE_MAX_BYTES = 2 * 1024 * 1024
export const PAGE_MAX_REDIRECTS = 3

const MEDIA_TYPES: Record<string, FetchedPage["kind"]> = {
  "text/html": "html",
  "application/xhtml+xml": "html",
  "text/plain": "text"
}

/** `URL.port` is empty for the scheme's default port; these are the others a page may be on. */
const WEB_PORTS: ReadonlySet<string> = new Set(["80", "443"])

const defaultPort = (url: URL) => url.protocol === "https:" ? "443" : "80"

const isAllowed = (url: URL, allowed: ReadonlySet<string>): boolean => {
  const host = url.hostname.toLowerCase()
  return allowed.has(host) || allowed.has(`${host}:${url.port === "" ? defaultPort(url) : url.port}`)
}

/** A lookup that answers only the addresses already checked for this host. */
const pinned = (addresses: ReadonlyArray<ResolvedAddress>): LookupFunction => (_hostname, options, callback) => {
  const first = addresses[0]
  if (first === undefined) return callback(new Error("no address"), "", 4)
  if (options.all === true) return callback(null, addresses.map(({ address, family }) => ({ address, family })))
  callback(null, first.address, first.family)
}

/** What a guarded GET asks for, and which answers it takes. */
export interface Wanted {
  readonly accept: string
  readonly userAgent: string
  /** Whether a body of this media type (lower case, no parameters) is read; another is refused unread. */
  readonly admits: (mediaType: string) => boolean
  /** What an answer of another type is not, for the refusal's reason ("HTML or text"). */
  readonly what: string
}

/** A body read through the guard: its URL after redirects, its Content-Type, and its bytes up to the cap. */
export interface Fetched {
  readonly url: string
  readonly contentType: string
  readonly bytes: Buffer
  /** The body was longer than the cap; `bytes` is its start. */
  readonly truncated: boolean
}

type Hop =
  | { readonly _tag: "Redirect"; readonly location: string }
  | { readonly _tag: "Body"; readonly contentType: string; readonly bytes: Buffer; readonly truncated: boolean }

const mediaTypeOf = (contentType: string): string => contentType.split(";")[0]?.trim().toLowerCase() ?? ""

/** The body as text in its declared charset; an unknown label is read as UTF-8, which reads most of the web. */
const decode = (contentType: string, bytes: Uint8Array): string => {
  const charset = /charset\s*=\s*"?([\w-]+)/i.exec(contentType)?.[1] ?? "utf-8"
  try {
    return new TextDecoder(charset).decode(bytes)
  } catch {
    return new TextDecoder("utf-8").decode(bytes)
  }
}

/** Reads the body up to `maxBytes`, then stops the transfer. */
export const readCapped = (response: IncomingMessage, maxBytes: number) =>
  new Promise<{ readonly bytes: Buffer; readonly truncated: boolean }>((resolve, reject) => {
    const chunks: Array<Buffer> = []
    let size = 0
    response.on("data", (chunk: Buffer) => {
      const room = maxBytes - size
      if (chunk.length >= room) {
        chunks.push(chunk.subarray(0, room))
        size = maxBytes
        // Settled first: cutting the connection then reports an abort that no longer matters.
        resolve({ bytes: Buffer.concat(chunks), truncated: true })
        response.removeAllListeners("data")
        response.destroy()
        return
      }
      chunks.push(chunk)
      size += chunk.length
    })
    response.once("end", () => resolve({ bytes: Buffer.concat(chunks), truncated: false }))
    response.once("error", reject)
    response.once("aborted", () => reject(new Error("the connection was cut")))
  })

/** One request: a redirect to follow, or a body of a type `wanted` admits. */
const getOnce = (url: URL, lookup: LookupFunction | undefined, maxBytes: number, wanted: Wanted, signal: AbortSignal) =>
  new Promise<Hop | PageError>((resolve, reject) => {
    const client = url.protocol === "https:" ? https : http
    const request = client.get(url, {
      agent: false,
      signal,
      headers: { "user-agent": wanted.userAgent, accept: wanted.accept },
      ...(lookup === undefined ? {} : { lookup })
    }, (response) => {
      const status = response.statusCode ?? 0
      const location = response.headers.location
      if (status >= 300 && status < 400 && location !== undefined) {
        response.destroy()
        return resolve({ _tag: "Redirect", location })
      }
      if (status < 200 || status >= 300) {
        response.destroy()
        return resolve(new PageFailed({ url: url.href, reason: `HTTP ${status}` }))
      }
      const contentType = response.headers["content-type"] ?? ""
      if (!wanted.admits(mediaTypeOf(contentType))) {
        response.destroy()
        return resolve(
          new PageRefused({ url: url.href, reason: `not ${wanted.what} (${contentType || "no content type"})` })
        )
      }
      readCapped(response, maxBytes).then(
        ({ bytes, truncated }) => resolve({ _tag: "Body", contentType, bytes, truncated }),
        reject
      )
    })
    request.once("error", reject)
  })

/** What an outbound request a user can aim may reach, besides public addresses. */
export interface AdmitRules {
  /** `host` (any port) or `host:port`, lower case, reachable although not public: `FETCH_ALLOWED_HOSTS` for pages, `WEBHOOK_ALLOWED_HOSTS` for webhooks. */
  readonly allowedHosts: ReadonlySet<string>
  /** Page fetching keeps to ports 80 and 443 outside the allowed hosts. */
  readonly webPortsOnly: boolean
  /** Webhook URLs must be `https` outside the allowed hosts. */
  readonly httpsOnly: boolean
}

/**
 * The address guard (docs/security.md, "Outbound requests") for one URL: http(s) only, no
 * credentials, and a host that is in `allowedHosts` or whose every address is
 * public (`refusedAddress`). Answers the lookup to connect with, answering only
 * the addresses checked (`undefined` for an IP literal: no lookup happens).
 */
export const admitUrl = (
  resolver: HostResolver["Type"],
  rules: AdmitRules,
  url: URL
): Effect.Effect<LookupFunction | undefined, PageError> =>
  Effect.gen(function*() {
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      return yield* new PageRefused({ url: url.href, reason: `the ${url.protocol} scheme is not fetched` })
    }
    if (url.username !== "" || url.password !== "") {
      return yield* new PageRefused({ url: url.href, reason: "URLs with credentials are not fetched" })
    }
    const allowed = isAllowed(url, rules.allowedHosts)
    if (!allowed && rules.httpsOnly && url.protocol !== "https:") {
      return yield* new PageRefused({
        url: url.href,
        reason: "only https URLs are reached (outside the allowed hosts)"
      })
    }
    // Other ports reach what is not a web site (SSH, databases, admin consoles) even on a public address.
    const portRefused = !allowed && rules.webPortsOnly && url.port !== "" && !WEB_PORTS.has(url.port)
      ? new PageRefused({ url: url.href, reason: `port ${url.port} is not fetched (only 80 and 443)` })
      : undefined
    if (isIpLiteral(url.hostname)) {
      const refused = allowed ? undefined : refusedAddress(url.hostname)
      if (refused !== undefined) {
        return yield* new PageRefused({ url: url.href, reason: `${url.hostname} is a ${refused} address` })
      }
      if (portRefused !== undefined) {
        return yield* portRefused
      }
      return undefined
    }
    const addresses = yield* Effect.tryPromise({
      try: () => resolver.lookup(url.hostname),
      catch: (error) => new PageFailed({ url: url.href, reason: `${url.hostname} did not resolve: ${String(error)}` })
    })
    if (addresses.length === 0) {
      return yield* new PageFailed({
        url: url.href,
        reason: `${url.hostname} has no address`
      })
    }
    if (!allowed) {
      for (const { address } of addresses) {
        const refused = refusedAddress(address)
        if (refused !== undefined) {
          return yield* new PageRefused({
            url: url.href,
            reason: `${url.hostname} resolves to ${address}, a ${refused} address`
          })
        }
      }
    }
    if (portRefused !== undefined) return yield* portRefused
    return pinned(addresses)
  })

/**
 * GETs without reaching inside the network (docs/security.md, "Outbound requests"): the
 * address guard (`admitUrl`) on ports 80 and 443 for the first host and each
 * redirect's; the connection goes to the addresses checked; at most
 * `maxRedirects` redirects; only the media types `wanted` admits; bodies capped.
 */
export const makeGuardedFetch = (resolver: HostResolver["Type"], limits: FetchLimits, wanted: Wanted) => {
  const rules: AdmitRules = { allowedHosts: limits.allowedHosts, webPortsOnly: true, httpsOnly: false }
  const admit = (url: URL) => admitUrl(resolver, rules, url)

  const hop = (url: URL) =>
    Effect.flatMap(admit(url), (lookup) =>
      Effect.flatMap(
        Effect.tryPromise({
          try: (signal) => getOnce(url, lookup, limits.maxBytes, wanted, signal),
          catch: (error) =>
            new PageFailed({ url: url.href, reason: error instanceof Error ? error.message : String(error) })
        }),
        (result): Effect.Effect<Hop, PageError> =>
          result._tag === "PageFailed" || result._tag === "PageRefused" ? Effect.fail(result) : Effect.succeed(result)
      ))

  const follow = (url: URL, redirects: number): Effect.Effect<Fetched, PageError> =>
    Effect.flatMap(hop(url), (result) => {
      if (result._tag === "Body") {
        return Effect.succeed({
          url: url.href,
          contentType: result.contentType,
          bytes: result.bytes,
          truncated: result.truncated
        })
      }
      if (redirects >= limits.maxRedirects) {
        return Effect.fail(new PageFailed({ url: url.href, reason: `more than ${limits.maxRedirects} redirects` }))
      }
      return Effect.try({
        try: () => new URL(result.location, url),
        catch: () =>
          new PageFailed({ url: url.href, reason: `a redirect to an invalid URL (${result.location.slice(0, 200)})` })
      }).pipe(Effect.flatMap((next) => follow(next, redirects + 1)))
    })

  const fetch = (raw: string): Effect.Effect<Fetched, PageError> =>
    Effect.try({
      try: () => new URL(raw),
      catch: () => new PageRefused({ url: raw.slice(0, 300), reason: "not a URL" })
    }).pipe(
      Effect.flatMap((url) => follow(url, 0)),
      Effect.timeoutFail({
        duration: limits.timeout,
        onTimeout: () =>
          new PageFailed({ url: raw.slice(0, 300), reason: `no page within ${Duration.format(limits.timeout)}` })
      })
    )

  return { fetch }
}

const PAGES: Wanted = {
  accept: "text/html,application/xhtml+xml,text/plain;q=0.9",
  userAgent: "nenas-web-search/1.0",
  admits: (mediaType) => MEDIA_TYPES[mediaType] !== undefined,
  what: "HTML or text"
}

/** Fetches web pages for search through the guard (`makeGuardedFetch`): only HTML and text, decoded. */
export const makePageFetcher = (resolver: HostResolver["Type"], limits: FetchLimits) => {
  const guarded = makeGuardedFetch(resolver, limits, PAGES)
  const fetch = (raw: string): Effect.Effect<FetchedPage, PageError> =>
    Effect.map(guarded.fetch(raw), ({ bytes, contentType, truncated, url }) => ({
      url,
      kind: MEDIA_TYPES[mediaTypeOf(contentType)] ?? "text",
      body: decode(contentType, bytes),
      truncated
    }))
  return { fetch }
}

export class PageFetcher extends Context.Tag("nenas/PageFetcher")<PageFetcher, {
  readonly fetch: (url: string) => Effect.Effect<FetchedPage, PageError>
}>() {
  /** Limits from configuration; the resolver is the caller's (`HostResolver.system` in the service). */
  static readonly layer = Layer.effect(
    PageFetcher,
    Effect.gen(function*() {
      const config = yield* AppConfig
      const resolver = yield* HostResolver
      return makePageFetcher(resolver, {
        allowedHosts: config.fetchAllowedHosts,
        timeout: Duration.millis(config.fetchPageTimeoutMs),
        maxBytes: PAGE_MAX_BYTES,
        maxRedirects: PAGE_MAX_REDIRECTS
      })
    })
  )
}
