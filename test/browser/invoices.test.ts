import { layer } from "@effect/vitest"
import { Effect } from "effect"
import { readFile } from "node:fs/promises"
import { PDFParse } from "pdf-parse"
import type { Download, Locator, Page } from "playwright-core"
import { beforeAll, expect } from "vitest"
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
import { TestServer, TestServerLive } from "../support/TestServer.js"

/**
 * Service tax, the billing profile and invoices in the dashboard, in a real browser (Debian's Chromium
 * via playwright-core) against the whole service with SST at 8% (docs/api/invoices.md): the tax beside
 * each top-up, the profile form refusing a bad TIN under its field and saving the fixed one, a top-up
 * through the simulated checkout, and its invoice on the Invoices page with its PDF downloaded; then the
 * form read-only for a viewer. Screenshots at desktop and phone width go to test-results/dashboard/.
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

const PROFILE = {
  legal_name: "Contoh Teknologi Sdn. Bhd.",
  tin: "C25845632020",
  id_type: "BRN",
  id_value: "201901234567",
  sst_number: null,
  email: "finance@example.my",
  phone: "+60312345678",
  address: { line1: "Level 5, Menara Contoh", city: "Kuala Lumpur", postcode: "50450", state_code: "14" }
}

layer(TestServerLive({ sstRateBps: 800 }), { excludeTestServices: true, timeout: 120_000 })(
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
            await field(page, "Legal name").control.fill(PROFILE.legal_name)
            await field(page, "TIN").control.fill("C123")
            expect(await field(page, "ID type").control.inputValue()).toBe("BRN")
            await field(page, "ID number").control.fill(PROFILE.id_value)
            await field(page, "Email").control.fill(PROFILE.email)
            await field(page, "Phone").control.fill(PROFILE.phone)
            await field(page, "Address line 1").control.fill(PROFILE.address.line1)
            await field(page, "City").control.fill(PROFILE.address.city)
            await field(page, "Postcode").control.fill(PROFILE.address.postcode)
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
            await tin.control.fill(PROFILE.tin)
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
              ...PROFILE,
              address: { ...PROFILE.address, line2: null, country_code: "MYS" }
            })
            // As the service keeps it, when the page is read again.
            await page.reload()
            await heading(page, "Billing profile").waitFor()
            await page.getByText(/^Last saved /).waitFor()
            expect(await field(page, "TIN").control.inputValue()).toBe(PROFILE.tin)
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
            expect(await cell("e-Invoice")).toBe("Pending validation")
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

    it.effect("a viewer reads the billing profile and cannot change it", () =>
      Effect.gen(function*() {
        const { baseUrl } = yield* TestServer
        const owner = yield* person("e2e-invoices-owner@example.com")
        const put = yield* call("PUT", "/dashboard/billing/profile", { token: owner.token, json: PROFILE })
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
          await expect.poll(() => tin.inputValue()).toBe(PROFILE.tin)
          expect(await tin.getAttribute("readonly")).not.toBeNull()
          expect(await field(page, "State").control.isDisabled()).toBe(true)
          expect(await field(page, "ID type").control.isDisabled()).toBe(true)
          expect(await page.getByRole("button", { name: "Save the buyer's details" }).count()).toBe(0)
          await screenshots(page, "64-viewer-billing-profile")
          expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)
          // Typing changes nothing in a read-only field.
          await tin.press("End")
          await page.keyboard.type("X")
          expect(await tin.inputValue()).toBe(PROFILE.tin)
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
