import { describe, expect, it, layer } from "@effect/vitest"
import { Context, Effect, Layer, Option } from "effect"
import {
  base64url,
  createLocalJWKSet,
  type CryptoKey,
  exportJWK,
  generateKeyPair,
  type JSONWebKeySet,
  jwtVerify,
  SignJWT
} from "jose"
import { mkdtemp, rm } from "node:fs/promises"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AccountsRepo } from "../../../src/Accounts/Repo.js"
import { AppConfig } from "../../../src/AppConfig.js"
import {
  CLOCK_TOLERANCE_SECONDS,
  DEV_ACCOUNT_ISSUER,
  DEV_AUDIENCE,
  IdentityConfigError,
  identityMode,
  IdentityProvider,
  IdentityProviderLive
} from "../../../src/Auth/IdentityProvider.js"
import { call, createKey, devToken, type Reply } from "../../support/Http.js"
import { loopbackServer } from "../../support/Idp.js"
import { query, TestServer, TestServerLive } from "../../support/TestServer.js"

// ---------------------------------------------------------------------------
// A test identity provider: an RS256 key pair whose public half is served as a
// JWKS by a small HTTP server on loopback, and helpers that sign tokens with it.
// ---------------------------------------------------------------------------

const ISSUER = "https://idp.test/"
const AUDIENCE = "nenas-dashboard-test"
const KID = "test-key-1"
const ALG = "RS256"

class TestIdp extends Context.Tag("test/TestIdp")<TestIdp, {
  readonly privateKey: CryptoKey
  readonly jwksUrl: string
  /** How many times the service fetched the JWKS. */
  readonly jwksRequests: () => number
}>() {}

interface Claims {
  readonly sub?: string | undefined
  readonly email?: string | undefined
  readonly issuer?: string
  readonly audience?: string
  /** Seconds since the epoch; `null` leaves the claim out. */
  readonly exp?: number | null
}

const nowSeconds = () => Math.floor(Date.now() / 1000)

/** A JWT signed with `key`; by default a good one for the configured issuer and audience. */
const signToken = (key: CryptoKey | Uint8Array, claims: Claims = {}, alg: string = ALG) =>
  Effect.promise(() => {
    const jwt = new SignJWT(claims.email === undefined ? {} : { email: claims.email })
      .setProtectedHeader({ alg, kid: KID, typ: "JWT" })
      .setIssuer(claims.issuer ?? ISSUER)
      .setAudience(claims.audience ?? AUDIENCE)
      .setIssuedAt()
    if (claims.exp !== null) jwt.setExpirationTime(claims.exp ?? nowSeconds() + 10 * 60)
    if (claims.sub !== undefined) jwt.setSubject(claims.sub)
    return jwt.sign(key)
  })

/** A token signed with the test identity provider's key. */
const goodToken = (sub: string, claims: Omit<Claims, "sub"> = {}) =>
  Effect.flatMap(TestIdp, ({ privateKey }) => signToken(privateKey, { sub, ...claims }))

const encodeJson = (value: unknown) => base64url.encode(JSON.stringify(value))

/** An unsecured JWT (`alg: none`): `header.payload.` with an empty signature. */
const unsecuredToken = (sub: string) =>
  `${encodeJson({ alg: "none", typ: "JWT" })}.${
    encodeJson({ sub, iss: ISSUER, aud: AUDIENCE, iat: nowSeconds(), exp: nowSeconds() + 600 })
  }.`

/** The same token with one character of its payload part changed. */
const tamperPayload = (token: string): string => {
  const [header, payload, signature] = token.split(".")
  if (header === undefined || payload === undefined || signature === undefined) throw new Error("not a JWT")
  const i = Math.floor(payload.length / 2)
  const replacement = payload[i] === "A" ? "B" : "A"
  return `${header}.${payload.slice(0, i)}${replacement}${payload.slice(i + 1)}.${signature}`
}

