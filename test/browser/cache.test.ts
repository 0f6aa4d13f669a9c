import { layer } from "@effect/vitest"
import { Effect } from "effect"
import type { Locator, Page } from "playwright-core"
import { beforeAll, describe, expect, it } from "vitest"
import { parseCacheTtl } from "../../web/src/cacheTtl.js"
import { formatMicroMyrExact } from "../../web/src/format.js"
import {
  DESKTOP,
  ensureDashboardBuilt,
  goTo,
  inBrowser,
  overflowAtPhoneWidth,
  PHONE,
  screenshots,
  signIn,
  strictPage
} from "../support/Browser.js"
import { call, devToken } from "../support/Http.js"
import { modelCall } from "../support/Models.js"
import { simulatedTopUp } from "../support/Stripe.js"
import { TestServer, TestServerLive } from "../support/TestServer.js"

/**
 * The response cache in the dashboard, in a real browser (Debian's Chromium via playwright-core) against the
 * whole service (docs/api/cache.md): a key's TTL set in the create form and the edit dialog, bad values refused
 * under the field before anything is sent and the service's 400 shown there too; a call made twice with the key,
 * the second a HIT, seen on Logs (its badge, the request it was cached from, what it saved) and on Usage (the hit
 * and the saving); the cache emptied by the owner, with the count; and no button for a developer. Screenshots
 * at desktop and phone width go to test-results/dashboard/.
 */

describe("parseCacheTtl: what the TTL field sends", () => {
  it.each([
    ["", null],
    [" 300 ", 300],
    ["60", 60],
    ["86400", 86_400]
  ])("%j → %j", (text, ttl) => {
    expect(parseCacheTtl(text)).toEqual({ ttl })
  })
  it.each(["59", "86401", "0", "-60", "300.5", "1e3", "abc", "99999999999999999999"])("%j is refused", (text) => {
    expect(parseCacheTtl(text)).toHaveProperty("problem")
  })
})

beforeAll(ensureDashboardBuilt, 180_000)

/** The form field labelled `label` (within `scope`): its control, and the message beneath it. */
const field = (scope: Page | Locator, label: string) => {
  // The inner locator of `has` is rooted at the page, and looked for within each field.
  const root = "mainFrame" in scope ? scope : scope.page()
  const box = scope.locator(".field").filter({ has: root.locator("label").getByText(label, { exact: true }) })
  return { control: scope.getByLabel(label, { exact: true }), error: box.locator(".field-error") }
}

const text = async (locator: Locator) => (await locator.textContent()) ?? ""

const stat = (page: Page, label: string) =>
  page.locator(".stat").filter({ has: page.locator(".stat-label", { hasText: new RegExp(`^${label}$`) }) })

const TTL = "Response cache TTL (seconds)"
const CALL = { model: "svc/nenas-flash", input: "Say hello to the cache.", max_output_tokens: 50 }

/** The person's session and their personal account. */
const person = (email: string) =>
  Effect.gen(function*() {
    const token = yield* devToken(email)
    const accounts = (yield* call("GET", "/dashboard/accounts", { token })).body.accounts as Array<{ id: string }>
    return { token, account: accounts[0]!.id }
  })

