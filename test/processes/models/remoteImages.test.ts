import { expect, layer } from "@effect/vitest"
import { Context, Duration, Effect, Either, Layer } from "effect"
import { execFileSync } from "node:child_process"
import { mkdtemp, readFile, rm } from "node:fs/promises"
import type { IncomingMessage, ServerResponse } from "node:http"
import { createServer } from "node:https"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { HostResolver } from "../../../src/Search/Fetch.js"
import { makeImageFetcher } from "../../../src/Search/ImageFetch.js"
import { expectClientError } from "../../support/ErrorBody.js"
import { fundedDeveloper } from "../../support/Fetch.js"
import { call, createKey, devToken } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream } from "../../support/Models.js"
import { startHttpDouble } from "../../support/Search.js"
import { startService, stopService } from "../../support/ServiceProcess.js"
import { freshDatabase, makeShiftableClock, TestServer } from "../../support/TestServer.js"
import { startUpstream, Upstream, type UpstreamServer } from "../../support/Upstream.js"

/**
 * `UPSTREAM_IMAGE_URLS=inline` fetches remote images through the
 * fetch guard and sends them upstream as `data:` URLs; unset, they pass as
 * they came.
 */

const MODEL = "svc/nenas-flash"
const PNG = Buffer.from(
  "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==",
  "base64"
)
const PNG_DATA_URL = `data:image/png;base64,${PNG.toString("base64")}`

/** Images, a page that is not one, a 1000-byte and a 1001-byte image, and a redirect to `?to=`. */
const serveImages = (_request: IncomingMessage, response: ServerResponse, url: URL) => {
  switch (url.pathname) {
    case "/cat.png":
      return void response.writeHead(200, { "content-type": "image/png" }).end(PNG)
    case "/page.html":
      return void response.writeHead(200, { "content-type": "text/html" }).end("<p>not an image</p>")
    case "/exact.png":
      return void response.writeHead(200, { "content-type": "image/png" }).end(Buffer.alloc(1000, 1))
    case "/over.png":
      return void response.writeHead(200, { "content-type": "image/png" }).end(Buffer.alloc(1001, 1))
    case "/away":
      return void response.writeHead(302, { location: url.searchParams.get("to") ?? "/" }).end()
    default:
      return void response.writeHead(404).end()
  }
}

const userImage = (url: string) => ({
  model: MODEL,
  messages: [{
    role: "user",
    content: [{ type: "text", text: "Describe." }, { type: "image_url", image_url: { url, detail: "low" } }]
  }]
})

// ---------------------------------------------------------------------------
// The image fetcher itself, over plain HTTP.
// ---------------------------------------------------------------------------

class Images extends Context.Tag("test/Images")<Images, Awaited<ReturnType<typeof startHttpDouble>>>() {}

const ImagesLive = Layer.scoped(
  Images,
  Effect.acquireRelease(
    Effect.promise(() => startHttpDouble(serveImages)),
    (double) => Effect.promise(() => double.close())
  )
)

const noDns = Layer.succeed(HostResolver, { lookup: (hostname) => Promise.reject(new Error(`ENOTFOUND ${hostname}`)) })

layer(Layer.merge(ImagesLive, noDns), { excludeTestServices: true })("the image fetcher", (it) => {
  const fetcherFor = (allowed: ReadonlyArray<string>) =>
    Effect.map(
      HostResolver,
      (resolver) =>
        makeImageFetcher(resolver, {
          allowedHosts: new Set(allowed),
          timeout: Duration.seconds(5),
          maxBytes: 1000,
          maxRedirects: 3
        })
    )

  it.effect("reads an image whole with its media type; refuses what is not an image, over the cap, or not allowed", () =>
    Effect.gen(function*() {
      const images = yield* Images
      const fetcher = yield* fetcherFor([images.host])
      expect(yield* fetcher.fetch(`${images.baseUrl}/cat.png`)).toEqual({ mediaType: "image/png", bytes: PNG })
      expect((yield* fetcher.fetch(`${images.baseUrl}/exact.png`)).bytes.length).toBe(1000)
      for (const path of ["/page.html", "/over.png"]) {
        const refused = yield* Effect.either(fetcher.fetch(`${images.baseUrl}${path}`))
        expect(Either.isLeft(refused) && refused.left._tag, path).toBe("PageRefused")
      }
      // Loopback, and not in the allowed hosts: refused before any connection.
      images.hits.length = 0
      const guarded = yield* fetcherFor([])
      const loopback = yield* Effect.either(guarded.fetch(`${images.baseUrl}/cat.png`))
      expect(Either.isLeft(loopback) && loopback.left._tag).toBe("PageRefused")
      expect(images.hits).toEqual([])
    }))
})

