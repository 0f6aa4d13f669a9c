import { describe, expect, it, layer } from "@effect/vitest"
import { Effect, Either, Option } from "effect"
import { spawnSync } from "node:child_process"
import { randomUUID } from "node:crypto"
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { connect } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { parse } from "yaml"
import { devRouteAllowed } from "../../../src/Http/DevRoutes.js"
import { APP_CSP, corsPolicy } from "../../../src/Lane/SecurityHeaders.js"
import { configFrom, PRODUCTION_ENV } from "../../support/Config.js"
import { expectClientError } from "../../support/ErrorBody.js"
import { call, devToken, type Reply } from "../../support/Http.js"
import { linesOf, startService } from "../../support/ServiceProcess.js"
import { query, TestServer, TestServerLive } from "../../support/TestServer.js"
import { developer } from "../../support/Wallet.js"

/**
 * The security headers and CORS (docs/security.md, "Security") on a running
 * service, and its refusal to start with a JWKS but no issuer or audience to
 * check tokens against.
 */

const FOREIGN = "https://evil.example"

/** A browser's CORS preflight for `method` on `path` from `origin`. */
const preflight = (path: string, origin: string, method = "POST") =>
  call("OPTIONS", path, {
    headers: {
      origin,
      "access-control-request-method": method,
      "access-control-request-headers": "authorization,content-type"
    }
  })

layer(TestServerLive(), { excludeTestServices: true })("security headers and CORS", (it) => {
  it.effect("every answer has nosniff and no-referrer; /app has the strict CSP; /docs is sandboxed", () =>
    Effect.gen(function*() {
      for (
        const path of [
          "/app/",
          "/app/config.json",
          "/docs",
          "/v1/models",
          "/dashboard/api-keys",
          "/healthz",
          "/no-such-route"
        ]
      ) {
        const reply = yield* call("GET", path)
        expect(reply.headers.get("x-content-type-options"), path).toBe("nosniff")
        expect(reply.headers.get("referrer-policy"), path).toBe("no-referrer")
        expect(reply.headers.get("content-security-policy"), path).toContain("frame-ancestors 'none'")
      }
      const app = (yield* call("GET", "/app/config.json")).headers.get("content-security-policy") ?? ""
      expect(app).toBe(APP_CSP)
      for (
        const directive of ["default-src 'self'", "frame-ancestors 'none'", "object-src 'none'", "base-uri 'none'"]
      ) {
        expect(app).toContain(directive)
      }
      const docs = yield* call("GET", "/docs")
      expect(docs.status).toBe(200)
      const docsPolicy = docs.headers.get("content-security-policy") ?? ""
      // An opaque origin: the docs' scripts cannot read the dashboard's sessionStorage.
      expect(docsPolicy).toMatch(/(^|; )sandbox allow-scripts( |;)/)
      expect(docsPolicy).not.toContain("allow-same-origin")
    }))

  it.effect("/v1 answers any origin; /dashboard only the dashboard's; /metrics and the docs none", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      const models = yield* call("GET", "/v1/models", { headers: { origin: FOREIGN } })
      expect(models.headers.get("access-control-allow-origin")).toBe("*")
      expect(models.headers.get("access-control-expose-headers")).toContain("x-request-id")
      const foreign = yield* call("GET", "/dashboard/api-keys", { headers: { origin: FOREIGN } })
      expect(foreign.headers.get("access-control-allow-origin")).toBeNull()
      expect(foreign.headers.get("vary")).toContain("Origin")
      const own = yield* call("GET", "/dashboard/api-keys", { headers: { origin: baseUrl } })
      expect(own.headers.get("access-control-allow-origin")).toBe(baseUrl)
      for (const path of ["/metrics", "/openapi.json", "/docs", "/healthz"]) {
        const reply = yield* call("GET", path, { headers: { origin: FOREIGN } })
        expect(reply.headers.get("access-control-allow-origin"), path).toBeNull()
      }
    }))

  it.effect("a preflight from a foreign origin on /dashboard is refused; the dashboard's own and /v1's are allowed", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      for (const path of ["/dashboard/api-keys", "/dashboard/billing/checkout", "/dev/session", "/metrics"]) {
        const refused = yield* preflight(path, FOREIGN)
        expect(refused.status, path).toBe(403)
        expect(refused.body.error.code).toBe("permission_denied")
        expect(refused.body.error.request_id).toBe(refused.headers.get("x-request-id"))
        expect(refused.headers.get("access-control-allow-origin"), path).toBeNull()
        expect(refused.headers.get("access-control-allow-methods"), path).toBeNull()
      }
      const own = yield* preflight("/dashboard/api-keys", baseUrl, "DELETE")
      expect(own.status).toBe(204)
      expect(own.headers.get("access-control-allow-origin")).toBe(baseUrl)
      expect(own.headers.get("access-control-allow-methods")).toContain("DELETE")
      expect(own.headers.get("access-control-allow-methods"), "the dashboard edits keys with PATCH").toContain("PATCH")
      expect(own.headers.get("access-control-allow-headers")).toBe("authorization,content-type")
      const api = yield* preflight("/v1/chat/completions", FOREIGN)
      expect(api.status).toBe(204)
      expect(api.headers.get("access-control-allow-origin")).toBe("*")
    }))

  it.effect("a browser may delete a stored response: /v1's preflight allows DELETE", () =>
    Effect.gen(function*() {
      const api = yield* preflight("/v1/responses/resp_x", FOREIGN, "DELETE")
      expect(api.status).toBe(204)
      expect(api.headers.get("access-control-allow-origin")).toBe("*")
      const methods = (api.headers.get("access-control-allow-methods") ?? "").split(",").map((method) => method.trim())
      expect(methods).toContain("DELETE")
      expect(methods).not.toContain("PATCH")
    }))
})

