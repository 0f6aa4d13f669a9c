import { createHash } from "node:crypto"

/**
 * What MyInvois checks in one UBL 2.1 JSON document (types 01-04, versions 1.0 and 1.1), as its SDK describes the
 * checks: "Document validation rules", the document type pages ("Invoice v1.1"), "Mathematical Mappings", "Signing a
 * JSON document" and the FAQ. Where the SDK names no error code, the codes here are the simulated MyInvois' own
 * (docs/api/e-invoices.md, "How submission works"). Pure: the document in, its errors out.
 */

/** One error as MyInvois reports it in a validation step (SDK, "Standard Error Response", "Error"). */
export interface ValidationError {
  readonly propertyName: string | null
  readonly propertyPath: string | null
  readonly errorCode: string
  readonly error: string
  readonly errorMS?: string
  readonly innerError?: ReadonlyArray<ValidationError> | null
}

export interface RulesContext {
  /** The TIN of the taxpayer the access token belongs to: every document's supplier. */
  readonly issuerTin: string
  readonly now: Date
}

/**
 * MyInvois' validators in the order of their steps. The SDK's error example names the third one
 * "Step03-Duplicated Submission Validator"; the other names are those of "Document validation rules".
 */
export const VALIDATORS = [
  "Structure",
  "Core Fields",
  "Duplicated Submission",
  "Signature",
  "Taxpayer",
  "Referenced Documents",
  "Code",
  "Currency"
] as const
export type Validator = typeof VALIDATORS[number]

/**
 * Every error code, its validator, and whether MyInvois refuses the document at submission already. The FAQ says
 * submission refuses an issuance time in the future or older than 72 hours and a supplier TIN that is not the
 * caller's; the Structure Validator runs then too. The DS codes are MyInvois' signature codes.
 */
export const RULES = {
  NotUblJson: { validator: "Structure", atSubmission: true },
  NotWrapped: { validator: "Structure", atSubmission: true },
  MissingField: { validator: "Core Fields", atSubmission: false },
  InvalidValue: { validator: "Core Fields", atSubmission: false },
  IssuedInFuture: { validator: "Core Fields", atSubmission: true },
  IssuedTooLongAgo: { validator: "Core Fields", atSubmission: true },
  TotalsMismatch: { validator: "Core Fields", atSubmission: false },
  MissingBillingReference: { validator: "Core Fields", atSubmission: false },
  DS302: { validator: "Duplicated Submission", atSubmission: false },
  DS301: { validator: "Signature", atSubmission: false },
  DS321: { validator: "Signature", atSubmission: false },
  DS322: { validator: "Signature", atSubmission: false },
  InvalidTin: { validator: "Taxpayer", atSubmission: false },
  IssuerTinMismatch: { validator: "Taxpayer", atSubmission: true },
  UnregisteredTin: { validator: "Taxpayer", atSubmission: false },
  ReferencedDocumentNotValid: { validator: "Referenced Documents", atSubmission: false },
  InvalidCode: { validator: "Code", atSubmission: false }
} as const satisfies Record<string, { readonly validator: Validator; readonly atSubmission: boolean }>
export type RuleCode = keyof typeof RULES

export const validatorOf = (error: ValidationError): Validator =>
  (RULES as Record<string, { readonly validator: Validator }>)[error.errorCode]?.validator ?? "Core Fields"

export const checkedAtSubmission = (error: ValidationError): boolean =>
  (RULES as Record<string, { readonly atSubmission: boolean }>)[error.errorCode]?.atSubmission ?? false

/** The general TINs of LHDN's e-Invoice Specific Guideline, Appendix 1. */
export const GENERAL_TINS = {
  generalPublic: "EI00000000010",
  foreignBuyer: "EI00000000020",
  foreignSupplier: "EI00000000030",
  government: "EI00000000040"
} as const

