import type { Party } from "../Invoices/Api.js"

/**
 * MyInvois documents in UBL 2.1 JSON (docs/api/e-invoices.md, "The documents"): invoice 01, credit note 02,
 * debit note 03 and refund note 04, all in MyInvois' `Invoice` structure with the type in `InvoiceTypeCode`.
 * Every value is wrapped as UBL's JSON form wants it, `[{"_": value, …attributes}]`. Amounts are MYR with
 * two decimals; dates and times are UTC.
 */

export type TypeCode = "01" | "02" | "03" | "04"

/** MyInvois' general TIN of a buyer who is the general public (consolidated e-invoices). */
export const GENERAL_PUBLIC_TIN = "EI00000000010"
/** The classification of a consolidated e-invoice's lines. */
export const CONSOLIDATED_CLASSIFICATION = "004"
/** MyInvois' tax type of service tax, and of no tax charged ("not applicable"). */
const SERVICE_TAX = "02"
const NO_TAX = "06"

export interface UblLine {
  readonly description: string
  readonly quantity: number
  readonly unitPriceSen: number
  readonly netSen: number
  readonly taxSen: number
  readonly taxRateBps: number
  readonly classificationCode: string
}

/** An e-invoice a note adjusts: its number (MyInvois' internal id) and MyInvois' UUID. */
export interface UblReference {
  readonly number: string
  readonly uuid: string
}

export interface UblInput {
  /** The document's number, MyInvois' `codeNumber` and UBL's `ID` (at most 50 characters). */
  readonly number: string
  readonly typeCode: TypeCode
  readonly issuedAt: Date
  readonly supplier: Party
  /** The buyer as the document names it; "general public" for a consolidated e-invoice. */
  readonly buyer: Party | "general public"
  readonly lines: ReadonlyArray<UblLine>
  /** What a note adjusts; empty for an invoice. */
  readonly references: ReadonlyArray<UblReference>
  /** A consolidated e-invoice's month, as its billing period. */
  readonly period?: { readonly start: string; readonly end: string } | undefined
  readonly paymentReference: string | null
  /** "1.0" unsigned, "1.1" signed (`Signing.ts` adds the signature to what this builds). */
  readonly version: "1.0" | "1.1"
}

type Value = string | number
const v = (value: Value, attributes: Record<string, string> = {}) => [{ _: value, ...attributes }]
const myr = (sen: number) => v(Math.round(sen) / 100, { currencyID: "MYR" })
const NA = "NA"

/** `2026-11-30` and `16:05:09Z`: MyInvois reads issue dates and times in UTC. */
export const utcDateTime = (at: Date): { readonly date: string; readonly time: string } => {
  const iso = at.toISOString()
  return { date: iso.slice(0, 10), time: `${iso.slice(11, 19)}Z` }
}

const identification = (id: string, scheme: string) => ({ ID: v(id, { schemeID: scheme }) })

const address = (party: Party) => {
  const where = party.address
  if (where === null) {
    return [{
      CityName: v(NA),
      PostalZone: v(NA),
      CountrySubentityCode: v("17"),
      AddressLine: [{ Line: v(NA) }],
      Country: [{ IdentificationCode: v("MYS", { listID: "ISO3166-1", listAgencyID: "6" }) }]
    }]
  }
  return [{
    CityName: v(where.city),
    PostalZone: v(where.postcode),
    CountrySubentityCode: v(where.state_code),
    AddressLine: [where.line1, where.line2].filter((line): line is string => line !== null && line !== "")
      .map((line) => ({ Line: v(line) })),
    Country: [{ IdentificationCode: v(where.country_code, { listID: "ISO3166-1", listAgencyID: "6" }) }]
  }]
}

const contact = (party: Party) => [{ Telephone: v(party.phone ?? NA), ElectronicMail: v(party.email ?? NA) }]

const partyOf = (party: Party, role: "supplier" | "buyer") => ({
  ...(role === "supplier"
    ? {
      IndustryClassificationCode: v(party.msic ?? "00000", { name: "Other information technology service activities" })
    }
    : {}),
  PartyIdentification: [
    identification(party.tin ?? GENERAL_PUBLIC_TIN, "TIN"),
    identification(party.id_value ?? NA, party.id_type ?? "BRN"),
    identification(party.sst_number ?? NA, "SST"),
    ...(role === "supplier" ? [identification(NA, "TTX")] : [])
  ],
  PostalAddress: address(party),
  PartyLegalEntity: [{ RegistrationName: v(party.legal_name) }],
  Contact: contact(party)
})

