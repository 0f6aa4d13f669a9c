import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as HttpApiSchema from "@effect/platform/HttpApiSchema"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import { InvalidRequest, NotFound, wire } from "../Domain/Errors.js"
import { PageParams } from "../Domain/Page.js"
import { allowRoles, EVERY_ROLE, SETTINGS_MAKERS } from "../Domain/Roles.js"
import { Rfc3339DateTime, SqlString, StrictUrlParams } from "../Domain/Strict.js"

/**
 * The buyer's billing profile and the parties a document names (docs/api/invoices.md, "The billing
 * profile"). Every field is checked as MyInvois checks it, with a message that says what is expected.
 */

/** MyInvois' state codes: 01 Johor … 16 Putrajaya, 17 not applicable (outside Malaysia). */
export const STATE_CODES = {
  "01": "Johor",
  "02": "Kedah",
  "03": "Kelantan",
  "04": "Melaka",
  "05": "Negeri Sembilan",
  "06": "Pahang",
  "07": "Pulau Pinang",
  "08": "Perak",
  "09": "Perlis",
  "10": "Selangor",
  "11": "Terengganu",
  "12": "Sabah",
  "13": "Sarawak",
  "14": "Wilayah Persekutuan Kuala Lumpur",
  "15": "Wilayah Persekutuan Labuan",
  "16": "Wilayah Persekutuan Putrajaya",
  "17": "Not Applicable"
} as const
export type StateCode = keyof typeof STATE_CODES

/** An individual's TIN: `IG` and up to 12 digits (14 characters at most). */
const INDIVIDUAL_TIN = /^IG\d{9,12}$/
/** A company's or other body's TIN: its prefix, digits with no leading zero, ending in 0 (`C25845632020`). */
const NON_INDIVIDUAL_TIN = /^(?:C|CS|D|E|F|FA|PT|TA|TC|TN|TR|TP|J|LE)[1-9]\d{7,11}0$/
/** MyInvois' general TIN for a foreign buyer. */
const FOREIGN_BUYER_TIN = "EI00000000020"

export const isTin = (text: string): boolean =>
  text.length <= 14 && (INDIVIDUAL_TIN.test(text) || NON_INDIVIDUAL_TIN.test(text) || text === FOREIGN_BUYER_TIN)

export const ID_TYPES = ["BRN", "NRIC", "PASSPORT", "ARMY"] as const
export type IdType = typeof ID_TYPES[number]

/** What each identification looks like: SSM's 12-digit BRN (or the old form), a 12-digit MyKad, a passport, an army number. */
const ID_FORMS: Record<IdType, { readonly pattern: RegExp; readonly expected: string }> = {
  BRN: { pattern: /^(?:\d{12}|\d{6,7}-[A-Z])$/, expected: "an SSM registration number: 12 digits (201901234567)" },
  NRIC: { pattern: /^\d{12}$/, expected: "a MyKad number: 12 digits without dashes (770625015324)" },
  PASSPORT: { pattern: /^[A-Z0-9]{6,12}$/, expected: "a passport number: 6 to 12 capital letters and digits" },
  ARMY: { pattern: /^[A-Z0-9]{4,12}$/, expected: "an army number: 4 to 12 capital letters and digits" }
}

/** The reason `value` is not an identification of `type`, or undefined when it is. */
export const idValueProblem = (type: IdType, value: string): string | undefined =>
  ID_FORMS[type].pattern.test(value) ? undefined : `must be ${ID_FORMS[type].expected} for id_type ${type}`

/** An SST registration number (`W10-1808-32000001`). */
const SST_NUMBER = /^[A-Z]\d{2}-\d{4}-\d{8}$/
/** E.164 or a Malaysian number as people write it (`012-345 6789`, `03-2161 0000`): 8 to 15 digits. */
const PHONE = /^\+?[0-9][0-9 -]{6,18}[0-9]$/
const EMAIL = /^[^\s@]{1,64}@[^\s@]+\.[^\s@]{2,}$/

const text = (name: string, max: number) =>
  SqlString.pipe(
    Schema.filter((value) => value.trim().length > 0 || `${name} must not be empty`),
    Schema.filter((value) => value.length <= max || `${name} must be at most ${max} characters`)
  )

