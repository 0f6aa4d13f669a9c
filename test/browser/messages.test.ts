import { layer } from "@effect/vitest"
import { Effect } from "effect"
import { mkdir } from "node:fs/promises"
import { beforeAll, expect } from "vitest"
import { formatCostMyr } from "../../web/src/format.js"
import { ensureDashboardBuilt, heading, inBrowser, screenshots, SHOTS, signIn } from "../support/Browser.js"
import { call, createKey, devToken } from "../support/Http.js"
import { simulatedTopUp } from "../support/Stripe.js"
import { TestServer, TestServerLive } from "../support/TestServer.js"

/**
 * A call through Anthropic's Messages API in the dashboard, in a real browser:
 * the logs list it as `/v1/messages` (and filter by it), with its cost, as
 * they do the other two endpoints.
 */

beforeAll(ensureDashboardBuilt, 180_000)

layer(TestServerLive(), { excludeTestServices: true, timeout: 120_000 })("/v1/messages in the dashboard", (it) => {
  it.effect(
    "the logs show a /v1/messages call with its cost, and the endpoint filter finds it",
    () =>
      Effect.gen(function*() {
        const { baseUrl } = yield* TestServer
        const email = "e2e-messages@example.com"
        const token = yield* devToken(email)
        yield* simulatedTopUp(token, 1000)
        const { full_key: apiKey } = yield* createKey(token, { name: "e2e claude code", environment: "live" })
        const messages = yield* call("POST", "/v1/messages", {
          headers: { "x-api-key": apiKey, "anthropic-version": "2023-06-01" },
          json: { model: "svc/nenas-flash", max_tokens: 50, messages: [{ role: "user", content: "Say hello." }] }
        })
        expect(messages.status, messages.text).toBe(200)
        const chat = yield* call("POST", "/v1/chat/completions", {
          headers: { authorization: `Bearer ${apiKey}` },
          json: { model: "svc/nenas-flash", max_tokens: 50, messages: [{ role: "user", content: "Say hello." }] }
        })
        expect(chat.status, chat.text).toBe(200)
        const cost = Number((messages.body.cost_myr as string).replace(".", ""))
        expect(cost).toBeGreaterThan(0)

        yield* inBrowser(async (context) => {
          await mkdir(SHOTS, { recursive: true })
          const page = await context.newPage()
          await signIn(page, baseUrl, email)
          await page.getByRole("link", { name: "Logs" }).click()
          await heading(page, "Logs").waitFor()
          const row = page.getByRole("row", { name: /\/v1\/messages.*billed/ })
          await row.waitFor()
          expect(await row.locator(".money").textContent()).toBe(formatCostMyr(cost))
          await page.getByLabel("Endpoint").selectOption("/v1/messages")
          await expect.poll(() => page.getByRole("row", { name: /\/v1\/chat\/completions/ }).count()).toBe(0)
          expect(await page.getByRole("row", { name: /\/v1\/messages/ }).count()).toBe(1)
          await screenshots(page, "18-logs-messages")
        })
      }),
    { timeout: 180_000 }
  )
})
