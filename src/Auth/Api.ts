import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as HttpApiMiddleware from "@effect/platform/HttpApiMiddleware"
import * as HttpApiSecurity from "@effect/platform/HttpApiSecurity"
import * as OpenApi from "@effect/platform/OpenApi"
import { Context, Schema } from "effect"
import type { SignedIn } from "../Domain/Account.js"
import {
  AuthenticationError,
  ExpiredApiKey,
  InvalidApiKey,
  InvalidRequest,
  NotFound,
  PermissionDenied,
  RateLimitExceeded,
  RevokedApiKey,
  wire
} from "../Domain/Errors.js"
import { EmailAddress, SingleLineName } from "../Domain/Names.js"

/** The account a dashboard request acts on, and the signed-in person's membership in it. */
export class CurrentAccount extends Context.Tag("nenas/CurrentAccount")<CurrentAccount, SignedIn>() {}

/** The API key a `/v1` call was made with, and its account. */
export interface ApiKeyPrincipal {
  readonly keyId: string
  readonly accountId: string
  readonly environment: "live" | "test"
  readonly monthlySpendLimitMicroMyr: number | null
  /** The member who made the key (null: none recorded). */
  readonly memberId: string | null
  /** That member's monthly budget over all its keys; null for none (or a removed member). */
  readonly memberMonthlySpendLimitMicroMyr: number | null
  readonly accountSuspended: boolean
  /** The key's own requests per minute; null: the operator's default (`RATE_LIMIT_RPM`). */
  readonly rateLimitRpm?: number | null
  /** The key's own calls in flight at once; null: the operator's default (`RATE_LIMIT_CONCURRENT`). */
  readonly rateLimitConcurrent?: number | null
  /** The guardrail policy's JSON, the account's and the key's override (null: none): compiled by the call. */
  readonly accountGuardrails?: string | null
  readonly keyGuardrails?: string | null
  /** How long the response cache keeps the key's answers; null or absent: only when a request asks. */
  readonly cacheTtlSeconds?: number | null
}

export class CurrentApiKey extends Context.Tag("nenas/CurrentApiKey")<CurrentApiKey, ApiKeyPrincipal>() {}

/**
 * `Authorization: Bearer <SESSION_TOKEN>` on `/dashboard/*`, acting on the account named by `Nenas-Account` (else the
 * person's own); a role the endpoint does not allow (`allowRoles`) gets 403, an address past its failed
 * authentications 429.
 */
export class DashboardAuth extends HttpApiMiddleware.Tag<DashboardAuth>()("DashboardAuth", {
  failure: Schema.Union(wire(AuthenticationError), wire(PermissionDenied), wire(RateLimitExceeded)),
  provides: CurrentAccount,
  security: { sessionToken: HttpApiSecurity.bearer }
}) {}

/** `Authorization: Bearer <API_KEY>` on `/v1/*`. */
export class ApiKeyAuth extends HttpApiMiddleware.Tag<ApiKeyAuth>()("ApiKeyAuth", {
  failure: Schema.Union(
    wire(AuthenticationError),
    wire(InvalidApiKey),
    wire(ExpiredApiKey),
    wire(RevokedApiKey),
    wire(PermissionDenied)
  ),
  provides: CurrentApiKey,
  security: { apiKey: HttpApiSecurity.bearer }
}) {}

export const DevSessionRequest = Schema.Struct({
  email: EmailAddress,
  /** The account's name at its first sign-in: it reaches invitation emails, so one line. */
  name: Schema.optional(SingleLineName)
})

export const DevSessionResponse = Schema.Struct({ token: Schema.String })

export const Jwks = Schema.Struct({
  keys: Schema.Array(Schema.Record({ key: Schema.String, value: Schema.Unknown }))
})

/** The development identity provider: on only when `AUTH_JWKS_URL` is unset and the service listens on loopback (or `DEV_AUTH=1`), never in production. */
export class DevIdentityApi extends HttpApiGroup.make("devIdentity")
  .add(
    HttpApiEndpoint.post("createSession", "/dev/session")
      .setPayload(DevSessionRequest)
      .addSuccess(DevSessionResponse)
      .addError(wire(InvalidRequest))
      .addError(wire(NotFound))
      .addError(wire(RateLimitExceeded))
  )
  .add(
    HttpApiEndpoint.get("jwks", "/dev/.well-known/jwks.json")
      .addSuccess(Jwks)
      .addError(wire(NotFound))
  )
  .annotate(
    OpenApi.Description,
    "Development identity provider: issues dashboard session tokens when AUTH_JWKS_URL is unset, on a loopback listen address or with DEV_AUTH=1 (never in production)."
  )
{}
