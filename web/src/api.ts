/** The dashboard API over fetch with the session token and account, typed by the service's contract (web/src/contract.ts). */

// Types only, generated from the contract: none of the server's code (nor effect) reaches the bundle.
import type { Routes, Schemas } from "./contract"
import type { MemberRoute } from "./roles"
import {
  ApiError,
  type Caller,
  callerHeaders,
  isErrorBody,
  localError,
  send,
  type SendOptions,
  unreachable
} from "./transport"

export { ApiError, type Caller } from "./transport"

// ---- the routes of the contract ---------------------------------------------

/** A route of the contract: `METHOD /path`, with `{name}` for each path parameter (as in /openapi.json). */
export type Route = keyof Routes

type Field<K extends Route, Name extends string> = Routes[K] extends { readonly [N in Name]: infer A } ? A : never

/** What the route answers, as JSON (a CSV export: its text). */
export type Success<K extends Route> = Routes[K]["success"]
/** The JSON body the route takes; `never` when it takes none. */
export type Payload<K extends Route> = Field<K, "payload">
/** The query parameters the route takes, as text; `never` when it takes none. */
export type Query<K extends Route> = Field<K, "query">
/** The route's path parameters, put in place of its `{name}`s; `never` when it has none. */
export type PathParams<K extends Route> = Field<K, "path">
/** The request headers the route reads (besides the session's); `never` when it reads none. */
export type Headers<K extends Route> = Field<K, "headers">

/** Routes answering JSON, and those answering text (CSV exports). */
export type JsonRoute = { [K in Route]: Routes[K] extends { readonly media: string } ? never : K }[Route]
export type TextRoute = Exclude<Route, JsonRoute>
/** Routes the pages read as they load. */
export type ReadRoute = Extract<JsonRoute, `GET ${string}`>

/** An option that must be given when the route has it (`needed`), and may not be given when it has not. */
type Option<Name extends string, A, Needed extends boolean> = [A] extends [never] ? { readonly [N in Name]?: never }
  : Needed extends true ? { readonly [N in Name]: A }
  : { readonly [N in Name]?: A }

/** Where a call of route `K` goes: its path parameters and query. */
export type Target<K extends Route> = Option<"path", PathParams<K>, true> & Option<"query", Query<K>, false>

export type RequestOptions<K extends Route> =
  & Target<K>
  & Option<"json", Payload<K>, true>
  & Option<"headers", Headers<K>, false>
  & Option<"caller", Caller, K extends MemberRoute ? true : false>
  & { readonly signal?: AbortSignal }

/** The options of any route, as the code that sends them sees them. */
interface AnyOptions extends SendOptions {
  readonly path?: Readonly<Record<string, string>>
  readonly query?: Readonly<Record<string, string | undefined>>
}

/** The route's method, and its URL with the path parameters in place and the query given (empty values left out). */
const locate = (route: string, options: AnyOptions): { readonly method: string; readonly url: string } => {
  const [method = "GET", template = "/"] = route.split(" ")
  const path = template.replace(/\{([^}]+)\}/g, (_, name: string) => {
    const value = options.path?.[name]
    // The types ask for every parameter; a call that gets here without one is a bug to see, not a request to send.
    if (value === undefined) throw new Error(`${route}: no value for {${name}}`)
    return encodeURIComponent(value)
  })
  const params = new URLSearchParams()
  for (const [key, value] of Object.entries(options.query ?? {})) {
    if (value !== undefined && value !== "") params.set(key, value)
  }
  const query = params.toString()
  return { method, url: query === "" ? path : `${path}?${query}` }
}

/**
 * Calls a route of the contract, e.g. `api("PATCH /dashboard/api-keys/{id}", { caller, path: { id }, json: { disabled: true } })`:
 * the path parameters, query and body are checked against the contract, and the answer is typed as it declares.
 */
export const api = <K extends JsonRoute>(route: K, options: RequestOptions<K>): Promise<Success<K>> => {
  const loose = options as AnyOptions
  const { method, url } = locate(route, loose)
  return send(method, url, loose) as Promise<Success<K>>
}

