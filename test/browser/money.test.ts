import { layer } from "@effect/vitest"
import { Effect } from "effect"
import type { Page } from "playwright-core"
import { beforeAll, expect } from "vitest"
import { formatCostMyr } from "../../web/src/format.js"
import {
  DESKTOP,
  ensureDashboardBuilt,
  heading,
  inBrowser,
  PHONE,
  screenshots,
  SHOTS,
  signIn,
  watchedPage
} from "../support/Browser.js"
import { call, createKey, devToken } from "../support/Http.js"
import { simulatedTopUp } from "../support/Stripe.js"
import { TestServer, TestServerLive } from "../support/TestServer.js"

/**
 * Money under one sen in a real browser (Debian's Chromium via playwright-core):
 * one live call costs a fraction of a sen, and every page that shows it (the
 * ledger, the overview, usage, the key's month to date) shows its digits, never
 * `RM 0.00`. Screenshots at desktop and phone width go to test-results/dashboard/.
 */

beforeAll(ensureDashboardBuilt, 180_000)

/** A shown amount read back as micro-MYR: `−RM 0.000293` → -293 (the digits, not the formatter, decide). */
const shownMicro = (text: string): number => {
  const match = /^(−?)RM ([\d,]+)\.(\d+)$/.exec(text)
  if (match === null) throw new Error(`not an amount: ${text}`)
  const [, sign, whole, fraction] = match
  if (whole === undefined || fraction === undefined || fraction.length > 6) throw new Error(`not an amount: ${text}`)
  const micro = Number(whole.replaceAll(",", "")) * 1_000_000 + Number(fraction.padEnd(6, "0"))
  return sign === "−" ? -micro : micro
}

const stat = (page: Page, label: string) =>
  page.locator(".stat").filter({ has: page.locator(".stat-label", { hasText: new RegExp(`^${label}$`) }) }).locator(
    ".money"
  ).first()

/** At phone width the page is no wider than the phone: nothing pushes it sideways. */
const overflowAtPhoneWidth = async (page: Page): Promise<number> => {
  await page.setViewportSize(PHONE)
  const overflow = await page.evaluate<number>("document.documentElement.scrollWidth - window.innerWidth")
  await page.setViewportSize(DESKTOP)
  return overflow
}

const text = async (locator: ReturnType<Page["locator"]>) => (await locator.textContent()) ?? ""