layer(TestServerLive(), { excludeTestServices: true })("development routes behind a proxy", (it) => {
  const FORWARDING: ReadonlyArray<Record<string, string>> = [
    { "x-forwarded-for": "203.0.113.9" },
    { forwarded: "for=203.0.113.9;proto=https" },
    { "x-forwarded-host": "nenas.example" },
    { "x-forwarded-proto": "https" }
  ]

  it.effect("a forwarded request to any /dev route answers 404 not_found; the same request sent directly works", () =>
    Effect.gen(function*() {
      const token = yield* devToken("dev-proxy@example.com")
      const checkout = yield* call("POST", "/dashboard/billing/checkout", { token, json: { amount_sen: 1000 } })
      expect(checkout.status, checkout.text).toBe(200)
      const session: string = checkout.body.session_id
      const routes: ReadonlyArray<readonly [string, string, Record<string, unknown> | undefined]> = [
        ["POST", "/dev/session", { email: "anyone@example.com" }],
        ["GET", "/dev/.well-known/jwks.json", undefined],
        ["GET", "/dev/mailbox", undefined],
        ["GET", `/dev/checkout/${session}`, undefined],
        ["GET", `/dev/checkout/setup/${session}`, undefined],
        ["POST", `/dev/checkout/setup/${session}/save`, undefined],
        ["POST", `/dev/checkout/${session}/cancel`, undefined],
        ["POST", `/dev/checkout/${session}/pay`, undefined]
      ]
      for (const [method, path, json] of routes) {
        for (const headers of FORWARDING) {
          const what = `${method} ${path} ${JSON.stringify(headers)}`
          const refused = yield* call(method, path, { headers, ...(json === undefined ? {} : { json }) })
          expectClientError(refused, { status: 404, code: "not_found" }, what)
          expect(refused.body.error.message, what).toContain("X-Forwarded-*")
          expect(refused.text, what).not.toContain("\"token\"")
        }
      }
      // Nothing forwarded was done: the checkout is still open, and it pays when asked directly.
      expect((yield* call("GET", `/dev/checkout/${session}`)).text).toContain(">Pay<")
      const signedIn = yield* call("POST", "/dev/session", { json: { email: "anyone@example.com" } })
      expect(signedIn.status).toBe(200)
      expect(typeof signedIn.body.token).toBe("string")
      expect((yield* call("GET", "/dev/.well-known/jwks.json")).status).toBe(200)
      expect((yield* call("GET", "/dev/mailbox")).status).toBe(200)
      const paid = yield* call("POST", `/dev/checkout/${session}/pay`)
      expect(paid.status, paid.text).toBe(200)
      expect(paid.text).toContain("Payment received")
    }))
})

