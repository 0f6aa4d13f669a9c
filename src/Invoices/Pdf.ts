import { Effect } from "effect"
import type { DocumentDetail, DocumentLine, DocumentType, Party } from "./Api.js"
import { STATE_CODES } from "./Api.js"

/**
 * A document as an A4 PDF (docs/api/invoices.md, "Invoices and service tax"): the facts `DocumentDetail` gives,
 * in pdfkit's standard Helvetica, with MyInvois' QR code once the e-invoice is valid.
 */

type Doc = PDFKit.PDFDocument

const MARGIN = 50
/** A4 in points. */
const PAGE_WIDTH = 595.28
const PAGE_HEIGHT = 841.89
const CONTENT_WIDTH = PAGE_WIDTH - 2 * MARGIN
const RIGHT = PAGE_WIDTH - MARGIN
/** Where content ends: pdfkit's own bottom, past which it would open a page by itself. */
const BOTTOM = PAGE_HEIGHT - MARGIN

/** The longest text drawn as it is; past it a string ends in "…". */
const MAX_TEXT = 300
/** The most lines a PDF lists; the totals still cover every line. */
const MAX_LINES = 200

const REGULAR = "Helvetica"
const BOLD = "Helvetica-Bold"
const INK = "#111111"
const MUTED = "#5f6368"
const RULE = "#c8c8c8"
const SHADE = "#f1f3f4"

const HEADINGS: Record<DocumentType, string> = {
  invoice: "Tax Invoice",
  refund_note: "Refund Note",
  debit_note: "Debit Note",
  credit_note: "Credit Note"
}

/** What WinAnsi has beyond Latin-1 (pdfkit's standard fonts draw nothing else): € ‚ ƒ „ … † ‡ ˆ ‰ Š ‹ Œ Ž ‘ ’ “ ” • – — ˜ ™ š › œ ž Ÿ. */
const WIN_ANSI_EXTRAS = new Set([
  0x20ac,
  0x201a,
  0x0192,
  0x201e,
  0x2026,
  0x2020,
  0x2021,
  0x02c6,
  0x2030,
  0x0160,
  0x2039,
  0x0152,
  0x017d,
  0x2018,
  0x2019,
  0x201c,
  0x201d,
  0x2022,
  0x2013,
  0x2014,
  0x02dc,
  0x2122,
  0x0161,
  0x203a,
  0x0153,
  0x017e,
  0x0178
])

const drawable = (codePoint: number): boolean =>
  (codePoint >= 0x20 && codePoint <= 0x7e) || (codePoint >= 0xa0 && codePoint <= 0xff) ||
  WIN_ANSI_EXTRAS.has(codePoint)

/**
 * `text` as Helvetica can draw it: composed (NFC, so "e" and a combining accent become "é"), white space as a
 * space, every other character it has no glyph for (Chinese, emoji, control characters) as "?", and at most
 * `MAX_TEXT` characters.
 */
const printable = (text: string): string => {
  const out: Array<string> = []
  // Composing never shortens text by more than a third: a string cut here still runs past MAX_TEXT.
  for (const char of text.slice(0, MAX_TEXT * 4).normalize("NFC")) {
    const codePoint = char.codePointAt(0) ?? 0
    out.push(drawable(codePoint) ? char : /\s/.test(char) ? " " : "?")
    if (out.length > MAX_TEXT) break
  }
  return out.length > MAX_TEXT ? `${out.slice(0, MAX_TEXT - 1).join("")}…` : out.join("")
}

const AMOUNT = new Intl.NumberFormat("en-MY", { minimumFractionDigits: 2, maximumFractionDigits: 2 })
const COUNT = new Intl.NumberFormat("en-MY", { maximumFractionDigits: 0 })
const PERCENT = new Intl.NumberFormat("en-MY", { maximumFractionDigits: 2 })

/** `1,234.50`: notes carry positive amounts (their type says which way the money moves), so no sign is printed. */
const amount = (myr: number): string => AMOUNT.format(Math.abs(myr))
const rm = (myr: number): string => `RM ${amount(myr)}`
/** 800 basis points are "8", 650 are "6.5". */
const percent = (bps: number): string => PERCENT.format(bps / 100)