layer(TestServerLive(), { excludeTestServices: true, timeout: 120_000 })(
  "amounts under one sen in the dashboard",
  (it) => {
    it.effect(
      "a sub-sen call shows its digits on the ledger, the overview, usage and the key's month to date",
      () =>
        Effect.gen(function*() {
          const { baseUrl } = yield* TestServer
          const email = "e2e-sub-sen@example.com"
          const token = yield* devToken(email)
          yield* simulatedTopUp(token, 1000)
          const { full_key: apiKey } = yield* createKey(token, { name: "e2e sub-sen", environment: "live" })
          const reply = yield* call("POST", "/v1/responses", {
            headers: { authorization: `Bearer ${apiKey}` },
            json: { model: "svc/nenas-flash", input: "Say hello.", max_output_tokens: 50 }
          })
          expect(reply.status).toBe(200)
          const costMyr = reply.body.usage.cost_myr as string
          const cost = Number(costMyr.replace(".", ""))
          // The case the issue names: a real call billed less than a sen, and not a whole number of sen.
          expect(cost).toBeGreaterThan(0)
          expect(cost).toBeLessThan(10_000)

          // The exports carry MYR with 6 decimals and micro-MYR (docs/api/dashboard.md, "Logs and usage").
          const logsCsv = (yield* call("GET", "/dashboard/logs/export?format=csv", { token })).text.trimEnd().split(
            "\r\n"
          )
          expect(logsCsv).toHaveLength(2)
          expect(logsCsv[1]).toContain(`,${costMyr},${cost},`)
          const usageCsv = (yield* call("GET", "/dashboard/usage/export?format=csv", { token })).text.trimEnd().split(
            "\r\n"
          )
          expect(
            usageCsv.filter((line) => line.split(",")[1] === "1").map((line) => line.split(",").slice(2, 4))
          )
            .toEqual([[costMyr, String(cost)]])

          yield* inBrowser(async (context) => {
            const { page, problems } = await watchedPage(context)
            await signIn(page, baseUrl, email)

            // Overview: today's spend is the call's cost, all its digits; the balance too.
            await expect.poll(() => text(stat(page, "Spent today"))).not.toBe("RM 0.00")
            expect(shownMicro(await text(stat(page, "Spent today")))).toBe(cost)
            expect(shownMicro(await text(stat(page, "Spent, last 30 days")))).toBe(cost)
            expect(shownMicro(await text(stat(page, "Available")))).toBe(10_000_000 - cost)
            await screenshots(page, "14-overview-sub-sen")
            expect(await overflowAtPhoneWidth(page)).toBe(0)

            // Billing: the usage entry and the balance after it, to the micro-MYR.
            await page.getByRole("link", { name: "Billing" }).click()
            await heading(page, "Billing").waitFor()
            const usageRow = page.getByRole("row").filter({
              has: page.getByRole("cell", { name: "Usage", exact: true })
            })
            await usageRow.waitFor()
            const [amount, balance] = await usageRow.locator(".money").allTextContents()
            expect(amount).toBe(formatCostMyr(-cost))
            expect(shownMicro(amount ?? "")).toBe(-cost)
            expect(shownMicro(balance ?? "")).toBe(10_000_000 - cost)
            await screenshots(page, "15-billing-sub-sen")
            // At phone width the ledger's entries stack and fit: nothing to scroll sideways (a request id wraps).
            expect(await overflowAtPhoneWidth(page)).toBe(0)
            await page.setViewportSize(PHONE)
            expect(await page.locator(".table-wrap").evaluate((box) => box.scrollWidth - box.clientWidth)).toBe(0)
            await page.setViewportSize(DESKTOP)

            // Usage: the total, the numbers behind the charts, and the cost chart's tooltip.
            await page.getByRole("link", { name: "Usage" }).click()
            await heading(page, "Usage").waitFor()
            await expect.poll(() => text(stat(page, "Cost"))).not.toBe("RM 0.00")
            expect(shownMicro(await text(stat(page, "Cost")))).toBe(cost)
            await page.getByText("Show the numbers").click()
            const costCells = await page.locator(".series-table tbody td:last-child").allTextContents()
            expect(costCells.filter((cell) => cell !== "RM 0.00").map(shownMicro)).toEqual([cost])
            const bar = page.locator(".recharts-bar-rectangle").last()
            await bar.hover()
            const tooltip = page.locator(".recharts-tooltip-wrapper").filter({ hasText: "Cost (RM)" })
            await expect.poll(() => text(tooltip)).toContain(`${formatCostMyr(cost)} (`)
            await page.waitForTimeout(300)
            await page.locator("figure", { hasText: "Cost per day" }).screenshot({
              path: `${SHOTS}/16-usage-sub-sen-tooltip.png`
            })
            // The tooltip follows the pointer: away from the chart, so the page is screenshot as a reader sees it.
            await page.mouse.move(0, 0)
            await screenshots(page, "16-usage-sub-sen")
            expect(await overflowAtPhoneWidth(page)).toBe(0)

            // API keys: the month to date spend of the key that made the call.
            await page.getByRole("link", { name: "API keys" }).click()
            await heading(page, "API keys").waitFor()
            const keyRow = page.getByRole("row", { name: /e2e sub-sen/ })
            await keyRow.waitFor()
            await expect.poll(() => keyRow.locator(".money").first().textContent()).not.toBe("RM 0.00")
            expect(shownMicro(await text(keyRow.locator(".money").first()))).toBe(cost)
            await screenshots(page, "17-api-keys-sub-sen")
            expect(await overflowAtPhoneWidth(page)).toBe(0)

            expect(problems).toEqual([])
          })
        }),
      { timeout: 180_000 }
    )
  }
)
