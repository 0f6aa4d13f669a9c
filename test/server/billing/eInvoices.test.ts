import { expect, layer } from "@effect/vitest"
import { Duration, Effect, Layer, Option, Redacted } from "effect"
import { execFile } from "node:child_process"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { promisify } from "node:util"
import { SANDBOX_SUPPLIER } from "../../../src/AppConfig.js"
import { COMPANY_PROFILE, UNREGISTERED_TIN } from "../../support/BillingProfile.js"
import { certificate } from "../../support/Certificates.js"
import { call } from "../../support/Http.js"
import { MyInvoisStandIn, MyInvoisStandInLive } from "../../support/MyInvoisStandIn.js"
import { realSleep } from "../../support/RealTime.js"
import { simulatedTopUp } from "../../support/Stripe.js"
import { query, TestServer, TestServerLive } from "../../support/TestServer.js"
import { developer } from "../../support/Wallet.js"

/**
 * E-invoices through the real server and the real MyInvois client, against a stand-in of MyInvois' API on
 * 127.0.0.1 (docs/api/e-invoices.md): who gets what, submission through outages and throttling, the
 * lifecycle (a rejection mended and resubmitted, refunds inside and outside 72 hours) and a month of 1,000
 * receipts consolidated twice. Top-ups go through the simulated checkout; the server's clock and the
 * stand-in's move together when a test jumps hours ahead.
 */

const PORTAL = "https://preprod.myinvois.hasil.gov.my"

