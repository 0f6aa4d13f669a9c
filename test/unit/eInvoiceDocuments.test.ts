import { Effect } from "effect"
import { createHash, createVerify, X509Certificate } from "node:crypto"
import { describe, expect, it } from "vitest"
import { SANDBOX_SUPPLIER } from "../../src/AppConfig.js"
import { checkDocument } from "../../src/EInvoicing/Rules.js"
import { makeSigner, transformed } from "../../src/EInvoicing/Signing.js"
import { buildDocument, GENERAL_PUBLIC_TIN, type UblInput } from "../../src/EInvoicing/Ubl.js"
import type { Party } from "../../src/Invoices/Api.js"
import { consolidatedNumber, lineOf, LINES_PER_PART, partsOf, runsOf } from "../../src/Invoices/Consolidation.js"
import type { Covered } from "../../src/Invoices/EInvoiceRepo.js"
import { certificate } from "../support/Certificates.js"

/** The e-invoice documents (docs/api/e-invoices.md, "The documents", "Signed documents", "Consolidated e-invoices"). */

const BUYER: Party = {
  legal_name: "Contoh Teknologi Sdn. Bhd.",
  tin: "C1234567890",
  id_type: "BRN",
  id_value: "201901234567",
  sst_number: null,
  msic: null,
  email: "finance@example.my",
  phone: "+60312345678",
  address: {
    line1: "Level 5",
    line2: null,
    city: "Kuala Lumpur",
    postcode: "50450",
    state_code: "14",
    country_code: "MYS"
  }
}

const input = (overrides: Partial<UblInput> = {}): UblInput => ({
  number: "INV-2026-000001",
  typeCode: "01",
  issuedAt: new Date("2026-12-02T06:05:09.123Z"),
  supplier: SANDBOX_SUPPLIER,
  buyer: BUYER,
  lines: [{
    description: "Prepaid credit top-up",
    quantity: 1,
    unitPriceSen: 1000,
    netSen: 1000,
    taxSen: 80,
    taxRateBps: 800,
    classificationCode: "022"
  }],
  references: [],
  paymentReference: "pi_123",
  version: "1.0",
  ...overrides
})

type Wrapped = ReadonlyArray<{ readonly _: string | number } & Record<string, unknown>>
const invoiceOf = (document: Record<string, unknown>) => (document["Invoice"] as Array<Record<string, unknown>>)[0]!
const valueOf = (field: unknown): string | number | undefined => (field as Wrapped | undefined)?.[0]?._
const at = (node: unknown, ...path: ReadonlyArray<string>): unknown =>
  path.reduce<unknown>((current, key) => (current as Array<Record<string, unknown>> | undefined)?.[0]?.[key], node)