/** An individual's TIN: `IG` and 9 to 12 digits. */
const INDIVIDUAL_TIN = /^IG\d{9,12}$/
/** Any other taxpayer's: its prefix (C company, CS cooperative, D partnership, ...), then digits ending in 0. */
const NON_INDIVIDUAL_TIN = /^(?:C|CS|D|E|F|FA|PT|TA|TC|TN|TR|TP|TJ|J|LE)[1-9]\d{7,11}0$/

/** A TIN as LHDN writes one (at most 14 characters; the SDK gives no pattern, so these are LHDN's prefixes). */
export const isTinFormat = (tin: string): boolean =>
  tin.length <= 14 && (INDIVIDUAL_TIN.test(tin) || NON_INDIVIDUAL_TIN.test(tin))

const BUYER_GENERAL_TINS: ReadonlyArray<string> = [
  GENERAL_TINS.generalPublic,
  GENERAL_TINS.foreignBuyer,
  GENERAL_TINS.government
]

const NAMESPACES = {
  _D: "urn:oasis:names:specification:ubl:schema:xsd:Invoice-2",
  _A: "urn:oasis:names:specification:ubl:schema:xsd:CommonAggregateComponents-2",
  _B: "urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2"
} as const

const TYPE_CODES = ["01", "02", "03", "04"] as const
const VERSIONS = ["1.0", "1.1"] as const
/** Tax types (SDK, "Tax Types"): sales, service, tourism, high-value goods, low-value goods, not applicable, exempt. */
const TAX_TYPES = ["01", "02", "03", "04", "05", "06", "E"]
/** Classification 004 is "Consolidated e-Invoice" (SDK, "Classification Codes"). */
const CONSOLIDATED_CLASSIFICATION = "004"
/** Issuance times this far ahead of MyInvois' clock are taken as clock drift, not the future. */
const CLOCK_SKEW_MS = 60_000
/** An issuance older than this before submission is refused (FAQ, "too old and cannot be submitted"). */
const MAX_AGE_MS = 72 * 60 * 60 * 1000

/** MyInvois' `documentHash`: the SHA-256 of the document's UTF-8 bytes, hex (SDK, "Submit Documents"). */
export const hashOf = (documentText: string): string => createHash("sha256").update(documentText, "utf8").digest("hex")

/**
 * The `DocDigest` of a version 1.1 document (SDK, "Signing a JSON document", steps 1 and 2): the document without
 * `UBLExtensions` and `Signature`, minified, its SHA-256 in base64.
 */
export const docDigestOf = (document: unknown): string => {
  const root = document as Record<string, unknown>
  const invoices = Array.isArray(root["Invoice"]) ? root["Invoice"] as ReadonlyArray<unknown> : []
  const stripped = invoices.map((invoice) => {
    if (!isObject(invoice)) return invoice
    const { Signature: _signature, UBLExtensions: _extensions, ...rest } = invoice
    return rest
  })
  return createHash("sha256").update(JSON.stringify({ ...root, Invoice: stripped }), "utf8").digest("base64")
}

type Node = Record<string, unknown>

const isObject = (value: unknown): value is Node => typeof value === "object" && value !== null && !Array.isArray(value)

const fail = (code: RuleCode, path: string, error: string): ValidationError => ({
  propertyName: path.split(".").pop()?.replace(/\[.*\]$/, "") ?? null,
  propertyPath: path,
  errorCode: code,
  error
})

/** A field one step down: the first element of its array, if it is one. */
const child = (node: Node | undefined, name: string): Node | undefined => {
  const value = node?.[name]
  return Array.isArray(value) && isObject(value[0]) ? value[0] : undefined
}

const children = (node: Node | undefined, name: string): ReadonlyArray<Node> => {
  const value = node?.[name]
  return Array.isArray(value) ? value.filter(isObject) : []
}

const descend = (node: Node | undefined, names: ReadonlyArray<string>): Node | undefined =>
  names.reduce<Node | undefined>((at, name) => child(at, name), node)

