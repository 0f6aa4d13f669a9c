import type { ApiError } from "../../Domain/Errors.js"
import { httpStatus, toErrorBody } from "../../Domain/Errors.js"
import type { AnthropicErrorBody, AnthropicErrorType } from "./AnthropicApi.js"

/**
 * Anthropic's SDKs raise their typed errors (`AuthenticationError`, `NotFoundError`, `RateLimitError`, …)
 * by HTTP status, and show `error.type`: both come from the status here, nenas's code stays in `code`.
 * 409 (`idempotency_conflict`) stays `invalid_request_error`, as in nenas's table; 502 and 504 are
 * `api_error`: the call failed or took too long, which retrying may cure, while `overloaded_error`
 * (503) tells Claude Code the service is saturated.
 */
const TYPE_BY_STATUS: ReadonlyMap<number, typeof AnthropicErrorType.Type> = new Map([
  [400, "invalid_request_error"],
  [401, "authentication_error"],
  [402, "billing_error"],
  [403, "permission_error"],
  [404, "not_found_error"],
  [409, "invalid_request_error"],
  [413, "request_too_large"],
  [429, "rate_limit_error"],
  [500, "api_error"],
  [502, "api_error"],
  [503, "overloaded_error"],
  [504, "api_error"],
  [529, "overloaded_error"]
])

/** Anthropic's `error.type` for an HTTP status: other 4xx are the request's fault, other 5xx ours. */
export const anthropicErrorType = (status: number): typeof AnthropicErrorType.Type =>
  TYPE_BY_STATUS.get(status) ?? (status < 500 ? "invalid_request_error" : "api_error")

/** An error in Anthropic's body: nenas's fields (code, guidance, action_url, retryable, param) inside `error`. */
export const anthropicErrorBody = (error: ApiError, requestId: string, dashboardUrl: string): AnthropicErrorBody => {
  const { request_id: _requestId, type: _type, ...fields } = toErrorBody(error, requestId, dashboardUrl).error
  return {
    type: "error",
    // eslint-disable-next-line nenas/no-spread-adding-field -- an error body, serialized at once
    error: { type: anthropicErrorType(httpStatus(error)), ...fields },
    request_id: requestId
  }
}
