import { Context, Effect, Layer } from "effect"
import { createServer, type IncomingMessage, type ServerResponse } from "node:http"
import type { AddressInfo, Socket } from "node:net"
import { PLANNER_MARKER } from "../../src/Search/Planning.js"

/** A SearXNG result as its JSON API sends it. */
export interface SearxResult {
  readonly title: string
  readonly url: string
  readonly content?: string | null
  readonly publishedDate?: string | null
}

export interface HttpDouble {
  /** `http://127.0.0.1:<port>` */
  readonly baseUrl: string
  /** `127.0.0.1:<port>`, as `FETCH_ALLOWED_HOSTS` names it. */
  readonly host: string
  /** Paths requested, in order (query strings included). */
  readonly hits: Array<string>
  close(): Promise<void>
}

/** Starts a plain Node server on a free loopback port; `close` also cuts hanging connections. */
export const startHttpDouble = (handle: (request: IncomingMessage, response: ServerResponse, url: URL) => void) =>
  new Promise<HttpDouble>((resolve) => {
    const hits: Array<string> = []
    const sockets = new Set<Socket>()
    const server = createServer((request, response) => {
      const url = new URL(request.url ?? "/", "http://localhost")
      hits.push(url.pathname + url.search)
      handle(request, response, url)
    })
    server.on("connection", (socket) => {
      sockets.add(socket)
      socket.once("close", () => sockets.delete(socket))
    })
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as AddressInfo // a TCP listener: never a pipe name
      resolve({
        baseUrl: `http://127.0.0.1:${port}`,
        host: `127.0.0.1:${port}`,
        hits,
        close: () =>
          new Promise<void>((done) => {
            server.close(() => done())
            for (const socket of sockets) socket.destroy()
          })
      })
    })
  })

export const FIVE_MIB = 5 * 1024 * 1024

/** An article long enough for Readability to recognise, naming `topic`. */
export const articleHtml = (topic: string) => {
  const paragraph = `<p>${
    `This page reports on ${topic}: the river rose two metres and the roads were closed for a day. `.repeat(4)
  }</p>`
  return `<!doctype html><html><head><title>About ${topic}</title><script>var hidden = "SCRIPT-TEXT"</script>` +
    `<style>p { color: red }</style></head><body><nav><a href="/">Home</a> <a href="/menu">NAV-MENU</a></nav>` +
    `<article><h1>Report on ${topic}</h1>${paragraph}${paragraph}<p>Readable &amp; plain text.</p></article>` +
    `<footer>FOOTER-TEXT</footer></body></html>`
}

/**
 * Pages as the web serves them, by path: `/page/error` 500s, `/page/slow`
 * never answers, `/page/huge` is 5 MiB of text sent in pieces, `/page/doc.pdf`
 * is a PDF, `/page/plain.txt` is text, `/redirect?to=<url>` redirects (302),
 * any other `/page/…` is an HTML article naming its path.
 */
export const servePage = (_request: IncomingMessage, response: ServerResponse, url: URL) => {
  const path = url.pathname
  if (path === "/redirect") {
    response.writeHead(302, { location: url.searchParams.get("to") ?? "/" }).end()
    return
  }
  if (path === "/page/error") {
    response.writeHead(500, { "content-type": "text/html" }).end("<h1>Internal Server Error</h1>")
    return
  }
  if (path === "/page/slow") return // never answers; the client's deadline ends it
  if (path === "/page/doc.pdf") {
    response.writeHead(200, { "content-type": "application/pdf" }).end("%PDF-1.7\n%binary report\n")
    return
  }
  if (path === "/page/plain.txt") {
    response.writeHead(200, { "content-type": "text/plain; charset=utf-8" }).end("Plain   text\n\nreport.")
    return
  }
  if (path === "/page/huge") {
    response.writeHead(200, { "content-type": "text/plain", "content-length": FIVE_MIB })
    const piece = Buffer.alloc(64 * 1024, "a")
    let sent = 0
    const more = () => {
      while (sent < FIVE_MIB && !response.destroyed) {
        sent += piece.length
        if (!response.write(piece)) return void response.once("drain", more)
      }
      if (!response.destroyed) response.end()
    }
    more()
    return
  }
  response.writeHead(200, { "content-type": "text/html; charset=utf-8" }).end(articleHtml(path))
}