interface EInvoiceView {
  readonly status: string
  readonly uuid: string | null
  readonly validation_url: string | null
  readonly validated_at: string | null
  readonly errors: ReadonlyArray<{ readonly code: string; readonly message: string; readonly target: string | null }>
  readonly route: string
  readonly number: string | null
  readonly overdue: boolean
}
interface Summary {
  readonly id: string
  readonly number: string
  readonly type: string
  readonly e_invoice: EInvoiceView
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

const documentNamed = (token: string, number: string) =>
  Effect.map(documents(token), (all) => {
    const found = all.find((document) => document.number === number)
    expect(found, number).toBeDefined()
    return found!
  })

/** Polls until `number`'s e-invoice is in `status` (at most 20 s of real time). */
const until = (token: string, number: string, status: string) =>
  Effect.gen(function*() {
    for (let tries = 0; tries < 200; tries++) {
      const document = yield* documentNamed(token, number)
      if (document.e_invoice.status === status) return document
      yield* realSleep(100)
    }
    const last = yield* documentNamed(token, number)
    return expect.fail(`${number} stayed ${last.e_invoice.status}, not ${status}: ${JSON.stringify(last.e_invoice)}`)
  })

const putProfile = (token: string, profile: unknown) =>
  Effect.map(call("PUT", "/dashboard/billing/profile", { token, json: profile }), ok)

/** Moves the server's clock and the stand-in's together. */
const advance = (duration: Duration.DurationInput) =>
  Effect.gen(function*() {
    const { clock } = yield* TestServer
    const standIn = yield* MyInvoisStandIn
    clock.advance(duration)
    standIn.advance(Duration.toMillis(duration))
  })

/** How often the stand-in was sent a document of this number. */
const submissionsOf = (number: string) =>
  Effect.map(
    MyInvoisStandIn,
    (standIn) => standIn.submissions.filter((submission) => submission.codeNumbers.includes(number)).length
  )

const eventsOf = (type: string, invoiceId: string) =>
  Effect.map(
    query<{ n: number }>(
      "SELECT count(*)::int AS n FROM outbox_events WHERE type = $1 AND payload->'data'->>'invoice_id' = $2",
      [type, invoiceId]
    ),
    (rows) => rows[0]?.n ?? 0
  )

const ServerWithMyInvois = Layer.unwrapEffect(Effect.map(MyInvoisStandIn, (standIn) =>
  TestServerLive({
    myinvoisBaseUrl: Option.some(standIn.url),
    myinvoisClientId: Option.some("nenas-erp"),
    myinvoisClientSecret: Option.some(Redacted.make("erp-secret")),
    myinvoisPortalUrl: PORTAL,
    eInvoicePollMs: 100
  }))).pipe(Layer.provideMerge(MyInvoisStandInLive))

layer(ServerWithMyInvois, { excludeTestServices: true, timeout: 120_000 })("e-invoices through MyInvois", (it) => {
  it.effect("a buyer with a TIN: its invoice is submitted on its own, validated, linked and announced once", () =>
    Effect.gen(function*() {
      const standIn = yield* MyInvoisStandIn
      const { token } = yield* developer("einvoice-b2b@example.my")
      yield* putProfile(token, COMPANY_PROFILE)
      yield* simulatedTopUp(token, 1000)
      const [invoice] = yield* documents(token)
      expect(invoice!.e_invoice.route).toBe("single")
      const valid = yield* until(token, invoice!.number, "valid")
      expect(valid.e_invoice.number).toBe(invoice!.number)
      const uuid = valid.e_invoice.uuid!
      const inStandIn = standIn.sim.documents().find((document) => document.uuid === uuid)!
      expect(inStandIn.codeNumber).toBe(invoice!.number)
      expect(inStandIn.status).toBe("Valid")
      expect(valid.e_invoice.validation_url).toBe(`${PORTAL}/${uuid}/share/${inStandIn.longId}`)
      expect(yield* submissionsOf(invoice!.number)).toBe(1)
      // The buyer as the document names it; the supplier's TIN is the one behind the client id.
      const sent = JSON.stringify(inStandIn.document)
      expect(sent).toContain("C1234567890")
      expect(sent).toContain("C25845632020")
      expect(standIn.logins, "the token is kept").toBeLessThanOrEqual(1)
      yield* realSleep(500)
      expect(yield* eventsOf("e_invoice.validated", invoice!.id), "once per document").toBe(1)
      const detail = ok(yield* call("GET", `/dashboard/billing/invoices/${invoice!.id}`, { token }))
      expect(detail.e_invoice).toMatchObject({ status: "valid", uuid, overdue: false })
    }))

  it.effect("a buyer without a TIN waits for the month's consolidated e-invoice: nothing is submitted for it", () =>
    Effect.gen(function*() {
      const { token } = yield* developer("einvoice-b2c@example.my")
      yield* simulatedTopUp(token, 1000)
      const [invoice] = yield* documents(token)
      yield* realSleep(1_000)
      const waiting = yield* documentNamed(token, invoice!.number)
      expect(waiting.e_invoice).toMatchObject({
        status: "pending",
        route: "consolidated",
        number: null,
        overdue: false
      })
      expect(yield* submissionsOf(invoice!.number)).toBe(0)
    }))

  it.effect("a rejection keeps MyInvois' errors and tells the account; after a profile fix, a resubmission is valid", () =>
    Effect.gen(function*() {
      const standIn = yield* MyInvoisStandIn
      const { accountId, token } = yield* developer("einvoice-rejected@example.my")
      yield* putProfile(token, { ...COMPANY_PROFILE, tin: UNREGISTERED_TIN })
      yield* simulatedTopUp(token, 1000)
      const [invoice] = yield* documents(token)
      const invalid = yield* until(token, invoice!.number, "invalid")
      expect(invalid.e_invoice.errors.length).toBeGreaterThan(0)
      expect(JSON.stringify(invalid.e_invoice.errors)).toContain(UNREGISTERED_TIN)
      yield* realSleep(300)
      expect(yield* eventsOf("e_invoice.rejected", invoice!.id)).toBe(1)
      const emails = yield* query<{ subject: string }>(
        "SELECT subject FROM outbox_emails WHERE account_id = $1 AND subject LIKE '%rejected%'",
        [accountId]
      )
      expect(emails.map((email) => email.subject)).toEqual([`MyInvois rejected the e-invoice of ${invoice!.number}`])

      // A valid document is not resubmitted; the fix first, then the resubmission with the profile as it is now.
      yield* putProfile(token, COMPANY_PROFILE)
      const resubmitted = ok(yield* call("POST", `/dashboard/billing/invoices/${invoice!.id}/resubmit`, { token }))
      expect(resubmitted.e_invoice).toMatchObject({ status: "pending", errors: [] })
      expect(resubmitted.buyer.tin, "the document keeps what it was issued with").toBe(UNREGISTERED_TIN)
      const valid = yield* until(token, invoice!.number, "valid")
      const sent = standIn.sim.documents().find((document) => document.uuid === valid.e_invoice.uuid)!
      expect(JSON.stringify(sent.document)).toContain("C1234567890")
      expect(yield* submissionsOf(invoice!.number)).toBe(2)
      const again = yield* call("POST", `/dashboard/billing/invoices/${invoice!.id}/resubmit`, { token })
      expect(again.status).toBe(400)
      expect(again.body.error.param).toBe("id")
      const audit = yield* query<{ action: string }>(
        "SELECT action FROM audit_log WHERE account_id = $1 AND action = 'billing.e_invoice_resubmitted'",
        [accountId]
      )
      expect(audit).toHaveLength(1)
    }))

  it.effect("a full refund within 72 hours cancels the e-invoice, its earlier note first; no refund note is submitted", () =>
    Effect.gen(function*() {
      const standIn = yield* MyInvoisStandIn
      const { token } = yield* developer("einvoice-refund-inside@example.my")
      yield* putProfile(token, COMPANY_PROFILE)
      const { sessionId } = yield* simulatedTopUp(token, 1000)
      const [invoice] = yield* documents(token)
      const valid = yield* until(token, invoice!.number, "valid")
      // A partial refund first: its refund note is an e-invoice of its own, referencing the invoice.
      ok(yield* call("POST", `/dev/checkout/${sessionId}/refund`, { json: { amount_sen: 400 } }))
      const [first] = yield* documents(token, "?type=refund_note")
      const firstValid = yield* until(token, first!.number, "valid")
      const firstSent = standIn.sim.documents().find((document) => document.uuid === firstValid.e_invoice.uuid)!
      expect(JSON.stringify(firstSent.document)).toContain(valid.e_invoice.uuid!)
      // The rest: the refund is now full.
      ok(yield* call("POST", `/dev/checkout/${sessionId}/refund`, { json: { amount_sen: 600 } }))
      const notes = yield* documents(token, "?type=refund_note")
      const second = notes.find((note) => note.number !== first!.number)!
      yield* until(token, invoice!.number, "cancelled")
      yield* until(token, first!.number, "cancelled")
      yield* until(token, second.number, "cancelled")
      expect(yield* submissionsOf(second.number), "no e-invoice of its own").toBe(0)
      const states = standIn.sim.documents().filter((document) =>
        [valid.e_invoice.uuid, firstValid.e_invoice.uuid].includes(document.uuid)
      )
      expect(states.map((document) => document.status)).toEqual(["Cancelled", "Cancelled"])
    }))

  it.effect("a full refund later than 72 hours submits the refund note, referencing the original's UUID", () =>
    Effect.gen(function*() {
      const standIn = yield* MyInvoisStandIn
      const signedIn = yield* developer("einvoice-refund-late@example.my")
      yield* putProfile(signedIn.token, COMPANY_PROFILE)
      const { sessionId } = yield* simulatedTopUp(signedIn.token, 1000)
      const [invoice] = yield* documents(signedIn.token)
      const valid = yield* until(signedIn.token, invoice!.number, "valid")
      yield* advance(Duration.hours(73))
      // The session has expired meanwhile: signed in again.
      const { token } = yield* developer("einvoice-refund-late@example.my")
      ok(yield* call("POST", `/dev/checkout/${sessionId}/refund`, { json: { amount_sen: 1000 } }))
      const [note] = yield* documents(token, "?type=refund_note")
      const noteValid = yield* until(token, note!.number, "valid")
      const sent = standIn.sim.documents().find((document) => document.uuid === noteValid.e_invoice.uuid)!
      expect(JSON.stringify(sent.document)).toContain(valid.e_invoice.uuid!)
      expect((yield* documentNamed(token, invoice!.number)).e_invoice.status).toBe("valid")
    }))
})

layer(ServerWithMyInvois, { excludeTestServices: true, timeout: 120_000 })(
  "submission through MyInvois' failures",
  (it) => {
    it.effect("an outage of an hour: retried with back-off, then submitted once, nothing lost", () =>
      Effect.gen(function*() {
        const standIn = yield* MyInvoisStandIn
        const { token } = yield* developer("einvoice-outage@example.my")
        yield* putProfile(token, COMPANY_PROFILE)
        standIn.outage(true)
        yield* simulatedTopUp(token, 1000)
        const [invoice] = yield* documents(token)
        const before = standIn.requests.length
        // An hour passes in six steps; each step the worker tries again when its back-off allows.
        for (let step = 0; step < 6; step++) {
          yield* advance(Duration.minutes(10))
          yield* realSleep(400)
        }
        const tried = standIn.requests.length - before
        expect(tried, "it kept trying").toBeGreaterThan(2)
        expect(tried, "with back-off, not every poll").toBeLessThan(40)
        expect((yield* documentNamed(token, invoice!.number)).e_invoice.status).toBe("pending")
        standIn.outage(false)
        // The back-off may have reached an hour: the next attempt comes within it.
        for (let step = 0; step < 12; step++) {
          const now = yield* documentNamed(token, invoice!.number)
          if (now.e_invoice.status === "valid") break
          yield* advance(Duration.minutes(10))
          yield* realSleep(400)
        }
        yield* until(token, invoice!.number, "valid")
        expect(yield* submissionsOf(invoice!.number), "submitted once").toBe(1)
      }))

    it.effect("not valid 24 hours after its issue: overdue on the document and in the metric, until it is valid", () =>
      Effect.gen(function*() {
        const standIn = yield* MyInvoisStandIn
        const { baseUrl } = yield* TestServer
        const signedIn = yield* developer("einvoice-overdue@example.my")
        yield* putProfile(signedIn.token, COMPANY_PROFILE)
        standIn.outage(true)
        yield* simulatedTopUp(signedIn.token, 1000)
        const [invoice] = yield* documents(signedIn.token)
        const overdueMetric = () =>
          Effect.promise(async () => {
            const text = await (await fetch(`${baseUrl}/metrics`)).text()
            return Number(/^nenas_e_invoices_overdue (\d+)/m.exec(text)?.[1] ?? "NaN")
          })
        const before = yield* overdueMetric()
        expect(invoice!.e_invoice.overdue).toBe(false)
        // Its first attempt (which issues the e-invoice) meets the outage; then a day passes.
        const attempts = standIn.requests.length
        for (let tries = 0; tries < 100 && standIn.requests.length === attempts; tries++) yield* realSleep(50)
        yield* advance(Duration.hours(25))
        const { token } = yield* developer("einvoice-overdue@example.my")
        const late = yield* documentNamed(token, invoice!.number)
        expect(late.e_invoice.overdue, JSON.stringify(late)).toBe(true)
        expect(yield* overdueMetric()).toBeGreaterThan(before)
        standIn.outage(false)
        for (let step = 0; step < 12; step++) {
          if ((yield* documentNamed(token, invoice!.number)).e_invoice.status === "valid") break
          yield* advance(Duration.minutes(30))
          yield* realSleep(400)
        }
        const valid = yield* until(token, invoice!.number, "valid")
        expect(valid.e_invoice.overdue).toBe(false)
        expect(yield* submissionsOf(invoice!.number)).toBe(1)
      }))

    it.effect("429 with Retry-After: nothing is sent again before it", () =>
      Effect.gen(function*() {
        const standIn = yield* MyInvoisStandIn
        const { token } = yield* developer("einvoice-throttled@example.my")
        yield* putProfile(token, COMPANY_PROFILE)
        standIn.throttle(1, 120)
        yield* simulatedTopUp(token, 1000)
        const [invoice] = yield* documents(token)
        yield* realSleep(1_500)
        const posts = () =>
          standIn.requests.filter((request) =>
            request.method === "POST" && request.path.includes("documentsubmissions")
          )
            .length
        const throttled = posts()
        expect(throttled).toBeGreaterThanOrEqual(1)
        yield* realSleep(1_000)
        expect(posts(), "waits for Retry-After").toBe(throttled)
        expect((yield* documentNamed(token, invoice!.number)).e_invoice.status).toBe("pending")
        yield* advance(Duration.seconds(121))
        yield* until(token, invoice!.number, "valid")
        expect(yield* submissionsOf(invoice!.number)).toBe(1)
      }))
  }
)

const run = promisify(execFile)

layer(ServerWithMyInvois, { excludeTestServices: true, timeout: 240_000 })("a month consolidated", (it) => {
  it.effect("1,000 receipts of an ended month, consolidated twice: submitted once, each part within 300 KB", () =>
    Effect.gen(function*() {
      const standIn = yield* MyInvoisStandIn
      const { databaseUrl } = yield* TestServer
      const { accountId, token } = yield* developer("einvoice-month@example.my")
      // 1,000 receipts of October 2025 issued with every other number (a B2B document between each two):
      // 1,000 lines, in 7 parts of at most 150.
      const buyer = {
        legal_name: "einvoice-month@example.my",
        tin: null,
        id_type: null,
        id_value: null,
        sst_number: null,
        msic: null,
        email: "einvoice-month@example.my",
        phone: null,
        address: null
      }
      const line = {
        description: "Prepaid credit top-up",
        quantity: 1,
        unitPriceSen: 1000,
        taxRateBps: 800,
        netSen: 1000,
        taxSen: 80,
        classificationCode: "022"
      }
      yield* query(
        `INSERT INTO billing_documents (id, account_id, type, number, year, sequence, issued_at, effect_key, supplier,
           buyer, lines, tax_rate_bps, net_sen, tax_sen, total_sen)
         SELECT 'doc_m' || n, $1, 'invoice', 'INV-2025-' || lpad((n * 2 - 1)::text, 6, '0'), 2025, n * 2 - 1,
           timestamptz '2025-10-01 00:00:00+08' + (n || ' minutes')::interval, 'month-test-' || n,
           $2::jsonb, $3::jsonb, $4::jsonb, 800, 1000, 80, 1080
         FROM generate_series(1, 1000) n`,
        [accountId, JSON.stringify(SANDBOX_SUPPLIER), JSON.stringify(buyer), JSON.stringify([line])]
      )
      const inserted = yield* query<{ n: number }>(
        "SELECT count(*)::int AS n FROM billing_documents WHERE account_id = $1",
        [accountId]
      )
      expect(inserted[0]!.n).toBe(1000)
      // By hand from the command line (an ended month), then again through the development route.
      const cli = yield* Effect.promise(() =>
        run(process.execPath, ["--import", "tsx", "src/Invoices/ConsolidateMonth.ts", "--month", "2025-10"], {
          env: { ...process.env, DATABASE_URL: databaseUrl }
        })
      )
      expect(cli.stdout).toContain("CON-INV-2025-10-001: 150 documents in 150 lines")
      expect(cli.stdout).toContain("CON-INV-2025-10-007: 100 documents in 100 lines")
      const twice = ok(yield* call("POST", "/dev/e-invoices/consolidate", { json: { month: "2025-10" } }))
      expect(twice).toEqual({ month: "2025-10", early: false, e_invoices: [] })
      const numbers = Array.from({ length: 7 }, (_, index) => `CON-INV-2025-10-00${index + 1}`)
      for (let tries = 0; tries < 300; tries++) {
        const states = yield* query<{ status: string }>(
          "SELECT status FROM e_invoices WHERE month = '2025-10'"
        )
        if (states.length === 7 && states.every((state) => state.status === "valid")) break
        yield* realSleep(100)
      }
      for (const number of numbers) expect(yield* submissionsOf(number), number).toBe(1)
      for (const document of standIn.sim.documents().filter((document) => numbers.includes(document.codeNumber))) {
        expect(Buffer.byteLength(JSON.stringify(document.document))).toBeLessThan(300 * 1024)
        expect(JSON.stringify(document.document)).toContain("EI00000000010")
      }
      const summaries = yield* documents(token, "?limit=100")
      expect(
        summaries.every((summary) => summary.e_invoice.status === "valid" && summary.e_invoice.route === "consolidated")
      )
        .toBe(true)
      // A month that has not ended is refused by the command line.
      const early = yield* Effect.promise(() =>
        run(process.execPath, ["--import", "tsx", "src/Invoices/ConsolidateMonth.ts", "--month", "2099-01"], {
          env: { ...process.env, DATABASE_URL: databaseUrl }
        }).then(() => "", (error: { stderr: string }) => error.stderr)
      )
      expect(early).toContain("2099-01 has not begun")
    }))

  it.effect("the current month closed early: its refund note is consolidated too, referencing the consolidated invoice", () =>
    Effect.gen(function*() {
      const standIn = yield* MyInvoisStandIn
      const { token } = yield* developer("einvoice-early@example.my")
      const { sessionId } = yield* simulatedTopUp(token, 2500)
      ok(yield* call("POST", `/dev/checkout/${sessionId}/refund`, { json: { amount_sen: 500 } }))
      const month = new Intl.DateTimeFormat("en-CA", {
        timeZone: "Asia/Kuala_Lumpur",
        year: "numeric",
        month: "2-digit"
      })
        .format(new Date()).slice(0, 7)
      const closed = ok(yield* call("POST", "/dev/e-invoices/consolidate", { json: { month } }))
      expect(closed.early).toBe(true)
      expect(closed.e_invoices.map((part: { number: string }) => part.number)).toEqual([
        `CON-INV-${month}-001`,
        `CON-RN-${month}-001`
      ])
      const [note] = yield* documents(token, "?type=refund_note")
      const [invoice] = yield* documents(token, "?type=invoice")
      const invoiceValid = yield* until(token, invoice!.number, "valid")
      const noteValid = yield* until(token, note!.number, "valid")
      expect(noteValid.e_invoice.number).toBe(`CON-RN-${month}-001`)
      const sent = standIn.sim.documents().find((document) => document.uuid === noteValid.e_invoice.uuid)!
      expect(JSON.stringify(sent.document)).toContain(invoiceValid.e_invoice.uuid!)
      // A top-up after the early close goes into a supplementary part of the same month.
      yield* simulatedTopUp(token, 1000)
      const later = ok(yield* call("POST", "/dev/e-invoices/consolidate", { json: { month } }))
      expect(later.e_invoices.map((part: { number: string }) => part.number)).toEqual([`CON-INV-${month}-002`])
      // What is not a month is refused, naming it.
      const refused = yield* call("POST", "/dev/e-invoices/consolidate", { json: { month: "2026-13" } })
      expect(refused.status).toBe(400)
      expect(refused.body.error.param).toBe("month")
    }))
})

/** The supplier's key and certificate as PEM files, as production sets them. */
const signingFiles = () => {
  const dir = mkdtempSync(join(tmpdir(), "nenas-signing-"))
  const { certPem, keyPem } = certificate()
  writeFileSync(join(dir, "key.pem"), keyPem, { mode: 0o600 })
  writeFileSync(join(dir, "cert.pem"), certPem)
  return { key: join(dir, "key.pem"), cert: join(dir, "cert.pem") }
}

const SignedServer = Layer.unwrapEffect(Effect.map(MyInvoisStandIn, (standIn) => {
  const files = signingFiles()
  return TestServerLive({
    myinvoisBaseUrl: Option.some(standIn.url),
    myinvoisClientId: Option.some("nenas-erp"),
    myinvoisClientSecret: Option.some(Redacted.make("erp-secret")),
    myinvoisSigningKey: Option.some(files.key),
    myinvoisSigningCert: Option.some(files.cert),
    eInvoicePollMs: 100
  })
})).pipe(Layer.provideMerge(MyInvoisStandInLive))

layer(SignedServer, { excludeTestServices: true, timeout: 60_000 })("signed e-invoices", (it) => {
  it.effect("with MYINVOIS_SIGNING_KEY and _CERT, documents are version 1.1, signed, and validated", () =>
    Effect.gen(function*() {
      const standIn = yield* MyInvoisStandIn
      const { token } = yield* developer("einvoice-signed@example.my")
      yield* putProfile(token, COMPANY_PROFILE)
      yield* simulatedTopUp(token, 1000)
      const [invoice] = yield* documents(token)
      const valid = yield* until(token, invoice!.number, "valid")
      const sent = standIn.sim.documents().find((document) => document.uuid === valid.e_invoice.uuid)!
      const text = JSON.stringify(sent.document)
      expect(text).toContain("\"listVersionID\":\"1.1\"")
      expect(text).toContain("urn:oasis:names:specification:ubl:dsig:enveloped:xades")
      expect(text).toContain("\"X509SerialNumber\"")
    }))
})
