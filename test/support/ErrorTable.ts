/**
 * The error table of docs/api/errors.md, "Errors", written out here so that the implementation is checked
 * against it.
 */
export const ERROR_TABLE = [
  ["InvalidRequest", "invalid_request", 400, "invalid_request_error", false],
  ["UnsupportedInput", "unsupported_input", 400, "invalid_request_error", false],
  ["ContentBlocked", "content_blocked", 400, "invalid_request_error", false],
  ["NotImplemented", "not_implemented", 400, "invalid_request_error", false],
  ["ContextLengthExceeded", "context_length_exceeded", 413, "invalid_request_error", false],
  ["NotFound", "not_found", 404, "invalid_request_error", false],
  ["AuthenticationError", "authentication_error", 401, "authentication_error", false],
  ["InvalidApiKey", "invalid_api_key", 401, "authentication_error", false],
  ["ExpiredApiKey", "expired_api_key", 401, "authentication_error", false],
  ["RevokedApiKey", "revoked_api_key", 401, "authentication_error", false],
  ["PermissionDenied", "permission_denied", 403, "permission_error", false],
  ["InsufficientBalance", "insufficient_balance", 402, "billing_error", false],
  ["SpendLimitExceeded", "spend_limit_exceeded", 402, "billing_error", false],
  ["BillingError", "billing_error", 502, "billing_error", true],
  ["IdempotencyConflict", "idempotency_conflict", 409, "invalid_request_error", false],
  ["RateLimitExceeded", "rate_limit_exceeded", 429, "rate_limit_error", true],
  ["ProviderUnavailable", "provider_unavailable", 503, "provider_error", true],
  ["ProviderKeyRefused", "provider_key_refused", 502, "provider_error", false],
  ["ProviderTimeout", "provider_timeout", 504, "provider_error", true],
  ["SearchError", "search_error", 502, "provider_error", true],
  ["InternalError", "internal_error", 500, "api_error", true]
] as const
