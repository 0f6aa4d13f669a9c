import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import jsQRModule from "jsqr"
import { execFile } from "node:child_process"
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { promisify } from "node:util"
import { PDFParse } from "pdf-parse"
import { PNG } from "pngjs"
import { simulatedLayer } from "../../../src/EInvoicing/MyInvois.js"
import { COMPANY_PROFILE, UNREGISTERED_TIN } from "../../support/BillingProfile.js"
import { call } from "../../support/Http.js"
import { realSleep } from "../../support/RealTime.js"
import { simulatedTopUp } from "../../support/Stripe.js"
import { TestServer, TestServerLive } from "../../support/TestServer.js"
import { developer } from "../../support/Wallet.js"

/**
 * The QR code on a document's PDF (docs/api/e-invoices.md, "Lifecycle"): once MyInvois validates the e-invoice,
 * page 1 carries a QR code of its validation link, `MYINVOIS_PORTAL_URL/{uuid}/share/{longId}`, and prints the
 * UUID. Through the real server with the simulated checkout and the simulated MyInvois (validating at once, the
 * worker polling every 100 ms); the page is rendered as a person's scanner sees it, by poppler's pdftoppm at
 * 150 dpi, and the code read with jsQR.
 */

const PORTAL = "https://portal.myinvois.test"

interface Listed {
  readonly id: string
  readonly number: string
  readonly e_invoice: {
    readonly status: string
    readonly uuid: string | null
    readonly validation_url: string | null
  }
}

const ok = (reply: { readonly status: number; readonly text: string; readonly body: any }) => {
  expect(reply.status, reply.text).toBe(200)
  return reply.body
}

/** Polls until the account's newest document's e-invoice is `status` (at most 15 s of real time). */
const newestIn = (token: string, status: string) =>
  Effect.gen(function*() {
    const newest = Effect.map(
      call("GET", "/dashboard/billing/invoices", { token }),
      (reply) => (ok(reply).data as Array<Listed>)[0]
    )
    for (let tries = 0; tries < 150; tries++) {
      const document = yield* newest
      if (document?.e_invoice.status === status) return document
      yield* realSleep(100)
    }
    const last = yield* newest
    return expect.fail(`the newest document's e-invoice stayed ${JSON.stringify(last?.e_invoice)}, not ${status}`)
  })

const run = promisify(execFile)
// jsqr is CommonJS whose types declare an ES default export: under NodeNext that default is `module.exports`, and
// the function is also its `default`.
const jsQR = jsQRModule.default

/** The document's PDF: its text as pdf-parse reads it, and the QR code on page 1 as rendered at 150 dpi (null: none). */
const pdfOf = (token: string, id: string) =>
  Effect.gen(function*() {
    const { baseUrl } = yield* TestServer
    return yield* Effect.promise(async () => {
      const response = await fetch(`${baseUrl}/dashboard/billing/invoices/${id}/pdf`, {
        headers: { authorization: `Bearer ${token}` }
      })
      expect(response.status).toBe(200)
      expect(response.headers.get("content-type")).toMatch(/^application\/pdf/)
      const bytes = new Uint8Array(await response.arrayBuffer())
      // pdf-parse takes its buffer over (detaches it): it reads a copy.
      const text = (await new PDFParse({ data: bytes.slice() }).getText()).text
      const dir = await mkdtemp(join(tmpdir(), "nenas-pdf-"))
      try {
        await writeFile(join(dir, "document.pdf"), bytes)
        await run("pdftoppm", ["-png", "-r", "150", "-f", "1", "-l", "1", "-singlefile", "document.pdf", "page"], {
          cwd: dir
        })
        const png = PNG.sync.read(await readFile(join(dir, "page.png")))
        const qr = jsQR(
          new Uint8ClampedArray(png.data.buffer, png.data.byteOffset, png.data.length),
          png.width,
          png.height
        )
        return { text, qr: qr === null ? null : qr.data }
      } finally {
        await rm(dir, { recursive: true, force: true })
      }
    })
  })

const ServerLive = TestServerLive({ eInvoicePollMs: 100, myinvoisPortalUrl: PORTAL }, {
  eInvoicing: simulatedLayer({ validateAfterMs: 0 })
})

layer(ServerLive, { excludeTestServices: true, timeout: 60_000 })("the QR code on a document's PDF", (it) => {
  it.effect("a validated e-invoice: page 1's QR code is its validation link, and its UUID is printed", () =>
    Effect.gen(function*() {
      const { token } = yield* developer("einvoice-pdf-valid@example.my")
      ok(yield* call("PUT", "/dashboard/billing/profile", { token, json: COMPANY_PROFILE }))
      yield* simulatedTopUp(token, 1000)
      const valid = yield* newestIn(token, "valid")
      const uuid = valid.e_invoice.uuid
      expect(uuid).not.toBeNull()
      // The link as MyInvois shares it: the portal, the UUID, then MyInvois' long id.
      expect(valid.e_invoice.validation_url).toMatch(
        new RegExp(`^${PORTAL.replace(/\./g, "\\.")}/${uuid}/share/[^/]+$`)
      )
      const pdf = yield* pdfOf(token, valid.id)
      expect(pdf.qr).toBe(valid.e_invoice.validation_url)
      expect(pdf.text).toContain(valid.number)
      expect(pdf.text).toContain(uuid!)
    }))

  it.effect("a rejected e-invoice: no QR code on the PDF", () =>
    Effect.gen(function*() {
      const { token } = yield* developer("einvoice-pdf-rejected@example.my")
      ok(
        yield* call("PUT", "/dashboard/billing/profile", { token, json: { ...COMPANY_PROFILE, tin: UNREGISTERED_TIN } })
      )
      yield* simulatedTopUp(token, 1000)
      const rejected = yield* newestIn(token, "invalid")
      expect(rejected.e_invoice.validation_url).toBeNull()
      const pdf = yield* pdfOf(token, rejected.id)
      expect(pdf.text).toContain(rejected.number)
      expect(pdf.qr).toBeNull()
    }))
})
