import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { PDFParse } from "pdf-parse"
import { COMPANY_PROFILE } from "../../support/BillingProfile.js"
import { call } from "../../support/Http.js"
import {
  deliverEvent,
  events,
  StripeDouble,
  testServerWithStripe,
  topUp,
  webhookOverrides
} from "../../support/Stripe.js"
import { query, TestServer, TestServerLive } from "../../support/TestServer.js"
import { developer } from "../../support/Wallet.js"

/**
 * Service tax, the billing profile and the documents through the real server (docs/money.md, "Service
 * tax"; docs/api/invoices.md, "Invoices and service tax"): a checkout through a local double of Stripe's
 * API, Stripe's events signed as Stripe signs them, and what the wallet, the ledger and the documents say.
 * Amounts in sen; the wallet's in micro-MYR (1 sen = 10_000).
 */

const SEN = 10_000

interface Summary {
  readonly id: string
  readonly number: string
  readonly type: string
  readonly type_code: string
  readonly issued_at: string
  readonly net_myr: number
  readonly tax_myr: number
  readonly total_myr: number
  readonly e_invoice: { readonly status: string; readonly route: string }
}

const ok = (reply: { readonly status: number; readonly text: string; readonly body: any }) => {
  expect(reply.status, reply.text).toBe(200)
  return reply.body
}

const documents = (token: string, params = "") =>
  Effect.map(
    call("GET", `/dashboard/billing/invoices${params}`, { token }),
    (reply) => ok(reply).data as Array<Summary>
  )

const detail = (token: string, id: string) =>
  Effect.map(call("GET", `/dashboard/billing/invoices/${id}`, { token }), ok)

const wallet = (accountId: string) =>
  Effect.map(
    query<{ available: number; ledger: number }>(
      `SELECT w.available_micro_myr + w.reserved_micro_myr + w.granted_micro_myr AS available,
              (SELECT COALESCE(SUM(amount_micro_myr), 0) FROM ledger_entries l WHERE l.account_id = w.account_id)::bigint AS ledger
       FROM wallets w WHERE w.account_id = $1`,
      [accountId]
    ),
    (rows) => {
      const row = rows[0]!
      // The ledger invariant: what the wallet holds is the sum of its ledger; tax is in neither.
      expect(Number(row.available), "wallet = sum of its ledger").toBe(Number(row.ledger))
      return Number(row.available)
    }
  )

const pdfOf = (token: string, id: string) =>
  Effect.gen(function*() {
    const { baseUrl } = yield* TestServer
    return yield* Effect.promise(async () => {
      const response = await fetch(`${baseUrl}/dashboard/billing/invoices/${id}/pdf`, {
        headers: { authorization: `Bearer ${token}` }
      })
      const bytes = new Uint8Array(await response.arrayBuffer())
      // pdf-parse takes its buffer over (detaches it): it reads a copy.
      const text = response.status === 200 ? (await new PDFParse({ data: bytes.slice() }).getText()).text : ""
      return { status: response.status, headers: response.headers, bytes, text }
    })
  })

const putProfile = (token: string, json: unknown) => call("PUT", "/dashboard/billing/profile", { token, json })

