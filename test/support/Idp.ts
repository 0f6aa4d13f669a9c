import { Effect } from "effect"
import { type CryptoKey, exportJWK, generateKeyPair, SignJWT } from "jose"
import { createServer, type RequestListener, type Server } from "node:http"
import type { AddressInfo } from "node:net"

/**
 * A small OpenID provider on loopback: an RS256 key whose public half is its
 * JWKS, and an implicit-flow `/authorize` that redirects straight back with an
 * `id_token` carrying the request's `nonce` and `state` in the fragment, as a
 * provider does once its user has signed in.
 */
export interface Idp {
  readonly issuer: string
  readonly audience: string
  readonly jwksUrl: string
  readonly authorizeUrl: string
  readonly sign: (claims: {
    readonly sub: string
    readonly email?: string
    readonly email_verified?: boolean
    readonly name?: string
    readonly nonce?: string
  }) => Promise<string>
}

const ALG = "RS256"
const KID = "idp-key-1"

const signWith = (privateKey: CryptoKey, issuer: string, audience: string): Idp["sign"] => (claims) =>
  new SignJWT({
    ...(claims.email === undefined ? {} : { email: claims.email }),
    ...(claims.email_verified === undefined ? {} : { email_verified: claims.email_verified }),
    ...(claims.name === undefined ? {} : { name: claims.name }),
    ...(claims.nonce === undefined ? {} : { nonce: claims.nonce })
  })
    .setProtectedHeader({ alg: ALG, kid: KID, typ: "JWT" })
    .setIssuer(issuer)
    .setAudience(audience)
    .setSubject(claims.sub)
    .setIssuedAt()
    .setExpirationTime("10m")
    .sign(privateKey)

/** An HTTP server on a free loopback port, closed (its connections cut) with the scope. */
export const loopbackServer = (handler: RequestListener) =>
  Effect.acquireRelease(
    Effect.async<Server>((resume) => {
      const http = createServer(handler)
      http.listen(0, "127.0.0.1", () => resume(Effect.succeed(http)))
    }),
    (http) =>
      Effect.async<void>((resume) => {
        http.closeAllConnections()
        http.close(() => resume(Effect.void))
      })
  )

/** Starts the provider (stopped with the scope); `subject` and `email` are whom its `/authorize` signs in. */
export const startIdp = (options: { readonly audience: string; readonly subject: string; readonly email: string }) =>
  Effect.gen(function*() {
    const { privateKey, publicKey } = yield* Effect.promise(() => generateKeyPair(ALG))
    const jwks = JSON.stringify({
      keys: [{ ...(yield* Effect.promise(() => exportJWK(publicKey))), kid: KID, alg: ALG, use: "sig" }]
    })
    let sign: Idp["sign"] = () => Promise.reject(new Error("not listening yet"))
    const server = yield* loopbackServer((req, res) => {
      const url = new URL(req.url ?? "/", "http://idp")
      if (url.pathname === "/.well-known/jwks.json") {
        res.writeHead(200, { "content-type": "application/json" }).end(jwks)
        return
      }
      if (url.pathname === "/authorize") {
        const nonce = url.searchParams.get("nonce") ?? ""
        const state = url.searchParams.get("state") ?? ""
        const redirect = url.searchParams.get("redirect_uri") ?? ""
        void sign({ sub: options.subject, email: options.email, email_verified: true, nonce }).then((token) => {
          const fragment = new URLSearchParams({ id_token: token, state }).toString()
          res.writeHead(302, { location: `${redirect}#${fragment}` }).end()
        })
        return
      }
      res.writeHead(404).end()
    })
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
    const issuer = `${base}/`
    sign = signWith(privateKey, issuer, options.audience)
    const idp: Idp = {
      issuer,
      audience: options.audience,
      jwksUrl: `${base}/.well-known/jwks.json`,
      authorizeUrl: `${base}/authorize`,
      sign
    }
    return idp
  })