const ZONE = "Asia/Kuala_Lumpur"
const DAY = new Intl.DateTimeFormat("en-GB", { timeZone: ZONE, day: "numeric", month: "long", year: "numeric" })
const TIME = new Intl.DateTimeFormat("en-GB", { timeZone: ZONE, hour: "2-digit", minute: "2-digit", hourCycle: "h23" })

/** An instant as Malaysia reads it: "2 December 2026" and "14:05 MYT"; text that is no instant, as it is. */
const moment = (iso: string): { readonly day: string; readonly time: string } => {
  const date = new Date(iso)
  if (Number.isNaN(date.getTime())) return { day: printable(iso), time: "" }
  return { day: DAY.format(date), time: `${TIME.format(date)} MYT` }
}
const momentText = (iso: string): string => {
  const { day, time } = moment(iso)
  return time === "" ? day : `${day}, ${time}`
}

/** Draws `text` (made printable) at `x, y` and returns where the next line starts. */
const write = (
  doc: Doc,
  text: string,
  x: number,
  y: number,
  style: {
    readonly width: number
    readonly size?: number
    readonly bold?: boolean
    readonly color?: string
    readonly align?: "left" | "right" | "center"
  }
): number => {
  doc.font(style.bold === true ? BOLD : REGULAR).fontSize(style.size ?? 9).fillColor(style.color ?? INK)
  doc.text(printable(text), x, y, { width: style.width, align: style.align ?? "left" })
  return doc.y
}

/** The height `text` takes in `width` at `size`. */
const heightOf = (doc: Doc, text: string, width: number, size: number, bold = false): number => {
  doc.font(bold ? BOLD : REGULAR).fontSize(size)
  return doc.heightOfString(printable(text), { width })
}

const rule = (doc: Doc, y: number, color = RULE): void => {
  doc.moveTo(MARGIN, y).lineTo(RIGHT, y).lineWidth(0.5).strokeColor(color).stroke()
}

/** A party's lines, top to bottom, with null fields left out (an unregistered SST number reads "—"). */
const partyLines = (party: Party, withMsic: boolean): ReadonlyArray<string> => {
  const lines: Array<string> = []
  if (party.tin !== null) lines.push(`TIN ${party.tin}`)
  if (party.id_type !== null && party.id_value !== null) lines.push(`${party.id_type} ${party.id_value}`)
  lines.push(`SST No. ${party.sst_number ?? "—"}`)
  if (withMsic && party.msic !== null) lines.push(`MSIC ${party.msic}`)
  const address = party.address
  if (address !== null) {
    lines.push(address.line1)
    if (address.line2 !== null) lines.push(address.line2)
    lines.push(`${address.postcode} ${address.city}`)
    lines.push(STATE_CODES[address.state_code as keyof typeof STATE_CODES] ?? address.state_code)
    lines.push(address.country_code)
  }
  if (party.email !== null) lines.push(party.email)
  if (party.phone !== null) lines.push(party.phone)
  return lines
}

const drawParty = (doc: Doc, label: string, party: Party, withMsic: boolean, x: number, y: number, width: number) => {
  let at = write(doc, label.toUpperCase(), x, y, { width, size: 7.5, bold: true, color: MUTED }) + 3
  at = write(doc, party.legal_name, x, at, { width, size: 10.5, bold: true }) + 2
  for (const line of partyLines(party, withMsic)) at = write(doc, line, x, at, { width, size: 9 }) + 1
  return at
}

interface Column {
  readonly header: string
  readonly width: number
  readonly align: "left" | "right"
  readonly cell: (line: DocumentLine) => string
}

/** The lines table; its widths add up to the content width (495.28 pt). */
const COLUMNS: ReadonlyArray<Column> = [
  { header: "Description", width: 140.28, align: "left", cell: (line) => line.description },
  { header: "Qty", width: 40, align: "right", cell: (line) => COUNT.format(line.quantity) },
  { header: "Unit price (RM)", width: 72, align: "right", cell: (line) => amount(line.unit_price_myr) },
  { header: "Subtotal (RM)", width: 68, align: "right", cell: (line) => amount(line.subtotal_myr) },
  { header: "Tax rate (%)", width: 55, align: "right", cell: (line) => percent(line.tax_rate_bps) },
  { header: "Tax (RM)", width: 52, align: "right", cell: (line) => amount(line.tax_myr) },
  { header: "Total (RM)", width: 68, align: "right", cell: (line) => amount(line.total_myr) }
]
/** Space on each side of a cell's text. */
const PAD = 4
const CELL_SIZE = 9
const CODE_SIZE = 7