describe("UBL 2.1 JSON documents", () => {
  it("an invoice: number, UTC issue time, type 01 of its version, both parties' TINs, the totals to the sen", () => {
    const document = buildDocument(input())
    expect(document["_D"]).toBe("urn:oasis:names:specification:ubl:schema:xsd:Invoice-2")
    const invoice = invoiceOf(document)
    expect(valueOf(invoice["ID"])).toBe("INV-2026-000001")
    expect(valueOf(invoice["IssueDate"])).toBe("2026-12-02")
    expect(valueOf(invoice["IssueTime"])).toBe("06:05:09Z")
    expect(invoice["InvoiceTypeCode"]).toEqual([{ _: "01", listVersionID: "1.0" }])
    const supplierIds = at(invoice["AccountingSupplierParty"], "Party", "PartyIdentification") as Array<unknown>
    expect(supplierIds.map((id) => (id as { ID: Wrapped }).ID[0])).toContainEqual({
      _: "C25845632020",
      schemeID: "TIN"
    })
    const buyerIds = at(invoice["AccountingCustomerParty"], "Party", "PartyIdentification") as Array<unknown>
    expect(buyerIds.map((id) => (id as { ID: Wrapped }).ID[0])).toEqual([
      { _: "C1234567890", schemeID: "TIN" },
      { _: "201901234567", schemeID: "BRN" },
      { _: "NA", schemeID: "SST" }
    ])
    const totals = (invoice["LegalMonetaryTotal"] as Array<Record<string, Wrapped>>)[0]!
    expect(valueOf(totals["TaxExclusiveAmount"])).toBe(10)
    expect(valueOf(totals["TaxInclusiveAmount"])).toBe(10.8)
    expect(valueOf(totals["PayableAmount"])).toBe(10.8)
    expect(valueOf(at(invoice["TaxTotal"], "TaxAmount"))).toBe(0.8)
    expect(valueOf(at(invoice["TaxTotal"], "TaxSubtotal", "TaxCategory", "ID"))).toBe("02")
    const line = (invoice["InvoiceLine"] as Array<Record<string, unknown>>)[0]!
    expect(valueOf(at(line["Item"], "CommodityClassification", "ItemClassificationCode"))).toBe("022")
    expect(valueOf(at(line["TaxTotal"], "TaxSubtotal", "Percent"))).toBe(8)
    expect(invoice["BillingReference"]).toBeUndefined()
  })

  it("notes 02, 03 and 04 reference the e-invoice they adjust by number and UUID", () => {
    for (const typeCode of ["02", "03", "04"] as const) {
      const invoice = invoiceOf(buildDocument(input({
        number: "RN-2026-000001",
        typeCode,
        references: [{ number: "INV-2026-000001", uuid: "F9D425P6DS7D8IU9PKV9AQYJ10" }]
      })))
      expect(valueOf(invoice["InvoiceTypeCode"])).toBe(typeCode)
      expect(invoice["BillingReference"]).toEqual([{
        InvoiceDocumentReference: [{ ID: [{ _: "INV-2026-000001" }], UUID: [{ _: "F9D425P6DS7D8IU9PKV9AQYJ10" }] }]
      }])
    }
  })

  it("no tax charged is MyInvois' tax type 06; a buyer without a TIN is the general public", () => {
    const invoice = invoiceOf(buildDocument(input({
      buyer: "general public",
      lines: [{ ...input().lines[0]!, taxSen: 0, taxRateBps: 0 }]
    })))
    expect(valueOf(at(invoice["TaxTotal"], "TaxSubtotal", "TaxCategory", "ID"))).toBe("06")
    const buyerIds = at(invoice["AccountingCustomerParty"], "Party", "PartyIdentification") as Array<{ ID: Wrapped }>
    expect(buyerIds[0]!.ID[0]).toEqual({ _: GENERAL_PUBLIC_TIN, schemeID: "TIN" })
    expect(valueOf(at(invoice["AccountingCustomerParty"], "Party", "PartyLegalEntity", "RegistrationName")))
      .toBe("General Public")
  })
})

describe("the SDK's rules, as the simulated MyInvois checks them", () => {
  const context = { issuerTin: SANDBOX_SUPPLIER.tin!, now: new Date("2026-12-02T06:10:00Z") }
  const reference = [{ number: "INV-2026-000001", uuid: "F9D425P6DS7D8IU9PKV9AQYJ10" }]

  it.each(
    [
      ["an invoice (01)", input()],
      ["a credit note (02)", input({ number: "CN-2026-000001", typeCode: "02", references: reference })],
      ["a debit note (03)", input({ number: "DN-2026-000001", typeCode: "03", references: reference })],
      ["a refund note (04)", input({ number: "RN-2026-000001", typeCode: "04", references: reference })],
      ["without tax", input({ lines: [{ ...input().lines[0]!, taxSen: 0, taxRateBps: 0 }] })],
      [
        "a consolidated e-invoice",
        input({
          number: "CON-INV-2026-11-001",
          buyer: "general public",
          paymentReference: null,
          period: { start: "2026-11-01", end: "2026-11-30" },
          lines: runsOf([1, 2, 3, 5].map((n) => covered(n))).map(lineOf)
        })
      ]
    ] as const
  )("%s passes every rule", (_, document) => {
    expect(checkDocument(buildDocument(document), context)).toEqual([])
  })

  it("a signed 1.1 document passes, and one changed after signing does not", async () => {
    const { certPem, keyPem } = certificate()
    const signer = await Effect.runPromise(makeSigner(keyPem, certPem))
    const text = signer.sign(buildDocument(input({ version: "1.1" })), context.now)
    expect(checkDocument(JSON.parse(text), context)).toEqual([])
    const changed = JSON.parse(text.replace("\"Prepaid credit top-up\"", "\"Something else\""))
    expect(checkDocument(changed, context).map((error) => error.errorCode)).not.toEqual([])
  })

  it("the supplier must be the taxpayer behind the client id, and a note must reference its invoice", () => {
    expect(checkDocument(buildDocument(input()), { ...context, issuerTin: "C11111111110" })).not.toEqual([])
    expect(checkDocument(buildDocument(input({ typeCode: "04", number: "RN-2026-000009" })), context)).not.toEqual([])
  })
})