type Leaf =
  | { readonly kind: "missing" }
  | { readonly kind: "unwrapped" }
  | { readonly kind: "present"; readonly value: unknown; readonly attributes: Node }

/** A basic field's `[{"_": value, ...attributes}]`. */
const leafOf = (node: Node | undefined, name: string): Leaf => {
  const value = node?.[name]
  if (value === undefined) return { kind: "missing" }
  if (!Array.isArray(value) || !isObject(value[0]) || !("_" in value[0])) return { kind: "unwrapped" }
  const { _: inner, ...attributes } = value[0]
  return { kind: "present", value: inner, attributes }
}

/** Reads basic fields under one aggregate, collecting what is missing, unwrapped or mistyped. */
class Reader {
  readonly errors: Array<ValidationError> = []

  text(node: Node | undefined, path: string, name: string, options: { readonly empty?: boolean } = {}) {
    if (node === undefined) return undefined
    const leaf = this.leaf(node, path, name)
    if (leaf === undefined) return undefined
    if (typeof leaf.value !== "string" || (!options.empty && leaf.value.trim() === "")) {
      this.errors.push(fail("MissingField", `${path}.${name}`, `${name} must be a non-empty text`))
      return undefined
    }
    return leaf.value
  }

  amount(node: Node | undefined, path: string, name: string, options: { readonly optional?: boolean } = {}) {
    if (node === undefined || (options.optional && node[name] === undefined)) return undefined
    const leaf = this.leaf(node, path, name)
    if (leaf === undefined) return undefined
    if (typeof leaf.value !== "number" || !Number.isFinite(leaf.value)) {
      this.errors.push(
        fail("InvalidValue", `${path}.${name}`, `${name} must be a number, not ${JSON.stringify(leaf.value)}`)
      )
      return undefined
    }
    return Math.round(leaf.value * 100)
  }

  attribute(node: Node | undefined, path: string, name: string, attribute: string) {
    const leaf = leafOf(node, name)
    if (leaf.kind !== "present") return undefined
    const value = leaf.attributes[attribute]
    if (typeof value !== "string" || value === "") {
      this.errors.push(fail("MissingField", `${path}.${name}.${attribute}`, `${name} needs its ${attribute} attribute`))
      return undefined
    }
    return value
  }

  /** A required aggregate; nothing more is said of the fields of one already reported missing. */
  aggregate(node: Node | undefined, path: string, name: string): Node | undefined {
    if (node === undefined) return undefined
    const found = child(node, name)
    if (found === undefined) {
      this.errors.push(
        fail(node[name] === undefined ? "MissingField" : "NotWrapped", `${path}.${name}`, `${name} is required`)
      )
    }
    return found
  }

  private leaf(node: Node | undefined, path: string, name: string) {
    const leaf = leafOf(node, name)
    if (leaf.kind === "missing") {
      this.errors.push(fail("MissingField", `${path}.${name}`, `${name} is required`))
      return undefined
    }
    if (leaf.kind === "unwrapped") {
      this.errors.push(fail("NotWrapped", `${path}.${name}`, `${name} must be written as [{"_": value}]`))
      return undefined
    }
    return leaf
  }
}

/** The root: the three namespace keys and `Invoice` holding one aggregate. */
const structureErrors = (document: unknown): ReadonlyArray<ValidationError> => {
  if (!isObject(document)) return [fail("NotUblJson", "$", "The document must be a UBL 2.1 JSON object")]
  const errors: Array<ValidationError> = []
  for (const [key, namespace] of Object.entries(NAMESPACES)) {
    if (document[key] !== namespace) errors.push(fail("NotUblJson", `$.${key}`, `${key} must be "${namespace}"`))
  }
  const invoice = document["Invoice"]
  if (!Array.isArray(invoice) || invoice.length !== 1 || !isObject(invoice[0])) {
    errors.push(fail("NotUblJson", "$.Invoice", "Invoice must be an array holding one Invoice aggregate"))
  } else {
    errors.push(...unwrappedValues(invoice[0], "$.Invoice[0]"))
  }
  return errors
}

