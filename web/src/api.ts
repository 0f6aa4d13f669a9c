/** The dashboard API, typed as the service's Api.ts files declare it, over fetch with the session token. */

// Type-only: the schemas' types are erased, so none of the server's code (nor effect) reaches the bundle.
import type { Schema } from "effect"
import type * as WebhooksApi from "../../src/Webhooks/Api.js"
import type * as AlertsApi from "../../src/Alerts/Api.js"
import type * as BillingApi from "../../src/Billing/Api.js"
import type { ErrorBody } from "../../src/Domain/Errors.js"
import type * as KeysApi from "../../src/Keys/Api.js"
import type * as UsageApi from "../../src/Usage/Api.js"
import type * as WalletApi from "../../src/Wallet/Api.js"

/** What a schema's JSON looks like in the browser: its encoded side (a decoded date, say, arrives as a string). */
type Json<S extends Schema.Schema.Any> = Schema.Schema.Encoded<S>

export type ApiErrorBody = Json<typeof ErrorBody>["error"]

/** A failed call: the spec's error body, or one made up when the body was not it (a network failure). */
export class ApiError extends Error {
  constructor(readonly status: number, readonly body: ApiErrorBody) {
    super(body.message)
  }
}

const isErrorBody = (value: unknown): value is { error: ApiErrorBody } =>
  typeof value === "object" && value !== null && "error" in value &&
  typeof (value as { error: unknown }).error === "object" && (value as { error: { message?: unknown } }).error !== null &&
  typeof (value as { error: { message?: unknown } }).error.message === "string"

const localError = (status: number, message: string, guidance: string): ApiError =>
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

export type Query = Record<string, string | number | undefined>

const withQuery = (path: string, query: Query | undefined): string => {
  if (query === undefined) return path
  const params = new URLSearchParams()
  for (const [key, value] of Object.entries(query)) if (value !== undefined && value !== "") params.set(key, String(value))
  const text = params.toString()
  return text === "" ? path : `${path}?${text}`
}

export interface RequestOptions {
  readonly token?: string | null
  readonly method?: "GET" | "POST" | "PUT" | "PATCH" | "DELETE"
  readonly json?: unknown
  /** Extra request headers, e.g. an `Idempotency-Key`. */
  readonly headers?: Record<string, string>
  readonly query?: Query
  readonly signal?: AbortSignal
}

export const request = async <A>(path: string, options: RequestOptions = {}): Promise<A> => {
  const headers: Record<string, string> = { ...options.headers, accept: "application/json" }
  if (options.token) headers["authorization"] = `Bearer ${options.token}`
  if (options.json !== undefined) headers["content-type"] = "application/json"
  let response: Response
  try {
    response = await fetch(withQuery(path, options.query), {
      method: options.method ?? "GET",
      headers,
      body: options.json === undefined ? null : JSON.stringify(options.json),
      // The session is the bearer token alone: never send or accept cookies.
      credentials: "omit",
      ...(options.signal === undefined ? {} : { signal: options.signal })
    })
  } catch (cause) {
    if (cause instanceof DOMException && cause.name === "AbortError") throw cause
    throw localError(0, "The service could not be reached.", "Check that the service is running, then try again.")
  }
  const body: unknown = await response.json().catch(() => undefined)
  if (response.ok) return body as A
  if (isErrorBody(body)) throw new ApiError(response.status, body.error)
  throw localError(response.status, `The service answered ${response.status} without an error body.`, "Try again; if it persists, check the service's log.")
}

/**
 * Saves what `path` answers (an export) as `filename`: fetched with the session
 * token (a link could not carry it), then handed to the browser as a download.
 */
export const download = async (path: string, query: Query, token: string | null, filename: string): Promise<void> => {
  let response: Response
  try {
    response = await fetch(withQuery(path, query), {
      headers: token ? { authorization: `Bearer ${token}` } : {},
      credentials: "omit"
    })
  } catch {
    throw localError(0, "The service could not be reached.", "Check that the service is running, then try again.")
  }
  if (!response.ok) {
    const body: unknown = await response.json().catch(() => undefined)
    if (isErrorBody(body)) throw new ApiError(response.status, body.error)
    throw localError(response.status, `The service answered ${response.status} without an error body.`, "Try again.")
  }
  const url = URL.createObjectURL(await response.blob())
  const link = document.createElement("a")
  link.href = url
  link.download = filename
  document.body.append(link)
  link.click()
  link.remove()
  setTimeout(() => URL.revokeObjectURL(url), 60_000)
}