layer(TestServerLive(), { excludeTestServices: true })("answers that carry secrets", (it) => {
  const noStore = (reply: Reply, what: string) =>
    expect(reply.headers.get("cache-control"), `${what}: ${reply.status}`).toBe("no-store")

  it.effect("a new key, a rotated key, a webhook secret, a session token and /v1/responses answers carry Cache-Control: no-store", () =>
    Effect.gen(function*() {
      const signedIn = yield* call("POST", "/dev/session", { json: { email: "no-store@example.com" } })
      noStore(signedIn, "POST /dev/session")
      const { accountId, token } = yield* developer("no-store@example.com")
      const created = yield* call("POST", "/dashboard/api-keys", {
        token,
        json: { name: "secret", environment: "test" }
      })
      expect(created.status).toBe(201)
      noStore(created, "POST /dashboard/api-keys")
      const rotated = yield* call("POST", `/dashboard/api-keys/${created.body.key.id}/rotate`, {
        token,
        json: {},
        headers: { "idempotency-key": randomUUID() }
      })
      expect(rotated.status).toBe(200)
      noStore(rotated, "rotate")
      // Whatever the registration's URL rules, its answer is never stored.
      noStore(
        yield* call("POST", "/dashboard/webhooks", {
          token,
          json: { url: "https://hooks.example/x", events: ["balance.low"] }
        }),
        "POST /dashboard/webhooks"
      )
      const endpoint = `we_${randomUUID()}`
      yield* query(
        "INSERT INTO webhook_endpoints (id, account_id, url, events, secret, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, now(), now())",
        [endpoint, accountId, "https://hooks.example/x", ["balance.low"], "whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"]
      )
      const secret = yield* call("POST", `/dashboard/webhooks/${endpoint}/rotate-secret`, { token })
      expect(secret.status, secret.text).toBe(200)
      noStore(secret, "rotate-secret")
      const key: string = rotated.body.full_key
      const ask = { model: "svc/nenas-flash", input: "Say hello.", max_output_tokens: 16 }
      const answered = yield* call("POST", "/v1/responses", { token: key, json: ask })
      expect(answered.status).toBe(200)
      noStore(answered, "POST /v1/responses")
      noStore(yield* call("GET", `/v1/responses/${answered.body.id}`, { token: key }), "GET /v1/responses/{id}")
      noStore(
        yield* call("POST", "/v1/responses", { token: key, json: { ...ask, stream: true } }),
        "POST /v1/responses, streamed"
      )
      noStore(yield* call("GET", "/v1/responses/resp_unknown", { token: key }), "GET /v1/responses/{unknown}")
    }))
})

describe("devRouteAllowed", () => {
  const local = { devAuth: Option.none(), production: false }
  it("answers a loopback peer with no forwarding header, IPv4, IPv6 or mapped", () => {
    for (const peer of ["127.0.0.1", "::1", "::ffff:127.0.0.1"]) {
      expect(devRouteAllowed({ peer, headers: {} }, local), peer).toBe(true)
    }
  })
  it("refuses a forwarded request, a peer off this machine, and an unknown peer", () => {
    expect(devRouteAllowed({ peer: "127.0.0.1", headers: { "x-forwarded-for": "127.0.0.1" } }, local)).toBe(false)
    expect(devRouteAllowed({ peer: "127.0.0.1", headers: { forwarded: "for=127.0.0.1" } }, local)).toBe(false)
    expect(devRouteAllowed({ peer: "127.0.0.1", headers: { "x-forwarded-port": "443" } }, local)).toBe(false)
    expect(devRouteAllowed({ peer: "192.168.1.20", headers: {} }, local)).toBe(false)
    expect(devRouteAllowed({ peer: undefined, headers: {} }, local)).toBe(false)
  })
  it("answers anyone with DEV_AUTH=1 outside production, and nobody off loopback in production", () => {
    const devAuth = { devAuth: Option.some(true), production: false }
    expect(devRouteAllowed({ peer: "192.168.1.20", headers: { "x-forwarded-for": "203.0.113.9" } }, devAuth)).toBe(true)
    expect(devRouteAllowed({ peer: "192.168.1.20", headers: {} }, { devAuth: Option.some(true), production: true }))
      .toBe(false)
    expect(devRouteAllowed({ peer: "192.168.1.20", headers: {} }, { devAuth: Option.some(false), production: false }))
      .toBe(false)
  })
})

describe("corsPolicy", () => {
  const cases = [
    ["/v1/chat/completions", "any"],
    ["/v1", "any"],
    ["/v1x", "none"],
    ["/dashboard/api-keys", "dashboard"],
    ["/dev/session", "dashboard"],
    ["/dev/checkout/cs_1", "none"],
    ["/metrics", "none"],
    ["/billing/stripe/webhook", "none"],
    ["/app/", "none"]
  ] as const
  for (const [path, policy] of cases) it(`${path}: ${policy}`, () => expect(corsPolicy(path)).toBe(policy))
})

