import { createHash } from "node:crypto"
import { describe, expect, it } from "vitest"
import {
  checkDocument,
  checkedAtSubmission,
  docDigestOf,
  hashOf,
  type ValidationError
} from "../../src/EInvoicing/Rules.js"
import { sampleDocument, withSignature } from "../support/MyInvoisStandIn.js"

/**
 * MyInvois' document rules (docs/api/e-invoices.md, "The documents"; the SDK's document type pages,
 * "Mathematical Mappings", "Signing a JSON document" and FAQ): documents built as the SDK's samples are, each
 * broken in one way, and the error MyInvois reports for it.
 */

const NOW = new Date("2026-03-02T08:00:00Z")
const CONTEXT = { issuerTin: "C25845632020", now: NOW }
const ISSUED = new Date(NOW.getTime() - 5 * 60 * 1000)
const INVOICE_UUID = "F9D425P6DS7D8IU0000000000A"

type Document = Record<string, unknown>
type Node = Record<string, any>

const invoice = (overrides: Partial<Parameters<typeof sampleDocument>[0]> = {}) =>
  sampleDocument({ number: "INV-2026-000001", issuedAt: ISSUED, ...overrides })

/** A copy of `document` changed by `change`, which gets the copy's Invoice aggregate. */
const changed = (document: Document, change: (root: Node, whole: Node) => void): Document => {
  const copy = structuredClone(document) as Node
  change(copy["Invoice"][0], copy)
  return copy
}

const codesOf = (errors: ReadonlyArray<ValidationError>) => errors.map((error) => error.errorCode)

describe("documents MyInvois takes", () => {
  const cases: ReadonlyArray<readonly [string, Document]> = [
    ["an invoice (01, v1.0) with a buyer's TIN", invoice()],
    ["an invoice of two lines", invoice({ lines: [{ netSen: 1000, taxSen: 80 }, { netSen: 2550, taxSen: 204 }] })],
    ["a consolidated e-invoice: the general public, classification 004", invoice({ buyerTin: "EI00000000010" })],
    ["an invoice to a foreign buyer (EI00000000020)", invoice({ buyerTin: "EI00000000020" })],
    ["an invoice to an individual (IG TIN)", invoice({ buyerTin: "IG115002000" })],
    ...(["02", "03", "04"] as const).map((typeCode) =>
      [
        `a note (${typeCode}) referencing its invoice`,
        invoice({ typeCode, number: `CN-${typeCode}`, references: [{ number: "INV-2026-000001", uuid: INVOICE_UUID }] })
      ] as const
    ),
    ["a signed invoice (v1.1)", withSignature(invoice({ version: "1.1" }))],
    ["an invoice issued 71 hours before", invoice({ issuedAt: new Date(NOW.getTime() - 71 * 3600 * 1000) })]
  ]
  for (const [name, document] of cases) {
    it(name, () => {
      expect(checkDocument(document, CONTEXT)).toEqual([])
    })
  }
})