/** UBL JSON: under an aggregate every field is an array of objects; only attributes are bare text. */
const unwrappedValues = (node: Node, path: string): ReadonlyArray<ValidationError> =>
  Object.entries(node).flatMap(([key, value]) => {
    if (key === "_") return []
    if (typeof value === "string") return []
    if (!Array.isArray(value) || value.some((item) => !isObject(item))) {
      return [fail("NotWrapped", `${path}.${key}`, `${key} must be written as [{"_": value}] or [{...}]`)]
    }
    return value.flatMap((item, index) => unwrappedValues(item as Node, `${path}.${key}[${index}]`))
  })

interface Heading {
  readonly typeCode: string | undefined
  readonly version: string | undefined
  readonly issuedAt: Date | undefined
}

const headingErrors = (read: Reader, invoice: Node, context: RulesContext): Heading => {
  const at = "$.Invoice[0]"
  read.text(invoice, at, "ID")
  const typeCode = read.text(invoice, at, "InvoiceTypeCode")
  if (typeCode !== undefined && !(TYPE_CODES as ReadonlyArray<string>).includes(typeCode)) {
    read.errors.push(
      fail("InvalidValue", `${at}.InvoiceTypeCode`, `InvoiceTypeCode ${typeCode} is not 01, 02, 03 or 04`)
    )
  }
  const version = read.attribute(invoice, at, "InvoiceTypeCode", "listVersionID")
  if (version !== undefined && !(VERSIONS as ReadonlyArray<string>).includes(version)) {
    read.errors.push(
      fail("InvalidValue", `${at}.InvoiceTypeCode.listVersionID`, `Version ${version} is not 1.0 or 1.1`)
    )
  }
  const currency = read.text(invoice, at, "DocumentCurrencyCode")
  if (currency !== undefined && !/^[A-Z]{3}$/.test(currency)) {
    read.errors.push(fail("InvalidCode", `${at}.DocumentCurrencyCode`, `${currency} is not an ISO 4217 currency code`))
  }
  const date = read.text(invoice, at, "IssueDate")
  const time = read.text(invoice, at, "IssueTime")
  if (date === undefined || time === undefined) return { typeCode, version, issuedAt: undefined }
  const issuedAt = /^\d{4}-\d{2}-\d{2}$/.test(date) && /^\d{2}:\d{2}:\d{2}Z$/.test(time)
    ? new Date(`${date}T${time}`)
    : undefined
  if (issuedAt === undefined || Number.isNaN(issuedAt.getTime())) {
    read.errors.push(
      fail(
        "InvalidValue",
        `${at}.IssueDate`,
        `Issuance ${date} ${time} is not a UTC date (YYYY-MM-DD) and time (HH:MM:SSZ)`
      )
    )
    return { typeCode, version, issuedAt: undefined }
  }
  if (issuedAt.getTime() > context.now.getTime() + CLOCK_SKEW_MS) {
    read.errors.push(fail("IssuedInFuture", `${at}.IssueDate`, "Document issuance date and time is in the future"))
  } else if (issuedAt.getTime() < context.now.getTime() - MAX_AGE_MS) {
    read.errors.push(
      fail(
        "IssuedTooLongAgo",
        `${at}.IssueDate`,
        "Issuance date time value of the document is too old and cannot be submitted"
      )
    )
  }
  return { typeCode, version, issuedAt }
}

/** The value of `PartyIdentification/ID[@schemeID=scheme]`. */
const identificationOf = (party: Node | undefined, scheme: string): string | undefined => {
  for (const identification of children(party, "PartyIdentification")) {
    const id = leafOf(identification, "ID")
    if (id.kind === "present" && id.attributes["schemeID"] === scheme && typeof id.value === "string") return id.value
  }
  return undefined
}