// ---- the shapes of src/*/Api.ts, as JSON -----------------------------------

/** Served at /app/config.json by src/Http/Dashboard.ts, which declares no schema for it. */
export interface ClientConfig {
  /** `off`: no identity provider, and the development one is off (not on loopback, or DEV_AUTH=0). */
  readonly identity: "development" | "external" | "off"
  /** Where the sign-in button sends the browser (an implicit-flow authorization endpoint), when configured. */
  readonly authorize: { readonly url: string; readonly client_id: string; readonly redirect_uri: string } | null
  readonly checkout: "simulated" | "stripe"
  readonly business_timezone: string
}

/**
 * Every member of a union of strings, in the order given; the compiler refuses
 * a list that misses one, so a value the server adds shows up here.
 */
const allOf = <T extends string>() =>
  <const L extends ReadonlyArray<T>>(
    list: L & ([Exclude<T, L[number]>] extends [never] ? unknown : { readonly missing: Exclude<T, L[number]> })
  ): ReadonlyArray<T> => list

export type Wallet = Json<typeof WalletApi.Wallet>
export type Balance = Json<typeof BillingApi.Balance>
export type LedgerType = Json<typeof WalletApi.LedgerType>
export const LEDGER_TYPES = allOf<LedgerType>()(["topup", "usage", "refund", "chargeback", "chargeback_reversal", "adjustment"])
export type LedgerEntry = Json<typeof WalletApi.LedgerEntry>
export type TransactionsPage = Json<typeof BillingApi.TransactionsPage>
export type CheckoutResponse = Json<typeof BillingApi.CheckoutResponse>

export type ApiKey = Json<typeof KeysApi.ApiKeyRecord>
export type CreatedKey = Json<typeof KeysApi.CreateApiKeyResponse>
export type UpdateKey = Json<typeof KeysApi.UpdateApiKeyRequest>
export type RotateKey = Json<typeof KeysApi.RotateApiKeyRequest>
export type RotatedKey = Json<typeof KeysApi.RotateApiKeyResponse>

export type LogStatus = Json<typeof UsageApi.LogStatus>
export const LOG_STATUSES = allOf<LogStatus>()(["pending", "succeeded", "failed", "billed"])
export type LogEntry = Json<typeof UsageApi.LogEntry>
export type LogsPage = Json<typeof UsageApi.LogsPage>
export type LogConversation = Json<typeof UsageApi.LogConversation>
export type Granularity = Json<typeof UsageApi.Granularity>
export type SeriesPoint = Json<typeof UsageApi.SeriesPoint>
export type UsageSeries = Json<typeof UsageApi.UsageSeries>
export type UsageCounters = Json<typeof UsageApi.UsageCounters>
export type Overview = Json<typeof UsageApi.Overview>

export type BillingSettings = Json<typeof AlertsApi.BillingSettings>
export type UpdateBillingSettings = Json<typeof AlertsApi.UpdateBillingSettings>
export type Banner = Json<typeof AlertsApi.Banner>
export const AUTO_TOPUP_AMOUNTS_MYR = [10, 25, 50, 100, 250, 500] as const
export type WebhookEndpoint = Json<typeof WebhooksApi.WebhookEndpoint>
export type CreatedWebhook = Json<typeof WebhooksApi.CreateWebhookResponse>
export type WebhookDelivery = Json<typeof WebhooksApi.WebhookDelivery>
export type WebhookEventType = Json<typeof WebhooksApi.WebhookEventType>
export const WEBHOOK_EVENTS = allOf<WebhookEventType>()([
  "balance.low", "topup.succeeded", "topup.failed", "auto_topup.failed",
  "key.limit_reached", "key.expiring", "account.suspended", "account.reinstated"
])