export interface SearchDouble extends HttpDouble {
  /** The `q` of every search, in order. */
  readonly queries: Array<string>
  /** Page paths requested (not searches). */
  readonly pages: Array<string>
  /** Answers every search with this status while set. */
  failWith: number | undefined
  /** The results of a search; default: four per query, the first shared by all queries. */
  results: (query: string) => ReadonlyArray<SearxResult>
}

const slug = (text: string) => text.toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "")

/** A SearXNG-compatible search API (`GET /search?q=…&format=json`) that also serves the pages it finds. */
export const startSearchDouble = async (): Promise<SearchDouble> => {
  const state = {
    queries: [] as Array<string>,
    pages: [] as Array<string>,
    failWith: undefined as number | undefined,
    results: (_query: string): ReadonlyArray<SearxResult> => []
  }
  const http = await startHttpDouble((request, response, url) => {
    if (url.pathname !== "/search") {
      state.pages.push(url.pathname)
      return servePage(request, response, url)
    }
    const query = url.searchParams.get("q") ?? ""
    state.queries.push(query)
    if (double.failWith !== undefined) return void response.writeHead(double.failWith).end("down")
    if (url.searchParams.get("format") !== "json") return void response.writeHead(400).end("format=json expected")
    response.writeHead(200, { "content-type": "application/json" }).end(
      JSON.stringify({ results: double.results(query) })
    )
  })
  const defaults = (query: string): ReadonlyArray<SearxResult> =>
    [1, 2, 3, 4].map((n) => ({
      title: n === 1 ? "Shared report" : `Report ${n} on ${query}`,
      url: n === 1 ? `${http.baseUrl}/page/shared` : `${http.baseUrl}/page/${slug(query)}-${n}`,
      content: `Snippet ${n} about ${query}.`,
      publishedDate: n === 1 ? "2026-11-20T00:00:00" : null
    }))
  const double: SearchDouble = Object.assign(http, {
    queries: state.queries,
    pages: state.pages,
    failWith: undefined,
    results: defaults
  })
  return double
}

export class Searx extends Context.Tag("test/Searx")<Searx, SearchDouble & { readonly reset: () => void }>() {
  static readonly layer = Layer.scoped(
    Searx,
    Effect.acquireRelease(
      Effect.promise(startSearchDouble),
      (double) => Effect.promise(() => double.close())
    ).pipe(Effect.map((double) => {
      const defaults = double.results
      return Object.assign(double, {
        reset: () => {
          double.queries.length = 0
          double.pages.length = 0
          double.hits.length = 0
          double.failWith = undefined
          double.results = defaults
        }
      })
    }))
  )
}

/** A server the service must never reach (an "internal" address); `hits` shows whether it was. */
export class Internal extends Context.Tag("test/Internal")<Internal, HttpDouble>() {
  static readonly layer = Layer.scoped(
    Internal,
    Effect.acquireRelease(
      Effect.promise(() =>
        startHttpDouble((_request, response) =>
          void response.writeHead(200, { "content-type": "text/html" }).end("<p>INTERNAL-SECRET</p>")
        )
      ),
      (double) => Effect.promise(() => double.close())
    )
  )
}

type Json = Record<string, unknown>

const messagesOf = (body: Json): ReadonlyArray<{ readonly role: string; readonly content: string }> =>
  Array.isArray(body["messages"])
    ? body["messages"] as ReadonlyArray<{ readonly role: string; readonly content: string }>
    : []

/** Whether an upstream request is web search's planning call. */
export const isPlanning = (body: unknown): boolean =>
  typeof body === "object" && body !== null && messagesOf(body as Json)[0]?.content?.startsWith(PLANNER_MARKER) === true

/** An upstream answer: `plan` for planning calls (a list of lines, or per round), `answer` for the rest. */
export const answering = (plan: ReadonlyArray<string> | ((round: number) => ReadonlyArray<string>), answer: string) => {
  return (body: Json): string => {
    if (!isPlanning(body)) return answer
    const round = messagesOf(body).some((m) => m.content.startsWith("Searches already run:")) ? 2 : 1
    return (typeof plan === "function" ? plan(round) : plan).join("\n")
  }
}