layer(testServerWithStripe({ sstRateBps: 800 }), { excludeTestServices: true, timeout: 60_000 })(
  "invoices with service tax at 8%",
  (it) => {
    it.effect("the balance shows each option's tax; a checkout charges the credit and the tax as two lines", () =>
      Effect.gen(function*() {
        const stripe = yield* StripeDouble
        const { token } = yield* developer("sst-checkout@example.my")
        const balance = ok(yield* call("GET", "/dashboard/billing/balance", { token }))
        expect(balance.sst_rate_bps).toBe(800)
        expect(balance.topup_options.slice(0, 2)).toEqual([
          { amount_sen: 1000, tax_sen: 80, total_sen: 1080 },
          { amount_sen: 2500, tax_sen: 200, total_sen: 2700 }
        ])
        const before = stripe.requests.length
        const reply = ok(yield* call("POST", "/dashboard/billing/checkout", { token, json: { amount_sen: 1000 } }))
        expect(reply).toMatchObject({ amount_sen: 1000, tax_sen: 80, total_sen: 1080 })
        const [request] = stripe.requests.slice(before)
        expect(request!.form).toMatchObject({
          "line_items[0][price_data][unit_amount]": "1000",
          "line_items[0][price_data][product_data][name]": "nenas wallet top-up, RM 10.00",
          "line_items[1][price_data][unit_amount]": "80",
          "line_items[1][price_data][product_data][name]": "Service tax (SST) 8%"
        })
        const stored = yield* query<{ taxSen: number; taxRateBps: number }>(
          "SELECT tax_sen AS \"taxSen\", tax_rate_bps AS \"taxRateBps\" FROM payment_transactions WHERE id = $1",
          [reply.transaction_id]
        )
        expect(stored).toEqual([{ taxSen: 80, taxRateBps: 800 }])
      }))

    it.effect("a paid top-up credits the net amount and issues one invoice; a duplicate event issues none", () =>
      Effect.gen(function*() {
        const { accountId, token } = yield* developer("sst-invoice@example.my")
        ok(yield* putProfile(token, COMPANY_PROFILE))
        const payment = yield* topUp(token, 1000)
        expect(payment.amountSen, "Stripe charged the total").toBe(1080)
        expect(yield* wallet(accountId)).toBe(1000 * SEN)
        const ledger = ok(yield* call("GET", "/dashboard/billing/transactions", { token })).ledger
        expect(ledger).toHaveLength(1)
        expect(ledger[0]).toMatchObject({
          type: "topup",
          amountMicroMyr: 1000 * SEN,
          payment: { transaction_id: payment.transactionId, amount_sen: 1000, tax_sen: 80, total_sen: 1080 }
        })

        const [invoice, ...others] = yield* documents(token)
        expect(others).toEqual([])
        expect(invoice).toMatchObject({
          type: "invoice",
          type_code: "01",
          net_myr: 10,
          tax_myr: 0.8,
          total_myr: 10.8,
          // A buyer with a TIN: its own e-invoice, on its way to the simulated MyInvois (docs/api/e-invoices.md).
          e_invoice: { route: "single" }
        })
        expect(["pending", "submitted", "valid"]).toContain(invoice!.e_invoice.status)
        expect(invoice!.number).toMatch(/^INV-20\d\d-\d{6}$/)
        const full = yield* detail(token, invoice!.id)
        expect(full.buyer).toMatchObject({ legal_name: COMPANY_PROFILE.legal_name, tin: COMPANY_PROFILE.tin })
        expect(full.supplier.legal_name).toMatch(/sandbox/)
        expect(full.payment_reference).toBe(payment.paymentIntentId)
        expect(full.transaction_id).toBe(payment.transactionId)
        expect(full.lines).toEqual([{
          description: "nenas prepaid API credits (wallet top-up)",
          quantity: 1,
          unit_price_myr: 10,
          tax_rate_bps: 800,
          tax_myr: 0.8,
          subtotal_myr: 10,
          total_myr: 10.8,
          classification_code: "022"
        }])

        // The same event again, and another event for the same payment: nothing more.
        const again = events.checkoutCompleted(payment)
        for (const event of [again, again, events.checkoutCompleted(payment)]) {
          const reply = yield* deliverEvent(event)
          expect(reply.status, reply.text).toBe(200)
        }
        expect(yield* documents(token)).toHaveLength(1)
        expect(yield* wallet(accountId)).toBe(1000 * SEN)

        const issued = yield* query<{ payload: any }>(
          "SELECT payload FROM outbox_events WHERE account_id = $1 AND type = 'invoice.issued'",
          [accountId]
        )
        expect(issued).toHaveLength(1)
        expect(issued[0]!.payload.data).toMatchObject({
          invoice_id: invoice!.id,
          number: invoice!.number,
          type: "invoice",
          net_myr: 10,
          tax_myr: 0.8,
          total_myr: 10.8,
          references: null
        })
      }))

    it.effect("refunds move the wallet by their net part only, each with a refund note naming its invoice", () =>
      Effect.gen(function*() {
        const { accountId, token } = yield* developer("sst-refund@example.my")
        const payment = yield* topUp(token, 1000)
        const refund = (cumulativeSen: number) =>
          deliverEvent(events.chargeRefunded({ ...payment, amountSen: 1080, amountRefundedSen: cumulativeSen }))
        // Half of the RM 10.80 paid: RM 5.00 of credit and RM 0.40 of tax.
        expect(ok(yield* refund(540)).processed).toBe(true)
        expect(yield* wallet(accountId)).toBe(500 * SEN)
        const [note] = yield* documents(token, "?type=refund_note")
        expect(note).toMatchObject({ type_code: "04", net_myr: 5, tax_myr: 0.4, total_myr: 5.4 })
        const invoice = (yield* documents(token, "?type=invoice"))[0]!
        expect((yield* detail(token, note!.id)).references).toEqual({ id: invoice.id, number: invoice.number })
        // The same cumulative amount again is no refund.
        expect(ok(yield* refund(540)).processed).toBe(false)
        // 1 sen more: all of it credit (its tax rounds to none).
        expect(ok(yield* refund(541)).processed).toBe(true)
        expect(yield* wallet(accountId)).toBe(499 * SEN)
        // The rest: the wallet ends at exactly zero, the notes' parts add up to the invoice's.
        expect(ok(yield* refund(1080)).processed).toBe(true)
        expect(yield* wallet(accountId)).toBe(0)
        const notes = yield* documents(token, "?type=refund_note")
        expect(notes.map((n) => [n.net_myr, n.tax_myr])).toEqual([[4.99, 0.4], [0.01, 0], [5, 0.4]])
        const numbers = notes.map((n) => Number(n.number.slice(-6))).sort((a, b) => a - b)
        expect(numbers[2]! - numbers[0]!, "consecutive numbers").toBe(2)
        const debited = yield* query<{ sum: string }>(
          "SELECT SUM(amount_micro_myr)::text AS sum FROM ledger_entries WHERE account_id = $1 AND type = 'refund'",
          [accountId]
        )
        expect(Number(debited[0]!.sum)).toBe(-1000 * SEN)
      }))

    it.effect("a dispute debits its net part with a refund note; money won back issues a debit note", () =>
      Effect.gen(function*() {
        const { accountId, token } = yield* developer("sst-dispute@example.my")
        const payment = yield* topUp(token, 2500)
        const dispute = { disputeId: "dp_sst_dispute", ...payment, amountSen: 2700 }
        expect(ok(yield* deliverEvent(events.disputeCreated(dispute))).processed).toBe(true)
        expect(yield* wallet(accountId)).toBe(0)
        expect(ok(yield* deliverEvent(events.fundsReinstated(dispute))).processed).toBe(true)
        expect(yield* wallet(accountId)).toBe(2500 * SEN)
        const all = yield* documents(token)
        expect(all.map((d) => [d.type, d.type_code, d.net_myr, d.tax_myr, d.total_myr])).toEqual([
          ["debit_note", "03", 25, 2, 27],
          ["refund_note", "04", 25, 2, 27],
          ["invoice", "01", 25, 2, 27]
        ])
        expect(all[0]!.number).toMatch(/^DN-/)
        // Delivered again, in any order: nothing more.
        yield* deliverEvent(events.fundsReinstated(dispute))
        yield* deliverEvent(events.disputeCreated(dispute))
        expect(yield* documents(token)).toHaveLength(3)
      }))

    it.effect("a profile change applies to documents issued after it; an issued one keeps its buyer", () =>
      Effect.gen(function*() {
        const { accountId, token } = yield* developer("sst-profile@example.my")
        // No profile: the account's own name (or email), no TIN.
        yield* topUp(token, 1000)
        const [first] = yield* documents(token)
        expect((yield* detail(token, first!.id)).buyer).toMatchObject({ tin: null, email: "sst-profile@example.my" })
        ok(yield* putProfile(token, COMPANY_PROFILE))
        ok(yield* putProfile(token, { ...COMPANY_PROFILE, legal_name: "Contoh Baru Sdn. Bhd.", tin: "C9876543210" }))
        yield* topUp(token, 1000)
        const [second] = yield* documents(token)
        expect((yield* detail(token, second!.id)).buyer).toMatchObject({ legal_name: "Contoh Baru Sdn. Bhd." })
        expect((yield* detail(token, first!.id)).buyer).toMatchObject({ tin: null })
        const audit = yield* query<{ action: string; details: any }>(
          "SELECT action, details FROM audit_log WHERE account_id = $1 AND action = 'billing.profile_updated' ORDER BY created_at",
          [accountId]
        )
        expect(audit.map((entry) => entry.details.fields)).toEqual([
          ["legal_name", "tin", "id_type", "id_value", "email", "phone", "address"],
          ["legal_name", "tin"]
        ])
        // The audit log names the fields changed, never the buyer's details.
        expect(JSON.stringify(audit)).not.toContain("C9876543210")
        const read = ok(yield* call("GET", "/dashboard/billing/profile", { token }))
        expect(read.profile).toMatchObject({ legal_name: "Contoh Baru Sdn. Bhd.", tin: "C9876543210" })
      }))

    it.effect("every bad field answers 400 naming it; hostile text is refused like any kept field", () =>
      Effect.gen(function*() {
        const { token } = yield* developer("sst-bad-profile@example.my")
        expect(ok(yield* call("GET", "/dashboard/billing/profile", { token }))).toEqual({ profile: null })
        const cases: ReadonlyArray<readonly [unknown, string]> = [
          [{ ...COMPANY_PROFILE, tin: "123" }, "tin"],
          [{ ...COMPANY_PROFILE, address: { ...COMPANY_PROFILE.address, state_code: "99" } }, "address.state_code"],
          [{ ...COMPANY_PROFILE, address: { ...COMPANY_PROFILE.address, postcode: "504" } }, "address.postcode"],
          [{ ...COMPANY_PROFILE, id_value: "12" }, "id_value"],
          [{ ...COMPANY_PROFILE, legal_name: "Contoh\u0000" }, "legal_name"],
          [{ ...COMPANY_PROFILE, legal_name: "Contoh \uD800" }, "legal_name"],
          [{ ...COMPANY_PROFILE, phone: "x".repeat(1_000_000) }, "phone"],
          [{ ...COMPANY_PROFILE, sst_numbr: "W10-1808-32000001" }, "sst_numbr"],
          [{ ...COMPANY_PROFILE, address: { ...COMPANY_PROFILE.address, county: "x" } }, "address.county"]
        ]
        for (const [json, param] of cases) {
          const reply = yield* putProfile(token, json)
          expect(reply.status, `${param}: ${reply.text.slice(0, 300)}`).toBe(400)
          expect(reply.body.error.code).toBe("invalid_request")
          expect(reply.body.error.param).toBe(param)
          expect(reply.body.error.message).toContain(param)
        }
        // 10 MB of legal name: refused before it is read, as every body past 8 MiB is.
        const huge = yield* putProfile(token, { ...COMPANY_PROFILE, legal_name: "x".repeat(10_000_000) })
        expect(huge.status, huge.text.slice(0, 300)).toBe(413)
        expect(huge.body.error.code).toBe("context_length_exceeded")
        expect(ok(yield* call("GET", "/dashboard/billing/profile", { token }))).toEqual({ profile: null })
      }))

    it.effect("the PDF reads back: number, both TINs, the tax line and the total; another account's is 404", () =>
      Effect.gen(function*() {
        const { token } = yield* developer("sst-pdf@example.my")
        ok(yield* putProfile(token, COMPANY_PROFILE))
        yield* topUp(token, 1000)
        const [invoice] = yield* documents(token)
        const pdf = yield* pdfOf(token, invoice!.id)
        expect(pdf.status).toBe(200)
        expect(pdf.headers.get("content-type")).toBe("application/pdf")
        expect(pdf.headers.get("content-disposition")).toBe(`attachment; filename="${invoice!.number}.pdf"`)
        expect(new TextDecoder().decode(pdf.bytes.slice(0, 5))).toBe("%PDF-")
        for (
          const text of [invoice!.number, "C25845632020", COMPANY_PROFILE.tin, "Service tax 8%", "RM 0.80", "RM 10.80"]
        ) {
          expect(pdf.text, text).toContain(text)
        }
        // Pending, or validated already by the simulated MyInvois (test/server/billing/eInvoicePdf.test.ts reads its QR).
        expect(pdf.text).toMatch(/e-Invoice pending validation|e-Invoice validated by MyInvois/)
        const other = yield* developer("sst-pdf-other@example.my")
        expect((yield* pdfOf(other.token, invoice!.id)).status).toBe(404)
        expect((yield* call("GET", `/dashboard/billing/invoices/${invoice!.id}`, { token: other.token })).status)
          .toBe(404)
      }))

    it.effect("the list filters by type and dates, and refuses what it does not take", () =>
      Effect.gen(function*() {
        const { token } = yield* developer("sst-list@example.my")
        const payment = yield* topUp(token, 1000)
        yield* deliverEvent(events.chargeRefunded({ ...payment, amountSen: 1080, amountRefundedSen: 1080 }))
        expect((yield* documents(token)).map((d) => d.type)).toEqual(["refund_note", "invoice"])
        expect((yield* documents(token, "?type=invoice")).map((d) => d.type)).toEqual(["invoice"])
        expect(yield* documents(token, "?from=2999-01-01T00:00:00Z")).toEqual([])
        expect(yield* documents(token, "?to=2000-01-01T00:00:00Z")).toEqual([])
        expect(yield* documents(token, "?limit=1&page=2")).toHaveLength(1)
        for (const [params, param] of [["?type=receipt", "type"], ["?colour=red", "colour"]] as const) {
          const reply = yield* call("GET", `/dashboard/billing/invoices${params}`, { token })
          expect(reply.status, reply.text).toBe(400)
          expect(reply.body.error.param).toBe(param)
        }
      }))
  }
)

