import { layer } from "@effect/vitest"
import { Effect } from "effect"
import { readFile } from "node:fs/promises"
import { PDFParse } from "pdf-parse"
import type { Download, Locator, Page } from "playwright-core"
import { beforeAll, expect } from "vitest"
import { simulatedLayer } from "../../src/EInvoicing/MyInvois.js"
import { COMPANY_PROFILE, UNREGISTERED_TIN } from "../support/BillingProfile.js"
import {
  DESKTOP,
  ensureDashboardBuilt,
  goTo,
  heading,
  inBrowser,
  overflowAtPhoneWidth,
  PHONE,
  screenshots,
  signIn,
  strictPage
} from "../support/Browser.js"
import { call, devToken } from "../support/Http.js"
import { realSleep } from "../support/RealTime.js"
import { simulatedTopUp } from "../support/Stripe.js"
import { TestServer, TestServerLive } from "../support/TestServer.js"

/**
 * Service tax, the billing profile and invoices in the dashboard, in a real browser (Debian's Chromium
 * via playwright-core) against the whole service with SST at 8% (docs/api/invoices.md): the tax beside
 * each top-up, the profile form refusing a bad TIN under its field and saving the fixed one, a top-up
 * through the simulated checkout, and its invoice on the Invoices page with its PDF downloaded and its e-invoice
 * validated; an e-invoice MyInvois rejects (docs/api/e-invoices.md, "Lifecycle"), overdue a day later, mended
 * through the profile and resubmitted; then the form read-only for a viewer, who cannot resubmit. The simulated
 * MyInvois validates at once and the worker polls every 100 ms. Screenshots at desktop and phone width go to
 * test-results/dashboard/.
 */

beforeAll(ensureDashboardBuilt, 180_000)

/** The form field labelled `label`: its control, and the service's message beneath it. */
const field = (page: Page, label: string) => {
  const box = page.locator(".field").filter({ has: page.getByText(label, { exact: true }) })
  return { control: page.getByLabel(label, { exact: true }), error: box.locator(".field-error") }
}

const text = async (locator: Locator) => (await locator.textContent()) ?? ""

/** The download's name and its bytes' first characters, with the text pdf-parse reads from it. */
const downloaded = async (download: Download) => {
  const path = await download.path()
  const bytes = new Uint8Array(await readFile(path))
  // pdf-parse takes its buffer over (detaches it): it reads a copy.
  const pdfText = (await new PDFParse({ data: bytes.slice() }).getText()).text
  return { name: download.suggestedFilename(), start: new TextDecoder().decode(bytes.slice(0, 5)), pdfText }
}

interface Listed {
  readonly id: string
  readonly number: string
  readonly e_invoice: {
    readonly status: string
    readonly validation_url: string | null
    readonly errors: ReadonlyArray<{ readonly code: string; readonly message: string; readonly target: string | null }>
    readonly route: string
    readonly number: string | null
    readonly overdue: boolean
  }
}

/** The account's documents, newest first, as the API lists them. */
const listed = (token: string) =>
  Effect.map(call("GET", "/dashboard/billing/invoices", { token }), (reply) => {
    expect(reply.status, reply.text).toBe(200)
    return reply.body.data as Array<Listed>
  })

/** Polls the API until the account's newest document's e-invoice is `status` (at most 15 s). */
const newestIn = (token: string, status: string) =>
  Effect.gen(function*() {
    for (let tries = 0; tries < 150; tries++) {
      const [newest] = yield* listed(token)
      if (newest?.e_invoice.status === status) return newest
      yield* realSleep(100)
    }
    const [last] = yield* listed(token)
    return expect.fail(`the newest document's e-invoice stayed ${JSON.stringify(last?.e_invoice)}, not ${status}`)
  })

const ServerLive = TestServerLive({ sstRateBps: 800, eInvoicePollMs: 100 }, {
  eInvoicing: simulatedLayer({ validateAfterMs: 0 })
})