layer(TestServerLive(), { excludeTestServices: true, timeout: 180_000 })(
  "the response cache in the dashboard",
  (it) => {
    it.effect(
      "a key's TTL set and refused in the form, a call twice (the second a HIT) on Logs and Usage, the cache emptied",
      () =>
        Effect.gen(function*() {
          const server = yield* TestServer
          const { baseUrl } = server
          const email = "e2e-cache@example.com"
          const owner = yield* person(email)
          yield* simulatedTopUp(owner.token, 1000)
          // The service's own refusal of a TTL, which the edit dialog is shown below.
          const refusal = yield* call("POST", "/dashboard/api-keys", {
            token: owner.token,
            json: { name: "refused", cache_ttl_seconds: 30 }
          })
          expect(refusal.status, refusal.text).toBe(400)
          expect(refusal.body.error).toMatchObject({ code: "invalid_request", param: "cache_ttl_seconds" })
          // A developer in the owner's account.
          const developerEmail = "e2e-cache-developer@example.com"
          const developer = yield* person(developerEmail)
          const invitation = yield* call("POST", "/dashboard/members/invitations", {
            token: owner.token,
            json: { email: developerEmail, role: "developer" }
          })
          expect(invitation.status, invitation.text).toBe(201)
          const accepted = yield* call("POST", `/dashboard/invitations/${invitation.body.id}/accept`, {
            token: developer.token
          })
          expect(accepted.status, accepted.text).toBe(200)

          /** A model call through the test server, as any client makes it. */
          const callWith = (apiKey: string) =>
            Effect.runPromise(Effect.provideService(modelCall(apiKey, "/v1/responses", CALL), TestServer, server))

          yield* inBrowser(async (context) => {
            const { page, problems, failed } = await strictPage(context)
            const keyWrites: Array<string> = []
            page.on("request", (request) => {
              const path = new URL(request.url()).pathname
              if (path.startsWith("/dashboard/api-keys") && request.method() !== "GET") {
                keyWrites.push(`${request.method()} ${path}`)
              }
            })
            await signIn(page, baseUrl, email)
            await goTo(page, "API keys")

            // Create: a TTL under a minute is refused under the field as it is left, and nothing is sent.
            await page.getByLabel("Name", { exact: true }).fill("e2e cached")
            const created = field(page.locator("form", { hasText: "Create a key" }), TTL)
            await created.control.fill("30")
            await created.control.press("Tab")
            expect(await text(created.error)).toBe("At least 60 seconds (or empty for none).")
            expect(await created.control.getAttribute("aria-invalid")).toBe("true")
            await page.getByRole("button", { name: "Create key" }).click()
            expect(await page.evaluate<string>("document.activeElement.id")).toBe(
              await created.control.getAttribute("id")
            )
            await created.control.fill("soon")
            expect(await text(created.error)).toBe("Whole seconds only, from 60 to 86400; or empty for none.")
            await screenshots(page, "80-cache-ttl-refused")
            expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)
            await page.getByRole("button", { name: "Create key" }).click()
            expect(keyWrites).toEqual([])
            await created.control.fill("300")
            expect(await created.error.count()).toBe(0)
            await page.getByRole("button", { name: "Create key" }).click()
            const apiKey = await page.getByLabel("Full API key").inputValue()
            expect(apiKey).toMatch(/^nns_live_/)
            await page.getByRole("button", { name: "I have saved it" }).click()
            const row = page.getByRole("row", { name: /e2e cached/ })
            await expect.poll(() => text(row.locator("td[data-label=\"Response cache\"]"))).toBe("cache 300 s")
            expect(await created.control.inputValue()).toBe("")

            // Edit: over a day is refused before sending; the service's 400 naming the field shows under it too.
            await page.getByRole("button", { name: "Edit e2e cached" }).click()
            const dialog = page.getByRole("dialog", { name: /Edit the key/ })
            await dialog.waitFor()
            const edited = field(dialog, TTL)
            expect(await edited.control.inputValue()).toBe("300")
            await edited.control.fill("90000")
            await dialog.getByRole("button", { name: "Save changes" }).click()
            expect(await text(edited.error)).toBe("At most 86400 seconds (a day).")
            expect(keyWrites).toEqual(["POST /dashboard/api-keys"])
            // The service is the last word: its refusal (the one read above) goes under the field, not above the form.
            await page.route("**/dashboard/api-keys/*", (route) =>
              route.request().method() === "PATCH"
                ? route.fulfill({ status: 400, contentType: "application/json", body: refusal.text })
                : route.fallback(), { times: 1 })
            await edited.control.fill("600")
            await dialog.getByRole("button", { name: "Save changes" }).click()
            await expect.poll(() => text(edited.error)).toBe(refusal.body.error.message)
            expect(await edited.control.getAttribute("aria-invalid")).toBe("true")
            expect(await dialog.locator(".error").count()).toBe(0)
            await screenshots(page, "81-cache-ttl-edit-refused")
            expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)
            // Changed again, the message goes, and the save goes through.
            await edited.control.fill("600 ")
            expect(await edited.error.count()).toBe(0)
            await dialog.getByRole("button", { name: "Save changes" }).click()
            await dialog.waitFor({ state: "detached" })
            await expect.poll(() => text(row.locator("td[data-label=\"Response cache\"]"))).toBe("cache 600 s")
            const listed = await fetch(`${baseUrl}/dashboard/api-keys`, {
              headers: { authorization: `Bearer ${owner.token}` }
            })
            const { keys } = (await listed.json()) as {
              keys: Array<{ id: string; name: string; cache_ttl_seconds: number | null }>
            }
            const key = keys.find((one) => one.name === "e2e cached")
            expect(key?.cache_ttl_seconds).toBe(600)

            // The same call twice: the model answers the first, the cache the second, free.
            const first = await callWith(apiKey)
            expect(first.status, first.text).toBe(200)
            expect(first.headers.get("nenas-cache")).toBe("MISS")
            const cost = Number((first.body.usage.cost_myr as string).replace(".", ""))
            expect(cost).toBeGreaterThan(0)
            const second = await callWith(apiKey)
            expect(second.status, second.text).toBe(200)
            expect(second.headers.get("nenas-cache")).toBe("HIT")
            const sourceId = first.headers.get("x-request-id") ?? ""
            expect(sourceId).not.toBe("")

            // Logs: the HIT's badge, the request it was cached from and what it saved; the MISS's badge.
            await goTo(page, "Logs")
            const rows = page.locator("table.logs tbody tr:not(.details-row)")
            await expect.poll(() => rows.count()).toBe(2)
            const hit = page.getByRole("row", { name: /cache HIT/ })
            expect(await text(hit.locator(".badge-cache"))).toBe("cache HIT")
            expect(await text(page.getByRole("row", { name: /cache MISS/ }).locator(".badge-cache"))).toBe("cache MISS")
            expect(await text(hit.locator("td[data-label=\"Cost\"]"))).toBe("RM 0.00")
            await hit.getByRole("button").click()
            const details = page.locator(".details")
            await details.waitFor()
            expect(await text(details)).toContain("Response cachehit: answered from the cache, free")
            expect(await text(details)).toContain(`Cached from request${sourceId}`)
            expect(await text(details)).toContain(`Saved by the cache${formatMicroMyrExact(cost)}`)
            await screenshots(page, "82-cache-logs")
            expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)
            await page.setViewportSize(PHONE)
            expect(await hit.locator(".badge-cache").isVisible()).toBe(true)
            await page.setViewportSize(DESKTOP)

            // Usage: the hit and what it saved, to the micro-MYR.
            await goTo(page, "Usage")
            await expect.poll(() => text(stat(page, "Cache hits").locator(".stat-value"))).toBe("1")
            const saved = stat(page, "Saved by the response cache").locator(".money")
            expect(await saved.getAttribute("data-micro-myr")).toBe(String(cost))
            await page.getByText("Show the numbers").click()
            // Requests, input, output and reasoning tokens, cache hits, saved, cost: the day of the calls.
            const days = await page.locator(".series-table tbody tr").evaluateAll((trs) =>
              trs.map((tr) => [...tr.querySelectorAll("td")].map((td) => td.textContent ?? ""))
            )
            expect(days.filter((cells) => cells[0] !== "0").map((cells) => cells.slice(4, 6))).toEqual([
              ["1", await text(saved)]
            ])
            await screenshots(page, "83-cache-usage")
            expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)

            // Empty cache, confirmed first: the count, and the next call is the model's again.
            await goTo(page, "API keys")
            await page.getByRole("button", { name: "Empty cache" }).click()
            const confirm = page.getByRole("dialog", { name: "Empty the response cache?" })
            await confirm.waitFor()
            await screenshots(page, "84-cache-empty-confirm")
            await confirm.getByRole("button", { name: "Empty cache" }).click()
            await confirm.waitFor({ state: "detached" })
            await expect.poll(() => text(page.getByRole("status").filter({ hasText: "Emptied" })))
              .toBe("Emptied: 1 answer.")
            await screenshots(page, "85-cache-emptied")
            expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)
            const third = await callWith(apiKey)
            expect(third.status, third.text).toBe(200)
            expect(third.headers.get("nenas-cache")).toBe("MISS")

            // A developer of the account sees the cache and no button to empty it (the service refuses it 403).
            const { page: other, problems: otherProblems } = await strictPage(context)
            await signIn(other, baseUrl, developerEmail)
            await other.getByLabel("Account", { exact: true }).selectOption(owner.account)
            await expect.poll(() => other.locator(".account .badge.role").textContent()).toBe("Your role: developer")
            await goTo(other, "API keys")
            await other.getByText("Emptying it needs the role owner or admin.").waitFor()
            expect(await other.getByRole("button", { name: "Empty cache" }).count()).toBe(0)
            await screenshots(other, "86-cache-developer")
            const refused = await fetch(`${baseUrl}/dashboard/cache`, {
              method: "DELETE",
              headers: { authorization: `Bearer ${developer.token}`, "nenas-account": owner.account }
            })
            expect(refused.status).toBe(403)

            // The only failed response is the refusal the edit dialog was given.
            expect(failed).toEqual([`400 /dashboard/api-keys/${key?.id}`])
            expect(problems).toEqual([
              `error: Failed to load resource: the server responded with a status of 400 (Bad Request) /dashboard/api-keys/${key?.id}`
            ])
            expect(otherProblems).toEqual([])
          })
        }),
      { timeout: 240_000 }
    )
  }
)