const GENERAL_PUBLIC: Party = {
  legal_name: "General Public",
  tin: GENERAL_PUBLIC_TIN,
  id_type: "BRN",
  id_value: NA,
  sst_number: NA,
  msic: null,
  email: null,
  phone: null,
  address: null
}

const taxCategory = (taxed: boolean) => [{
  ID: v(taxed ? SERVICE_TAX : NO_TAX),
  TaxScheme: [{ ID: v("OTH", { schemeID: "UN/ECE 5153", schemeAgencyID: "6" }) }]
}]

const taxTotal = (netSen: number, taxSen: number, rateBps: number | undefined) => [{
  TaxAmount: myr(taxSen),
  TaxSubtotal: [{
    TaxableAmount: myr(netSen),
    TaxAmount: myr(taxSen),
    ...(rateBps === undefined ? {} : { Percent: v(rateBps / 100) }),
    TaxCategory: taxCategory(taxSen > 0 || (rateBps ?? 0) > 0)
  }]
}]

/** The document as MyInvois reads it, without a signature. */
export const buildDocument = (input: UblInput): Record<string, unknown> => {
  const { date, time } = utcDateTime(input.issuedAt)
  const netSen = input.lines.reduce((sum, line) => sum + line.netSen, 0)
  const taxSen = input.lines.reduce((sum, line) => sum + line.taxSen, 0)
  const buyer = input.buyer === "general public" ? GENERAL_PUBLIC : input.buyer
  const invoice = {
    ID: v(input.number),
    IssueDate: v(date),
    IssueTime: v(time),
    InvoiceTypeCode: v(input.typeCode, { listVersionID: input.version }),
    DocumentCurrencyCode: v("MYR"),
    TaxCurrencyCode: v("MYR"),
    ...(input.period === undefined ? {} : {
      InvoicePeriod: [{
        StartDate: v(input.period.start),
        EndDate: v(input.period.end),
        Description: v("Monthly")
      }]
    }),
    ...(input.references.length === 0 ? {} : {
      BillingReference: input.references.map((reference) => ({
        InvoiceDocumentReference: [{ ID: v(reference.number), UUID: v(reference.uuid) }]
      }))
    }),
    AccountingSupplierParty: [{ Party: [partyOf(input.supplier, "supplier")] }],
    AccountingCustomerParty: [{ Party: [partyOf(buyer, "buyer")] }],
    // Paid by card through Stripe before the document exists: MyInvois' payment mode 04, the payment's
    // reference in the terms (a prepaid amount would make the payable amount 0).
    ...(input.paymentReference === null ? {} : {
      PaymentMeans: [{ PaymentMeansCode: v("04") }],
      PaymentTerms: [{ Note: v(`Paid by card: ${input.paymentReference}`.slice(0, 300)) }]
    }),
    TaxTotal: taxTotal(netSen, taxSen, undefined),
    LegalMonetaryTotal: [{
      LineExtensionAmount: myr(netSen),
      TaxExclusiveAmount: myr(netSen),
      TaxInclusiveAmount: myr(netSen + taxSen),
      PayableAmount: myr(netSen + taxSen)
    }],
    InvoiceLine: input.lines.map((line, index) => ({
      ID: v(String(index + 1)),
      InvoicedQuantity: v(line.quantity, { unitCode: "C62" }),
      LineExtensionAmount: myr(line.netSen),
      TaxTotal: taxTotal(line.netSen, line.taxSen, line.taxRateBps),
      Item: [{
        CommodityClassification: [{ ItemClassificationCode: v(line.classificationCode, { listID: "CLASS" }) }],
        Description: v(line.description)
      }],
      Price: [{ PriceAmount: myr(line.unitPriceSen) }],
      ItemPriceExtension: [{ Amount: myr(line.netSen) }]
    }))
  }
  return {
    _D: "urn:oasis:names:specification:ubl:schema:xsd:Invoice-2",
    _A: "urn:oasis:names:specification:ubl:schema:xsd:CommonAggregateComponents-2",
    _B: "urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2",
    Invoice: [invoice]
  }
}