describe("each broken rule gives its error", () => {
  /** The document, the codes of its errors (space-separated), a part of the first error's path. */
  const cases: ReadonlyArray<readonly [string, Document, string, string]> = [
    ["a namespace key missing", changed(invoice(), (_, whole) => delete whole["_D"]), "NotUblJson", "$._D"],
    [
      "a value not wrapped as [{\"_\": value}]",
      changed(invoice(), (root) => root["ID"] = "INV-1"),
      "NotWrapped",
      "$.Invoice[0].ID"
    ],
    [
      "the issue time missing",
      changed(invoice(), (root) => delete root["IssueTime"]),
      "MissingField",
      "$.Invoice[0].IssueTime"
    ],
    [
      "the supplier's name missing",
      changed(invoice(), (root) => delete root["AccountingSupplierParty"][0]["Party"][0]["PartyLegalEntity"]),
      "MissingField",
      "$.Invoice[0].AccountingSupplierParty[0].Party[0].PartyLegalEntity"
    ],
    [
      "a line's description missing",
      changed(invoice(), (root) => delete root["InvoiceLine"][0]["Item"][0]["Description"]),
      "MissingField",
      "$.Invoice[0].InvoiceLine[0].Item[0].Description"
    ],
    ["no lines", changed(invoice(), (root) => root["InvoiceLine"] = []), "MissingField", "$.Invoice[0].InvoiceLine"],
    [
      "a type that is not 01-04",
      changed(invoice(), (root) => root["InvoiceTypeCode"][0]["_"] = "11"),
      "InvalidValue",
      "$.Invoice[0].InvoiceTypeCode"
    ],
    [
      "a version MyInvois has not",
      changed(invoice(), (root) => root["InvoiceTypeCode"][0]["listVersionID"] = "2.0"),
      "InvalidValue",
      "listVersionID"
    ],
    [
      "an amount given as text",
      changed(invoice(), (root) => root["LegalMonetaryTotal"][0]["PayableAmount"][0]["_"] = "10.80"),
      "InvalidValue",
      "PayableAmount"
    ],
    [
      "a supplier TIN LHDN does not issue",
      invoice({ supplierTin: "X123" }),
      "InvalidTin IssuerTinMismatch",
      "AccountingSupplierParty"
    ],
    ["a buyer TIN LHDN does not issue", invoice({ buyerTin: "C2584563202" }), "InvalidTin", "AccountingCustomerParty"],
    [
      "the foreign supplier's TIN as a buyer's",
      invoice({ buyerTin: "EI00000000030" }),
      "InvalidTin",
      "AccountingCustomerParty"
    ],
    [
      "a supplier that is not the caller",
      invoice({ supplierTin: "C1234567890" }),
      "IssuerTinMismatch",
      "AccountingSupplierParty"
    ],
    [
      "the lines' net off by a sen",
      changed(invoice(), (root) => root["LegalMonetaryTotal"][0]["LineExtensionAmount"][0]["_"] = 10.01),
      "TotalsMismatch",
      "LineExtensionAmount"
    ],
    [
      "the total excluding tax off by a sen",
      changed(invoice(), (root) => {
        root["LegalMonetaryTotal"][0]["TaxExclusiveAmount"][0]["_"] = 9.99
        root["LegalMonetaryTotal"][0]["TaxInclusiveAmount"][0]["_"] = 10.79
        root["LegalMonetaryTotal"][0]["PayableAmount"][0]["_"] = 10.79
      }),
      "TotalsMismatch",
      "TaxExclusiveAmount"
    ],
    [
      "the tax total off by a sen",
      changed(invoice(), (root) => {
        root["TaxTotal"][0]["TaxAmount"][0]["_"] = 0.81
        root["TaxTotal"][0]["TaxSubtotal"][0]["TaxAmount"][0]["_"] = 0.81
        root["LegalMonetaryTotal"][0]["TaxInclusiveAmount"][0]["_"] = 10.81
        root["LegalMonetaryTotal"][0]["PayableAmount"][0]["_"] = 10.81
      }),
      "TotalsMismatch",
      "$.Invoice[0].TaxTotal[0].TaxAmount"
    ],
    [
      "the payable amount off by a sen",
      changed(invoice(), (root) => root["LegalMonetaryTotal"][0]["PayableAmount"][0]["_"] = 10.79),
      "TotalsMismatch",
      "PayableAmount"
    ],
    [
      "a prepayment not taken off the payable amount",
      changed(
        invoice(),
        (root) => root["PrepaidPayment"] = [{ ID: [{ _: "pi_1" }], PaidAmount: [{ _: 10.8, currencyID: "MYR" }] }]
      ),
      "TotalsMismatch",
      "PayableAmount"
    ],
    [
      "a credit note without BillingReference",
      invoice({ typeCode: "02" }),
      "MissingBillingReference",
      "BillingReference"
    ],
    [
      "a refund note whose reference has no UUID",
      invoice({ typeCode: "04", references: [{ number: "INV-2026-000001", uuid: "" }] }),
      "MissingBillingReference",
      "UUID"
    ],
    [
      "an issue time an hour ahead",
      invoice({ issuedAt: new Date(NOW.getTime() + 3600 * 1000) }),
      "IssuedInFuture",
      "IssueDate"
    ],
    [
      "an issue time 73 hours before",
      invoice({ issuedAt: new Date(NOW.getTime() - 73 * 3600 * 1000) }),
      "IssuedTooLongAgo",
      "IssueDate"
    ],
    [
      "a tax type MyInvois has not",
      changed(invoice(), (root) => root["TaxTotal"][0]["TaxSubtotal"][0]["TaxCategory"][0]["ID"][0]["_"] = "99"),
      "InvalidCode",
      "TaxCategory"
    ],
    [
      "a consolidated line sold to a named buyer",
      invoice({ lines: [{ netSen: 1000, taxSen: 80, classification: "004" }] }),
      "InvalidValue",
      "AccountingCustomerParty"
    ],
    ["a v1.1 document without its signature", invoice({ version: "1.1" }), "DS301", "UBLExtensions"],
    [
      "a v1.1 document whose digest is empty",
      withSignature(invoice({ version: "1.1" }), ""),
      "DS321",
      "DigestValue"
    ],
    [
      "a v1.1 document changed after it was signed",
      changed(
        withSignature(invoice({ version: "1.1" })),
        (root) => root["InvoiceLine"][0]["Item"][0]["Description"][0]["_"] = "Changed"
      ),
      "DS322",
      "DigestValue"
    ]
  ]
  for (const [name, document, code, path] of cases) {
    it(name, () => {
      const errors = checkDocument(document, CONTEXT)
      expect(codesOf(errors), JSON.stringify(errors)).toEqual(code.split(" "))
      expect(errors[0]!.propertyPath).toContain(path)
      expect(errors[0]!.error.length).toBeGreaterThan(0)
    })
  }

  it("a document that is not an object is the Structure Validator's alone", () => {
    expect(codesOf(checkDocument([1, 2], CONTEXT))).toEqual(["NotUblJson"])
    expect(codesOf(checkDocument(changed(invoice(), (_, whole) => whole["Invoice"] = [{}, {}]), CONTEXT))).toEqual([
      "NotUblJson"
    ])
  })

  it("names the TINs it refuses, as MyInvois' messages do", () => {
    const [error] = checkDocument(invoice({ supplierTin: "C1234567890" }), CONTEXT)
    expect(error!.error).toContain("The authenticated TIN and documents TIN is not matching")
    expect(error!.error).toContain("C1234567890")
  })
})