const ID_SCHEMES = ["BRN", "NRIC", "PASSPORT", "ARMY"]

const addressErrors = (read: Reader, party: Node, at: string) => {
  const address = read.aggregate(party, at, "PostalAddress")
  if (address === undefined) return
  const where = `${at}.PostalAddress[0]`
  read.text(address, where, "CityName")
  read.text(read.aggregate(address, where, "AddressLine"), `${where}.AddressLine[0]`, "Line")
  const country = read.text(read.aggregate(address, where, "Country"), `${where}.Country[0]`, "IdentificationCode")
  const state = read.text(address, where, "CountrySubentityCode")
  if (country === "MYS" && state !== undefined && !/^(0[1-9]|1[0-7])$/.test(state)) {
    read.errors.push(
      fail("InvalidCode", `${where}.CountrySubentityCode`, `${state} is not a Malaysian state code (01-17)`)
    )
  }
}

/** A party's name, TIN (format), identification, address and telephone; the TIN it names. */
const partyErrors = (
  read: Reader,
  invoice: Node,
  role: "AccountingSupplierParty" | "AccountingCustomerParty"
): string | undefined => {
  const at = `$.Invoice[0].${role}[0].Party[0]`
  const party = read.aggregate(read.aggregate(invoice, "$.Invoice[0]", role), `$.Invoice[0].${role}[0]`, "Party")
  if (party === undefined) return undefined
  read.text(read.aggregate(party, at, "PartyLegalEntity"), `${at}.PartyLegalEntity[0]`, "RegistrationName")
  const tin = identificationOf(party, "TIN")
  const tinPath = `${at}.PartyIdentification.ID[@schemeID='TIN']`
  if (tin === undefined) {
    read.errors.push(
      fail("MissingField", tinPath, "The party's TIN (PartyIdentification ID with schemeID TIN) is required")
    )
    return undefined
  }
  const general = role === "AccountingCustomerParty" && BUYER_GENERAL_TINS.includes(tin)
  if (!general && !isTinFormat(tin)) {
    read.errors.push(fail("InvalidTin", tinPath, `${tin} is not a TIN LHDN issues`))
  }
  if (!general && !ID_SCHEMES.some((scheme) => identificationOf(party, scheme) !== undefined)) {
    read.errors.push(
      fail("MissingField", `${at}.PartyIdentification`, "The party's BRN, NRIC, PASSPORT or ARMY number is required")
    )
  }
  if (role === "AccountingSupplierParty") {
    const msic = read.text(party, at, "IndustryClassificationCode")
    read.attribute(party, at, "IndustryClassificationCode", "name")
    if (msic !== undefined && !/^\d{5}$/.test(msic)) {
      read.errors.push(fail("InvalidCode", `${at}.IndustryClassificationCode`, `${msic} is not a 5-digit MSIC code`))
    }
  }
  // The buyer of a consolidated e-invoice, or one without a TIN, is given as "NA" (Specific Guideline, Appendix 2).
  if (general) return tin
  addressErrors(read, party, at)
  read.text(read.aggregate(party, at, "Contact"), `${at}.Contact[0]`, "Telephone")
  return tin
}

