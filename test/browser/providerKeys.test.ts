import { layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import type { Page } from "playwright-core"
import { beforeAll, expect } from "vitest"
import { randomBase62 } from "../../src/Domain/Ids.js"
import {
  ensureDashboardBuilt,
  goTo,
  inBrowser,
  overflowAtPhoneWidth,
  screenshots,
  signIn,
  strictPage
} from "../support/Browser.js"
import { call } from "../support/Http.js"
import { ProviderStandIn, ProviderStandInLive } from "../support/ProviderStandIn.js"
import { query, TestServer, TestServerLive } from "../support/TestServer.js"
import { developer } from "../support/Wallet.js"

/**
 * Provider keys in the dashboard, in a real browser (Debian's Chromium via playwright-core) against the whole
 * service and a stand-in provider on 127.0.0.1, allowed by PROVIDER_ALLOWED_HOSTS (docs/api/provider-keys.md):
 * a key added and listed by its last four only, a key the provider refuses shown with the service's message and
 * guidance, the mode changed, the key tested again, and deleted; the secret in the page at no step. A viewer
 * reads the list, a failing key with its last error, and is offered no change. Screenshots at desktop and phone
 * width go to test-results/dashboard/.
 */

beforeAll(ensureDashboardBuilt, 180_000)

const Server = Layer.merge(
  TestServerLive({ providerAllowedHosts: new Set(["127.0.0.1"]) }),
  ProviderStandInLive
)

const freshApiKey = () => `sk-standin-${randomBase62(32)}`

/** Whether `secret` is anywhere in the page: its text, its markup, or the value of a field. */
const shows = async (page: Page, secret: string): Promise<boolean> => {
  const values = await page.evaluate<Array<string>>(
    "[...document.querySelectorAll('input')].map((input) => input.value)"
  )
  return (await page.content()).includes(secret) || values.some((value) => value.includes(secret))
}

layer(Server, { excludeTestServices: true, timeout: 120_000 })("provider keys in the dashboard", (it) => {
  it.effect(
    "add, a refused key, change the mode, test and delete; the secret never on the page",
    () =>
      Effect.gen(function*() {
        const { baseUrl } = yield* TestServer
        const standIn = yield* ProviderStandIn
        const email = "e2e-provider-keys@example.com"
        const { token } = yield* developer(email)
        const listed = async () => {
          const response = await fetch(`${baseUrl}/dashboard/provider-keys`, {
            headers: { authorization: `Bearer ${token}` }
          })
          return ((await response.json()) as any).provider_keys as Array<any>
        }
        const goodKey = freshApiKey()
        const badKey = freshApiKey()
        standIn.accept(goodKey)

        yield* inBrowser(async (context) => {
          const { page, problems, failed } = await strictPage(context)
          await signIn(page, baseUrl, email)
          await goTo(page, "Provider keys")
          await page.getByText("No provider keys yet.").waitFor()
          await page.getByText("costs a BYOK fee, 5% of nenas's price").waitFor()

          // Added: the provider took the key; listed by its last four, and the field emptied.
          const form = page.getByRole("form", { name: "Add a provider key" })
          const fill = async (name: string, apiKey: string) => {
            await form.getByLabel("Name", { exact: true }).fill(name)
            await form.getByLabel("Base URL").fill(standIn.baseUrl)
            await form.getByLabel("API key").fill(apiKey)
            await form.getByLabel("General model").fill("stand-in-general")
            await form.getByLabel("Reasoning model").fill("stand-in-reasoning")
          }
          expect(await form.getByLabel("API key").getAttribute("type")).toBe("password")
          await fill("team vLLM", goodKey)
          await form.getByLabel("Embedding model").fill("e5")
          await form.getByText("First: your key first, before nenas's own upstreams.").waitFor()
          await form.getByRole("button", { name: "Add key" }).click()
          await page.getByRole("status").filter({ hasText: "Added “team vLLM”: the provider took the key." }).waitFor()
          const row = page.getByRole("row", { name: /team vLLM/ })
          await row.waitFor()
          expect(await row.getByRole("cell").allTextContents()).toEqual([
            standIn.baseUrl,
            "general stand-in-generalreasoning stand-in-reasoningembedding e5",
            // The mode's select, with its three options.
            "FirstFallbackOnly",
            `…${goodKey.slice(-4)}`,
            "ok",
            expect.any(String),
            "TestDelete"
          ])
          expect(await row.getByLabel("Mode of team vLLM").inputValue()).toBe("first")
          expect(await form.getByLabel("API key").inputValue()).toBe("")
          expect(await shows(page, goodKey)).toBe(false)
          const [key] = await listed()
          expect(key).toMatchObject({ name: "team vLLM", mode: "first", status: "ok", last4: goodKey.slice(-4) })
          expect(standIn.requests().at(-1)).toEqual({
            method: "GET",
            path: "/v1/models",
            authorization: `Bearer ${goodKey}`
          })
          await screenshots(page, "90-provider-keys")
          expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)

          // A key the provider refuses (401): the service's message and guidance, the field marked and focused.
          await fill("second account", badKey)
          await form.getByLabel("Mode", { exact: true }).selectOption("only")
          await form.getByText("Only: your key alone, never nenas's upstreams.").waitFor()
          await form.getByRole("button", { name: "Add key" }).click()
          const refusal = form.getByRole("alert")
          await refusal.waitFor()
          expect(await refusal.locator(".error-message").textContent()).toBe(
            `The provider refused the API key: GET ${standIn.baseUrl}/models answered HTTP 401.`
          )
          expect(await refusal.locator(".error-guidance").textContent()).toMatch(/^Check the key at the provider/)
          expect(await refusal.locator(".error-meta code").first().textContent()).toBe("invalid_request")
          const apiKeyField = form.getByLabel("API key")
          expect(await apiKeyField.getAttribute("aria-invalid")).toBe("true")
          expect(await page.evaluate<string>("document.activeElement.id")).toBe(await apiKeyField.getAttribute("id"))
          await screenshots(page, "91-provider-keys-refused")
          expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)
          expect(await listed()).toHaveLength(1)
          await form.getByLabel("API key").fill("")

          // The mode, changed in the list: the service has it.
          await page.getByLabel("Mode of team vLLM").selectOption("fallback")
          await page.getByRole("status").filter({ hasText: "“team vLLM” is now Fallback" }).waitFor()
          expect((await listed())[0].mode).toBe("fallback")
          await expect.poll(() => page.getByLabel("Mode of team vLLM").inputValue()).toBe("fallback")

          // Test: the provider is asked again with the stored key; once it revokes the key, the status says so.
          const checks = standIn.requests().length
          await page.getByRole("button", { name: "Test team vLLM" }).click()
          await page.getByRole("status").filter({ hasText: "Tested “team vLLM”: the provider took the key." }).waitFor()
          standIn.revoke(goodKey)
          await page.getByRole("button", { name: "Test team vLLM" }).click()
          await page.getByRole("status").filter({ hasText: "Tested “team vLLM”: refused." }).waitFor()
          await page.locator(".provider-status").filter({ hasText: "HTTP 401" }).waitFor()
          await screenshots(page, "92-provider-keys-test")
          expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)
          expect(standIn.requests().slice(checks)).toEqual([
            { method: "GET", path: "/v1/models", authorization: `Bearer ${goodKey}` },
            { method: "GET", path: "/v1/models", authorization: `Bearer ${goodKey}` }
          ])
          expect((await listed())[0]).toMatchObject({ status: "refused", mode: "fallback", last4: goodKey.slice(-4) })
          expect(await shows(page, goodKey)).toBe(false)
          expect(await shows(page, badKey)).toBe(false)

          // Deleted, after the confirmation.
          await page.getByRole("button", { name: "Delete team vLLM" }).click()
          const confirm = page.getByRole("dialog", { name: "Delete the provider key “team vLLM”?" })
          await confirm.getByRole("button", { name: "Delete key" }).click()
          await confirm.waitFor({ state: "detached" })
          await page.getByRole("status").filter({ hasText: "Deleted “team vLLM”." }).waitFor()
          await page.getByText("No provider keys yet.").waitFor()
          expect(await listed()).toEqual([])

          // The only failed response is the refusal of the bad key (a test that finds the key refused is a 200).
          const refused = ["/dashboard/provider-keys"]
          expect(failed).toEqual(refused.map((path) => `400 ${path}`))
          expect(problems).toEqual(refused.map((path) =>
            `error: Failed to load resource: the server responded with a status of 400 (Bad Request) ${path}`
          ))
        })
      }),
    180_000
  )

  it.effect("a viewer reads the keys, a failing one with its last error, and is offered no change", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      const standIn = yield* ProviderStandIn
      const owner = yield* developer("e2e-provider-keys-owner@example.com")
      const apiKey = freshApiKey()
      standIn.accept(apiKey)
      const made = yield* call("POST", "/dashboard/provider-keys", {
        token: owner.token,
        json: {
          name: "our OpenAI account",
          base_url: standIn.baseUrl,
          api_key: apiKey,
          models: { general: "gpt-4.1-mini", reasoning: "o4-mini" },
          mode: "only"
        }
      })
      expect(made.status, made.text).toBe(201)
      // As the key's latest calls would leave it: the provider answering 5xx.
      const failing = "the provider answered HTTP 503"
      yield* query("UPDATE provider_keys SET status = 'failing', last_error = $1 WHERE id = $2", [
        failing,
        made.body.provider_key.id
      ])
      const viewer = yield* developer("e2e-provider-keys-viewer@example.com")
      const invitation = yield* call("POST", "/dashboard/members/invitations", {
        token: owner.token,
        json: { email: "e2e-provider-keys-viewer@example.com", role: "viewer" }
      })
      expect(invitation.status, invitation.text).toBe(201)
      const accepted = yield* call("POST", `/dashboard/invitations/${invitation.body.id}/accept`, {
        token: viewer.token
      })
      expect(accepted.status, accepted.text).toBe(200)

      yield* inBrowser(async (context) => {
        const { page, problems, failed } = await strictPage(context)
        await signIn(page, baseUrl, "e2e-provider-keys-viewer@example.com")
        await page.getByLabel("Account", { exact: true }).selectOption(owner.accountId)
        await expect.poll(() => page.locator(".account .badge.role").textContent()).toBe("Your role: viewer")
        await goTo(page, "Provider keys")
        await page.getByText("Adding and changing provider keys needs the role owner or admin in this account.")
          .waitFor()
        const row = page.getByRole("row", { name: /our OpenAI account/ })
        await row.waitFor()
        expect(await row.getByRole("cell").allTextContents()).toEqual([
          standIn.baseUrl,
          "general gpt-4.1-minireasoning o4-miniembedding none",
          "Only",
          `…${apiKey.slice(-4)}`,
          `failing${failing}`,
          expect.any(String)
        ])
        expect(await page.getByRole("form", { name: "Add a provider key" }).count()).toBe(0)
        expect(await page.getByLabel("API key").count()).toBe(0)
        expect(await page.locator("table").getByRole("combobox").count()).toBe(0)
        expect(await page.locator("main").getByRole("button").count()).toBe(0)
        await screenshots(page, "93-viewer-provider-keys")
        expect(await overflowAtPhoneWidth(page)).toBeLessThanOrEqual(0)
        expect(failed).toEqual([])
        expect(problems).toEqual([])
      })
    }))
})