/** Starts the JWKS server (stopped with the layer), then the service configured to use it. */
const IdpServerLive = Layer.unwrapScoped(Effect.gen(function*() {
  const { privateKey, publicKey } = yield* Effect.promise(() => generateKeyPair(ALG))
  const publicJwk = { ...(yield* Effect.promise(() => exportJWK(publicKey))), kid: KID, alg: ALG, use: "sig" }
  const jwks = JSON.stringify({ keys: [publicJwk] })
  let requests = 0
  const server = yield* loopbackServer((req, res) => {
    requests += 1
    if (req.url === "/.well-known/jwks.json") {
      res.writeHead(200, { "content-type": "application/json" }).end(jwks)
    } else {
      res.writeHead(404).end()
    }
  })
  const { port } = server.address() as AddressInfo
  const jwksUrl = `http://127.0.0.1:${port}/.well-known/jwks.json`
  return Layer.merge(
    TestServerLive({
      authJwksUrl: Option.some(jwksUrl),
      authIssuer: Option.some(ISSUER),
      authAudience: Option.some(AUDIENCE)
    }),
    Layer.succeed(TestIdp, { privateKey, jwksUrl, jwksRequests: () => requests })
  )
}))

/** A 401 `authentication_error` in the spec's error body, with a matching `X-Request-Id`. */
const expectAuthenticationError = (reply: Reply) => {
  expect(reply.status, reply.text).toBe(401)
  expect(reply.body.type).toBe("error")
  expect(reply.body.error.code).toBe("authentication_error")
  expect(reply.body.error.type).toBe("authentication_error")
  expect(reply.body.error.retryable).toBe(false)
  expect(typeof reply.body.error.message).toBe("string")
  expect(reply.body.error.request_id).toBeTruthy()
  expect(reply.body.error.request_id).toBe(reply.headers.get("x-request-id"))
}

const listKeys = (token: string | undefined) => call("GET", "/dashboard/api-keys", { token })

// ---------------------------------------------------------------------------

