/**
 * How the dashboard talks to the service: one fetch with the session's token and
 * account, its answer read as JSON, and every failure as an `ApiError` in the
 * spec's error shape. No DOM and no contract types beyond the error body, so the
 * service's tests run it in Node against a real HTTP server (test/dashboardClient.test.ts).
 */
import type { ErrorBody } from "./contract.js"

export type ApiErrorBody = ErrorBody["error"]

/** A failed call: the spec's error body, or one made up when the body was not it (a network failure). */
export class ApiError extends Error {
  constructor(readonly status: number, readonly body: ApiErrorBody) {
    super(body.message)
  }
}

export const isErrorBody = (value: unknown): value is { error: ApiErrorBody } =>
  typeof value === "object" && value !== null && "error" in value &&
  typeof (value as { error: unknown }).error === "object" &&
  (value as { error: { message?: unknown } }).error !== null &&
  typeof (value as { error: { message?: unknown } }).error.message === "string"

export const localError = (status: number, message: string, guidance: string): ApiError =>
  new ApiError(status, {
    message,
    type: "api_error",
    code: status === 0 ? "network_error" : "unexpected_response",
    param: null,
    request_id: "",
    guidance,
    action_url: null,
    retryable: true
  })

/**
 * Who calls: the session's token, and the account the call acts on (sent as
 * `Nenas-Account`; null: the person's personal account, the service's default).
 * Every member route needs one, so that no call forgets which account it changes.
 */
export interface Caller {
  readonly token: string | null
  readonly account: string | null
}

/** What a request carries besides its method and URL. */
export interface SendOptions {
  readonly caller?: Caller
  readonly signal?: AbortSignal
  readonly json?: unknown
  readonly headers?: Readonly<Record<string, string>>
}

/** The session's bearer token and the account named, as request headers. */
export const callerHeaders = (caller: Caller | undefined): Record<string, string> => ({
  ...(caller?.token ? { authorization: `Bearer ${caller.token}` } : {}),
  ...(caller?.account ? { "nenas-account": caller.account } : {})
})

export const unreachable = () =>
  localError(0, "The service could not be reached.", "Check that the service is running, then try again.")

export const send = async (method: string, url: string, options: SendOptions): Promise<unknown> => {
  const headers: Record<string, string> = {
    ...options.headers,
    ...callerHeaders(options.caller),
    accept: "application/json"
  }
  if (options.json !== undefined) headers["content-type"] = "application/json"
  let response: Response
  try {
    response = await fetch(url, {
      method,
      headers,
      body: options.json === undefined ? null : JSON.stringify(options.json),
      // The session is the bearer token alone: never send or accept cookies.
      credentials: "omit",
      ...(options.signal === undefined ? {} : { signal: options.signal })
    })
  } catch (cause) {
    if (cause instanceof DOMException && cause.name === "AbortError") throw cause
    throw unreachable()
  }
  // No Content (a deletion): nothing to read.
  if (response.status === 204) return undefined
  let body: unknown
  try {
    body = await response.json()
  } catch (cause) {
    // Aborted while the body was read: the caller asked for no answer, so it gets none (not an empty one).
    if (options.signal?.aborted) throw cause
    body = undefined
  }
  if (response.ok) {
    if (body === undefined) {
      throw localError(
        response.status,
        `The service answered ${response.status} without a JSON body.`,
        "Try again; if it persists, check the service's log."
      )
    }
    return body
  }
  if (isErrorBody(body)) throw new ApiError(response.status, body.error)
  throw localError(
    response.status,
    `The service answered ${response.status} without an error body.`,
    "Try again; if it persists, check the service's log."
  )
}