/** A `TaxTotal`: its amount, and that of each subtotal with its tax type (scheme OTH). Amounts in sen. */
const taxTotalOf = (read: Reader, owner: Node, at: string) => {
  const total = read.aggregate(owner, at, "TaxTotal")
  if (total === undefined) return undefined
  const where = `${at}.TaxTotal[0]`
  const amount = read.amount(total, where, "TaxAmount")
  const subtotals = children(total, "TaxSubtotal")
  if (subtotals.length === 0) {
    read.errors.push(fail("MissingField", `${where}.TaxSubtotal`, "At least one TaxSubtotal is required"))
  }
  let sum = 0
  subtotals.forEach((subtotal, index) => {
    const sub = `${where}.TaxSubtotal[${index}]`
    sum += read.amount(subtotal, sub, "TaxAmount") ?? 0
    const category = read.aggregate(subtotal, sub, "TaxCategory")
    const taxType = read.text(category, `${sub}.TaxCategory[0]`, "ID")
    if (taxType !== undefined && !TAX_TYPES.includes(taxType)) {
      read.errors.push(fail("InvalidCode", `${sub}.TaxCategory[0].ID`, `${taxType} is not a tax type (01-06, E)`))
    }
    const scheme = read.text(
      read.aggregate(category, `${sub}.TaxCategory[0]`, "TaxScheme"),
      `${sub}.TaxCategory[0].TaxScheme[0]`,
      "ID"
    )
    if (scheme !== undefined && scheme !== "OTH") {
      read.errors.push(
        fail("InvalidValue", `${sub}.TaxCategory[0].TaxScheme[0].ID`, `The tax scheme must be OTH, not ${scheme}`)
      )
    }
  })
  return { amount, subtotalSum: sum, path: where }
}

interface LineSums {
  readonly net: number
  readonly tax: number
  readonly classifications: ReadonlyArray<string>
}

const lineErrors = (read: Reader, invoice: Node): LineSums => {
  const lines = children(invoice, "InvoiceLine")
  if (lines.length === 0) {
    read.errors.push(fail("MissingField", "$.Invoice[0].InvoiceLine", "At least one InvoiceLine is required"))
  }
  let net = 0
  let tax = 0
  const classifications: Array<string> = []
  lines.forEach((line, index) => {
    const at = `$.Invoice[0].InvoiceLine[${index}]`
    read.text(line, at, "ID")
    net += read.amount(line, at, "LineExtensionAmount") ?? 0
    tax += taxTotalOf(read, line, at)?.amount ?? 0
    const item = read.aggregate(line, at, "Item")
    read.text(item, `${at}.Item[0]`, "Description")
    const classes = children(item, "CommodityClassification").flatMap((classification) => {
      const code = leafOf(classification, "ItemClassificationCode")
      return code.kind === "present" && code.attributes["listID"] === "CLASS" && typeof code.value === "string"
        ? [code.value]
        : []
    })
    if (classes.length === 0) {
      read.errors.push(
        fail(
          "MissingField",
          `${at}.Item[0].CommodityClassification`,
          "An ItemClassificationCode with listID CLASS is required"
        )
      )
    }
    for (const code of classes) {
      if (!/^\d{3}$/.test(code)) {
        read.errors.push(
          fail("InvalidCode", `${at}.Item[0].CommodityClassification`, `${code} is not a classification code`)
        )
      }
    }
    classifications.push(...classes)
    read.amount(read.aggregate(line, at, "Price"), `${at}.Price[0]`, "PriceAmount")
    read.amount(read.aggregate(line, at, "ItemPriceExtension"), `${at}.ItemPriceExtension[0]`, "Amount")
  })
  return { net, tax, classifications }
}

const sen = (amount: number) => (amount / 100).toFixed(2)