layer(IdpServerLive, { excludeTestServices: true })("session tokens from a configured identity provider", (it) => {
  it.effect("a good token reaches the dashboard, verified against the remote JWKS", () =>
    Effect.gen(function*() {
      const idp = yield* TestIdp
      const token = yield* goodToken("idp|first-sign-in", { email: "first@example.com" })
      const reply = yield* listKeys(token)
      expect(reply.status, reply.text).toBe(200)
      expect(reply.body).toEqual({ keys: [] })
      expect(idp.jwksRequests()).toBeGreaterThan(0)
    }))

  it.effect("the same sub reaches the same account; another sub does not see its keys", () =>
    Effect.gen(function*() {
      const first = yield* goodToken("idp|same-account")
      const { key } = yield* createKey(first, { name: "idp key" })
      const second = yield* goodToken("idp|same-account", { exp: nowSeconds() + 20 * 60 })
      expect(second).not.toBe(first)
      const mine = yield* listKeys(second)
      expect(mine.status).toBe(200)
      expect(mine.body.keys.map((k: { id: string }) => k.id)).toEqual([key.id])
      const other = yield* listKeys(yield* goodToken("idp|someone-else"))
      expect(other.status).toBe(200)
      expect(other.body.keys).toEqual([])
    }))

  it.effect("a wrong issuer is refused", () =>
    Effect.gen(function*() {
      const token = yield* goodToken("idp|wrong-issuer", { issuer: "https://evil.test/" })
      expectAuthenticationError(yield* listKeys(token))
    }))

  it.effect("a wrong audience is refused", () =>
    Effect.gen(function*() {
      const token = yield* goodToken("idp|wrong-audience", { audience: "some-other-app" })
      expectAuthenticationError(yield* listKeys(token))
    }))

  it.effect("an expired token is refused", () =>
    Effect.gen(function*() {
      const token = yield* goodToken("idp|expired", { exp: nowSeconds() - 10 * 60 })
      expectAuthenticationError(yield* listKeys(token))
    }))

  it.effect("a token without exp is refused", () =>
    Effect.gen(function*() {
      const token = yield* goodToken("idp|no-exp", { exp: null })
      const reply = yield* listKeys(token)
      expectAuthenticationError(reply)
      expect(reply.body.error.message).toContain("exp")
    }))

  it.effect("a token expired beyond the clock tolerance (at most 60 s) is refused; one within it is accepted", () =>
    Effect.gen(function*() {
      expect(CLOCK_TOLERANCE_SECONDS).toBeLessThanOrEqual(60)
      expectAuthenticationError(yield* listKeys(yield* goodToken("idp|late", { exp: nowSeconds() - 61 })))
      const withinTolerance = yield* goodToken("idp|late", { exp: nowSeconds() - CLOCK_TOLERANCE_SECONDS + 10 })
      expect((yield* listKeys(withinTolerance)).status).toBe(200)
    }))

  it.effect("the right JWKS, another issuer, the victim's sub: refused, and the victim's keys stay unseen", () =>
    Effect.gen(function*() {
      const victim = yield* goodToken("shared|victim")
      const { key } = yield* createKey(victim, { name: "victim key" })
      for (const claims of [{ issuer: "https://other-tenant.test/" }, { audience: "another-app" }]) {
        const forged = yield* goodToken("shared|victim", claims)
        const reply = yield* listKeys(forged)
        expectAuthenticationError(reply)
        expect(reply.text).not.toContain(key.id)
      }
    }))

  it.effect("a token signed by another key with the same kid is refused", () =>
    Effect.gen(function*() {
      const { privateKey: otherKey } = yield* Effect.promise(() => generateKeyPair(ALG))
      const token = yield* signToken(otherKey, { sub: "idp|forged" })
      expectAuthenticationError(yield* listKeys(token))
    }))

  it.effect("an unsecured alg:none token is refused", () =>
    Effect.gen(function*() {
      const token = unsecuredToken("idp|unsecured")
      expect(token.endsWith(".")).toBe(true)
      expectAuthenticationError(yield* listKeys(token))
    }))

  it.effect("an HS256 token is refused", () =>
    Effect.gen(function*() {
      const secret = new TextEncoder().encode("a-shared-secret-that-is-long-enough-for-hs256")
      const token = yield* signToken(secret, { sub: "idp|symmetric" }, "HS256")
      expectAuthenticationError(yield* listKeys(token))
    }))

  it.effect("a token without sub is refused", () =>
    Effect.gen(function*() {
      const { privateKey } = yield* TestIdp
      const token = yield* signToken(privateKey, { email: "nosub@example.com" })
      const reply = yield* listKeys(token)
      expectAuthenticationError(reply)
      expect(reply.body.error.message).toContain("sub")
    }))

  it.effect("a garbage token is refused", () =>
    Effect.gen(function*() {
      expectAuthenticationError(yield* listKeys("this-is-not-a-jwt"))
    }))

  it.effect("a missing Authorization header is refused", () =>
    Effect.gen(function*() {
      expectAuthenticationError(yield* listKeys(undefined))
    }))

  it.effect("the development identity provider answers 404 not_found", () =>
    Effect.gen(function*() {
      const session = yield* call("POST", "/dev/session", { json: { email: "dev@example.com" } })
      expect(session.status).toBe(404)
      expect(session.body.error.code).toBe("not_found")
      expect(session.body.error.request_id).toBe(session.headers.get("x-request-id"))
      const jwks = yield* call("GET", "/dev/.well-known/jwks.json")
      expect(jwks.status).toBe(404)
      expect(jwks.body.error.code).toBe("not_found")
    }))
})

