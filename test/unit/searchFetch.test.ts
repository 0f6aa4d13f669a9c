import { describe, expect, it, layer } from "@effect/vitest"
import { Context, Duration, Effect, Either, Layer } from "effect"
import { AppConfig, type AppConfigShape } from "../../src/AppConfig.js"
import { refusedAddress } from "../../src/Search/Address.js"
import { mainText } from "../../src/Search/Extract.js"
import type { ResolvedAddress } from "../../src/Search/Fetch.js"
import { HostResolver, makePageFetcher, PAGE_MAX_BYTES, PageFetcher } from "../../src/Search/Fetch.js"
import { FIVE_MIB, servePage, startHttpDouble } from "../support/Search.js"
import type { HttpDouble } from "../support/Search.js"

describe("refusedAddress", () => {
  const cases: ReadonlyArray<readonly [string, string | undefined]> = [
    ["127.0.0.1", "loopback"],
    ["127.255.0.9", "loopback"],
    ["::1", "loopback"],
    ["10.1.2.3", "private"],
    ["172.16.5.4", "private"],
    ["192.168.1.1", "private"],
    ["169.254.169.254", "linkLocal"], // AWS, GCP and Azure metadata
    ["fe80::1", "linkLocal"],
    ["100.64.0.1", "carrierGradeNat"],
    ["100.100.100.200", "carrierGradeNat"], // Alibaba Cloud metadata
    ["fd00:ec2::254", "uniqueLocal"], // AWS metadata over IPv6
    ["fd20:ce::254", "uniqueLocal"], // GCP metadata over IPv6
    ["169.254.0.23", "linkLocal"], // Tencent Cloud metadata
    ["169.254.170.2", "linkLocal"], // AWS ECS task metadata
    ["192.0.0.192", "reserved"], // Oracle Cloud metadata
    // Azure's wireserver is a public-range address: refused by name, and in every IPv6 form that carries it
    ["168.63.129.16", "metadata"],
    ["::ffff:168.63.129.16", "metadata"],
    ["::a83f:8110", "ipv4Compatible"],
    ["64:ff9b::a83f:8110", "rfc6052"],
    ["2002:a83f:8110::", "6to4"],
    ["168.63.129.17", undefined],
    ["fc00::1", "uniqueLocal"],
    ["::ffff:127.0.0.1", "loopback"], // IPv4-mapped IPv6 is judged as the IPv4 inside
    ["::ffff:169.254.169.254", "linkLocal"],
    ["0.0.0.0", "unspecified"],
    ["::", "unspecified"],
    ["224.0.0.1", "multicast"],
    ["255.255.255.255", "broadcast"],
    ["64:ff9b::7f00:1", "rfc6052"], // NAT64 of 127.0.0.1
    // Every IPv6 form that carries an IPv4 address, whatever the address inside
    ["::7f00:1", "ipv4Compatible"], // ::/96: http://[::127.0.0.1] is 127.0.0.1
    ["::808:808", "ipv4Compatible"],
    ["::ffff:8.8.8.8", "ipv4Mapped"],
    ["::ffff:0:808:808", "rfc6145"],
    ["64:ff9b::808:808", "rfc6052"],
    ["64:ff9b:1::808:808", "rfc6052"],
    ["2002:808:808::1", "6to4"],
    ["2001:0:4136:e378:8000:63bf:3fff:fdd2", "teredo"],
    ["8.8.8.8", undefined],
    ["1.1.1.1", undefined],
    ["2001:4860:4860::8888", undefined],
    ["[2606:4700::1111]", undefined]
  ]
  for (const [address, expected] of cases) {
    it(`${address} → ${expected ?? "public"}`, () => expect(refusedAddress(address)).toBe(expected))
  }
})