const classification = (line: DocumentLine): string => `Classification ${line.classification_code}`

const headerHeight = (doc: Doc): number =>
  Math.max(...COLUMNS.map((column) => heightOf(doc, column.header, column.width - 2 * PAD, 7.5, true))) + 2 * PAD

const drawTableHeader = (doc: Doc, y: number): number => {
  const height = headerHeight(doc)
  doc.rect(MARGIN, y, CONTENT_WIDTH, height).fillColor(SHADE).fill()
  let x = MARGIN
  for (const column of COLUMNS) {
    write(doc, column.header, x + PAD, y + PAD, {
      width: column.width - 2 * PAD,
      size: 7.5,
      bold: true,
      color: MUTED,
      align: column.align
    })
    x += column.width
  }
  return y + height
}

const rowHeight = (doc: Doc, line: DocumentLine): number => {
  const [first, ...rest] = COLUMNS
  const description = first === undefined ? 0 : heightOf(doc, first.cell(line), first.width - 2 * PAD, CELL_SIZE) +
    1 + heightOf(doc, classification(line), first.width - 2 * PAD, CODE_SIZE)
  const others = rest.map((column) => heightOf(doc, column.cell(line), column.width - 2 * PAD, CELL_SIZE))
  return Math.max(description, ...others) + 2 * PAD
}

const drawRow = (doc: Doc, line: DocumentLine, y: number, height: number): number => {
  let x = MARGIN
  for (const [index, column] of COLUMNS.entries()) {
    const width = column.width - 2 * PAD
    const below = write(doc, column.cell(line), x + PAD, y + PAD, { width, size: CELL_SIZE, align: column.align })
    if (index === 0) write(doc, classification(line), x + PAD, below + 1, { width, size: CODE_SIZE, color: MUTED })
    x += column.width
  }
  rule(doc, y + height)
  return y + height
}

/** A new page for a table or block that does not fit, headed by the document it continues. */
const continuePage = (doc: Doc, document: DocumentDetail): number => {
  doc.addPage()
  const heading = `${HEADINGS[document.type]} ${document.number} (continued)`
  return write(doc, heading, MARGIN, MARGIN, { width: CONTENT_WIDTH, size: 8, color: MUTED }) + 10
}

const drawLines = (doc: Doc, document: DocumentDetail, top: number): number => {
  let y = drawTableHeader(doc, top)
  const shown = document.lines.slice(0, MAX_LINES)
  for (const line of shown) {
    const height = rowHeight(doc, line)
    if (y + height > BOTTOM) y = drawTableHeader(doc, continuePage(doc, document))
    y = drawRow(doc, line, y, height)
  }
  if (document.lines.length > shown.length) {
    const note = `The first ${MAX_LINES} of ${COUNT.format(document.lines.length)} lines are shown; ` +
      "the totals cover every line."
    if (y + 20 > BOTTOM) y = continuePage(doc, document)
    y = write(doc, note, MARGIN, y + 4, { width: CONTENT_WIDTH, size: 7.5, color: MUTED })
  }
  return y
}

const TOTALS_WIDTH = 250
const TOTALS_LABEL = 150

const drawTotals = (doc: Doc, document: DocumentDetail, top: number): number => {
  const rows: ReadonlyArray<readonly [string, string]> = [
    ["Subtotal (excl. tax)", rm(document.net_myr)],
    document.tax_rate_bps === 0
      ? ["Service tax", "—  not charged"]
      : [`Service tax ${percent(document.tax_rate_bps)}%`, rm(document.tax_myr)]
  ]
  const total = ["Total", rm(document.total_myr)] as const
  const height = (rows.length + 1) * 16 + 12
  let y = top + height > BOTTOM ? continuePage(doc, document) : top
  const x = RIGHT - TOTALS_WIDTH
  const valueWidth = TOTALS_WIDTH - TOTALS_LABEL
  for (const [label, value] of rows) {
    write(doc, label, x, y, { width: TOTALS_LABEL, size: 9.5, color: MUTED })
    y = Math.max(doc.y, write(doc, value, x + TOTALS_LABEL, y, { width: valueWidth, size: 9.5, align: "right" })) + 5
  }
  doc.moveTo(x, y).lineTo(RIGHT, y).lineWidth(0.75).strokeColor(INK).stroke()
  y += 6
  write(doc, total[0], x, y, { width: TOTALS_LABEL, size: 11, bold: true })
  return Math.max(
    doc.y,
    write(doc, total[1], x + TOTALS_LABEL, y, { width: valueWidth, size: 11, bold: true, align: "right" })
  )
}