layer(ServerLive, { excludeTestServices: true, timeout: 120_000 })(
  "service tax, the billing profile and invoices in the dashboard",
  (it) => {
    it.effect(
      "the tax beside each top-up; the profile refused under its field, then saved; the invoice listed and its PDF downloaded",
      () =>
        Effect.gen(function*() {
          const { baseUrl, clock } = yield* TestServer
          const email = "e2e-invoices@example.com"
          const token = yield* devToken(email)
          // Numbered per year in the business time zone (docs/api/invoices.md, "Documents").
          const year = new Intl.DateTimeFormat("en", { timeZone: "Asia/Kuala_Lumpur", year: "numeric" }).format(
            clock.unsafeCurrentTimeMillis()
          )
          const number = `INV-${year}-000001`

          yield* inBrowser(async (context) => {
            const { page, problems, failed } = await strictPage(context)
            await signIn(page, baseUrl, email)

            // Billing: each option with its 8% tax and what the card is charged; the amount alone is credited.
            await goTo(page, "Billing")
            const ten = page.getByRole("button", { name: /^Top up RM 10\.00 / })
            expect(await text(ten)).toBe("Top up RM 10.00 + RM 0.80 SST = RM 10.80")
            expect(await text(ten.locator(".topup-tax"))).toBe("+ RM 0.80 SST = RM 10.80")
            expect(await text(page.getByRole("button", { name: /^Top up RM 25\.00 / }))).toBe(
              "Top up RM 25.00 + RM 2.00 SST = RM 27.00"
            )
            await page.getByText("Service tax (SST) of 8% is added to each top-up").waitFor()
            await screenshots(page, "60-billing-sst")
            expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)

            // The billing profile: a TIN MyInvois would refuse is refused under the TIN field, and focused.
            await page.getByRole("link", { name: "Edit the buyer's details" }).click()
            await heading(page, "Billing profile").waitFor()
            await page.getByText("Not set yet: documents name the account only, without a TIN.").waitFor()
            await field(page, "Legal name").control.fill(COMPANY_PROFILE.legal_name)
            await field(page, "TIN").control.fill("C123")
            expect(await field(page, "ID type").control.inputValue()).toBe("BRN")
            await field(page, "ID number").control.fill(COMPANY_PROFILE.id_value)
            await field(page, "Email").control.fill(COMPANY_PROFILE.email)
            await field(page, "Phone").control.fill(COMPANY_PROFILE.phone)
            await field(page, "Address line 1").control.fill(COMPANY_PROFILE.address.line1)
            await field(page, "City").control.fill(COMPANY_PROFILE.address.city)
            await field(page, "Postcode").control.fill(COMPANY_PROFILE.address.postcode)
            const state = field(page, "State").control
            // The 17 MyInvois states, in code order, with a placeholder before them.
            expect(await state.locator("option").allTextContents()).toHaveLength(18)
            expect((await state.locator("option").allTextContents()).slice(1, 3)).toEqual(["Johor", "Kedah"])
            expect(await state.locator("option").last().textContent()).toBe("Not Applicable")
            await state.selectOption({ label: "Wilayah Persekutuan Kuala Lumpur" })
            expect(await field(page, "Country").control.inputValue()).toBe("MYS")
            await page.getByRole("button", { name: "Save the buyer's details" }).click()
            const tin = field(page, "TIN")
            await tin.error.waitFor()
            expect(await text(tin.error)).toMatch(/^Invalid 'tin': must be a MyInvois TIN: /)
            expect(await tin.control.getAttribute("aria-invalid")).toBe("true")
            expect(await page.evaluate<string>("document.activeElement.id")).toBe(await tin.control.getAttribute("id"))
            // Read with the field: its description names the message.
            const describedBy = (await tin.control.getAttribute("aria-describedby")) ?? ""
            expect(await page.locator(`[id="${describedBy.split(" ")[0]}"]`).textContent()).toBe(await text(tin.error))
            // Only that field: no other field's message, nothing above the form, not saved.
            expect(await page.locator(".field-error").count()).toBe(1)
            expect(await page.locator(".error").count()).toBe(0)
            expect(await page.getByText("Saved", { exact: true }).count()).toBe(0)
            await screenshots(page, "61-billing-profile-error")
            expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)

            // Fixed: the message goes with the edit, and the save succeeds.
            await tin.control.fill(COMPANY_PROFILE.tin)
            expect(await tin.error.count()).toBe(0)
            await page.getByRole("button", { name: "Save the buyer's details" }).click()
            await page.getByRole("status").filter({ hasText: "Saved" }).waitFor()
            expect(await page.locator(".field-error").count()).toBe(0)
            await screenshots(page, "62-billing-profile-saved")
            const response = await fetch(`${baseUrl}/dashboard/billing/profile`, {
              headers: { authorization: `Bearer ${token}` }
            })
            const saved = (await response.json()) as { profile: unknown }
            expect(saved.profile).toMatchObject({
              ...COMPANY_PROFILE,
              address: { ...COMPANY_PROFILE.address, line2: null, country_code: "MYS" }
            })
            // As the service keeps it, when the page is read again.
            await page.reload()
            await heading(page, "Billing profile").waitFor()
            await page.getByText(/^Last saved /).waitFor()
            expect(await field(page, "TIN").control.inputValue()).toBe(COMPANY_PROFILE.tin)
            expect(await state.inputValue()).toBe("14")

            // A top-up of RM 10 through the simulated checkout: RM 10.80 charged, RM 10.00 credited.
            await goTo(page, "Billing")
            await ten.click()
            await page.waitForURL(/\/dev\/checkout\//)
            // The simulated checkout's page charges the total.
            expect(await text(page.locator("tr", { hasText: "Total" }))).toBe("TotalRM 10.80")
            await page.getByRole("button", { name: "Pay" }).click()
            await page.getByRole("link", { name: "Back to the dashboard" }).click()
            await page.waitForURL(/\/app\/billing\?checkout=success/)
            await heading(page, "Billing").waitFor()
            const available = page.locator(".stat").filter({ hasText: "Available" }).locator(".money").first()
            await expect.poll(() => text(available)).toBe("RM 10.00")

            // Invoices: the top-up's invoice, its tax, total and e-invoice state.
            await goTo(page, "Invoices")
            const row = page.getByRole("row").filter({
              has: page.getByRole("rowheader", { name: number, exact: true })
            })
            await row.waitFor()
            expect(await page.locator("table.invoices tbody tr").count()).toBe(1)
            const cell = (label: string) => text(row.locator(`td[data-label="${label}"]`))
            expect(await cell("Type")).toBe("Invoice")
            expect(await cell("Net")).toBe("RM 10.00")
            expect(await cell("Tax")).toBe("RM 0.80")
            expect(await cell("Total")).toBe("RM 10.80")
            // Its buyer has a TIN: an e-invoice of its own, validated in seconds; the page follows it.
            await expect.poll(() => cell("e-Invoice"), { timeout: 15_000 }).toBe("ValidCheck on MyInvois")
            const check = row.getByRole("link", { name: "Check on MyInvois" })
            const listing = await fetch(`${baseUrl}/dashboard/billing/invoices`, {
              headers: { authorization: `Bearer ${token}` }
            })
            const [document] = ((await listing.json()) as { data: Array<Listed> }).data
            expect(document?.e_invoice).toMatchObject({ status: "valid", route: "single", overdue: false })
            expect(await check.getAttribute("href")).toBe(document?.e_invoice.validation_url)
            expect(await check.getAttribute("target")).toBe("_blank")
            await screenshots(page, "63-invoices")
            expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)

            // Its PDF, fetched with the session and saved as <number>.pdf.
            const pdf = row.getByRole("button", { name: `Download PDF of ${number}` })
            const [atDesktop] = await Promise.all([page.waitForEvent("download"), pdf.click()])
            const desktopFile = await downloaded(atDesktop)
            expect(desktopFile.name).toBe(`${number}.pdf`)
            expect(desktopFile.start).toBe("%PDF-")
            expect(desktopFile.pdfText).toContain(number)
            expect(desktopFile.pdfText).toContain("C25845632020")
            expect(desktopFile.pdfText).toContain("10.80")

            // At phone width the row is a card of its own, and its button still downloads.
            await page.setViewportSize(PHONE)
            expect(await row.locator(`td[data-label="Total"]`).isVisible()).toBe(true)
            const [atPhone] = await Promise.all([page.waitForEvent("download"), pdf.click()])
            const phoneFile = await downloaded(atPhone)
            expect(phoneFile.name).toBe(`${number}.pdf`)
            expect(phoneFile.start).toBe("%PDF-")
            expect(await page.evaluate<number>("document.documentElement.scrollWidth - window.innerWidth"))
              .toBeLessThanOrEqual(0)
            await page.setViewportSize(DESKTOP)

            // The type filter: no refund notes yet.
            await page.getByLabel("Type").selectOption({ label: "Refund note" })
            await page.getByText("No documents of this type.").waitFor()
            await page.getByLabel("Type").selectOption({ label: "Invoice" })
            await row.waitFor()

            // The only failed response is the refused TIN; the simulated checkout's plain page has no favicon.
            expect(failed).toEqual(["400 /dashboard/billing/profile"])
            expect(problems).toEqual([
              "error: Failed to load resource: the server responded with a status of 400 (Bad Request) /dashboard/billing/profile",
              "error: Failed to load resource: the server responded with a status of 404 (Not Found) /favicon.ico"
            ])
          })
        }),
      { timeout: 180_000 }
    )

    it.effect(
      "an e-invoice MyInvois rejects: every error on its row, overdue a day later, the profile fixed, resubmitted and valid",
      () =>
        Effect.gen(function*() {
          const { baseUrl, clock } = yield* TestServer
          const email = "e2e-e-invoice-rejected@example.com"
          const token = yield* devToken(email)
          const put = yield* call("PUT", "/dashboard/billing/profile", {
            token,
            json: { ...COMPANY_PROFILE, tin: UNREGISTERED_TIN }
          })
          expect(put.status, put.text).toBe(200)
          yield* simulatedTopUp(token, 1000)
          const rejected = yield* newestIn(token, "invalid")
          expect(rejected.e_invoice.route).toBe("single")
          // MyInvois' answer names the TIN, and where in the document it stands.
          const named = rejected.e_invoice.errors.find((error) => error.message.includes(UNREGISTERED_TIN))
          expect(named, JSON.stringify(rejected.e_invoice.errors)).toBeDefined()
          const number = rejected.number
          const rowOf = (page: Page) =>
            page.getByRole("row").filter({ has: page.getByRole("rowheader", { name: number, exact: true }) })
          const cellOf = (page: Page) => rowOf(page).locator(`td[data-label="e-Invoice"]`)

          // Rejected: the badge, every error behind a disclosure, the fix and the button.
          yield* inBrowser(async (context) => {
            const { page, problems, failed } = await strictPage(context)
            await signIn(page, baseUrl, email)
            await goTo(page, "Invoices")
            const cell = cellOf(page)
            await cell.waitFor()
            expect(await text(cell.locator(".badge"))).toBe("Rejected")
            const errors = cell.locator("details.e-invoice-errors")
            expect(await errors.getAttribute("open")).toBeNull()
            const count = rejected.e_invoice.errors.length
            await errors.locator("summary").click()
            expect(await text(errors.locator("summary"))).toBe(
              `${count === 1 ? "1 error" : `${count} errors`} from MyInvois`
            )
            const items = errors.locator("li")
            expect(await items.count()).toBe(count)
            for (const [index, error] of rejected.e_invoice.errors.entries()) {
              const item = items.nth(index)
              expect(await text(item.locator(".e-invoice-reason"))).toBe(error.message)
              expect(await text(item.locator(".e-invoice-error-meta"))).toBe(
                error.target === null ? error.code : `${error.code} at ${error.target}`
              )
            }
            expect(await text(cell)).toContain(`TIN ${UNREGISTERED_TIN} is not registered with LHDN`)
            await cell.getByText("Fix the buyer's details first, then resubmit.").waitFor()
            const resubmit = cell.getByRole("button", { name: `Resubmit ${number} to MyInvois` })
            expect(await resubmit.isEnabled()).toBe(true)
            // Not overdue yet: no warning on the row, no notice above the table.
            expect(await page.locator(".e-invoice-overdue").count()).toBe(0)
            expect(await page.locator(".e-invoice-notice").count()).toBe(0)
            await screenshots(page, "65-e-invoice-rejected")
            expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)
            expect(failed).toEqual([])
            expect(problems).toEqual([])
            await page.close()
          })

          // A day and an hour later the rejection is overdue (24 hours after the e-invoice's issue).
          clock.advance("25 hours")
          const later = yield* devToken(email)
          const overdue = (yield* listed(later)).find((document) => document.number === number)
          expect(overdue?.e_invoice).toMatchObject({ status: "invalid", overdue: true })

          yield* inBrowser(async (context) => {
            const { page, problems, failed } = await strictPage(context)
            // The session signed in a day ago has expired: signed in again.
            await signIn(page, baseUrl, email)
            await goTo(page, "Invoices")
            const cell = cellOf(page)
            await cell.waitFor()
            expect(await text(cell.locator(".e-invoice-overdue"))).toBe("Not validated 24 hours after issue")
            expect(await rowOf(page).getAttribute("class")).toBe("overdue")
            const notice = page.locator(".e-invoice-notice")
            expect(await text(notice)).toBe(
              "1 document below is not validated by MyInvois in time. MyInvois rejected it: fix the buyer's details, then resubmit."
            )
            // The notice stands above the table.
            const noticeBox = await notice.boundingBox()
            const tableBox = await page.locator("table.invoices").boundingBox()
            expect(noticeBox!.y + noticeBox!.height).toBeLessThanOrEqual(tableBox!.y)
            await screenshots(page, "66-e-invoice-overdue")
            expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)

            // The row's link leads to the profile: the TIN fixed and saved.
            await cell.getByRole("link", { name: "buyer's details" }).click()
            await heading(page, "Billing profile").waitFor()
            const tin = field(page, "TIN").control
            await expect.poll(() => tin.inputValue()).toBe(UNREGISTERED_TIN)
            await tin.fill(COMPANY_PROFILE.tin)
            await page.getByRole("button", { name: "Save the buyer's details" }).click()
            await page.getByRole("status").filter({ hasText: "Saved" }).waitFor()

            // Resubmitted with the profile as it is now: pending at once, then valid, and no longer overdue.
            await goTo(page, "Invoices")
            await cell.waitFor()
            const [answer] = await Promise.all([
              page.waitForResponse((response) =>
                response.url().endsWith(`/dashboard/billing/invoices/${rejected.id}/resubmit`)
              ),
              cell.getByRole("button", { name: `Resubmit ${number} to MyInvois` }).click()
            ])
            expect(answer.status()).toBe(200)
            const detail = (await answer.json()) as Listed
            expect(detail.e_invoice.status).toBe("pending")
            expect(detail.e_invoice.overdue).toBe(false)
            await expect.poll(() => text(cell), { timeout: 15_000 }).toBe("ValidCheck on MyInvois")
            const listing = await fetch(`${baseUrl}/dashboard/billing/invoices`, {
              headers: { authorization: `Bearer ${later}` }
            })
            const mended = ((await listing.json()) as { data: Array<Listed> }).data.find((one) => one.number === number)
            expect(mended?.e_invoice).toMatchObject({ status: "valid", errors: [], overdue: false })
            expect(await cell.getByRole("link", { name: "Check on MyInvois" }).getAttribute("href")).toBe(
              mended?.e_invoice.validation_url
            )
            expect(await page.locator(".e-invoice-notice").count()).toBe(0)
            expect(await page.locator(".e-invoice-overdue").count()).toBe(0)
            expect(await rowOf(page).getAttribute("class")).toBeNull()
            await screenshots(page, "67-e-invoice-resubmitted")
            expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)
            expect(failed).toEqual([])
            expect(problems).toEqual([])
          })
        }),
      { timeout: 180_000 }
    )

    it.effect("a viewer reads the billing profile and cannot change it, nor resubmit a rejected e-invoice", () =>
      Effect.gen(function*() {
        const { baseUrl } = yield* TestServer
        const owner = yield* person("e2e-invoices-owner@example.com")
        // A top-up whose e-invoice MyInvois rejects, then the profile fixed: the document stays rejected until resubmitted.
        const unregistered = yield* call("PUT", "/dashboard/billing/profile", {
          token: owner.token,
          json: { ...COMPANY_PROFILE, tin: UNREGISTERED_TIN }
        })
        expect(unregistered.status, unregistered.text).toBe(200)
        yield* simulatedTopUp(owner.token, 1000)
        const rejected = yield* newestIn(owner.token, "invalid")
        const put = yield* call("PUT", "/dashboard/billing/profile", { token: owner.token, json: COMPANY_PROFILE })
        expect(put.status, put.text).toBe(200)
        const viewer = yield* person("e2e-invoices-viewer@example.com")
        const invitation = yield* call("POST", "/dashboard/members/invitations", {
          token: owner.token,
          json: { email: "e2e-invoices-viewer@example.com", role: "viewer" }
        })
        expect(invitation.status, invitation.text).toBe(201)
        const accepted = yield* call("POST", `/dashboard/invitations/${invitation.body.id}/accept`, {
          token: viewer.token
        })
        expect(accepted.status, accepted.text).toBe(200)

        yield* inBrowser(async (context) => {
          const { page, problems, failed } = await strictPage(context)
          await signIn(page, baseUrl, "e2e-invoices-viewer@example.com")
          await page.getByLabel("Account", { exact: true }).selectOption(owner.account)
          await expect.poll(() => page.locator(".account .badge.role").textContent()).toBe("Your role: viewer")
          await goTo(page, "Billing")
          await page.getByRole("link", { name: "The buyer's details" }).click()
          await heading(page, "Billing profile").waitFor()
          await page.getByText("Changing these needs the role owner, admin or billing in this account.").waitFor()
          const tin = field(page, "TIN").control
          await expect.poll(() => tin.inputValue()).toBe(COMPANY_PROFILE.tin)
          expect(await tin.getAttribute("readonly")).not.toBeNull()
          expect(await field(page, "State").control.isDisabled()).toBe(true)
          expect(await field(page, "ID type").control.isDisabled()).toBe(true)
          expect(await page.getByRole("button", { name: "Save the buyer's details" }).count()).toBe(0)
          await screenshots(page, "64-viewer-billing-profile")
          expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)
          // Typing changes nothing in a read-only field.
          await tin.press("End")
          await page.keyboard.type("X")
          expect(await tin.inputValue()).toBe(COMPANY_PROFILE.tin)

          // The rejected e-invoice with its errors, but no button: who may resubmit is named instead.
          await goTo(page, "Invoices")
          const cell = page.getByRole("row").filter({
            has: page.getByRole("rowheader", { name: rejected.number, exact: true })
          }).locator(`td[data-label="e-Invoice"]`)
          await cell.waitFor()
          expect(await text(cell.locator(".badge"))).toBe("Rejected")
          expect(await cell.locator("details.e-invoice-errors li").count()).toBe(rejected.e_invoice.errors.length)
          expect(await text(cell.locator(".e-invoice-fix"))).toBe(
            "Once the buyer's details are fixed, a member with the role owner, admin or billing resubmits it."
          )
          expect(await page.getByRole("button", { name: /^Resubmit/ }).count()).toBe(0)
          await screenshots(page, "68-viewer-e-invoice-rejected")
          expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)
          expect(failed).toEqual([])
          expect(problems).toEqual([])
        })
      }))

    it.effect("a buyer without a TIN: in its month's consolidated e-invoice, then named by its number and validated", () =>
      Effect.gen(function*() {
        const { baseUrl, clock } = yield* TestServer
        const email = "e2e-e-invoice-consolidated@example.com"
        const token = yield* devToken(email)
        yield* simulatedTopUp(token, 1000)
        const [waiting] = yield* listed(token)
        expect(waiting?.e_invoice).toMatchObject({
          route: "consolidated",
          number: null,
          status: "pending",
          overdue: false
        })
        const number = waiting!.number

        yield* inBrowser(async (context) => {
          const { page, problems, failed } = await strictPage(context)
          await signIn(page, baseUrl, email)
          await goTo(page, "Invoices")
          const cell = page.getByRole("row").filter({
            has: page.getByRole("rowheader", { name: number, exact: true })
          }).locator(`td[data-label="e-Invoice"]`)
          await cell.waitFor()
          // Nothing sent yet: its month's consolidated e-invoice is made once the month ends.
          expect(await text(cell.locator(".badge"))).toBe("Pending")
          expect(await text(cell.locator(".e-invoice-route"))).toBe("In the month's consolidated e-invoice")
          expect(await cell.getByRole("link", { name: "Check on MyInvois" }).count()).toBe(0)
          expect(await cell.getByRole("button").count()).toBe(0)
          await screenshots(page, "69-e-invoice-consolidated-waiting")
          expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)

          // The month closed early (the development route): the document is in its consolidated e-invoice.
          const month = new Intl.DateTimeFormat("en-CA", {
            timeZone: "Asia/Kuala_Lumpur",
            year: "numeric",
            month: "2-digit"
          }).format(clock.unsafeCurrentTimeMillis())
          const closed = await fetch(`${baseUrl}/dev/e-invoices/consolidate`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({ month })
          })
          expect(closed.status).toBe(200)
          const made =
            ((await closed.json()) as { e_invoices: Array<{ number: string; type_code: string }> }).e_invoices
          const part = made.find((one) => one.type_code === "01")
          expect(part?.number).toMatch(/^CON-INV-\d{4}-\d{2}-\d{3}$/)
          await page.getByRole("button", { name: "Refresh" }).click()
          await expect.poll(() => text(cell.locator(".badge")), { timeout: 15_000 }).toBe("Valid")
          expect(await text(cell.locator(".e-invoice-route"))).toBe(
            `In the month's consolidated e-invoice ${part?.number}`
          )
          const listing = await fetch(`${baseUrl}/dashboard/billing/invoices`, {
            headers: { authorization: `Bearer ${token}` }
          })
          const reported = ((await listing.json()) as { data: Array<Listed> }).data.find((one) => one.number === number)
          expect(reported?.e_invoice).toMatchObject({ route: "consolidated", number: part?.number, status: "valid" })
          expect(await cell.getByRole("link", { name: "Check on MyInvois" }).getAttribute("href")).toBe(
            reported?.e_invoice.validation_url
          )
          await screenshots(page, "70-e-invoice-consolidated-valid")
          expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)
          expect(failed).toEqual([])
          expect(problems).toEqual([])
        })
      }))
  }
)

/** The person's session and their personal account. */
const person = (email: string) =>
  Effect.gen(function*() {
    const token = yield* devToken(email)
    const accounts = (yield* call("GET", "/dashboard/accounts", { token })).body.accounts as Array<{ id: string }>
    return { token, account: accounts[0]!.id }
  })
