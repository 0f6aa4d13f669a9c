import * as HttpApiSchema from "@effect/platform/HttpApiSchema"
import { Effect, FiberRef, ParseResult, Schema } from "effect"
import type * as AST from "effect/SchemaAST"
import { CurrentRequestId } from "../Request/Context.js"

/**
 * The error model (docs/api/errors.md, "Errors"): one `Schema.TaggedError` per error code, each
 * carrying its HTTP status, `error.type` and retryable flag, and one wire
 * encoding (`{ type: "error", error: {...} }`) shared by the server's error
 * middleware and the OpenAPI document.
 */

/** Where `action_url` points; set once at start-up from `DASHBOARD_URL`. */
export const CurrentDashboardUrl: FiberRef.FiberRef<string> = FiberRef.unsafeMake("")

const fields = {
  message: Schema.String,
  param: Schema.optionalWith(Schema.NullOr(Schema.String), { default: () => null }),
  guidance: Schema.optional(Schema.String),
  retryable: Schema.optional(Schema.Boolean),
  retry_after_seconds: Schema.optional(Schema.Int),
  /** This error's own dashboard page (a key's edit view, say), relative to `DASHBOARD_URL`; else its code's. */
  action: Schema.optional(Schema.String)
}

interface Meta {
  readonly code: string
  readonly status: number
  readonly type: string
  readonly retryable: boolean
  readonly guidance: string
  /** Dashboard page the user can act on, relative to `DASHBOARD_URL`. */
  readonly action?: string
}

const MetaId = Symbol.for("nenas/ErrorMeta")
const meta = (m: Meta) => ({ [HttpApiSchema.AnnotationStatus]: m.status, [MetaId]: m })

/** `provider_timeout`'s advice, naming the output field of the endpoint called. */
export const providerTimeoutGuidance = (outputField: string): string =>
  `The model provider did not answer in time; retry, or lower ${outputField}.`