const pattern = (test: (value: string) => boolean, message: string) =>
  SqlString.pipe(Schema.filter((value) => (value.length <= 320 && test(value)) || message))

export const Address = Schema.Struct({
  line1: text("line1", 150),
  line2: Schema.optionalWith(Schema.NullOr(text("line2", 150)), { default: () => null }),
  city: text("city", 50),
  postcode: pattern((value) => /^[A-Z0-9 -]{3,10}$/.test(value), "must be a postcode of 3 to 10 letters or digits"),
  state_code: Schema.Literal(...(Object.keys(STATE_CODES) as Array<StateCode>)).annotations({
    message: () => ({
      message: "must be a MyInvois state code from 01 (Johor) to 16 (Putrajaya), or 17 outside Malaysia",
      override: true
    })
  }),
  country_code: Schema.optionalWith(
    pattern((value) => /^[A-Z]{3}$/.test(value), "must be an ISO 3166-1 alpha-3 country code such as MYS"),
    { default: () => "MYS" }
  )
}).pipe(
  Schema.filter((address) => {
    if (address.country_code !== "MYS") return true
    if (!/^\d{5}$/.test(address.postcode)) return { path: ["postcode"], message: "must be 5 digits in Malaysia" }
    return address.state_code !== "17" ||
      { path: ["state_code"], message: "must name the state (01 to 16) of an address in Malaysia" }
  })
).annotations({ identifier: "Address" })

const IdType = Schema.Literal(...ID_TYPES).annotations({
  message: () => ({ message: "must be one of BRN, NRIC, PASSPORT or ARMY", override: true })
})

/** What `PUT /dashboard/billing/profile` takes: every field at once (`sst_number` and `address.line2` may be null). */
export const BillingProfileInput = Schema.Struct({
  legal_name: text("legal_name", 300),
  tin: pattern(
    isTin,
    "must be a MyInvois TIN: IG and digits for a person, C… ending in 0 for a company (C25845632020)"
  ),
  id_type: IdType,
  id_value: SqlString.pipe(Schema.maxLength(20)),
  sst_number: Schema.optionalWith(
    Schema.NullOr(pattern((value) => SST_NUMBER.test(value), "must be an SST registration number (W10-1808-32000001)")),
    { default: () => null }
  ),
  email: pattern((value) => EMAIL.test(value), "must be an email address"),
  phone: pattern(
    (value) => PHONE.test(value) && value.replace(/\D/g, "").length >= 8,
    "must be a phone number such as +60123456789 or 012-345 6789"
  ),
  address: Address
}).pipe(
  Schema.filter((profile) => {
    const problem = idValueProblem(profile.id_type, profile.id_value)
    return problem === undefined || { path: ["id_value"], message: problem }
  })
).annotations({
  identifier: "BillingProfileInput",
  // A misspelt field (`sst_numbr`) is named, never dropped: a document would go out without it.
  parseOptions: { onExcessProperty: "error" }
})
export type BillingProfileInput = typeof BillingProfileInput.Type

/** A party as a document keeps it: the operator (with its MSIC code) or the buyer, who may have no profile yet. */
export const Party = Schema.Struct({
  legal_name: Schema.String,
  tin: Schema.NullOr(Schema.String),
  id_type: Schema.NullOr(Schema.Literal(...ID_TYPES)),
  id_value: Schema.NullOr(Schema.String),
  sst_number: Schema.NullOr(Schema.String),
  /** The supplier's Malaysia Standard Industrial Classification code; null for a buyer. */
  msic: Schema.NullOr(Schema.String),
  email: Schema.NullOr(Schema.String),
  phone: Schema.NullOr(Schema.String),
  address: Schema.NullOr(Schema.Struct({
    line1: Schema.String,
    line2: Schema.NullOr(Schema.String),
    city: Schema.String,
    postcode: Schema.String,
    state_code: Schema.String,
    country_code: Schema.String
  }))
}).annotations({ identifier: "Party" })
export type Party = typeof Party.Type

