import { Schema } from "effect"
import { expect } from "vitest"
import type { Reply } from "./Http.js"

/** docs/api/errors.md, "Errors": the one error body every failure answers with. */
export const ErrorBody = Schema.Struct({
  type: Schema.Literal("error"),
  error: Schema.Struct({
    message: Schema.NonEmptyString,
    type: Schema.Literal(
      "invalid_request_error",
      "authentication_error",
      "permission_error",
      "billing_error",
      "rate_limit_error",
      "provider_error",
      "api_error"
    ),
    code: Schema.NonEmptyString,
    param: Schema.NullOr(Schema.String),
    request_id: Schema.String.pipe(Schema.pattern(/^req_/)),
    guidance: Schema.NonEmptyString,
    action_url: Schema.NullOr(Schema.String),
    retryable: Schema.Boolean,
    retry_after_seconds: Schema.optional(Schema.Number)
  })
})

export const isErrorBody = Schema.is(ErrorBody)

/** A 4xx in the error shape, its `X-Request-Id` equal to `error.request_id`. */
export const expectClientError = (
  reply: Reply,
  expected: { readonly status: number; readonly code: string; readonly param?: string | null },
  name = ""
) => {
  expect(reply.status, `${name} status (${reply.text.slice(0, 300)})`).toBe(expected.status)
  expect(isErrorBody(reply.body), `${name} error shape (${reply.text.slice(0, 300)})`).toBe(true)
  expect(reply.headers.get("x-request-id"), `${name} X-Request-Id`).toBe(reply.body.error.request_id)
  expect(reply.body.error.code, `${name} code`).toBe(expected.code)
  if (expected.param !== undefined) expect(reply.body.error.param, `${name} param`).toBe(expected.param)
}