describe("a JWKS without an issuer and an audience to check", () => {
  it.effect("is refused by the configuration, in one line naming what is missing", () =>
    Effect.gen(function*() {
      const jwks = { AUTH_JWKS_URL: "https://idp.example/.well-known/jwks.json" }
      for (
        const [env, missing] of [
          [jwks, ["AUTH_ISSUER", "AUTH_AUDIENCE"]],
          [{ ...jwks, AUTH_ISSUER: "https://idp.example/" }, ["AUTH_AUDIENCE"]],
          [{ ...jwks, AUTH_AUDIENCE: "nenas" }, ["AUTH_ISSUER"]]
        ] as const
      ) {
        const result = yield* configFrom(env)
        expect(Either.isLeft(result)).toBe(true)
        const message = Either.isLeft(result) ? String(result.left) : ""
        expect(message.split("\n")).toHaveLength(1)
        for (const name of missing) expect(message).toContain(name)
      }
      const complete = yield* configFrom({ ...jwks, AUTH_ISSUER: "https://idp.example/", AUTH_AUDIENCE: "nenas" })
      expect(Either.isRight(complete)).toBe(true)
    }))

  it.effect("DEV_AUTH=1 is refused in production", () =>
    Effect.gen(function*() {
      const result = yield* configFrom({ ...PRODUCTION_ENV, DEV_AUTH: "1" })
      expect(Either.isLeft(result) && String(result.left)).toContain("DEV_AUTH")
    }))

  it("stops the service at start, with a line naming AUTH_ISSUER and AUTH_AUDIENCE", async () => {
    const service = await startService({
      env: { AUTH_JWKS_URL: "https://idp.example/.well-known/jwks.json", DATA_DIR: "/nonexistent/never-created" },
      until: "spawned"
    })
    const exit = await service.closed
    expect(exit.code, service.output()).not.toBe(0)
    const named = linesOf(service.output()).filter((line) =>
      line.includes("AUTH_ISSUER") && line.includes("AUTH_AUDIENCE")
    )
    expect(named, service.output()).toHaveLength(1)
    // It stopped before listening: nothing answers on its port.
    await expect(fetch(`${service.baseUrl}/healthz`)).rejects.toThrow()
  }, 60_000)
})

// ---------------------------------------------------------------------------
// compose.yaml: every secret and real part required, images pinned.
// ---------------------------------------------------------------------------

const ROOT = fileURLToPath(new URL("../../../", import.meta.url))
const COMPOSE_TEXT = readFileSync(join(ROOT, "compose.yaml"), "utf8")

/** What `docker compose config` must refuse to go without, and a value that satisfies it. */
const REQUIRED: Record<string, string> = {
  UPSTREAM_BASE_URL: "https://upstream.example/v1",
  METRICS_TOKEN: "metrics-secret",
  AUTH_JWKS_URL: "https://idp.example/.well-known/jwks.json",
  AUTH_ISSUER: "https://idp.example/",
  AUTH_AUDIENCE: "nenas",
  POSTGRES_PASSWORD: "generated-database-password",
  SEARXNG_SECRET: "generated-searxng-secret",
  STRIPE_SECRET_KEY: "sk_test_x",
  STRIPE_WEBHOOK_SECRET: "whsec_x",
  SUPPLIER_NAME: "Nenas Digital Sdn. Bhd.",
  SUPPLIER_TIN: "C25845632020",
  SUPPLIER_BRN: "202401012345",
  SUPPLIER_MSIC: "62099",
  SUPPLIER_ADDRESS:
    "{\"line1\":\"1 Jalan Nenas\",\"city\":\"Kuala Lumpur\",\"postcode\":\"50000\",\"state_code\":\"14\"}",
  SUPPLIER_EMAIL: "billing@nenas.example",
  SUPPLIER_PHONE: "+60312345678",
  MYINVOIS_BASE_URL: "https://api.myinvois.hasil.gov.my",
  MYINVOIS_CLIENT_ID: "erp-client",
  MYINVOIS_CLIENT_SECRET: "erp-secret",
  MYINVOIS_SIGNING_KEY: "/run/secrets/myinvois-key.pem",
  MYINVOIS_SIGNING_CERT: "/run/secrets/myinvois-cert.pem"
}

/**
 * A Compose CLI that can run `config` without a daemon: the v2 plugin, or Debian's
 * `docker-compose` 1.29 (which does not know the top-level `name`, so it gets the file without it).
 */