/**
 * Saves what a route answering a file (a CSV export, an invoice's PDF) answers as `filename`: fetched with
 * the session token and account (a link could not carry them), then handed to the browser as a download.
 */
export const download = async <K extends TextRoute>(
  route: K,
  options: Target<K> & { readonly caller: Caller },
  filename: string
): Promise<void> => {
  const { url } = locate(route, options as AnyOptions)
  let response: Response
  try {
    response = await fetch(url, {
      headers: callerHeaders(options.caller),
      credentials: "omit"
    })
  } catch {
    throw unreachable()
  }
  if (!response.ok) {
    const body: unknown = await response.json().catch(() => undefined)
    if (isErrorBody(body)) throw new ApiError(response.status, body.error)
    throw localError(response.status, `The service answered ${response.status} without an error body.`, "Try again.")
  }
  const href = URL.createObjectURL(await response.blob())
  const link = document.createElement("a")
  link.href = href
  link.download = filename
  document.body.append(link)
  link.click()
  link.remove()
  setTimeout(() => URL.revokeObjectURL(href), 60_000)
}

/** Served at /app/config.json by src/Http/Dashboard.ts, which declares no schema for it. */
export interface ClientConfig {
  /** `off`: no identity provider, and the development one is off (not on loopback, or DEV_AUTH=0). */
  readonly identity: "development" | "external" | "off"
  /** Where the sign-in button sends the browser (an implicit-flow authorization endpoint), when configured. */
  readonly authorize: { readonly url: string; readonly client_id: string; readonly redirect_uri: string } | null
  readonly checkout: "simulated" | "stripe"
  readonly business_timezone: string
}

export const loadClientConfig = (): Promise<ClientConfig> =>
  send("GET", "/app/config.json", {}) as Promise<ClientConfig>

// ---- the shapes the pages name, taken from the routes --------------------------

/**
 * Every member of a union, in the order given; the compiler refuses a list
 * that misses one, so a value the server adds shows up here.
 */
const allOf = <T extends string | number>() =>
<const L extends ReadonlyArray<T>>(
  list: L & ([Exclude<T, L[number]>] extends [never] ? unknown : { readonly missing: Exclude<T, L[number]> })
): ReadonlyArray<T> => list

export type Balance = Success<"GET /dashboard/billing/balance">
export type TopupOption = Balance["topup_options"][number]
export type TopUpSen = Payload<"POST /dashboard/billing/checkout">["amount_sen"]
export type LedgerEntry = Success<"GET /dashboard/billing/transactions">["ledger"][number]
export type LedgerType = LedgerEntry["type"]
export const LEDGER_TYPES = allOf<LedgerType>()([
  "topup",
  "usage",
  "refund",
  "chargeback",
  "chargeback_reversal",
  "adjustment"
])

export type ApiKey = Success<"GET /dashboard/api-keys">["keys"][number]
export type CreatedKey = Success<"POST /dashboard/api-keys">
export type UpdateKey = Payload<"PATCH /dashboard/api-keys/{id}">
export type RotatedKey = Success<"POST /dashboard/api-keys/{id}/rotate">

export type LogEntry = Success<"GET /dashboard/logs">["logs"][number]
export type LogStatus = LogEntry["status"]
export const LOG_STATUSES = allOf<LogStatus>()(["pending", "succeeded", "failed", "billed"])
export type Granularity = Success<"GET /dashboard/usage">["granularity"]
export type SeriesPoint = Success<"GET /dashboard/usage">["series"][number]

export type BillingSettings = Success<"GET /dashboard/billing/settings">
export type UpdateBillingSettings = Payload<"PUT /dashboard/billing/settings">
export type AutoTopupAmount = NonNullable<NonNullable<UpdateBillingSettings["auto_topup"]>["amount_myr"]>
export const AUTO_TOPUP_AMOUNTS_MYR = allOf<AutoTopupAmount>()([10, 25, 50, 100, 250, 500])
export type Banner = Success<"GET /dashboard/alerts">["banners"][number]