/** The buyer a profile makes. */
export const buyerOf = (profile: BillingProfileInput): Party => ({
  legal_name: profile.legal_name.trim(),
  tin: profile.tin,
  id_type: profile.id_type,
  id_value: profile.id_value,
  sst_number: profile.sst_number,
  msic: null,
  email: profile.email,
  phone: profile.phone,
  address: profile.address
})

/**
 * Tax invoices and the notes that follow them (docs/api/invoices.md, "Invoices and service tax"). Each kind
 * has its MyInvois e-invoice type code and its own gapless numbering per calendar year.
 */
export const DocumentType = Schema.Literal("invoice", "credit_note", "debit_note", "refund_note")
export type DocumentType = typeof DocumentType.Type

export const EInvoiceStatus = Schema.Literal("pending", "submitted", "valid", "invalid", "cancelled")

export const EInvoice = Schema.Struct({
  status: EInvoiceStatus,
  /** MyInvois' document UUID, once submitted. */
  uuid: Schema.NullOr(Schema.String),
  /** The validation link (`MYINVOIS_PORTAL_URL/{uuid}/share/{longId}`), once valid. */
  validation_url: Schema.NullOr(Schema.String),
  validated_at: Schema.NullOr(Schema.String),
  /** MyInvois' reasons, while invalid. */
  errors: Schema.Array(
    Schema.Struct({ code: Schema.String, message: Schema.String, target: Schema.NullOr(Schema.String) })
  ),
  /** `single`: its own e-invoice (a buyer with a TIN, or above RM 10,000); `consolidated`: in its month's. */
  route: Schema.Literal("single", "consolidated"),
  /** The e-invoice's number: the document's own, or the consolidated e-invoice's (`CON-INV-2026-11-001`). */
  number: Schema.NullOr(Schema.String),
  /** True when it is not valid 24 hours after its e-invoice's issue (or, consolidated, after its month's deadline). */
  overdue: Schema.Boolean
}).annotations({ identifier: "EInvoice" })

export const DocumentSummary = Schema.Struct({
  id: Schema.String,
  /** `INV-2026-000001`, `RN-…`, `DN-…`, `CN-…`: gapless per type and year. */
  number: Schema.String,
  type: DocumentType,
  /** MyInvois' e-invoice type: 01 invoice, 02 credit note, 03 debit note, 04 refund note. */
  type_code: Schema.Literal("01", "02", "03", "04"),
  issued_at: Schema.String,
  currency: Schema.Literal("MYR"),
  net_myr: Schema.Number,
  tax_myr: Schema.Number,
  total_myr: Schema.Number,
  e_invoice: EInvoice
}).annotations({ identifier: "InvoiceSummary" })
export type DocumentSummary = typeof DocumentSummary.Type

export const DocumentLine = Schema.Struct({
  description: Schema.String,
  quantity: Schema.Int,
  unit_price_myr: Schema.Number,
  /** Service tax rate in basis points (800 = 8%). */
  tax_rate_bps: Schema.Int,
  tax_myr: Schema.Number,
  /** Net: quantity × unit price. */
  subtotal_myr: Schema.Number,
  total_myr: Schema.Number,
  /** MyInvois' classification code of the service (022: others). */
  classification_code: Schema.String
}).annotations({ identifier: "InvoiceLine" })
export type DocumentLine = typeof DocumentLine.Type

export const DocumentDetail = Schema.Struct({
  ...DocumentSummary.fields,
  /** The operator and the account as they were at issue: a later profile change never rewrites them. */
  supplier: Party,
  buyer: Party,
  lines: Schema.Array(DocumentLine),
  tax_rate_bps: Schema.Int,
  /** Stripe's payment intent (or checkout session) the money moved by. */
  payment_reference: Schema.NullOr(Schema.String),
  transaction_id: Schema.NullOr(Schema.String),
  /** The invoice a note adjusts. */
  references: Schema.NullOr(Schema.Struct({ id: Schema.String, number: Schema.String }))
}).annotations({ identifier: "InvoiceDetail" })
export type DocumentDetail = typeof DocumentDetail.Type

