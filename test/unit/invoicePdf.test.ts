import { Effect } from "effect"
import { execFileSync } from "node:child_process"
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { PDFParse } from "pdf-parse"
import { afterAll, describe, expect, it } from "vitest"
import type { DocumentDetail, DocumentLine } from "../../src/Invoices/Api.js"
import { renderPdf } from "../../src/Invoices/Pdf.js"

/** The invoice PDF (docs/api/invoices.md, "Invoices and service tax"), read back as text, images and pixels. */

const PDFTOPPM = "/usr/bin/pdftoppm"
const hasPdftoppm = existsSync(PDFTOPPM)
/** Where each fixture's first page is kept as a PNG, to look at by eye. */
const PREVIEW = "/tmp/invoice-pdf"

const UUID = "F9D425P6DS7D8IU9PKV9AQYJ10"
const VALIDATION_URL = `https://myinvois.hasil.gov.my/${UUID}/share/R0GAJ5J8T9QFKH9FH4B4XYJ10ABCDEF`

const line = (overrides: Partial<DocumentLine> = {}): DocumentLine => ({
  description: "Prepaid credit top-up",
  quantity: 1,
  unit_price_myr: 10,
  tax_rate_bps: 800,
  tax_myr: 0.8,
  subtotal_myr: 10,
  total_myr: 10.8,
  classification_code: "022",
  ...overrides
})

const invoice = (overrides: Partial<DocumentDetail> = {}): DocumentDetail => ({
  id: "doc_01J0000000000000000000000",
  number: "INV-2026-000001",
  type: "invoice",
  type_code: "01",
  issued_at: "2026-12-02T06:05:00.000Z",
  currency: "MYR",
  net_myr: 10,
  tax_myr: 0.8,
  total_myr: 10.8,
  e_invoice: {
    status: "pending",
    uuid: null,
    validation_url: null,
    validated_at: null,
    errors: [],
    route: "single",
    number: "INV-2026-000001",
    overdue: false
  },
  supplier: {
    legal_name: "Nenas Teknologi Sdn. Bhd.",
    tin: "C25845632020",
    id_type: "BRN",
    id_value: "201901234567",
    sst_number: "W10-1808-32000001",
    msic: "62010",
    email: "billing@nenas.my",
    phone: "+60321610000",
    address: {
      line1: "Level 12, Menara Nenas",
      line2: "Jalan Ampang",
      city: "Kuala Lumpur",
      postcode: "50450",
      state_code: "14",
      country_code: "MYS"
    }
  },
  buyer: {
    legal_name: "Kedai Kopi Ah Seng",
    tin: "C1234567890",
    id_type: "NRIC",
    id_value: "770625015324",
    sst_number: null,
    msic: null,
    email: "ahseng@example.my",
    phone: null,
    address: {
      line1: "12 Jalan Besar",
      line2: null,
      city: "Georgetown",
      postcode: "10200",
      state_code: "07",
      country_code: "MYS"
    }
  },
  lines: [line()],
  tax_rate_bps: 800,
  payment_reference: "pi_3QabcDEF123456",
  transaction_id: "txn_01J000000000000000000000",
  references: null,
  ...overrides
})

const validated: DocumentDetail["e_invoice"] = {
  status: "valid",
  uuid: UUID,
  validation_url: VALIDATION_URL,
  validated_at: "2026-12-02T07:30:00.000Z",
  errors: [],
  route: "single",
  number: "INV-2026-000001",
  overdue: false
}

const render = (document: DocumentDetail, title?: string): Promise<Uint8Array> =>
  Effect.runPromise(renderPdf(document, title === undefined ? {} : { title }))

const parsed = async <A>(bytes: Uint8Array, read: (parser: PDFParse) => Promise<A>): Promise<A> => {
  // pdf.js takes the buffer over: hand it a copy.
  const parser = new PDFParse({ data: new Uint8Array(bytes) })
  try {
    return await read(parser)
  } finally {
    await parser.destroy()
  }
}

const textOf = (bytes: Uint8Array) => parsed(bytes, (parser) => parser.getText())
const latin1 = (bytes: Uint8Array): string => Buffer.from(bytes).toString("latin1")

const work = mkdtempSync(join(tmpdir(), "invoice-pdf-"))
afterAll(() => rmSync(work, { recursive: true, force: true }))