/** SDK, "Mathematical Mappings": the totals follow from the lines, to the sen. */
const totalErrors = (read: Reader, invoice: Node, lines: LineSums) => {
  // Without lines (reported already) the totals have nothing to follow from.
  if (children(invoice, "InvoiceLine").length === 0) return
  const at = "$.Invoice[0].LegalMonetaryTotal[0]"
  const tax = taxTotalOf(read, invoice, "$.Invoice[0]")
  const totals = read.aggregate(invoice, "$.Invoice[0]", "LegalMonetaryTotal")
  if (totals === undefined) return
  const mismatch = (field: string, stated: number | undefined, expected: number, how: string) => {
    if (stated !== undefined && stated !== expected) {
      read.errors.push(
        fail("TotalsMismatch", `${at}.${field}`, `${field} is ${sen(stated)} but ${how} is ${sen(expected)}`)
      )
    }
  }
  const net = read.amount(totals, at, "LineExtensionAmount", { optional: true })
  mismatch("LineExtensionAmount", net, lines.net, "the sum of the lines' LineExtensionAmount")
  const allowances = read.amount(totals, at, "AllowanceTotalAmount", { optional: true }) ?? 0
  const charges = read.amount(totals, at, "ChargeTotalAmount", { optional: true }) ?? 0
  const exclusive = read.amount(totals, at, "TaxExclusiveAmount")
  mismatch(
    "TaxExclusiveAmount",
    exclusive,
    lines.net - allowances + charges,
    "the lines' net less allowances plus charges"
  )
  if (tax !== undefined) {
    if (tax.amount !== undefined && tax.amount !== tax.subtotalSum) {
      read.errors.push(
        fail(
          "TotalsMismatch",
          `${tax.path}.TaxAmount`,
          `TaxAmount is ${sen(tax.amount)} but its subtotals sum to ${sen(tax.subtotalSum)}`
        )
      )
    }
    if (tax.amount !== undefined && tax.amount !== lines.tax) {
      read.errors.push(
        fail(
          "TotalsMismatch",
          `${tax.path}.TaxAmount`,
          `TaxAmount is ${sen(tax.amount)} but the lines' tax sums to ${sen(lines.tax)}`
        )
      )
    }
  }
  const inclusive = read.amount(totals, at, "TaxInclusiveAmount")
  if (exclusive !== undefined && tax?.amount !== undefined) {
    mismatch("TaxInclusiveAmount", inclusive, exclusive + tax.amount, "TaxExclusiveAmount plus TaxAmount")
  }
  const prepaid =
    read.amount(child(invoice, "PrepaidPayment"), "$.Invoice[0].PrepaidPayment[0]", "PaidAmount", { optional: true }) ??
      0
  const rounding = read.amount(totals, at, "PayableRoundingAmount", { optional: true }) ?? 0
  const payable = read.amount(totals, at, "PayableAmount")
  if (inclusive !== undefined) {
    mismatch(
      "PayableAmount",
      payable,
      inclusive - prepaid + rounding,
      "TaxInclusiveAmount less PrepaidPayment's PaidAmount plus rounding"
    )
  }
}

/** A note names the e-invoice it adjusts: its internal id and MyInvois UUID (SDK, "Credit Note v1.1"). */
const referenceErrors = (read: Reader, invoice: Node, typeCode: string | undefined) => {
  if (typeCode === undefined || !["02", "03", "04"].includes(typeCode)) return
  const references = children(invoice, "BillingReference").flatMap((reference) =>
    children(reference, "InvoiceDocumentReference")
  )
  const path = "$.Invoice[0].BillingReference[0].InvoiceDocumentReference[0]"
  if (references.length === 0) {
    read.errors.push(
      fail(
        "MissingBillingReference",
        path,
        `A note (type ${typeCode}) must reference the e-invoice it adjusts in BillingReference`
      )
    )
    return
  }
  references.forEach((reference, index) => {
    const at = `$.Invoice[0].BillingReference.InvoiceDocumentReference[${index}]`
    const id = leafOf(reference, "ID")
    const uuid = leafOf(reference, "UUID")
    if (id.kind !== "present" || typeof id.value !== "string" || id.value === "") {
      read.errors.push(
        fail("MissingBillingReference", `${at}.ID`, "The referenced e-invoice's internal ID is required")
      )
    }
    if (uuid.kind !== "present" || typeof uuid.value !== "string" || !/^[A-Z0-9]{26}$/.test(uuid.value)) {
      read.errors.push(
        fail(
          "MissingBillingReference",
          `${at}.UUID`,
          "The referenced e-invoice's 26-character MyInvois UUID is required"
        )
      )
    }
  })
}