export class InvalidRequest extends Schema.TaggedError<InvalidRequest>()(
  "InvalidRequest",
  fields,
  meta({
    code: "invalid_request",
    status: 400,
    type: "invalid_request_error",
    retryable: false,
    guidance: "Correct the request as the message says (the field is named in `param`) and send it again."
  })
) {}
export class UnsupportedInput extends Schema.TaggedError<UnsupportedInput>()(
  "UnsupportedInput",
  fields,
  meta({
    code: "unsupported_input",
    status: 400,
    type: "invalid_request_error",
    retryable: false,
    guidance:
      "Remove or replace the input named in `param`: the message says what is not supported there and what is accepted."
  })
) {}
export class ContentBlocked extends Schema.TaggedError<ContentBlocked>()(
  "ContentBlocked",
  fields,
  meta({
    code: "content_blocked",
    status: 400,
    type: "invalid_request_error",
    retryable: false,
    guidance:
      "A guardrail of this account or key blocked the text (the message names the rule, `param` the field; null: " +
      "the answer). Remove it, or ask an owner or admin to change the policy.",
    action: "/guardrails"
  })
) {}
export class NotImplemented extends Schema.TaggedError<NotImplemented>()(
  "NotImplemented",
  fields,
  meta({
    code: "not_implemented",
    status: 400,
    type: "invalid_request_error",
    retryable: false,
    guidance: "This operation is not available yet."
  })
) {}
export class ContextLengthExceeded extends Schema.TaggedError<ContextLengthExceeded>()(
  "ContextLengthExceeded",
  fields,
  meta({
    code: "context_length_exceeded",
    status: 413,
    type: "invalid_request_error",
    retryable: false,
    guidance: "Shorten the input so that it fits the model's context window (and the body stays under 8 MiB)."
  })
) {}
export class NotFound extends Schema.TaggedError<NotFound>()(
  "NotFound",
  fields,
  meta({
    code: "not_found",
    status: 404,
    type: "invalid_request_error",
    retryable: false,
    guidance: "Check the path and the identifier."
  })
) {}
export class AuthenticationError extends Schema.TaggedError<AuthenticationError>()(
  "AuthenticationError",
  fields,
  meta({
    code: "authentication_error",
    status: 401,
    type: "authentication_error",
    retryable: false,
    guidance: "Send `Authorization: Bearer <token>` with a valid credential."
  })
) {}
export class InvalidApiKey extends Schema.TaggedError<InvalidApiKey>()(
  "InvalidApiKey",
  fields,
  meta({
    code: "invalid_api_key",
    status: 401,
    type: "authentication_error",
    retryable: false,
    guidance: "Check the API key, or create a new one in the dashboard.",
    action: "/api-keys"
  })
) {}
export class ExpiredApiKey extends Schema.TaggedError<ExpiredApiKey>()(
  "ExpiredApiKey",
  fields,
  meta({
    code: "expired_api_key",
    status: 401,
    type: "authentication_error",
    retryable: false,
    guidance: "This API key has expired; create a new one in the dashboard.",
    action: "/api-keys"
  })
) {}
export class RevokedApiKey extends Schema.TaggedError<RevokedApiKey>()(
  "RevokedApiKey",
  fields,
  meta({
    code: "revoked_api_key",
    status: 401,
    type: "authentication_error",
    retryable: false,
    guidance: "This API key was deleted; create a new one in the dashboard.",
    action: "/api-keys"
  })
) {}
export class PermissionDenied extends Schema.TaggedError<PermissionDenied>()(
  "PermissionDenied",
  fields,
  meta({
    code: "permission_denied",
    status: 403,
    type: "permission_error",
    retryable: false,
    guidance: "This credential may not do this; the message says why."
  })
) {}
export class InsufficientBalance extends Schema.TaggedError<InsufficientBalance>()(
  "InsufficientBalance",
  fields,
  meta({
    code: "insufficient_balance",
    status: 402,
    type: "billing_error",
    retryable: false,
    guidance: "Top up the wallet, or lower the request's output token limit to reduce the reservation.",
    action: "/billing"
  })
) {}
export class SpendLimitExceeded extends Schema.TaggedError<SpendLimitExceeded>()(
  "SpendLimitExceeded",
  fields,
  meta({
    code: "spend_limit_exceeded",
    status: 402,
    type: "billing_error",
    retryable: false,
    guidance: "Raise the key's monthly spend limit or wait for the next month.",
    action: "/api-keys"
  })
) {}
export class BillingError extends Schema.TaggedError<BillingError>()(
  "BillingError",
  fields,
  meta({
    code: "billing_error",
    status: 502,
    type: "billing_error",
    retryable: true,
    guidance: "The payment processor could not be reached; try again shortly."
  })
) {}
export class IdempotencyConflict extends Schema.TaggedError<IdempotencyConflict>()(
  "IdempotencyConflict",
  fields,
  meta({
    code: "idempotency_conflict",
    status: 409,
    type: "invalid_request_error",
    retryable: false,
    guidance: "Use a new Idempotency-Key for a different request, or wait for the first one to finish."
  })
) {}
export class RateLimitExceeded extends Schema.TaggedError<RateLimitExceeded>()(
  "RateLimitExceeded",
  fields,
  meta({
    code: "rate_limit_exceeded",
    status: 429,
    type: "rate_limit_error",
    retryable: true,
    guidance: "Slow down and retry after `retry_after_seconds`."
  })
) {}
export class ProviderUnavailable extends Schema.TaggedError<ProviderUnavailable>()(
  "ProviderUnavailable",
  fields,
  meta({
    code: "provider_unavailable",
    status: 503,
    type: "provider_error",
    retryable: true,
    guidance: "The model provider is unavailable; retry with backoff."
  })
) {}
/** A team's own provider key refused by its provider, on a call that may use nothing else (docs/api/provider-keys.md, "Routing"). */
export class ProviderKeyRefused extends Schema.TaggedError<ProviderKeyRefused>()(
  "ProviderKeyRefused",
  fields,
  meta({
    code: "provider_key_refused",
    status: 502,
    type: "provider_error",
    retryable: false,
    guidance: "Your provider refused your provider key (HTTP 401 or 403), and its mode is `only`: replace the key " +
      "(PATCH /dashboard/provider-keys/{id} with api_key), or set its mode to `first` or `fallback` so that " +
      "nenas's own upstreams answer meanwhile. The call cost nothing."
  })
) {}
export class ProviderTimeout extends Schema.TaggedError<ProviderTimeout>()(
  "ProviderTimeout",
  fields,
  meta({
    code: "provider_timeout",
    status: 504,
    type: "provider_error",
    retryable: true,
    guidance: providerTimeoutGuidance("the request's output token limit")
  })
) {}
export class SearchError extends Schema.TaggedError<SearchError>()(
  "SearchError",
  fields,
  meta({
    code: "search_error",
    status: 502,
    type: "provider_error",
    retryable: true,
    guidance: "Web search failed; retry, or send the request with web_search.mode off."
  })
) {}
export class InternalError extends Schema.TaggedError<InternalError>()(
  "InternalError",
  fields,
  meta({
    code: "internal_error",
    status: 500,
    type: "api_error",
    retryable: true,
    guidance: "Something went wrong on our side; retry, and quote the request_id if it persists."
  })
) {}

export const errorClasses = [
  InvalidRequest,
  UnsupportedInput,
  ContentBlocked,
  NotImplemented,
  ContextLengthExceeded,
  NotFound,
  AuthenticationError,
  InvalidApiKey,
  ExpiredApiKey,
  RevokedApiKey,
  PermissionDenied,
  InsufficientBalance,
  SpendLimitExceeded,
  BillingError,
  IdempotencyConflict,
  RateLimitExceeded,
  ProviderUnavailable,
  ProviderKeyRefused,
  ProviderTimeout,
  SearchError,
  InternalError
] as const

