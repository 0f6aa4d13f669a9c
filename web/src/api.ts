/** The dashboard API, typed as the service's Api.ts files declare it, over fetch with the session token. */

export interface ApiErrorBody {
  readonly message: string
  readonly type: string
  readonly code: string
  readonly param: string | null
  readonly request_id: string
  readonly guidance: string | null
  readonly action_url: string | null
  readonly retryable: boolean
  readonly retry_after_seconds?: number
}

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
  readonly method?: "GET" | "POST" | "DELETE"
  readonly json?: unknown
  readonly query?: Query
  readonly signal?: AbortSignal
}

export const request = async <A>(path: string, options: RequestOptions = {}): Promise<A> => {
  const headers: Record<string, string> = { accept: "application/json" }
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

// ---- the shapes of src/*/Api.ts --------------------------------------------

export interface ClientConfig {
  readonly identity: "development" | "external"
  readonly checkout: "simulated" | "stripe"
  readonly business_timezone: string
}

export interface Wallet {
  readonly availableMicroMyr: number
  readonly reservedMicroMyr: number
  readonly lifetimeTopupMicroMyr: number
  readonly lifetimeSpendMicroMyr: number
}

export interface Balance {
  readonly wallet: Wallet
  readonly topup_options_sen: ReadonlyArray<number>
  readonly account_suspended: boolean
}

export type LedgerType = "topup" | "usage" | "refund" | "chargeback" | "chargeback_reversal" | "adjustment"
export const LEDGER_TYPES: ReadonlyArray<LedgerType> = ["topup", "usage", "refund", "chargeback", "chargeback_reversal", "adjustment"]

export interface LedgerEntry {
  readonly id: string
  readonly type: LedgerType
  readonly amountMicroMyr: number
  readonly balanceAfterMicroMyr: number
  readonly description: string
  readonly createdAt: string
}

export interface TransactionsPage {
  readonly ledger: ReadonlyArray<LedgerEntry>
  readonly page: number
  readonly limit: number
}

export interface CheckoutResponse {
  readonly url: string
  readonly session_id: string
  readonly transaction_id: string
}

export interface ApiKey {
  readonly id: string
  readonly name: string
  readonly prefix: string
  readonly environment: "live" | "test"
  readonly status: "active" | "expired"
  readonly created_at: string
  readonly last_used_at: string | null
  readonly monthly_spend_limit_micro_myr: number | null
  readonly expires_at: string | null
}

export interface CreatedKey {
  readonly key: ApiKey
  readonly full_key: string
  readonly warning: string
}

export type LogStatus = "pending" | "succeeded" | "failed" | "billed"
export const LOG_STATUSES: ReadonlyArray<LogStatus> = ["pending", "succeeded", "failed", "billed"]

export interface LogEntry {
  readonly requestId: string
  readonly apiKeyId: string
  readonly publicModel: string
  readonly endpoint: string
  readonly stream: boolean
  readonly status: LogStatus
  readonly routingCategory: string | null
  readonly errorCode: string | null
  readonly inputTokens: number
  readonly outputTokens: number
  readonly reasoningTokens: number
  readonly cachedTokens: number
  readonly usageSource: "provider" | "estimated"
  readonly searchCount: number
  readonly contentPages: number
  readonly costMicroMyr: number
  readonly latencyMs: number
  readonly createdAt: string
}

export interface LogsPage {
  readonly logs: ReadonlyArray<LogEntry>
  readonly total: number
  readonly has_more: boolean
}

export type Granularity = "hour" | "day"

export interface SeriesPoint {
  readonly bucket: string
  readonly requests: number
  readonly costMicroMyr: number
  readonly inputTokens: number
  readonly outputTokens: number
  readonly reasoningTokens: number
}

export interface UsageSeries {
  readonly from: string
  readonly to: string
  readonly granularity: Granularity
  readonly series: ReadonlyArray<SeriesPoint>
}

export interface UsageCounters {
  readonly requests: number
  readonly inputTokens: number
  readonly outputTokens: number
  readonly reasoningTokens: number
  readonly searchCount: number
  readonly contentPages: number
  readonly costMicroMyr: number
}

export interface Overview {
  readonly wallet: Wallet
  readonly today_usage: UsageCounters
  readonly total_usage: UsageCounters
  readonly daily_series: ReadonlyArray<SeriesPoint>
  readonly api_key_count: number
  readonly active_api_key_count: number
}