describe("version 1.1: the signature", () => {
  it("verifies with the certificate: DocDigest, the signature value, CertDigest and PropsDigest as the SDK defines them", async () => {
    const { certPem, keyPem } = certificate()
    const signer = await Effect.runPromise(makeSigner(keyPem, certPem))
    const unsigned = buildDocument(input({ version: "1.1" }))
    const text = signer.sign(unsigned, new Date("2026-12-02T06:05:09Z"))
    const signed = JSON.parse(text) as Record<string, unknown>
    const invoice = invoiceOf(signed)
    expect(invoice["InvoiceTypeCode"]).toEqual([{ _: "01", listVersionID: "1.1" }])
    expect(invoice["Signature"]).toEqual([{
      ID: [{ _: "urn:oasis:names:specification:ubl:signature:Invoice" }],
      SignatureMethod: [{ _: "urn:oasis:names:specification:ubl:dsig:enveloped:xades" }]
    }])
    const signature = at(
      invoice["UBLExtensions"],
      "UBLExtension",
      "ExtensionContent",
      "UBLDocumentSignatures",
      "SignatureInformation",
      "Signature"
    ) as Array<Record<string, unknown>>
    // The signed content: the document read back, without UBLExtensions and Signature, minified.
    const content = transformed(signed)
    expect(content).toBe(JSON.stringify(unsigned))
    const sha256 = (data: string | Buffer) => createHash("sha256").update(data).digest("base64")
    const references = at(signature, "SignedInfo", "Reference") as unknown as Array<Record<string, unknown>>
    const docDigest = references.find((reference) => reference["URI"] === "")!
    expect(valueOf(docDigest["DigestValue"])).toBe(sha256(content))
    const x509 = new X509Certificate(certPem)
    const verifier = createVerify("RSA-SHA256")
    verifier.update(content)
    expect(verifier.verify(x509.publicKey, String(valueOf(signature[0]!["SignatureValue"])), "base64")).toBe(true)
    // A changed amount no longer verifies.
    const tampered = createVerify("RSA-SHA256")
    tampered.update(content.replace("10.8", "1.08"))
    expect(tampered.verify(x509.publicKey, String(valueOf(signature[0]!["SignatureValue"])), "base64")).toBe(false)
    const qualifying = at(signature, "Object", "QualifyingProperties") as Array<unknown>
    const properties = at(qualifying, "SignedProperties") as Array<unknown>
    const propsDigest = references.find((reference) => reference["URI"] === "#id-xades-signed-props")!
    // PropsDigest: the minified QualifyingProperties, as the SDK's sample digests them.
    expect(valueOf(propsDigest["DigestValue"])).toBe(sha256(JSON.stringify(qualifying[0])))
    const cert = at(properties, "SignedSignatureProperties", "SigningCertificate", "Cert") as Array<
      Record<string, unknown>
    >
    expect(valueOf(at(cert[0]!["CertDigest"], "DigestValue"))).toBe(sha256(x509.raw))
    expect(valueOf(at(cert[0]!["IssuerSerial"], "X509SerialNumber"))).toBe(String(0x0a1b2c3d))
    expect(valueOf(at(cert[0]!["IssuerSerial"], "X509IssuerName"))).toBe("CN=Test CA, C=MY")
    const keyInfo = at(signature, "KeyInfo", "X509Data", "X509Certificate")
    expect(valueOf(keyInfo)).toBe(x509.raw.toString("base64"))
  })

  it("refuses a key that is not a PEM key, naming both variables", async () => {
    const exit = await Effect.runPromiseExit(makeSigner("not a key", "not a certificate"))
    expect(String(exit._tag === "Failure" ? exit.cause : "")).toContain(
      "MYINVOIS_SIGNING_KEY and MYINVOIS_SIGNING_CERT"
    )
  })
})