layer(TestServerLive(), { excludeTestServices: true })("the development identity provider", (it) => {
  it.effect("dev session tokens reach the dashboard", () =>
    Effect.gen(function*() {
      const token = yield* devToken("auth-dev@example.com")
      const reply = yield* listKeys(token)
      expect(reply.status, reply.text).toBe(200)
      expect(reply.body).toEqual({ keys: [] })
      const { key } = yield* createKey(token)
      const again = yield* listKeys(yield* devToken("AUTH-Dev@Example.com"))
      expect(again.body.keys.map((k: { id: string }) => k.id)).toEqual([key.id])
    }))

  it.effect("a dev token with a tampered payload is refused", () =>
    Effect.gen(function*() {
      const token = yield* devToken("auth-tamper@example.com")
      const tampered = tamperPayload(token)
      expect(tampered).not.toBe(token)
      expectAuthenticationError(yield* listKeys(tampered))
      expect((yield* listKeys(token)).status).toBe(200)
    }))

  it.effect("the dev JWKS holds exactly one public key, which verifies dev tokens", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      const reply = yield* call("GET", "/dev/.well-known/jwks.json")
      expect(reply.status).toBe(200)
      const jwks = reply.body as JSONWebKeySet
      expect(jwks.keys).toHaveLength(1)
      const [key] = jwks.keys
      expect(key).toMatchObject({ kty: "EC", crv: "P-256", alg: "ES256" })
      expect(key?.kid).toBeTruthy()
      for (const privateMember of ["d", "p", "q", "dp", "dq", "qi", "k"]) {
        expect(key).not.toHaveProperty(privateMember)
      }
      const token = yield* devToken("auth-jwks@example.com")
      const { payload } = yield* Effect.promise(() =>
        jwtVerify(token, createLocalJWKSet(jwks), { issuer: `${baseUrl}/dev`, audience: DEV_AUDIENCE })
      )
      expect(payload.sub).toBe("dev|auth-jwks@example.com")
      expect(payload["email"]).toBe("auth-jwks@example.com")
    }))

  it.effect("accounts are keyed by issuer and subject: another issuer's same sub is another account", () =>
    Effect.gen(function*() {
      const accounts = yield* AccountsRepo
      const subject = "shared-subject"
      const first = yield* accounts.signIn({ issuer: "https://tenant-a.test/", subject, email: null, name: null })
      const other = yield* accounts.signIn({ issuer: "https://tenant-b.test/", subject, email: null, name: null })
      const again = yield* accounts.signIn({ issuer: "https://tenant-a.test/", subject, email: null, name: null })
      expect(other.id).not.toBe(first.id)
      expect(again.id).toBe(first.id)
      expect([first.issuer, other.issuer]).toEqual(["https://tenant-a.test/", "https://tenant-b.test/"])
    }))

  it.effect("an account from before issuers were recorded is claimed by its first sign-in, once, and keeps its keys", () =>
    Effect.gen(function*() {
      const token = yield* devToken("legacy@example.com")
      const { key } = yield* createKey(token, { name: "legacy key" })
      // What migration 0007 leaves for an existing account: its row, with no issuer.
      yield* query("UPDATE accounts SET issuer = NULL WHERE subject = $1", ["dev|legacy@example.com"])
      const accounts = yield* AccountsRepo
      const identity = { issuer: DEV_ACCOUNT_ISSUER, subject: "dev|legacy@example.com", email: null, name: null }
      // Two first sign-ins at once: one claims the row, the other finds it; neither makes a second account.
      const [one, two] = yield* Effect.all([accounts.signIn(identity), accounts.signIn(identity)], { concurrency: 2 })
      expect(two?.id).toBe(one?.id)
      const reply = yield* listKeys(yield* devToken("legacy@example.com"))
      expect(reply.body.keys.map((k: { id: string }) => k.id)).toEqual([key.id])
      const rows = yield* query<{ issuer: string | null }>(
        "SELECT issuer FROM accounts WHERE subject = $1",
        ["dev|legacy@example.com"]
      )
      expect(rows).toEqual([{ issuer: DEV_ACCOUNT_ISSUER }])
    }))

  it.effect("POST /dev/session requires a valid email", () =>
    Effect.gen(function*() {
      for (const json of [{}, { email: "not-an-email" }]) {
        const reply = yield* call("POST", "/dev/session", { json })
        expect(reply.status, reply.text).toBe(400)
        expect(reply.body.error.code).toBe("invalid_request")
        expect(reply.body.error.type).toBe("invalid_request_error")
        expect(reply.body.error.param).toBe("email")
        expect(reply.body.error.request_id).toBe(reply.headers.get("x-request-id"))
      }
    }))
})

layer(TestServerLive({ host: "0.0.0.0" }), { excludeTestServices: true })("listening on every interface", (it) => {
  it.effect("the development sign-in is refused, and says why", () =>
    Effect.gen(function*() {
      const session = yield* call("POST", "/dev/session", { json: { email: "anyone@example.com" } })
      expect(session.status, session.text).toBe(404)
      expect(session.body.error.code).toBe("not_found")
      expect(session.body.error.message).toContain("0.0.0.0")
      expect(session.body.error.message).toContain("DEV_AUTH=1")
      expect((yield* call("GET", "/dev/.well-known/jwks.json")).status).toBe(404)
      expectAuthenticationError(yield* listKeys("eyJhbGciOiJFUzI1NiJ9.e30.c2ln"))
      const config = yield* call("GET", "/app/config.json")
      expect(config.body.identity).toBe("off")
    }))
})