const composeCli =
  ((): { readonly command: string; readonly args: ReadonlyArray<string>; readonly v1: boolean } | null => {
    const works = (command: string, args: ReadonlyArray<string>) =>
      spawnSync(command, [...args, "version"], { stdio: "ignore" }).status === 0
    if (works("docker", ["compose"])) return { command: "docker", args: ["compose"], v1: false }
    if (works("docker-compose", [])) return { command: "docker-compose", args: [], v1: true }
    return null
  })()

const composeConfig = (env: Record<string, string>) => {
  if (composeCli === null) throw new Error("no Compose CLI")
  const dir = mkdtempSync(join(tmpdir(), "nenas-compose-"))
  try {
    const file = join(dir, "compose.yaml")
    writeFileSync(file, composeCli.v1 ? COMPOSE_TEXT.replace(/^name: .*$/m, "") : COMPOSE_TEXT)
    const result = spawnSync(
      composeCli.command,
      [...composeCli.args, "--project-directory", ROOT, "-p", "nenas", "-f", file, "config"],
      { env: { PATH: process.env["PATH"] ?? "/usr/bin:/bin", HOME: dir, ...env }, encoding: "utf8" }
    )
    return { status: result.status, output: `${result.stdout}${result.stderr}` }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

describe("compose.yaml", () => {
  it("requires (${VAR:?}) the upstream, METRICS_TOKEN, the identity provider and generated secrets", () => {
    for (const name of Object.keys(REQUIRED)) {
      expect(COMPOSE_TEXT, name).toMatch(new RegExp(`\\$\\{${name}:\\?[^}]+\\}`))
      // No default anywhere that would let it start without one.
      expect(COMPOSE_TEXT, name).not.toMatch(new RegExp(`\\$\\{${name}:-`))
    }
    expect(COMPOSE_TEXT).not.toContain("nenas:nenas@")
    expect(readFileSync(join(ROOT, "deploy/searxng/settings.yml"), "utf8")).not.toContain("change-me-in-production")
  })

  it("pins every image to a version", () => {
    const document = parse(COMPOSE_TEXT, { merge: true }) as { services: Record<string, { image?: string }> }
    for (const [name, service] of Object.entries(document.services)) {
      expect(service.image, name).toMatch(/^[\w./-]+:\d[\w.-]*$/)
    }
    expect(readFileSync(join(ROOT, "Dockerfile"), "utf8")).toMatch(/^ARG NODE_IMAGE=node:\d+\.\d+\.\d+-/m)
  })

  it.skipIf(composeCli === null)("`compose config` fails without each required variable and names it", () => {
    const complete = composeConfig(REQUIRED)
    expect(complete.status, complete.output).toBe(0)
    for (const name of Object.keys(REQUIRED)) {
      const { [name]: _missing, ...others } = REQUIRED
      const refused = composeConfig(others)
      expect(refused.status, `${name}: ${refused.output}`).not.toBe(0)
      expect(refused.output, name).toContain(name)
    }
  }, 120_000)
})

if (composeCli === null) {
  console.warn(
    "No Compose CLI (docker compose or docker-compose): `compose config` not run; the ${VAR:?} forms were checked in the file."
  )
}

layer(TestServerLive(), { excludeTestServices: true })("request targets the URL parser refuses", (it) => {
  /** One raw HTTP/1.1 request: what the server writes back before it closes. */
  const raw = (target: string) =>
    Effect.flatMap(TestServer, ({ baseUrl }) =>
      Effect.promise(() =>
        new Promise<string>((resolve, reject) => {
          const { hostname, port } = new URL(baseUrl)
          const socket = connect(
            Number(port),
            hostname,
            () => socket.end(`GET ${target} HTTP/1.1\r\nHost: ${hostname}\r\nConnection: close\r\n\r\n`)
          )
          let text = ""
          socket.setEncoding("utf8")
          socket.on("data", (chunk: string) => text += chunk)
          socket.on("end", () => resolve(text))
          socket.on("error", reject)
        })
      ))

  it.effect("are answered in the error shape with the security headers, and the service goes on serving", () =>
    Effect.gen(function*() {
      for (const target of ["//[", "//[::1", "http://[/v1/models", "/%"]) {
        const answer = yield* raw(target)
        expect(answer, target).toMatch(/^HTTP\/1\.1 4\d\d /)
        expect(answer.toLowerCase(), target).toContain("x-content-type-options: nosniff")
        expect(answer, target).toMatch(/"request_id":"req_/)
      }
      expect((yield* call("GET", "/healthz")).status).toBe(200)
    }))
})