export type ApiError = InstanceType<(typeof errorClasses)[number]>
type ErrorClass = (typeof errorClasses)[number]

const metaByTag: ReadonlyMap<string, Meta> = new Map(
  // A class schema is a transformation to its declaration, which carries the class's annotations.
  errorClasses.map((cls) => [cls._tag, (cls.ast as AST.Transformation).to.annotations[MetaId] as Meta] as const)
)

export const isApiError = (u: unknown): u is ApiError =>
  typeof u === "object" && u !== null && "_tag" in u && metaByTag.has((u as { _tag: string })._tag)

/** The fields of an error that the wire body is made from (an error or its encoded form). */
type ErrorFields = Omit<Schema.Schema.Encoded<ErrorClass>, "_tag"> & { readonly _tag: string }

export const errorMeta = (error: { readonly _tag: string }): Meta => {
  const found = metaByTag.get(error._tag)
  if (found === undefined) throw new Error(`not an API error: ${error._tag}`)
  return found
}

export const httpStatus = (error: { readonly _tag: string }): number => errorMeta(error).status

const ErrorObject = Schema.Struct({
  message: Schema.String,
  type: Schema.String,
  code: Schema.String,
  param: Schema.NullOr(Schema.String),
  request_id: Schema.String,
  guidance: Schema.String,
  action_url: Schema.NullOr(Schema.String),
  retryable: Schema.Boolean,
  retry_after_seconds: Schema.optional(Schema.Int.pipe(Schema.nonNegative()))
})

/** The spec's error body. */
export const ErrorBody = Schema.Struct({ type: Schema.Literal("error"), error: ErrorObject }).annotations({
  identifier: "ErrorBody"
})
export type ErrorBody = typeof ErrorBody.Type

export const toErrorBody = (
  error: ErrorFields,
  requestId: string,
  dashboardUrl: string
): ErrorBody => {
  const m = errorMeta(error)
  return {
    type: "error",
    error: {
      message: error.message,
      type: m.type,
      code: m.code,
      param: error.param ?? null,
      request_id: requestId,
      guidance: error.guidance ?? m.guidance,
      action_url: (error.action ?? m.action) === undefined ? null : `${dashboardUrl}${error.action ?? m.action}`,
      retryable: error.retryable ?? m.retryable,
      ...(error.retry_after_seconds === undefined ? {} : { retry_after_seconds: error.retry_after_seconds })
    }
  }
}

/**
 * The schema an endpoint declares for an error: the spec's body on the wire,
 * the tagged error in code. OpenAPI documents the body; a typed client decodes
 * it back into the tagged error.
 */
export const wire = <C extends ErrorClass>(cls: C) => {
  const m = errorMeta(cls)
  const body = Schema.Struct({
    type: Schema.Literal("error"),
    error: Schema.Struct({ ...ErrorObject.fields, code: Schema.Literal(m.code) })
  })
  return Schema.transformOrFail(body, cls as ErrorClass, {
    strict: false,
    decode: ({ error }) =>
      ParseResult.succeed({
        _tag: cls._tag,
        message: error.message,
        param: error.param,
        guidance: error.guidance,
        retryable: error.retryable,
        retry_after_seconds: error.retry_after_seconds
      }),
    encode: (error) =>
      Effect.zipWith(
        FiberRef.get(CurrentRequestId),
        FiberRef.get(CurrentDashboardUrl),
        (requestId, dashboardUrl) => ({
          ...toErrorBody(error as ErrorFields, requestId, dashboardUrl),
          type: "error" as const
        })
      )
  }).annotations({
    ...HttpApiSchema.annotations({ status: m.status }),
    identifier: `${cls._tag}Body`
  }) as unknown as Schema.Schema<
    InstanceType<C>,
    ErrorBody
  >
}

/** `insufficient_balance`'s guidance, naming the endpoint's own output field (`max_tokens` on chat). */
export const insufficientBalanceGuidance = (outputField: string): string =>
  `Top up the wallet, or lower ${outputField} to reduce the reservation.`

/** `insufficient_balance` when the wallet is below zero: a smaller request would not help. */
export const NEGATIVE_BALANCE_GUIDANCE = "The wallet's balance is negative; top up to bring it above zero, then retry."

/** The dashboard's edit view of one key (the keys page opens the key named in `edit`). */
export const keyEditAction = (apiKeyId: string): string => `/api-keys?edit=${encodeURIComponent(apiKeyId)}`

/** An account with an open payment dispute may not make model calls (docs/money.md, "Payments (Stripe)"). */
export const accountSuspended = () =>
  new PermissionDenied({
    message: "This account is suspended while a payment dispute is open; model calls resume when it closes.",
    guidance: "The account is suspended while a payment dispute is open.",
    action: "/billing"
  })
