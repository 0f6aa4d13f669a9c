import { layer } from "@effect/vitest"
import { Effect } from "effect"
import { beforeAll, describe, expect, it } from "vitest"
import { hourlyAllowed } from "../../web/src/format.js"
import { ensureDashboardBuilt, heading, inBrowser, screenshots, signIn, watchedPage } from "../support/Browser.js"
import { TestServer, TestServerLive } from "../support/TestServer.js"

/**
 * Managing a key from the dashboard in a real browser (Debian's Chromium via
 * playwright-core): edit its name and limit, disable and enable it, rotate it;
 * each step checked against the model API. Screenshots at desktop and phone
 * width go to test-results/dashboard/.
 */

describe("hourlyAllowed: the Usage page asks for no more than 744 hourly buckets", () => {
  const HOUR = 3_600_000
  const span = (hours: number) => ({ from: new Date(0).toISOString(), to: new Date(hours * HOUR).toISOString() })
  it.each([[24, true], [30 * 24, true], [743, true], [743.01, false], [31 * 24, false], [90 * 24, false]])(
    "%d hours → %s",
    (hours, allowed) => {
      const { from, to } = span(hours)
      expect(hourlyAllowed(from, to)).toBe(allowed)
    }
  )
})

beforeAll(ensureDashboardBuilt, 180_000)

interface CallReply {
  readonly status: number
  readonly code: string | undefined
}

/** A simulated model call (a test key costs nothing): its status and error code. */
const modelCall = async (baseUrl: string, apiKey: string): Promise<CallReply> => {
  const response = await fetch(`${baseUrl}/v1/responses`, {
    method: "POST",
    headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "svc/nenas-flash", input: "Say hello.", max_output_tokens: 50 })
  })
  const body = await response.json() as { error?: { code: string } }
  return { status: response.status, code: body.error?.code }
}

layer(TestServerLive(), { excludeTestServices: true, timeout: 120_000 })("managing a key in the dashboard", (it) => {
  it.effect("edit, disable, enable and rotate a key, each seen by the model API", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      yield* inBrowser(async (context) => {
        const { page, problems } = await watchedPage(context)

        await signIn(page, baseUrl, "keys@example.com")

        // A test key: the simulated model answers it without a balance.
        await page.getByRole("link", { name: "API keys" }).click()
        await heading(page, "API keys").waitFor()
        await page.getByLabel("Name", { exact: true }).fill("e2e managed")
        await page.getByLabel("Environment").selectOption("test")
        await page.getByRole("button", { name: "Create key" }).click()
        const oldSecret = await page.getByLabel("Full API key").inputValue()
        expect(oldSecret).toMatch(/^nns_test_/)
        await page.getByRole("button", { name: "I have saved it" }).click()
        expect(await modelCall(baseUrl, oldSecret)).toEqual({ status: 200, code: undefined })

        // Edit: name and monthly limit; the list shows both, and the URL names the key being edited.
        await page.getByRole("button", { name: "Edit e2e managed" }).click()
        const edit = page.getByRole("dialog", { name: /Edit the key/ })
        await edit.waitFor()
        expect(new URL(page.url()).searchParams.get("edit")).toMatch(/^key_/)
        const editUrl = page.url()
        await edit.getByLabel("Key name").fill("e2e renamed")
        await edit.getByLabel("Monthly limit (RM)").fill("12.5")
        await screenshots(page, "11-api-keys-edit")
        await edit.getByRole("button", { name: "Save changes" }).click()
        await edit.waitFor({ state: "detached" })
        const row = page.getByRole("row", { name: /e2e renamed/ })
        await row.waitFor()
        // The month's spend against the limit: a test key's calls are free.
        expect(await row.getByRole("cell", { name: /of RM 12\.50/ }).textContent()).toBe("RM 0.00 of RM 12.50")
        await row.getByRole("meter", { name: "0% of the monthly limit" }).waitFor()

        // Opened directly from a link (an error's action_url): disable, and the key answers 403.
        await page.goto(editUrl)
        await page.getByRole("dialog", { name: /Edit the key “e2e renamed”/ }).waitFor()
        await page.getByRole("button", { name: "Disable key" }).click()
        await page.getByRole("button", { name: "Enable key" }).waitFor()
        await expect.poll(() => row.textContent()).toContain("disabled")
        await expect.poll(() => modelCall(baseUrl, oldSecret), { timeout: 5_000 })
          .toEqual({ status: 403, code: "permission_denied" })
        await screenshots(page, "12-api-keys-disabled")
        await page.getByRole("button", { name: "Enable key" }).click()
        await page.getByRole("button", { name: "Disable key" }).waitFor()
        await expect.poll(() => row.textContent()).toContain("active")
        await expect.poll(() => modelCall(baseUrl, oldSecret), { timeout: 5_000 })
          .toEqual({ status: 200, code: undefined })
        await page.getByRole("button", { name: "Close" }).click()

        // Rotate with no grace: the new secret is shown once and works; the old one is revoked.
        await page.getByRole("button", { name: "Rotate e2e renamed" }).click()
        const rotate = page.getByRole("dialog", { name: /Rotate the key/ })
        await rotate.getByLabel("Grace period").selectOption("0")
        await rotate.getByRole("button", { name: "Rotate key" }).click()
        const newSecret = await page.getByLabel("Full API key").inputValue()
        expect(newSecret).toMatch(/^nns_test_/)
        expect(newSecret).not.toBe(oldSecret)
        await page.getByRole("heading", { name: /The new secret of “e2e renamed”/ }).waitFor()
        await page.getByText("The old secret no longer works").waitFor()
        await screenshots(page, "13-api-keys-rotated")
        await expect.poll(() => modelCall(baseUrl, oldSecret), { timeout: 5_000 })
          .toEqual({ status: 401, code: "revoked_api_key" })
        expect(await modelCall(baseUrl, newSecret)).toEqual({ status: 200, code: undefined })
        // Still one key: same row, same name and limit.
        expect(await page.getByRole("row", { name: /e2e renamed/ }).count()).toBe(1)
        expect(await row.textContent()).toContain("RM 12.50")

        expect(problems).toEqual([])
      })
    }), 120_000)
})