describe("what MyInvois refuses at submission, and what only in validation", () => {
  it("the issuance window, the supplier and the structure at submission; totals, fields and signature later", () => {
    const at = (document: Document) => checkDocument(document, CONTEXT).map(checkedAtSubmission)
    expect(at(invoice({ issuedAt: new Date(NOW.getTime() - 73 * 3600 * 1000) }))).toEqual([true])
    expect(at(invoice({ issuedAt: new Date(NOW.getTime() + 3600 * 1000) }))).toEqual([true])
    expect(at(invoice({ supplierTin: "C1234567890" }))).toEqual([true])
    expect(at(changed(invoice(), (root) => root["ID"] = "INV-1"))).toEqual([true])
    expect(at(invoice({ typeCode: "02" }))).toEqual([false])
    expect(at(invoice({ version: "1.1" }))).toEqual([false])
    expect(at(changed(invoice(), (root) => root["LegalMonetaryTotal"][0]["PayableAmount"][0]["_"] = 10.79))).toEqual([
      false
    ])
  })
})

describe("the hashes the SDK defines", () => {
  it("documentHash is the SHA-256 of the document's UTF-8 text, in hex", () => {
    const text = JSON.stringify(invoice({ number: "INV-Ω" }))
    expect(hashOf(text)).toBe(createHash("sha256").update(Buffer.from(text, "utf8")).digest("hex"))
    expect(hashOf(text)).toMatch(/^[0-9a-f]{64}$/)
  })

  it("DocDigest is the base64 SHA-256 of the minified document without UBLExtensions and Signature", () => {
    const unsigned = invoice({ version: "1.1" })
    const expected = createHash("sha256").update(JSON.stringify(unsigned), "utf8").digest("base64")
    expect(docDigestOf(unsigned)).toBe(expected)
    expect(docDigestOf(withSignature(unsigned)), "the signature is not part of what it digests").toBe(expected)
    expect(docDigestOf(invoice({ version: "1.1", number: "INV-2026-000002" }))).not.toBe(expected)
  })
})