export const InvoicesParams = StrictUrlParams({
  ...PageParams.fields,
  type: Schema.optional(DocumentType),
  from: Schema.optional(Rfc3339DateTime),
  to: Schema.optional(Rfc3339DateTime)
})

export const InvoicesPage = Schema.Struct({
  data: Schema.Array(DocumentSummary),
  page: Schema.Int,
  limit: Schema.Int
})

export const BillingProfileView = Schema.Struct({
  /** Null until an owner, admin or billing member sets it; documents then name the account only. */
  profile: Schema.NullOr(Schema.Struct({ ...Party.fields, updated_at: Schema.String }))
}).annotations({ identifier: "BillingProfileView" })

const Id = HttpApiSchema.param("id", SqlString.pipe(Schema.maxLength(64)))

export const Pdf = HttpApiSchema.Uint8Array({ contentType: "application/pdf" })

export class InvoicesApi extends HttpApiGroup.make("invoices")
  .add(
    HttpApiEndpoint.get("profile", "/dashboard/billing/profile").addSuccess(BillingProfileView)
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.put("updateProfile", "/dashboard/billing/profile")
      .setPayload(BillingProfileInput)
      .addSuccess(BillingProfileView)
      .annotate(
        OpenApi.Description,
        "Sets the buyer's details that invoices issued from now on carry (every field at once). " +
          "Documents already issued keep what they were issued with."
      )
      .pipe(allowRoles(...SETTINGS_MAKERS))
  )
  .add(
    HttpApiEndpoint.get("list", "/dashboard/billing/invoices").setUrlParams(InvoicesParams).addSuccess(InvoicesPage)
      .annotate(OpenApi.Description, "Invoices, refund notes, debit notes and credit notes, newest first.")
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.get("get")`/dashboard/billing/invoices/${Id}`.addSuccess(DocumentDetail)
      .addError(wire(NotFound))
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.get("pdf")`/dashboard/billing/invoices/${Id}/pdf`.addSuccess(Pdf)
      .addError(wire(NotFound))
      .annotate(OpenApi.Description, "The document as an A4 PDF.")
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.post("resubmit")`/dashboard/billing/invoices/${Id}/resubmit`.addSuccess(DocumentDetail)
      .addError(wire(NotFound))
      .annotate(
        OpenApi.Description,
        "Submits a new e-invoice of the same number for a document MyInvois found invalid, with the buyer's " +
          "current billing profile, issued now. The document and its PDF keep what they were issued with."
      )
      .pipe(allowRoles(...SETTINGS_MAKERS))
  )
  .addError(wire(InvalidRequest))
  .middleware(DashboardAuth)
  .annotate(OpenApi.Description, "Tax invoices and notes for top-ups, and the buyer's billing profile.")
{}

export const ConsolidateRequest = Schema.Struct({
  /** `YYYY-MM` in `BUSINESS_TIMEZONE`; the current month closes early here (development only). */
  month: SqlString.pipe(Schema.maxLength(7))
}).annotations({ parseOptions: { onExcessProperty: "error" } })

export const ConsolidationView = Schema.Struct({
  month: Schema.String,
  /** True when the month had not ended: documents issued later go into a supplementary consolidated e-invoice. */
  early: Schema.Boolean,
  /** The consolidated e-invoices this run made (none when the month was consolidated already). */
  e_invoices: Schema.Array(Schema.Struct({
    id: Schema.String,
    number: Schema.String,
    type_code: Schema.Literal("01", "02", "03", "04"),
    documents: Schema.Int,
    lines: Schema.Int
  }))
})

/** Development only: consolidates a month's e-invoices now, as the scheduler does after the month ends. */
export class DevEInvoicesApi extends HttpApiGroup.make("devEInvoices")
  .add(
    HttpApiEndpoint.post("consolidate", "/dev/e-invoices/consolidate")
      .setPayload(ConsolidateRequest)
      .addSuccess(ConsolidationView)
      .annotate(
        OpenApi.Description,
        "Consolidates the month's documents that have no e-invoice of their own, idempotently; the current " +
          "month is closed early."
      )
  )
  .addError(wire(InvalidRequest))
  .annotate(OpenApi.Description, "Development only: e-invoice consolidation on demand.")
{}