/** The QR code's side on the page, in points. */
const QR_SIDE = 100

/** MyInvois' part, at the foot of the last page: the validation and its QR code, or why there is none yet. */
const drawEInvoice = (doc: Doc, document: DocumentDetail, qr: Buffer | undefined, top: number): void => {
  const eInvoice = document.e_invoice
  const url = eInvoice.validation_url
  if (eInvoice.status === "valid" && url !== null) {
    const urlHeight = heightOf(doc, url, CONTENT_WIDTH, 7)
    const height = 10 + QR_SIDE + 4 + urlHeight
    if (top + 20 + height > BOTTOM) continuePage(doc, document)
    const y = BOTTOM - height - 1
    rule(doc, y)
    const qrTop = y + 10
    const indent = qr === undefined ? 0 : QR_SIDE + 15
    if (qr !== undefined) doc.image(qr, MARGIN, qrTop, { width: QR_SIDE, height: QR_SIDE })
    const textX = MARGIN + indent
    const textWidth = CONTENT_WIDTH - indent
    const heading = eInvoice.route === "consolidated"
      ? `Reported in consolidated e-Invoice ${eInvoice.number ?? ""}, validated by MyInvois`
      : "e-Invoice validated by MyInvois"
    let at = write(doc, heading, textX, qrTop + 4, { width: textWidth, size: 10, bold: true })
    at = write(doc, `MyInvois UUID: ${eInvoice.uuid ?? "—"}`, textX, at + 4, { width: textWidth, size: 9 })
    const validated = eInvoice.validated_at === null ? "—" : momentText(eInvoice.validated_at)
    at = write(doc, `Validated: ${validated}`, textX, at + 2, { width: textWidth, size: 9 })
    const check = qr === undefined ? "Open the link below" : "Scan the code or open the link below"
    write(doc, `${check} to check this document on the MyInvois portal.`, textX, at + 6, {
      width: textWidth,
      size: 7.5,
      color: MUTED
    })
    write(doc, url, MARGIN, qrTop + QR_SIDE + 4, { width: CONTENT_WIDTH, size: 7, color: MUTED })
    return
  }
  const message = eInvoice.status === "invalid"
    ? eInvoice.errors[0] === undefined
      ? "e-Invoice rejected by MyInvois"
      : `e-Invoice rejected by MyInvois: ${eInvoice.errors[0].message}`
    : eInvoice.status === "cancelled"
    ? "e-Invoice cancelled"
    : eInvoice.route === "consolidated"
    ? "e-Invoice pending: reported in the month's consolidated e-Invoice after the month ends"
    : "e-Invoice pending validation"
  const height = 10 + heightOf(doc, message, CONTENT_WIDTH, 9.5, true)
  if (top + 20 + height > BOTTOM) continuePage(doc, document)
  const y = BOTTOM - height - 1
  rule(doc, y)
  write(doc, message, MARGIN, y + 10, { width: CONTENT_WIDTH, size: 9.5, bold: true })
}

/** "INV-2026-000001 · Page 1 of 2" under every page, written in the bottom margin once all pages exist. */
const drawFooters = (doc: Doc, document: DocumentDetail): void => {
  const range = doc.bufferedPageRange()
  for (let index = range.start; index < range.start + range.count; index++) {
    doc.switchToPage(index)
    const margins = doc.page.margins
    doc.page.margins = { ...margins, bottom: 0 }
    const footer = `${printable(document.number)} · Page ${index - range.start + 1} of ${range.count}`
    doc.font(REGULAR).fontSize(7).fillColor(MUTED)
    doc.text(footer, MARGIN, PAGE_HEIGHT - MARGIN + 18, { width: CONTENT_WIDTH, align: "center", lineBreak: false })
    doc.page.margins = margins
  }
}