describe("IdentityProviderLive in production", () => {
  const tempDir = Effect.acquireRelease(
    Effect.promise(() => mkdtemp(join(tmpdir(), "nenas-auth-test-"))),
    (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
  )

  const build = (overrides: Parameters<typeof AppConfig.layerWith>[0]) =>
    Layer.build(IdentityProviderLive.pipe(Layer.provide(AppConfig.layerWith(overrides))))

  it.scoped("refuses to start without AUTH_JWKS_URL", () =>
    Effect.gen(function*() {
      const dataDir = yield* tempDir
      const error = yield* Effect.flip(build({ production: true, authJwksUrl: Option.none(), dataDir }))
      expect(error._tag).toBe("IdentityConfigError")
      expect(error instanceof IdentityConfigError && error.message).toContain("AUTH_JWKS_URL")
    }))

  it.scoped("builds with AUTH_JWKS_URL, AUTH_ISSUER and AUTH_AUDIENCE set, with the development provider off", () =>
    Effect.gen(function*() {
      const dataDir = yield* tempDir
      const context = yield* build({
        production: true,
        authJwksUrl: Option.some("https://idp.test/.well-known/jwks.json"),
        authIssuer: Option.some(ISSUER),
        authAudience: Option.some(AUDIENCE),
        dataDir
      })
      const provider = Context.get(context, IdentityProvider)
      expect(Option.isNone(provider.dev)).toBe(true)
    }))

  it.scoped("refuses AUTH_JWKS_URL without AUTH_ISSUER and AUTH_AUDIENCE, naming what is missing", () =>
    Effect.gen(function*() {
      const dataDir = yield* tempDir
      const jwks = { authJwksUrl: Option.some("https://idp.test/.well-known/jwks.json"), dataDir }
      for (
        const [overrides, missing] of [
          [{ authIssuer: Option.none(), authAudience: Option.none() }, ["AUTH_ISSUER", "AUTH_AUDIENCE"]],
          [{ authIssuer: Option.some(ISSUER), authAudience: Option.none() }, ["AUTH_AUDIENCE"]],
          [{ authIssuer: Option.none(), authAudience: Option.some(AUDIENCE) }, ["AUTH_ISSUER"]]
        ] as const
      ) {
        for (const production of [true, false]) {
          const error = yield* Effect.flip(build({ ...jwks, ...overrides, production }))
          expect(error._tag).toBe("IdentityConfigError")
          for (const name of missing) expect(error.message).toContain(name)
        }
      }
    }))
})

describe("identityMode: when the development identity provider is on", () => {
  const base = { authJwksUrl: Option.none<string>(), devAuth: Option.none<boolean>(), production: false }
  const cases: ReadonlyArray<
    readonly [string, Partial<typeof base> & { host: string }, "development" | "external" | "off"]
  > = [
    ["IPv4 loopback", { host: "127.0.0.1" }, "development"],
    ["another 127/8 address", { host: "127.0.0.2" }, "development"],
    ["IPv6 loopback", { host: "::1" }, "development"],
    ["bracketed IPv6 loopback", { host: "[::1]" }, "development"],
    ["localhost", { host: "localhost" }, "development"],
    ["every IPv4 interface", { host: "0.0.0.0" }, "off"],
    ["every IPv6 interface", { host: "::" }, "off"],
    ["a private address", { host: "10.0.0.5" }, "off"],
    ["a host name", { host: "api.example.com" }, "off"],
    ["IPv4-mapped loopback", { host: "::ffff:127.0.0.1" }, "development"],
    ["DEV_AUTH=1 off loopback", { host: "0.0.0.0", devAuth: Option.some(true) }, "development"],
    ["DEV_AUTH=0 on loopback", { host: "127.0.0.1", devAuth: Option.some(false) }, "off"],
    ["production, even with DEV_AUTH=1", { host: "127.0.0.1", devAuth: Option.some(true), production: true }, "off"],
    ["a configured provider", { host: "127.0.0.1", authJwksUrl: Option.some("https://idp.test/jwks.json") }, "external"]
  ]
  for (const [name, config, expected] of cases) {
    it(name, () => {
      expect(identityMode({ ...base, ...config })._tag).toBe(expected)
    })
  }
})
