import { Clock, Context, Data, Effect, Layer, Option } from "effect"
import ipaddr from "ipaddr.js"
import {
  createLocalJWKSet,
  createRemoteJWKSet,
  exportJWK,
  generateKeyPair,
  importJWK,
  type JSONWebKeySet,
  type JWK,
  jwtVerify,
  type JWTVerifyGetKey,
  SignJWT
} from "jose"
import { mkdir, readFile, writeFile } from "node:fs/promises"
import { join } from "node:path"
import { AppConfig, type AppConfigShape, identityConfigProblem } from "../AppConfig.js"
import type { Identity } from "../Domain/Account.js"
import { AuthenticationError } from "../Domain/Errors.js"
import { randomBase62 } from "../Domain/Ids.js"
import { emailForm, singleLineName } from "../Domain/Names.js"

/** The development identity provider's own keys and token issuer. */
export interface DevIdentity {
  readonly issue: (input: { readonly email: string; readonly name?: string | undefined }) => Effect.Effect<string>
  readonly jwks: JSONWebKeySet
}

export class IdentityProvider extends Context.Tag("nenas/IdentityProvider")<IdentityProvider, {
  readonly verify: (token: string) => Effect.Effect<Identity, AuthenticationError>
  /** Present only when the development identity provider is on (see `identityMode`). */
  readonly dev: Option.Option<DevIdentity>
  /** Why the development identity provider is off, for the answer `/dev/session` gives. */
  readonly devOffReason: string
}>() {}

export class IdentityConfigError extends Data.TaggedError("IdentityConfigError")<{ readonly message: string }> {}

/** Asymmetric algorithms only: a symmetric one would let a public key sign tokens. */
const ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]

export const DEV_AUDIENCE = "nenas-dashboard"
/**
 * The issuer the development provider's accounts are keyed by: not its tokens' `iss`
 * (`PUBLIC_BASE_URL/dev`, which moves with the port), so its accounts survive a new port.
 */
export const DEV_ACCOUNT_ISSUER = "nenas:dev"
/** Seconds a token's `exp`, `nbf` and `iat` may be off by: clocks drift, a minute at most. */
export const CLOCK_TOLERANCE_SECONDS = 30
const DEV_ALGORITHM = "ES256"
const DEV_TOKEN_TTL_SECONDS = 24 * 60 * 60

const stringClaim = (value: unknown): string | null => typeof value === "string" && value.length > 0 ? value : null

/**
 * The token's email in its comparable form, only when the provider vouches for it (`email_verified: true`) and it is
 * in NFKC form: a provider that lets its users type any address would otherwise hand out anyone's invitations.
 */
const verifiedEmail = (payload: Record<string, unknown>): string | null => {
  const email = stringClaim(payload["email"])
  if (email === null || payload["email_verified"] !== true) return null
  return emailForm(email) ?? null
}

/** The token's name, on one line and capped: it becomes an account's name, which invitation emails show. */
const nameOf = (payload: Record<string, unknown>): string | null => {
  const name = stringClaim(payload["name"])
  return name === null ? null : singleLineName(name)
}

/** What is wrong with a refused token, in words that name nothing of the identity provider's set-up. */
const sessionTokenProblem = (error: unknown): string => {
  const fields: { readonly code?: unknown; readonly claim?: unknown; readonly reason?: unknown } =
    typeof error === "object" && error !== null ? error : {}
  const code = String(fields.code ?? "")
  switch (code) {
    case "ERR_JWT_EXPIRED":
      return "it has expired"
    case "ERR_JWT_CLAIM_VALIDATION_FAILED": {
      // The claim's name tells the developer what to fix; the expected value (our issuer, audience) stays unsaid.
      const claim = typeof fields.claim === "string" && /^[a-z]{2,5}$/.test(fields.claim) ? fields.claim : null
      const missing = fields.reason === "missing"
      if (claim === null) return "its claims are not valid for this service"
      return missing ? `its \`${claim}\` claim is missing` : `its \`${claim}\` claim is not valid for this service`
    }
    case "ERR_JWS_SIGNATURE_VERIFICATION_FAILED":
    case "ERR_JWKS_NO_MATCHING_KEY":
    case "ERR_JWKS_MULTIPLE_MATCHING_KEYS":
      return "its signature does not verify"
    case "ERR_JWS_INVALID":
    case "ERR_JWT_INVALID":
    case "ERR_JOSE_ALG_NOT_ALLOWED":
    case "ERR_JOSE_NOT_SUPPORTED":
      return "it is not a valid token"
    default:
      return "it could not be verified"
  }
}