const draw = (doc: Doc, document: DocumentDetail, qr: Buffer | undefined): void => {
  // Heading on the left, the document's facts on the right.
  const factsWidth = 200
  const factsX = RIGHT - factsWidth
  let left = write(doc, HEADINGS[document.type], MARGIN, MARGIN, {
    width: CONTENT_WIDTH - factsWidth,
    size: 22,
    bold: true
  })
  left = write(doc, `e-Invoice type ${document.type_code}`, MARGIN, left + 2, { width: 200, size: 7.5, color: MUTED })
  const { day, time } = moment(document.issued_at)
  const facts: ReadonlyArray<readonly [string, string]> = [
    ["Number", document.number],
    ["Date", day],
    ...(time === "" ? [] : [["Time", time] as const]),
    ["Currency", document.currency]
  ]
  let right = MARGIN + 2
  for (const [label, value] of facts) {
    write(doc, label, factsX, right, { width: 60, size: 9, color: MUTED })
    right = Math.max(doc.y, write(doc, value, factsX + 60, right, { width: factsWidth - 60, size: 9, bold: true })) + 2
  }
  let y = Math.max(left, right) + 14
  rule(doc, y)
  y += 12

  // Supplier and buyer side by side.
  const gap = 30
  const columnWidth = (CONTENT_WIDTH - gap) / 2
  const supplierEnd = drawParty(doc, "Supplier", document.supplier, true, MARGIN, y, columnWidth)
  const buyerEnd = drawParty(doc, "Buyer", document.buyer, false, MARGIN + columnWidth + gap, y, columnWidth)
  y = Math.max(supplierEnd, buyerEnd) + 12

  if (document.type !== "invoice" && document.references !== null) {
    const adjusts = `Adjusts invoice ${document.references.number}`
    y = write(doc, adjusts, MARGIN, y, { width: CONTENT_WIDTH, size: 10, bold: true }) + 10
  }

  y = drawLines(doc, document, y) + 14
  y = drawTotals(doc, document, y) + 14
  if (document.payment_reference !== null) {
    if (y + 20 > BOTTOM) y = continuePage(doc, document)
    y = write(doc, `Payment reference: ${document.payment_reference}`, MARGIN, y, {
      width: CONTENT_WIDTH,
      size: 8.5,
      color: MUTED
    })
  }
  drawEInvoice(doc, document, qr, y)
  drawFooters(doc, document)
}

const render = async (document: DocumentDetail, options: { readonly title?: string }): Promise<Uint8Array> => {
  // Loaded with the first document, not at start (docs/performance.md, "Modules loaded when used").
  const [{ default: PDFDocument }, QRCode] = await Promise.all([import("pdfkit"), import("qrcode")])
  const url = document.e_invoice.validation_url
  const qr = document.e_invoice.status === "valid" && url !== null
    // A link too long for a QR code is printed without one.
    ? await QRCode.toBuffer(url, { type: "png", margin: 1, width: 240 }).catch(() => undefined)
    : undefined
  const doc = new PDFDocument({
    size: "A4",
    margin: MARGIN,
    bufferPages: true,
    info: {
      Title: (options.title ?? document.number).slice(0, MAX_TEXT),
      Author: document.supplier.legal_name.slice(0, MAX_TEXT)
    }
  })
  const chunks: Array<Buffer> = []
  const done = new Promise<Uint8Array>((resolve, reject) => {
    doc.on("data", (chunk: Buffer) => chunks.push(chunk))
    doc.on("end", () => resolve(Buffer.concat(chunks)))
    doc.on("error", reject)
  })
  draw(doc, document, qr)
  doc.end()
  return done
}

/**
 * The document as an A4 PDF. `title` is the PDF's Title (the document's number unless given); the Author is the
 * supplier. Every text is made printable and bounded, and at most 200 lines are listed.
 */
export const renderPdf = (document: DocumentDetail, options: { readonly title?: string }): Effect.Effect<Uint8Array> =>
  Effect.promise(() => render(document, options)).pipe(Effect.withSpan("Invoices.renderPdf"))