const covered = (sequence: number, overrides: Partial<Covered> = {}): Covered => ({
  id: `doc_${sequence}`,
  accountId: "acct_1",
  type: "invoice",
  number: `INV-2026-${String(sequence).padStart(6, "0")}`,
  year: 2026,
  sequence,
  taxRateBps: 800,
  netSen: 1000,
  taxSen: 80,
  referencesId: null,
  ...overrides
})

describe("consolidation's lines and parts", () => {
  it("a run of consecutive numbers at one rate is one line, its amounts summed", () => {
    const runs = runsOf([1, 2, 3, 5, 6].map((n) => covered(n)))
    expect(runs.map((run) => run.documents.map((document) => document.sequence))).toEqual([[1, 2, 3], [5, 6]])
    expect(lineOf(runs[0]!)).toEqual({
      description: "Receipts INV-2026-000001 to INV-2026-000003 (3)",
      quantity: 1,
      unitPriceSen: 3000,
      netSen: 3000,
      taxSen: 240,
      taxRateBps: 800,
      classificationCode: "004"
    })
    expect(lineOf(runsOf([covered(9)])[0]!).description).toBe("Receipt INV-2026-000009")
  })

  it("a run breaks at another tax rate or another year", () => {
    const rates = runsOf([covered(1), covered(2, { taxRateBps: 600 }), covered(3, { taxRateBps: 600 })])
    expect(rates.map((run) => run.documents.length)).toEqual([1, 2])
    const years = runsOf([covered(7), covered(1, { year: 2027, number: "INV-2027-000001" })])
    expect(years).toHaveLength(2)
  })

  it("parts hold at most LINES_PER_PART lines, in order, every run once", () => {
    const runs = runsOf(Array.from({ length: 1_000 }, (_, index) => covered(index * 2 + 1)))
    const parts = partsOf(runs)
    expect(parts.map((part) => part.length)).toEqual([150, 150, 150, 150, 150, 150, 100])
    expect(parts.flat()).toEqual(runs)
    expect(Math.max(...parts.map((part) => part.length))).toBeLessThanOrEqual(LINES_PER_PART)
  })

  it("a consolidated e-invoice's number names its type, month and part", () => {
    expect(consolidatedNumber("01", "2026-11", 1)).toBe("CON-INV-2026-11-001")
    expect(consolidatedNumber("04", "2026-11", 12)).toBe("CON-RN-2026-11-012")
  })

  it("a full part of 150 lines, signed or not, is far below MyInvois' 300 KB a document", async () => {
    const runs = runsOf(Array.from({ length: LINES_PER_PART }, (_, index) => covered(index * 2 + 1)))
    const document = buildDocument(input({
      number: "CON-INV-2026-11-001",
      buyer: "general public",
      lines: runs.map(lineOf),
      period: { start: "2026-11-01", end: "2026-11-30" }
    }))
    expect(Buffer.byteLength(JSON.stringify(document))).toBeLessThan(200 * 1024)
    const { certPem, keyPem } = certificate()
    const signed = (await Effect.runPromise(makeSigner(keyPem, certPem))).sign(document, new Date())
    expect(Buffer.byteLength(signed)).toBeLessThan(210 * 1024)
  })
})