describe("mainText", () => {
  it("keeps the article and drops scripts, styles, navigation and footer", () => {
    const text = mainText(
      `<!doctype html><html><head><title>Floods</title><script>var x = "SCRIPT"</script><style>p{}</style></head>
      <body><nav><a href="/">Home</a><a href="/m">NAV-MENU</a></nav><article><h1>Floods in KL</h1>
      <p>${"The Klang river rose two metres on Tuesday and several roads were closed. ".repeat(5)}</p>
      <p>${"Residents moved to higher ground &amp; shelters opened. ".repeat(5)}</p></article>
      <footer>FOOTER-TEXT</footer></body></html>`
    )
    expect(text).toContain("The Klang river rose two metres on Tuesday")
    expect(text).toContain("Residents moved to higher ground & shelters opened.")
    expect(text).not.toMatch(/SCRIPT|NAV-MENU|FOOTER-TEXT|<p>/)
    // Paragraphs stay apart: a block ends its line.
    expect(text.split("\n").length).toBeGreaterThan(2)
  })

  it("reads a short page without an article as its body's text, entities decoded", () => {
    expect(
      mainText(
        "<html><body><script>hidden()</script><h1>Title</h1><p>A &lt;b&gt; &eacute;t&eacute; &#8212; &quot;x&quot;</p></body></html>"
      )
    )
      .toBe("Title\nA <b> été — \"x\"")
  })
})

/** A resolver with fixed answers, as the tests' DNS: names it does not know do not resolve. */
const fixedResolver = (names: Record<string, ReadonlyArray<ResolvedAddress>>) =>
  Layer.succeed(HostResolver, {
    lookup: (hostname) => {
      const found = names[hostname]
      return found === undefined ? Promise.reject(new Error(`ENOTFOUND ${hostname}`)) : Promise.resolve(found)
    }
  })

class Servers
  extends Context.Tag("test/Servers")<Servers, { readonly pages: HttpDouble; readonly internal: HttpDouble }>()
{}

const ServersLive = Layer.scoped(
  Servers,
  Effect.acquireRelease(
    Effect.promise(async () => ({
      pages: await startHttpDouble(servePage),
      internal: await startHttpDouble((_request, response) =>
        void response.writeHead(200, { "content-type": "text/html" }).end("INTERNAL-SECRET")
      )
    })),
    ({ internal, pages }) => Effect.promise(() => Promise.all([pages.close(), internal.close()]))
  )
)

const loopback: ReadonlyArray<ResolvedAddress> = [{ address: "127.0.0.1", family: 4 }]

/** Names the test resolver knows: public-looking names that point inside, and the allowed test host. */
const Resolver = fixedResolver({
  "pages.test": loopback,
  "rebind.test": loopback,
  "intranet.test": [{ address: "10.0.0.7", family: 4 }],
  "metadata.test": [{ address: "169.254.169.254", family: 4 }],
  "wireserver.test": [{ address: "168.63.129.16", family: 4 }],
  "mixed.test": [{ address: "93.184.216.34", family: 4 }, { address: "192.168.0.10", family: 4 }],
  "v6.test": [{ address: "::1", family: 6 }],
  "public.test": [{ address: "93.184.216.34", family: 4 }]
})

const fetcherWith = (allowed: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const resolver = yield* HostResolver
    return makePageFetcher(resolver, {
      allowedHosts: new Set(allowed),
      timeout: Duration.millis(800),
      maxBytes: PAGE_MAX_BYTES,
      maxRedirects: 3
    })
  })

const failureOf = <A, E>(effect: Effect.Effect<A, E>) =>
  Effect.map(Effect.either(effect), (e) => Either.isLeft(e) ? e.left : undefined)