// ---------------------------------------------------------------------------
// The service with UPSTREAM_IMAGE_URLS=inline, in a process of its own that
// trusts the test's certificate: image URLs must be https.
// ---------------------------------------------------------------------------

interface HttpsImages {
  /** `https://127.0.0.1:<port>` of the allowed server and of one that is not allowed. */
  readonly allowed: string
  readonly forbidden: string
  /** Paths requested from either server. */
  readonly hits: Array<string>
  readonly upstream: UpstreamServer
}

class Fixture extends Context.Tag("test/RemoteImagesFixture")<Fixture, HttpsImages>() {}

/** A self-signed certificate for 127.0.0.1, made with openssl in `dir`. */
const certificate = (dir: string) =>
  Effect.promise(async () => {
    const [key, cert] = [join(dir, "key.pem"), join(dir, "cert.pem")]
    execFileSync("openssl", [
      "req",
      "-x509",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:prime256v1",
      "-nodes",
      "-days",
      "2",
      "-keyout",
      key,
      "-out",
      cert,
      "-subj",
      "/CN=127.0.0.1",
      "-addext",
      "subjectAltName=IP:127.0.0.1"
    ], { stdio: "ignore" })
    return { key: await readFile(key), cert: await readFile(cert), certPath: cert }
  })

const httpsServer = (tls: { readonly key: Buffer; readonly cert: Buffer }, hits: Array<string>) =>
  Effect.acquireRelease(
    Effect.promise(() =>
      new Promise<{ readonly server: ReturnType<typeof createServer>; readonly origin: string }>((resolve) => {
        const server = createServer({ key: tls.key, cert: tls.cert }, (request, response) => {
          const url = new URL(request.url ?? "/", "https://127.0.0.1")
          hits.push(url.pathname)
          serveImages(request, response, url)
        })
        server.listen(0, "127.0.0.1", () => {
          const { port } = server.address() as AddressInfo // a TCP listener: never a pipe name
          resolve({ server, origin: `https://127.0.0.1:${port}` })
        })
      })
    ),
    ({ server }) =>
      Effect.promise(() =>
        new Promise<void>((done) => {
          server.closeAllConnections()
          server.close(() => done())
        })
      )
  )

const InlineServiceLive = Layer.scopedContext(Effect.gen(function*() {
  const dir = yield* Effect.acquireRelease(
    Effect.promise(() => mkdtemp(join(tmpdir(), "nenas-images-"))),
    (path) => Effect.promise(() => rm(path, { recursive: true, force: true }))
  )
  const tls = yield* certificate(dir)
  const hits: Array<string> = []
  const allowed = yield* httpsServer(tls, hits)
  const forbidden = yield* httpsServer(tls, hits)
  const upstream = yield* Effect.acquireRelease(
    Effect.promise(() => startUpstream()),
    (server) => Effect.promise(() => server.close())
  )
  const database = yield* freshDatabase
  const service = yield* Effect.acquireRelease(
    Effect.promise(() =>
      startService({
        env: {
          DATABASE_URL: database.url,
          DATA_DIR: join(dir, "data"),
          UPSTREAM_BASE_URL: upstream.baseUrl,
          UPSTREAM_IMAGE_URLS: "inline",
          FETCH_ALLOWED_HOSTS: new URL(allowed.origin).host,
          NODE_EXTRA_CA_CERTS: tls.certPath
        }
      })
    ),
    (started) => Effect.promise(() => stopService(started, "SIGKILL"))
  )
  const testServer = {
    baseUrl: service.baseUrl,
    databaseUrl: database.url,
    clock: makeShiftableClock(),
    settled: Effect.void
  }
  return Context.make(TestServer, testServer).pipe(
    Context.add(Fixture, { allowed: allowed.origin, forbidden: forbidden.origin, hits, upstream })
  )
}))