/** The one verification path, for the development keys and a real provider's JWKS alike. */
const makeVerifier = (
  keys: JWTVerifyGetKey,
  options: { readonly issuer: string; readonly audience: string; readonly accountIssuer: string }
) =>
(token: string): Effect.Effect<Identity, AuthenticationError> =>
  Effect.gen(function*() {
    if (token.length === 0) {
      return yield* new AuthenticationError({
        message: "Missing session token. Send `Authorization: Bearer <SESSION_TOKEN>`."
      })
    }
    const now = yield* Clock.currentTimeMillis
    const { payload } = yield* Effect.tryPromise({
      try: () =>
        jwtVerify(token, keys, {
          algorithms: ALGORITHMS,
          currentDate: new Date(now),
          issuer: options.issuer,
          audience: options.audience,
          // Without `exp` a token would sign in for ever; without `sub` it names no account.
          requiredClaims: ["exp", "sub"],
          clockTolerance: CLOCK_TOLERANCE_SECONDS
        }),
      catch: (error) => error
    }).pipe(Effect.catchAll((error) =>
      // jose's messages can name the JWKS URL or the expected issuer: logged, answered in generic words.
      Effect.zipRight(
        Effect.logInfo(`session token refused: ${error instanceof Error ? error.message : String(error)}`),
        Effect.fail(new AuthenticationError({ message: `Invalid session token: ${sessionTokenProblem(error)}.` }))
      )
    ))
    const subject = stringClaim(payload.sub)
    if (subject === null) {
      return yield* new AuthenticationError({ message: "Invalid session token: it has no `sub` claim." })
    }
    return {
      issuer: options.accountIssuer,
      subject,
      email: verifiedEmail(payload),
      name: nameOf(payload)
    }
  })

interface StoredKey {
  readonly privateJwk: JWK
  readonly publicJwk: JWK
}

/** The development signing key lives in `DATA_DIR`, so tokens survive a restart. */
const loadDevKey = async (dataDir: string): Promise<StoredKey> => {
  const file = join(dataDir, "dev-identity-key.json")
  try {
    return JSON.parse(await readFile(file, "utf8")) as StoredKey
  } catch {
    const { privateKey, publicKey } = await generateKeyPair(DEV_ALGORITHM, { extractable: true })
    const kid = randomBase62(16)
    const stored: StoredKey = {
      privateJwk: { ...(await exportJWK(privateKey)), kid, alg: DEV_ALGORITHM },
      publicJwk: { ...(await exportJWK(publicKey)), kid, alg: DEV_ALGORITHM, use: "sig" }
    }
    await mkdir(dataDir, { recursive: true })
    await writeFile(file, JSON.stringify(stored), { mode: 0o600 })
    return stored
  }
}

const makeDev = (dataDir: string, issuer: string) =>
  Effect.gen(function*() {
    const stored = yield* Effect.promise(() => loadDevKey(dataDir))
    const privateKey = yield* Effect.promise(() => importJWK(stored.privateJwk, DEV_ALGORITHM))
    const jwks: JSONWebKeySet = { keys: [stored.publicJwk] }
    const dev: DevIdentity = {
      jwks,
      issue: ({ email, name }) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) => {
          const normalized = emailForm(email) ?? email.toLowerCase()
          const issuedAt = Math.floor(now / 1000)
          // Verified: the developer typed the address on a route only this machine (or DEV_AUTH=1) reaches.
          return Effect.promise(() =>
            new SignJWT({ email: normalized, email_verified: true, ...(name === undefined ? {} : { name }) })
              .setProtectedHeader({ alg: DEV_ALGORITHM, kid: stored.publicJwk.kid ?? "" })
              .setSubject(`dev|${normalized}`)
              .setIssuer(issuer)
              .setAudience(DEV_AUDIENCE)
              .setIssuedAt(issuedAt)
              .setExpirationTime(issuedAt + DEV_TOKEN_TTL_SECONDS)
              .sign(privateKey)
          )
        })
    }
    return IdentityProvider.of({
      verify: makeVerifier(createLocalJWKSet(jwks), {
        issuer,
        audience: DEV_AUDIENCE,
        accountIssuer: DEV_ACCOUNT_ISSUER
      }),
      dev: Option.some(dev),
      devOffReason: ""
    })
  })