/** Version 1.1: the enveloped signature is there and its document digest is that of the document. */
const signatureErrors = (document: unknown, invoice: Node): ReadonlyArray<ValidationError> => {
  const at =
    "$.Invoice[0].UBLExtensions[0].UBLExtension[0].ExtensionContent[0].UBLDocumentSignatures[0].SignatureInformation[0].Signature[0]"
  const signature = descend(invoice, [
    "UBLExtensions",
    "UBLExtension",
    "ExtensionContent",
    "UBLDocumentSignatures",
    "SignatureInformation",
    "Signature"
  ])
  const method = leafOf(child(invoice, "Signature"), "SignatureMethod")
  if (signature === undefined || method.kind !== "present") {
    return [
      fail("DS301", "$.Invoice[0].UBLExtensions", "Signature not found: version 1.1 needs UBLExtensions and Signature")
    ]
  }
  const reference = children(child(signature, "SignedInfo"), "Reference").find((each) => each["URI"] === "")
  const digest = leafOf(reference, "DigestValue")
  const path = `${at}.SignedInfo[0].Reference[@URI='']`
  if (digest.kind !== "present" || typeof digest.value !== "string" || digest.value === "") {
    return [fail("DS321", `${path}.DigestValue`, "Document digest is missing or empty")]
  }
  const expected = docDigestOf(document)
  return digest.value === expected ? [] : [
    fail(
      "DS322",
      `${path}.DigestValue`,
      `Document digest value ${digest.value} doesn't match digest calculated value ${expected} from existing document content`
    )
  ]
}

/** The checks that need the whole document read: the supplier, consolidation and the signature. */
const crossErrors = (
  read: Reader,
  document: unknown,
  invoice: Node,
  facts: {
    readonly heading: Heading
    readonly supplierTin?: string | undefined
    readonly buyerTin?: string | undefined
    readonly lines: LineSums
  },
  context: RulesContext
) => {
  if (facts.supplierTin !== undefined && facts.supplierTin !== context.issuerTin) {
    read.errors.push(fail(
      "IssuerTinMismatch",
      "$.Invoice[0].AccountingSupplierParty[0].Party[0].PartyIdentification.ID[@schemeID='TIN']",
      `The authenticated TIN and documents TIN is not matching: ${facts.supplierTin} is not ${context.issuerTin}`
    ))
  }
  if (
    facts.lines.classifications.includes(CONSOLIDATED_CLASSIFICATION) && facts.buyerTin !== undefined &&
    facts.buyerTin !== GENERAL_TINS.generalPublic
  ) {
    read.errors.push(fail(
      "InvalidValue",
      "$.Invoice[0].AccountingCustomerParty[0].Party[0].PartyIdentification.ID[@schemeID='TIN']",
      `A consolidated e-invoice (classification 004) is issued to the general public, ${GENERAL_TINS.generalPublic}, not ${facts.buyerTin}`
    ))
  }
  if (facts.heading.version === "1.1") read.errors.push(...signatureErrors(document, invoice))
}

/** Every error MyInvois would report for this document, the Structure Validator's alone when its shape is wrong. */
export const checkDocument = (document: unknown, context: RulesContext): ReadonlyArray<ValidationError> => {
  const structure = structureErrors(document)
  if (structure.length > 0) return structure
  const invoice = (document as { readonly Invoice: ReadonlyArray<Node> }).Invoice[0]!
  const read = new Reader()
  const heading = headingErrors(read, invoice, context)
  const supplierTin = partyErrors(read, invoice, "AccountingSupplierParty")
  const buyerTin = partyErrors(read, invoice, "AccountingCustomerParty")
  const lines = lineErrors(read, invoice)
  totalErrors(read, invoice, lines)
  referenceErrors(read, invoice, heading.typeCode)
  crossErrors(read, document, invoice, { heading, supplierTin, buyerTin, lines }, context)
  return read.errors
}