layer(InlineServiceLive, { excludeTestServices: true, timeout: 180_000 })("UPSTREAM_IMAGE_URLS=inline", (it) => {
  const funded = (email: string) =>
    Effect.flatMap(
      TestServer,
      ({ baseUrl }) => Effect.promise(() => fundedDeveloper(baseUrl, email, 1000, "simulated checkout"))
    )

  it.effect("an allowed remote image reaches the upstream as a data: URL of its bytes, on both endpoints", () =>
    Effect.gen(function*() {
      const { allowed, hits, upstream } = yield* Fixture
      const { apiKey } = yield* funded("inline-ok@example.com")
      upstream.reset()
      hits.length = 0
      const chat = yield* modelCall(apiKey, "/v1/chat/completions", userImage(`${allowed}/cat.png`))
      expect(chat.status, chat.text).toBe(200)
      const responses = yield* modelCall(apiKey, "/v1/responses", {
        model: MODEL,
        input: [{
          role: "user",
          content: [{ type: "input_text", text: "Describe." }, { type: "input_image", image_url: `${allowed}/cat.png` }]
        }]
      })
      expect(responses.status, responses.text).toBe(200)
      expect(hits).toEqual(["/cat.png", "/cat.png"])
      const sent = upstream.requests.map((request) =>
        (request.body as { messages: Array<{ content: unknown }> }).messages[0]?.content
      )
      expect(sent).toEqual([
        [{ type: "text", text: "Describe." }, { type: "image_url", image_url: { url: PNG_DATA_URL, detail: "low" } }],
        [{ type: "text", text: "Describe." }, { type: "image_url", image_url: { url: PNG_DATA_URL } }]
      ])
    }))

  it.effect("a loopback image not allowed, directly or through a redirect, or not an image: 400 naming it, nothing fetched, nothing sent, nothing held", () =>
    Effect.gen(function*() {
      const { allowed, forbidden, hits, upstream } = yield* Fixture
      const { apiKey, token } = yield* funded("inline-refused@example.com")
      const before = (yield* call("GET", "/dashboard/billing/balance", { token })).body
      upstream.reset()
      hits.length = 0
      const direct = yield* modelCall(apiKey, "/v1/chat/completions", userImage(`${forbidden}/cat.png`))
      expectClientError(direct, { status: 400, code: "invalid_request", param: "messages[0].content[1].image_url.url" })
      expect(direct.text).not.toContain("127.0.0.1")
      expect(hits).toEqual([])
      const streamed = yield* modelCall(apiKey, "/v1/responses", {
        model: MODEL,
        stream: true,
        input: [{ role: "user", content: [{ type: "input_image", image_url: `${forbidden}/cat.png` }] }]
      })
      expectClientError(streamed, { status: 400, code: "invalid_request", param: "input[0].content[0].image_url" })
      expect(hits).toEqual([])
      // The allowed server answers with a redirect to the forbidden one, which is never asked.
      const redirected = yield* modelCall(
        apiKey,
        "/v1/chat/completions",
        userImage(`${allowed}/away?to=${encodeURIComponent(`${forbidden}/cat.png`)}`)
      )
      expectClientError(redirected, {
        status: 400,
        code: "invalid_request",
        param: "messages[0].content[1].image_url.url"
      })
      expect(hits).toEqual(["/away"])
      const page = yield* modelCall(apiKey, "/v1/chat/completions", userImage(`${allowed}/page.html`))
      expectClientError(page, { status: 400, code: "invalid_request", param: "messages[0].content[1].image_url.url" })
      expect(upstream.requests).toEqual([])
      // Every hold was returned: the wallet is as it was.
      const after = (yield* call("GET", "/dashboard/billing/balance", { token })).body
      expect(after.reserved_myr).toBe(0)
      expect(after.balance_myr).toBe(before.balance_myr)
    }))

  it.effect("a test key's call goes to the built-in model, which fetches nothing: the image is not fetched", () =>
    Effect.gen(function*() {
      const { forbidden, hits } = yield* Fixture
      const key =
        (yield* createKey(yield* devToken("inline-test-key@example.com"), { name: "test", environment: "test" }))
          .full_key
      hits.length = 0
      const reply = yield* modelCall(key, "/v1/chat/completions", userImage(`${forbidden}/cat.png`))
      expect(reply.status, reply.text).toBe(200)
      expect(hits).toEqual([])
    }))
})

// ---------------------------------------------------------------------------
// Unset: remote image URLs go to the upstream as they came.
// ---------------------------------------------------------------------------

layer(TestServerWithUpstream(), { excludeTestServices: true, timeout: 60_000 })("UPSTREAM_IMAGE_URLS unset", (it) => {
  it.effect("a remote image URL reaches the upstream unchanged", () =>
    Effect.gen(function*() {
      const upstream = yield* Upstream
      const { apiKey } = yield* caller("pass-images@example.com", { sen: 1000 })
      upstream.reset()
      const reply = yield* modelCall(apiKey, "/v1/chat/completions", userImage("https://images.example/cat.png"))
      expect(reply.status, reply.text).toBe(200)
      expect((upstream.requests[0]?.body as { messages: Array<{ content: unknown }> }).messages[0]?.content).toEqual([
        { type: "text", text: "Describe." },
        { type: "image_url", image_url: { url: "https://images.example/cat.png", detail: "low" } }
      ])
    }))
})