/** Whether `host` (the listen address) is reachable only from this machine. */
export const isLoopbackHost = (host: string): boolean => {
  const bare = host.replace(/^\[(.*)\]$/, "$1").toLowerCase()
  if (bare === "localhost") return true
  return ipaddr.isValid(bare) && ipaddr.process(bare).range() === "loopback"
}

/** Which identity provider signs developers in. */
export type IdentityMode =
  | { readonly _tag: "external"; readonly jwksUrl: string }
  | { readonly _tag: "development" }
  | { readonly _tag: "off"; readonly reason: string }

/**
 * `AUTH_JWKS_URL` when set; else the development provider, which signs anyone in by email: only on
 * a loopback listen address unless `DEV_AUTH=1` (or `0`) says otherwise, and never in production.
 */
export const identityMode = (
  config: Pick<AppConfigShape, "authJwksUrl" | "devAuth" | "host" | "production">
): IdentityMode => {
  if (Option.isSome(config.authJwksUrl)) return { _tag: "external", jwksUrl: config.authJwksUrl.value }
  if (config.production) {
    return { _tag: "off", reason: "NODE_ENV=production refuses the development identity provider." }
  }
  if (Option.isSome(config.devAuth)) {
    return config.devAuth.value
      ? { _tag: "development" }
      : { _tag: "off", reason: "DEV_AUTH=0 turns the development identity provider off." }
  }
  return isLoopbackHost(config.host) ? { _tag: "development" } : {
    _tag: "off",
    reason:
      `The development identity provider is off: the service listens on ${config.host}, not loopback. Set AUTH_JWKS_URL, or DEV_AUTH=1 to allow it.`
  }
}

const signInOff = (reason: string) =>
  IdentityProvider.of({
    verify: () =>
      Effect.fail(new AuthenticationError({ message: `No identity provider signs developers in. ${reason}` })),
    dev: Option.none(),
    devOffReason: reason
  })

/**
 * The identity provider at `AUTH_JWKS_URL`, whose tokens must name `AUTH_ISSUER` and
 * `AUTH_AUDIENCE`, or the development one where `identityMode` allows it.
 */
export const IdentityProviderLive = Layer.effect(
  IdentityProvider,
  Effect.gen(function*() {
    const config = yield* AppConfig
    const mode = identityMode(config)
    switch (mode._tag) {
      case "external": {
        const problem = identityConfigProblem(config)
        if (Option.isSome(problem) || Option.isNone(config.authIssuer) || Option.isNone(config.authAudience)) {
          return yield* new IdentityConfigError({
            message: Option.match(problem, {
              onNone: () => "AUTH_JWKS_URL needs AUTH_ISSUER and AUTH_AUDIENCE.",
              onSome: ([, message]) => message
            })
          })
        }
        const keys = createRemoteJWKSet(new URL(mode.jwksUrl))
        return IdentityProvider.of({
          verify: makeVerifier(keys, {
            issuer: config.authIssuer.value,
            audience: config.authAudience.value,
            accountIssuer: config.authIssuer.value
          }),
          dev: Option.none(),
          devOffReason: "The development identity provider is off: an identity provider is configured (AUTH_JWKS_URL)."
        })
      }
      case "development":
        return yield* makeDev(config.dataDir, `${config.publicBaseUrl}/dev`)
      case "off":
        if (config.production) {
          return yield* new IdentityConfigError({
            message: "AUTH_JWKS_URL must be set when NODE_ENV=production: the development identity provider is refused."
          })
        }
        yield* Effect.logWarning(mode.reason)
        return signInOff(mode.reason)
    }
  })
)