/** Page 1 as a PNG at 60 dpi, by poppler; a copy is kept under PREVIEW. */
const firstPagePng = (bytes: Uint8Array, name: string): string => {
  const pdf = join(work, `${name}.pdf`)
  writeFileSync(pdf, bytes)
  execFileSync(PDFTOPPM, ["-png", "-r", "60", "-f", "1", "-l", "1", pdf, join(work, name)])
  // pdftoppm numbers its pages, padded to the digits of the page count ("name-1.png", "name-01.png").
  const png = ["1", "01", "001"].map((page) => join(work, `${name}-${page}.png`)).find((path) => existsSync(path))
  if (png === undefined) throw new Error(`pdftoppm wrote no page 1 for ${name}`)
  mkdirSync(PREVIEW, { recursive: true })
  copyFileSync(png, join(PREVIEW, `${name}.png`))
  return png
}

describe("invoice PDF", () => {
  it("is an A4 PDF with the invoice's facts, pending validation", async () => {
    const bytes = await render(invoice())
    expect(latin1(bytes.subarray(0, 5))).toBe("%PDF-")
    expect(latin1(bytes)).toContain("/MediaBox [0 0 595.28 841.89]")

    const { text, total } = await textOf(bytes)
    expect(total).toBe(1)
    for (
      const fact of [
        "Tax Invoice",
        "e-Invoice type 01",
        "INV-2026-000001",
        // 06:05 UTC is 14:05 in Kuala Lumpur.
        "2 December 2026",
        "14:05 MYT",
        "MYR",
        "Nenas Teknologi Sdn. Bhd.",
        "TIN C25845632020",
        "BRN 201901234567",
        "SST No. W10-1808-32000001",
        "MSIC 62010",
        "Wilayah Persekutuan Kuala Lumpur",
        "50450 Kuala Lumpur",
        "Kedai Kopi Ah Seng",
        "TIN C1234567890",
        "NRIC 770625015324",
        "SST No. —",
        "Pulau Pinang",
        "Prepaid credit top-up",
        "Classification 022",
        "Subtotal (excl. tax)",
        "RM 10.00",
        "Service tax 8%",
        "RM 0.80",
        "RM 10.80",
        "Payment reference: pi_3QabcDEF123456",
        "e-Invoice pending validation",
        "INV-2026-000001 · Page 1 of 1"
      ]
    ) expect(text).toContain(fact)
    // The buyer has no phone and no second address line, and no MSIC code: none is invented.
    expect(text.match(/MSIC/g)).toHaveLength(1)
    expect(text).not.toContain("null")
    expect(text).not.toContain("MyInvois UUID")
    expect(text).not.toContain("Adjusts invoice")
    // Nothing is drawn as an image before MyInvois validates the document.
    expect(latin1(bytes)).not.toContain("/Subtype /Image")

    const info = await parsed(bytes, (parser) => parser.getInfo())
    expect(info.info.Title).toBe("INV-2026-000001")
    expect(info.info.Author).toBe("Nenas Teknologi Sdn. Bhd.")
  })

  it("once valid, carries the MyInvois UUID, the validation time and a QR code of the link", async () => {
    const bytes = await render(invoice({ e_invoice: validated }))
    const { text } = await textOf(bytes)
    expect(text).toContain(`MyInvois UUID: ${UUID}`)
    // 07:30 UTC is 15:30 in Kuala Lumpur.
    expect(text).toContain("Validated: 2 December 2026, 15:30 MYT")
    expect(text.replace(/\s/g, "")).toContain(VALIDATION_URL)
    expect(text).not.toContain("pending")

    expect(latin1(bytes)).toContain("/Subtype /Image")
    const images = await parsed(bytes, (parser) => parser.getImage({ imageBuffer: false, imageDataUrl: false }))
    // qrcode draws the link 240 pixels square.
    expect(images.pages[0]?.images.map((image) => [image.width, image.height])).toEqual([[240, 240]])
  })

  it("says why there is no QR code when MyInvois rejected or cancelled the document, or gave no link", async () => {
    const rejected = await textOf(
      await render(invoice({
        e_invoice: {
          status: "invalid",
          uuid: UUID,
          validation_url: null,
          validated_at: null,
          errors: [
            { code: "CF321", message: "Buyer TIN does not match the registered name", target: "buyer.tin" },
            { code: "CF322", message: "Second reason", target: null }
          ],
          route: "single",
          number: "INV-2026-000001",
          overdue: false
        }
      }))
    )
    expect(rejected.text).toContain("e-Invoice rejected by MyInvois: Buyer TIN does not match the registered name")
    expect(rejected.text).not.toContain("Second reason")

    const cancelled = await textOf(await render(invoice({ e_invoice: { ...validated, status: "cancelled" } })))
    expect(cancelled.text).toContain("e-Invoice cancelled")
    expect(cancelled.text).not.toContain("MyInvois UUID")

    const noLink = await render(invoice({ e_invoice: { ...validated, validation_url: null } }))
    expect((await textOf(noLink)).text).toContain("e-Invoice pending validation")
    expect(latin1(noLink)).not.toContain("/Subtype /Image")
  })

  it("heads a note by its type and names the invoice it adjusts; untaxed amounts say tax was not charged", async () => {
    const note = invoice({
      number: "CN-2026-000003",
      type: "credit_note",
      type_code: "02",
      net_myr: 1234.5,
      tax_myr: 0,
      total_myr: 1234.5,
      tax_rate_bps: 0,
      lines: [line({ unit_price_myr: 1234.5, subtotal_myr: 1234.5, tax_rate_bps: 0, tax_myr: 0, total_myr: 1234.5 })],
      references: { id: "doc_01J0000000000000000000001", number: "INV-2026-000001" },
      payment_reference: null
    })
    const bytes = await render(note, "Credit note CN-2026-000003")
    const { text } = await textOf(bytes)
    expect(text).toContain("Credit Note")
    expect(text).toContain("e-Invoice type 02")
    expect(text).toContain("Adjusts invoice INV-2026-000001")
    expect(text).toContain("1,234.50")
    expect(text).toContain("RM 1,234.50")
    expect(text).toMatch(/Service tax\s+—\s+not charged/)
    expect(text).not.toContain("Service tax 0%")
    expect(text).not.toContain("Payment reference")
    expect(text).not.toContain("Tax Invoice")
    expect(text).not.toMatch(/RM\s*-/)
    const info = await parsed(bytes, (parser) => parser.getInfo())
    expect(info.info.Title).toBe("Credit note CN-2026-000003")

    for (
      const [type, heading] of [["refund_note", "Refund Note"], ["debit_note", "Debit Note"]] as const
    ) expect((await textOf(await render({ ...note, type }))).text).toContain(heading)
  })

  it("draws what Helvetica cannot as ?, keeps Latin-1 accents, and runs a long table onto more pages", async () => {
    const lines = Array.from(
      { length: 100 },
      (_, index) =>
        line({ description: `Top-up ${index + 1} — crédit prépayé`, unit_price_myr: 100, subtotal_myr: 100 })
    )
    const bytes = await render(
      invoice({
        buyer: { ...invoice().buyer, legal_name: "陈氏贸易 Chén Trading 🍍 Sdn. Bhd." },
        lines,
        net_myr: 10_000,
        tax_myr: 800,
        total_myr: 10_800
      }),
      "发票 INV-2026-000001"
    )
    const { text, total } = await textOf(bytes)
    expect(total).toBeGreaterThanOrEqual(2)
    expect(text).toContain("???? Chén Trading ? Sdn. Bhd.")
    expect(text).toContain("Top-up 1 — crédit prépayé")
    expect(text).toContain("Top-up 100 — crédit prépayé")
    expect(text).toContain("RM 10,800.00")
    expect(text).toContain("INV-2026-000001 (continued)")
    expect(text).toContain(`Page ${total} of ${total}`)
    // The table's heading is repeated on every page it runs onto.
    expect(text.match(/Description/g)?.length).toBe(total)
    // The metadata is Unicode: only the drawn text is limited to what Helvetica has.
    const info = await parsed(bytes, (parser) => parser.getInfo())
    expect(info.info.Title).toBe("发票 INV-2026-000001")
  })

  it("bounds long text and lists at most 200 lines", async () => {
    const bytes = await render(invoice({
      buyer: { ...invoice().buyer, legal_name: `Syarikat ${"Panjang ".repeat(100)}` },
      lines: Array.from({ length: 250 }, (_, index) => line({ description: `Item ${index + 1}` }))
    }))
    const { text } = await textOf(bytes)
    expect(text).toContain("Item 200")
    expect(text).not.toContain("Item 201")
    expect(text).toContain("The first 200 of 250 lines are shown; the totals cover every line.")
    // 300 characters: "Syarikat ", 36 times "Panjang " and "Pa", then the ellipsis.
    expect(text).toMatch(/Panjang\s+Pa…/)
    expect(text.match(/Panjang/g)).toHaveLength(36)
  })

  it.skipIf(!hasPdftoppm)("renders to pixels with poppler", async () => {
    const fixtures: ReadonlyArray<readonly [string, DocumentDetail]> = [
      ["pending", invoice()],
      ["valid", invoice({ e_invoice: validated })],
      [
        "chinese-100-lines",
        invoice({
          buyer: { ...invoice().buyer, legal_name: "陈氏贸易 Chén Trading 🍍 Sdn. Bhd." },
          lines: Array.from({ length: 100 }, (_, index) => line({ description: `Top-up ${index + 1}` }))
        })
      ]
    ]
    for (const [name, document] of fixtures) {
      const png = firstPagePng(await render(document), name)
      expect(statSync(png).size).toBeGreaterThan(5_000)
    }
  })
})