layer(Layer.merge(ServersLive, Resolver), { excludeTestServices: true })("page fetching", (it) => {
  it.effect("reads an allowed host's HTML and text; a name resolves through the injected resolver, not real DNS", () =>
    Effect.gen(function*() {
      const { pages } = yield* Servers
      const port = new URL(pages.baseUrl).port
      const fetcher = yield* fetcherWith([pages.host, `pages.test:${port}`])
      const html = yield* fetcher.fetch(`${pages.baseUrl}/page/report`)
      expect(html).toMatchObject({ kind: "html", truncated: false, url: `${pages.baseUrl}/page/report` })
      expect(html.body).toContain("Readable &amp; plain text.")
      // `pages.test` exists only in the test's resolver: the connection went where it said.
      const named = yield* fetcher.fetch(`http://pages.test:${port}/page/plain.txt`)
      expect(named).toMatchObject({ kind: "text", body: "Plain   text\n\nreport." })
    }))

  it.effect("refuses every non-public address class given as a literal, and never connects", () =>
    Effect.gen(function*() {
      const { internal } = yield* Servers
      const port = new URL(internal.baseUrl).port
      const fetcher = yield* fetcherWith([])
      const before = internal.hits.length
      for (
        const host of [
          "127.0.0.1",
          "127.0.0.2",
          "[::1]",
          "10.0.0.1",
          "172.16.0.1",
          "192.168.0.1",
          "169.254.169.254",
          "100.64.0.1",
          "[fe80::1]",
          "[fd00:ec2::254]",
          "[::ffff:127.0.0.1]",
          "0.0.0.0",
          "0x7f.1",
          "2130706433",
          "168.63.129.16",
          "[::ffff:168.63.129.16]"
        ]
      ) {
        const error = yield* failureOf(fetcher.fetch(`http://${host}:${port}/`))
        expect(error?._tag, host).toBe("PageRefused")
      }
      expect(internal.hits.length).toBe(before)
    }))

  it.effect("refuses a name that resolves to loopback, private, metadata or partly private addresses", () =>
    Effect.gen(function*() {
      const { internal } = yield* Servers
      const port = new URL(internal.baseUrl).port
      const fetcher = yield* fetcherWith([])
      const before = internal.hits.length
      for (
        const name of ["rebind.test", "intranet.test", "metadata.test", "wireserver.test", "mixed.test", "v6.test"]
      ) {
        const error = yield* failureOf(fetcher.fetch(`http://${name}:${port}/`))
        expect(error, name).toMatchObject({ _tag: "PageRefused" })
        expect(error?.reason, name).toMatch(/resolves to/)
      }
      expect(internal.hits.length).toBe(before)
    }))

  it.effect("refuses [::127.0.0.1] and the other embedded-IPv4 literals on the default port, and never connects", () =>
    Effect.gen(function*() {
      const fetcher = yield* fetcherWith([])
      for (
        const host of [
          "[::127.0.0.1]",
          "[::7f00:1]",
          "[::a00:1]",
          "[::ffff:7f00:1]",
          "[64:ff9b::127.0.0.1]",
          "[2002:7f00:1::]"
        ]
      ) {
        const error = yield* failureOf(fetcher.fetch(`http://${host}/`))
        expect(error, host).toMatchObject({ _tag: "PageRefused" })
        expect(error?.reason, host).toMatch(/address/)
      }
    }))

  it.effect("keeps to ports 80 and 443: a public host's :22 is refused before any connection; an allowed host:port is reached", () =>
    Effect.gen(function*() {
      const { pages } = yield* Servers
      const port = new URL(pages.baseUrl).port
      const fetcher = yield* fetcherWith([`pages.test:${port}`])
      const before = pages.hits.length
      for (
        const url of [
          "http://public.test:22/",
          "https://public.test:8443/x",
          `http://public.test:${port}/page/x`,
          "http://93.184.216.34:22/"
        ]
      ) {
        const error = yield* failureOf(fetcher.fetch(url))
        expect(error, url).toMatchObject({ _tag: "PageRefused" })
        expect(error?.reason, url).toMatch(/^port \d+ is not fetched/)
      }
      // A redirect to another port is checked as well.
      const unlisted = yield* fetcherWith([pages.host])
      const redirected = yield* failureOf(
        unlisted.fetch(`${pages.baseUrl}/redirect?to=${encodeURIComponent("http://public.test:22/")}`)
      )
      expect(redirected?.reason).toMatch(/^port 22 is not fetched/)
      expect(pages.hits.length).toBe(before + 1)
      // FETCH_ALLOWED_HOSTS names test servers with their ports: those are fetched.
      expect((yield* fetcher.fetch(`http://pages.test:${port}/page/plain.txt`)).kind).toBe("text")
    }))

  it.effect("the service's page fetcher reaches FETCH_ALLOWED_HOSTS only, never a host in WEBHOOK_ALLOWED_HOSTS alone", () =>
    Effect.gen(function*() {
      const { internal, pages } = yield* Servers
      const fetcherFor = (config: Partial<AppConfigShape>) =>
        Effect.provide(PageFetcher, PageFetcher.layer.pipe(Layer.provide(AppConfig.layerWith(config))))
      const before = internal.hits.length
      const webhooksOnly = yield* fetcherFor({
        webhookAllowedHosts: new Set([internal.host]),
        fetchAllowedHosts: new Set()
      })
      expect(yield* failureOf(webhooksOnly.fetch(`${internal.baseUrl}/`))).toMatchObject({ _tag: "PageRefused" })
      expect(internal.hits.length).toBe(before)
      const pagesAllowed = yield* fetcherFor({
        webhookAllowedHosts: new Set(),
        fetchAllowedHosts: new Set([pages.host])
      })
      expect((yield* pagesAllowed.fetch(`${pages.baseUrl}/page/plain.txt`)).kind).toBe("text")
    }))

  it.effect("refuses schemes other than http(s), and URLs with credentials", () =>
    Effect.gen(function*() {
      const { pages } = yield* Servers
      const fetcher = yield* fetcherWith([pages.host])
      for (
        const url of [
          "file:///etc/passwd",
          "ftp://example.com/x",
          "gopher://127.0.0.1:70/",
          "data:text/html,hi",
          "not a url"
        ]
      ) {
        expect((yield* failureOf(fetcher.fetch(url)))?._tag, url).toBe("PageRefused")
      }
      const withCredentials = `http://user:secret@${pages.host}/page/x`
      expect((yield* failureOf(fetcher.fetch(withCredentials)))?._tag).toBe("PageRefused")
    }))

  it.effect("checks every redirect: one to a private address or a name resolving to one is refused; at most 3 are followed", () =>
    Effect.gen(function*() {
      const { internal, pages } = yield* Servers
      const fetcher = yield* fetcherWith([pages.host])
      const port = new URL(internal.baseUrl).port
      const before = internal.hits.length
      const redirect = (to: string) => `${pages.baseUrl}/redirect?to=${encodeURIComponent(to)}`
      for (
        const target of [
          `${internal.baseUrl}/`,
          `http://rebind.test:${port}/`,
          "http://169.254.169.254/latest/meta-data/",
          "file:///etc/passwd"
        ]
      ) {
        expect((yield* failureOf(fetcher.fetch(redirect(target))))?._tag, target).toBe("PageRefused")
      }
      expect(internal.hits.length).toBe(before)
      // Three redirects are followed to the page; a fourth is one too many.
      const three = redirect(redirect(redirect(`${pages.baseUrl}/page/end`)))
      expect((yield* fetcher.fetch(three)).url).toBe(`${pages.baseUrl}/page/end`)
      const four = yield* failureOf(fetcher.fetch(redirect(three)))
      expect(four).toMatchObject({ _tag: "PageFailed" })
      expect(four?.reason).toMatch(/more than 3 redirects/)
    }))

  it.effect("a 500, a PDF and a page that never answers fail; a 5 MiB page is read to 2 MiB and cut off", () =>
    Effect.gen(function*() {
      const { pages } = yield* Servers
      const fetcher = yield* fetcherWith([pages.host])
      expect(yield* failureOf(fetcher.fetch(`${pages.baseUrl}/page/error`))).toMatchObject({
        _tag: "PageFailed",
        reason: "HTTP 500"
      })
      const pdf = yield* failureOf(fetcher.fetch(`${pages.baseUrl}/page/doc.pdf`))
      expect(pdf).toMatchObject({ _tag: "PageRefused" })
      expect(pdf?.reason).toMatch(/application\/pdf/)
      const slow = yield* failureOf(fetcher.fetch(`${pages.baseUrl}/page/slow`))
      expect(slow).toMatchObject({ _tag: "PageFailed" })
      expect(slow?.reason).toMatch(/no page within/)
      const huge = yield* fetcher.fetch(`${pages.baseUrl}/page/huge`)
      expect(huge.truncated).toBe(true)
      expect(huge.body.length).toBe(PAGE_MAX_BYTES)
      expect(PAGE_MAX_BYTES).toBeLessThan(FIVE_MIB)
    }))
})