layer(testServerWithStripe(), { excludeTestServices: true, timeout: 60_000 })("invoices without service tax", (it) => {
  describe("SST_RATE_BPS=0 (the default)", () => {
    it.effect("nothing changes but the invoice: no tax line, the amount charged as before", () =>
      Effect.gen(function*() {
        const stripe = yield* StripeDouble
        const { accountId, token } = yield* developer("no-sst@example.my")
        const before = stripe.requests.length
        const payment = yield* topUp(token, 2500)
        expect(payment.amountSen).toBe(2500)
        expect(Object.keys(stripe.requests[before]!.form).some((field) => field.startsWith("line_items[1]")))
          .toBe(false)
        expect(yield* wallet(accountId)).toBe(2500 * SEN)
        const [invoice] = yield* documents(token)
        expect(invoice).toMatchObject({ net_myr: 25, tax_myr: 0, total_myr: 25 })
        const pdf = yield* pdfOf(token, invoice!.id)
        expect(pdf.text).toMatch(/Service tax\s+—\s+not charged/)
        yield* deliverEvent(events.chargeRefunded({ ...payment, amountRefundedSen: 1000 }))
        expect(yield* wallet(accountId)).toBe(1500 * SEN)
      }))
  })
})

layer(TestServerLive({ ...webhookOverrides, sstRateBps: 800 }), { excludeTestServices: true, timeout: 60_000 })(
  "the walkthrough, on the simulated checkout",
  (it) => {
    it.effect("pay RM 10.80, refund half through the development route, see the refund note", () =>
      Effect.gen(function*() {
        const { accountId, token } = yield* developer("walkthrough-sst@example.my")
        ok(yield* putProfile(token, COMPANY_PROFILE))
        const created = ok(yield* call("POST", "/dashboard/billing/checkout", { token, json: { amount_sen: 1000 } }))
        const path = `/dev/checkout/${created.session_id}`
        const page = yield* call("GET", path)
        expect(page.text).toContain("Service tax (SST) 8%")
        expect(page.text).toContain("RM 10.80")
        // Only a paid checkout can be refunded.
        expect((yield* call("POST", `${path}/refund`, { json: { amount_sen: 540 } })).status).toBe(400)
        expect((yield* call("POST", `${path}/pay`)).status).toBe(200)
        expect(yield* wallet(accountId)).toBe(1000 * SEN)
        const half = ok(yield* call("POST", `${path}/refund`, { json: { amount_sen: 540 } }))
        expect(half.amount_refunded_sen).toBe(540)
        expect(yield* wallet(accountId)).toBe(500 * SEN)
        const [note] = yield* documents(token, "?type=refund_note")
        expect(note).toMatchObject({ net_myr: 5, tax_myr: 0.4, total_myr: 5.4 })
        expect((yield* detail(token, note!.id)).references.number).toMatch(/^INV-/)
        // More than is left is capped at what was paid: the wallet ends at zero, never below.
        expect(ok(yield* call("POST", `${path}/refund`, { json: { amount_sen: 5000 } })).amount_refunded_sen).toBe(1080)
        expect(yield* wallet(accountId)).toBe(0)
        expect(yield* documents(token, "?type=refund_note")).toHaveLength(2)
      }))
  }
)
