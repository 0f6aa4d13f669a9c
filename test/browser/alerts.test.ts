import { layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { beforeAll, expect } from "vitest"
import { ensureDashboardBuilt, heading, inBrowser, screenshots, signIn, watchedPage } from "../support/Browser.js"
import { TestServer, TestServerLive } from "../support/TestServer.js"
import { WebhookReceiver, WebhookReceiverLive } from "../support/WebhookReceiver.js"

/**
 * Alerts, auto top-up and webhooks in the dashboard, in a real browser
 * (Debian's Chromium): set a low-balance threshold, save a card through the
 * simulated checkout, turn on auto top-up, register a webhook endpoint and see
 * a delivery. Screenshots at desktop and phone width go to
 * test-results/dashboard/.
 */

beforeAll(ensureDashboardBuilt, 180_000)

const Server = Layer.unwrapEffect(
  Effect.map(
    WebhookReceiver,
    (receiver) => TestServerLive({ webhookAllowedHosts: new Set([`127.0.0.1:${receiver.port}`]), outboxPollMs: 50 })
  )
)
  .pipe(Layer.provideMerge(WebhookReceiverLive))

layer(Server, { excludeTestServices: true, timeout: 150_000 })(
  "alerts, auto top-up and webhooks in the dashboard",
  (it) => {
    it.effect("set a threshold, save a card, turn on auto top-up, register an endpoint and see a delivery", () =>
      Effect.gen(function*() {
        const { baseUrl } = yield* TestServer
        const receiver = yield* WebhookReceiver
        yield* inBrowser(async (context) => {
          const { page, problems } = await watchedPage(context)

          await signIn(page, baseUrl, "alerts-ui@example.com")

          // The threshold: an empty wallet is below it at once, so the banner shows.
          await page.getByRole("link", { name: "Billing" }).click()
          await heading(page, "Billing").waitFor()
          await page.getByLabel("Alert below (RM)").fill("5")
          await page.getByRole("button", { name: "Save alert" }).click()
          await page.getByText("Alert saved.").waitFor()
          await page.getByRole("link", { name: "Overview" }).click()
          const banner = page.locator("[data-kind=\"balance_low\"]")
          await banner.waitFor()
          expect(await banner.textContent()).toContain("below the RM 5.00 you set")

          // A card through the simulated checkout's setup page, and back.
          await page.getByRole("link", { name: "Billing" }).click()
          await page.getByRole("button", { name: "Save a card" }).click()
          await page.getByRole("heading", { name: "Save a card for auto top-up" }).waitFor()
          expect(page.url()).toContain("/dev/checkout/setup/")
          await screenshots(page, "21-save-card")
          await page.getByLabel("Card number").fill("4242 4242 4242 4242")
          await page.getByRole("button", { name: "Save card" }).click()
          await page.getByRole("heading", { name: "Card saved" }).waitFor()
          await page.getByRole("link", { name: "Back to the dashboard" }).click()
          await heading(page, "Billing").waitFor()
          await page.getByText("visa ending 4242").waitFor()

          // Auto top-up on.
          await page.getByLabel("Top up automatically").check()
          await page.getByLabel("When the balance is below (RM)").fill("3")
          await page.getByLabel("Add (RM)").selectOption("25")
          await page.getByRole("button", { name: "Save auto top-up" }).click()
          await page.getByText("Auto top-up is on.").waitFor()
          await screenshots(page, "22-billing-alerts-auto-topup")

          // An endpoint: its secret once, then a test event delivered.
          await page.getByRole("link", { name: "Webhooks" }).click()
          await heading(page, "Webhooks").waitFor()
          await page.getByLabel("Endpoint URL").fill(receiver.url("/ui"))
          await page.getByRole("button", { name: "Add endpoint" }).click()
          const secret = await page.getByLabel("Signing secret").inputValue()
          expect(secret).toMatch(/^whsec_/)
          await page.getByRole("button", { name: "I have saved it" }).click()
          const card = page.getByRole("article", { name: `Endpoint ${receiver.url("/ui")}` })
          await card.getByRole("button", { name: "Send test event" }).click()
          await expect.poll(async () => {
            await card.getByRole("button", { name: "Hide deliveries" }).click()
            await card.getByRole("button", { name: "Show deliveries" }).click()
            return (await card.getByRole("table").textContent({ timeout: 2_000 }).catch(() => "")) ?? ""
          }, { timeout: 15_000 }).toMatch(/webhook\.test\s*delivered/)
          expect(receiver.received().filter((r) => r.path === "/ui").length).toBe(1)
          await screenshots(page, "23-webhooks-delivery")
          expect(problems).toEqual([])
        })
      }))
  }
)