export type WebhookEndpoint = Success<"GET /dashboard/webhooks">["endpoints"][number]
export type CreatedWebhook = Success<"POST /dashboard/webhooks">
export type WebhookEventType = Success<"GET /dashboard/webhooks/event-types">["event_types"][number]
export const WEBHOOK_EVENTS = allOf<WebhookEventType>()([
  "balance.low",
  "topup.succeeded",
  "topup.failed",
  "auto_topup.failed",
  "key.limit_reached",
  "key.expiring",
  "account.suspended",
  "account.reinstated",
  "invoice.issued",
  "e_invoice.validated",
  "e_invoice.rejected"
])

export type BillingProfile = NonNullable<Success<"GET /dashboard/billing/profile">["profile"]>
export type BillingProfileInput = Payload<"PUT /dashboard/billing/profile">
export type IdType = BillingProfileInput["id_type"]
export const ID_TYPES = allOf<IdType>()(["BRN", "NRIC", "PASSPORT", "ARMY"])
export type StateCode = BillingProfileInput["address"]["state_code"]

export type Invoice = Success<"GET /dashboard/billing/invoices">["data"][number]
export type InvoiceType = Invoice["type"]
export const INVOICE_TYPES = allOf<InvoiceType>()(["invoice", "refund_note", "debit_note", "credit_note"])
export type EInvoiceStatus = Invoice["e_invoice"]["status"]

export type GuardrailPolicy = Schemas["GuardrailPolicy"]
export type GuardrailOverride = Schemas["GuardrailOverride"]
export type GuardrailAction = NonNullable<GuardrailPolicy["pii"]>["action"]
export const GUARDRAIL_ACTIONS = allOf<GuardrailAction>()(["off", "flag", "redact", "block"])
export type InjectionAction = NonNullable<GuardrailPolicy["injection"]>["action"]
export const INJECTION_ACTIONS = allOf<InjectionAction>()(["off", "flag", "block"])
export type PiiType = NonNullable<NonNullable<GuardrailPolicy["pii"]>["types"]>[number]
export const PII_TYPES = allOf<PiiType>()(["email", "phone", "mykad", "card", "ip"])
export type GuardrailDirection = NonNullable<GuardrailPolicy["apply_to"]>[number]
export const GUARDRAIL_DIRECTIONS = allOf<GuardrailDirection>()(["input", "output"])
export type GuardrailTestResult = Success<"POST /dashboard/guardrails/test">
export type GuardrailOutcome = NonNullable<Query<"GET /dashboard/logs">["guardrail"]>
export const GUARDRAIL_OUTCOMES = allOf<GuardrailOutcome>()(["blocked", "redacted", "flagged"])

export type ProviderKey = Schemas["ProviderKey"]
export type NewProviderKey = Payload<"POST /dashboard/provider-keys">
export type ProviderKeyMode = ProviderKey["mode"]
export const PROVIDER_KEY_MODES = allOf<ProviderKeyMode>()(["first", "fallback", "only"])
export type ProviderKeyStatus = ProviderKey["status"]

export type AccountSummary = Schemas["AccountSummary"]
export type Member = Success<"GET /dashboard/members">["members"][number]
export type Invitation = Success<"GET /dashboard/members/invitations">["invitations"][number]
export type RemovedMember = Success<"DELETE /dashboard/members/{id}">

export type AuditEntry = Success<"GET /dashboard/audit-log">["entries"][number]
export type AuditAction = AuditEntry["action"]
export const AUDIT_ACTIONS = allOf<AuditAction>()([
  "api_key.created",
  "api_key.updated",
  "api_key.rotated",
  "api_key.deleted",
  "member.invited",
  "member.invitation_revoked",
  "member.joined",
  "member.updated",
  "member.removed",
  "billing.settings_updated",
  "billing.card_setup_started",
  "billing.card_saved",
  "billing.card_removed",
  "webhook.created",
  "webhook.updated",
  "webhook.deleted",
  "webhook.secret_rotated",
  "webhook.disabled",
  "webhook.test_sent",
  "webhook.delivery_resent",
  "billing.checkout_created",
  "usage.grouping_tags_updated",
  "response.deleted",
  "billing.profile_updated",
  "guardrails.updated",
  "billing.e_invoice_resubmitted",
  "provider_key.created",
  "provider_key.updated",
  "provider_key.deleted"
])
