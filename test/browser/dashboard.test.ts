import { layer } from "@effect/vitest"
import { Effect, Option } from "effect"
import { mkdir, readFile } from "node:fs/promises"
import { get } from "node:http"
import type { Page } from "playwright-core"
import { beforeAll, expect } from "vitest"
import { randomBase62 } from "../../src/Domain/Ids.js"
import { ensureDashboardBuilt, heading, inBrowser, screenshots, SHOTS, signIn } from "../support/Browser.js"
import { devToken } from "../support/Http.js"
import { deliverEvent, events, topUp, webhookOverrides } from "../support/Stripe.js"
import { TestServer, TestServerLive } from "../support/TestServer.js"

/**
 * The dashboard in a real browser (Debian's Chromium, driven by playwright-core)
 * against the whole service: sign-in, keys, the simulated checkout, a model
 * call seen in logs and on the chart, a 402's action_url, deletion. Screenshots
 * of every page at desktop and phone width go to test-results/dashboard/.
 */

beforeAll(ensureDashboardBuilt, 180_000)

interface CallReply {
  readonly status: number
  readonly body: { readonly error?: { readonly code: string; readonly action_url: string | null } }
}

const modelCall = (baseUrl: string, apiKey: string): Promise<CallReply> =>
  fetch(`${baseUrl}/v1/responses`, {
    method: "POST",
    headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "svc/nenas-flash", input: "Say hello to the dashboard.", max_output_tokens: 200 })
  }).then(async (response) => ({ status: response.status, body: await response.json() as CallReply["body"] }))

/** A GET with the path exactly as given. */
const rawGet = (baseUrl: string, path: string) =>
  new Promise<{ status: number; body: string }>((resolve, reject) => {
    const { hostname, port } = new URL(baseUrl)
    get({ host: hostname, port: Number(port), path }, (response) => {
      let body = ""
      response.setEncoding("utf8")
      response.on("data", (chunk: string) => (body += chunk))
      response.on("end", () => resolve({ status: response.statusCode ?? 0, body }))
    }).on("error", reject)
  })

/** Clicks the page's Export CSV button and reads the file the browser saves. */
const exported = async (page: Page): Promise<Array<string>> => {
  const [download] = await Promise.all([
    page.waitForEvent("download"),
    page.getByRole("button", { name: "Export CSV" }).click()
  ])
  return (await readFile(await download.path(), "utf8")).trimEnd().split("\r\n")
}

const stat = (page: Page, label: string) =>
  page.locator(".stat").filter({ has: page.locator(".stat-label", { hasText: new RegExp(`^${label}$`) }) }).locator(
    ".money"
  ).first()

layer(TestServerLive(webhookOverrides), { excludeTestServices: true, timeout: 120_000 })(
  "the dashboard in a browser",
  (it) => {
    it.effect("serves the build at /app/ with the caching the files need", () =>
      Effect.gen(function*() {
        const { baseUrl } = yield* TestServer
        yield* Effect.promise(async () => {
          const index = await fetch(`${baseUrl}/app/`)
          expect(index.status).toBe(200)
          expect(index.headers.get("content-type")).toContain("text/html")
          expect(index.headers.get("cache-control")).toBe("no-cache")
          const html = await index.text()
          const asset = /src="\/app\/(assets\/[^"]+\.js)"/.exec(html)?.[1]
          expect(asset).toBeDefined()

          // A client route is the same page: the app routes it.
          const route = await fetch(`${baseUrl}/app/billing?checkout=success`)
          expect(route.status).toBe(200)
          expect(route.headers.get("cache-control")).toBe("no-cache")
          expect(await route.text()).toBe(html)

          const script = await fetch(`${baseUrl}/app/${asset}`)
          expect(script.status).toBe(200)
          expect(script.headers.get("content-type")).toContain("javascript")
          expect(script.headers.get("cache-control")).toBe("public, max-age=31536000, immutable")

          // A missing asset is a 404 in the error shape, never the page in its place.
          const missing = await fetch(`${baseUrl}/app/assets/gone-0000.js`)
          expect(missing.status).toBe(404)
          expect((await missing.json() as CallReply["body"]).error?.code).toBe("not_found")

          // Nothing outside web/dist is reachable (sent raw: fetch would normalise the dots away).
          for (
            const path of [
              "/app/%2e%2e/%2e%2e/package.json",
              "/app/..%2f..%2fpackage.json",
              "/app/assets/..%2f..%2f..%2fpackage.json"
            ]
          ) {
            const escape = await rawGet(baseUrl, path)
            expect(escape.body, path).not.toContain("\"name\": \"nenas\"")
          }

          const head = await fetch(`${baseUrl}/app/logs`, { method: "HEAD" })
          expect(head.status).toBe(200)
          expect(head.headers.get("cache-control")).toBe("no-cache")

          const bare = await fetch(`${baseUrl}/app`, { redirect: "manual" })
          expect(bare.status).toBe(308)
          expect(bare.headers.get("location")).toBe("/app/")

          const config = await fetch(`${baseUrl}/app/config.json`)
          expect(await config.json() as unknown).toEqual({
            identity: "development",
            authorize: null,
            checkout: "simulated",
            business_timezone: "Asia/Kuala_Lumpur"
          })
        })
      }))

    it.effect(
      "sign in, create a key, follow a 402, top up, call, read logs and charts, delete the key",
      () =>
        Effect.gen(function*() {
          const { baseUrl } = yield* TestServer
          yield* inBrowser(async (context) => {
            await mkdir(SHOTS, { recursive: true })
            const problems: Array<string> = []
            const page = await context.newPage()
            page.on("console", (message) => {
              if (message.type() === "error" || message.type() === "warning") {
                problems.push(`${message.type()}: ${message.text()} ${new URL(message.location().url).pathname}`)
              }
            })
            page.on("pageerror", (error) => problems.push(`pageerror: ${error.message}`))
            // Chromium reports every failed response on the console; those are checked one by one below.
            const failedResponses: Array<string> = []
            page.on("response", (response) => {
              if (response.status() >= 400) {
                failedResponses.push(`${response.status()} ${new URL(response.url()).pathname}`)
              }
            })

            // Sign in through the development identity provider.
            await page.goto(`${baseUrl}/app/`)
            await expect.poll(() => heading(page, "Sign in to nenas").isVisible()).toBe(true)
            await screenshots(page, "1-sign-in")
            await page.getByLabel("Email").fill("e2e@example.com")
            await page.getByRole("button", { name: "Sign in", exact: true }).click()
            await heading(page, "Overview").waitFor()
            expect(await stat(page, "Available").textContent()).toBe("RM 0.00")
            // The token is kept in this tab's sessionStorage, never in a cookie.
            expect(await page.evaluate("window.sessionStorage.getItem('nenas.session')")).toMatch(/^ey/)
            expect(await context.cookies()).toEqual([])

            // Create a live key: the full key is shown once, with the warning and a copy button.
            await page.getByRole("link", { name: "API keys" }).click()
            await heading(page, "API keys").waitFor()
            await page.getByText("No API keys yet").waitFor()
            await page.getByLabel("Name").fill("e2e live")
            await page.getByLabel("Monthly spend limit (RM)").fill("50")
            await page.getByRole("button", { name: "Create key" }).click()
            const fullKeyInput = page.getByLabel("Full API key")
            await fullKeyInput.waitFor()
            const apiKey = await fullKeyInput.inputValue()
            expect(apiKey).toMatch(/^nns_live_[0-9A-Za-z]{32,}$/)
            await expect.poll(() => page.getByRole("note").textContent()).toMatch(/\S/)
            await expect.poll(() => page.getByRole("button", { name: "Copy" }).isVisible()).toBe(true)
            await page.getByRole("row", { name: /e2e live/ }).waitFor()
            expect(await page.getByRole("row", { name: /e2e live/ }).textContent()).toContain("RM 50.00")
            await screenshots(page, "2-api-keys-new-key")
            await page.getByRole("button", { name: "I have saved it" }).click()
            await page.reload()
            await page.getByRole("row", { name: /e2e live/ }).waitFor()
            // Seen once: after that, only the prefix.
            expect(await page.content()).not.toContain(apiKey)
            expect(await page.content()).toContain(`${apiKey.slice(0, 12)}…`)

            // An empty wallet: the call answers 402, and its action_url opens the billing page.
            const refused = await modelCall(baseUrl, apiKey)
            expect(refused.status).toBe(402)
            expect(refused.body.error?.code).toBe("insufficient_balance")
            const actionUrl = refused.body.error?.action_url
            expect(actionUrl).toBe(`${baseUrl}/app/billing`)
            await page.goto(actionUrl ?? "")
            await heading(page, "Billing").waitFor()
            expect(await stat(page, "Available").textContent()).toBe("RM 0.00")

            // Top up RM 10.00 through the simulated checkout and come back to the new balance.
            await page.getByRole("button", { name: "Top up RM 10.00" }).click()
            await page.waitForURL(/\/dev\/checkout\//)
            await page.getByRole("button", { name: "Pay" }).click()
            await page.getByRole("link", { name: "Back to the dashboard" }).click()
            await page.waitForURL(/\/app\/billing\?checkout=success/)
            await heading(page, "Billing").waitFor()
            await page.getByText("Payment received").waitFor()
            await expect.poll(() => stat(page, "Available").textContent()).toBe("RM 10.00")
            expect(await stat(page, "Available").getAttribute("title")).toBe("10,000,000 micro-MYR (RM 10.000000)")
            await page.getByRole("cell", { name: "Top-up", exact: true }).waitFor()
            await screenshots(page, "3-billing")

            // A model call with the key, billed, then visible in the logs with its details.
            const answered = await modelCall(baseUrl, apiKey)
            expect(answered.status).toBe(200)
            await page.getByRole("link", { name: "Logs" }).click()
            await heading(page, "Logs").waitFor()
            // The refused call is logged too, as failed; the answered one is billed.
            await expect.poll(() => page.getByRole("row", { name: /\/v1\/responses/ }).count()).toBe(2)
            await page.getByRole("row", { name: /\/v1\/responses.*failed/ }).waitFor()
            const row = page.getByRole("row", { name: /\/v1\/responses.*billed/ })
            await row.getByRole("button").click()
            const details = page.locator(".details")
            await details.waitFor()
            const detailText = await details.textContent()
            for (
              const label of ["Input tokens", "Cached input tokens", "Output tokens", "Reasoning tokens", "Latency"]
            ) {
              expect(detailText).toContain(label)
            }
            expect(detailText).toContain("API keye2e live")
            expect(detailText).toMatch(/Routing(general|reasoning)/)
            expect(detailText).toContain("Errornone")
            expect(detailText).toMatch(/Cost[\d,]+ micro-MYR \(RM 0\.\d{6}\)/)
            // The refused call's details name the error it answered with.
            await page.getByRole("row", { name: /\/v1\/responses.*failed/ }).getByRole("button").click()
            await expect.poll(() => page.locator(".details").last().textContent()).toContain(
              "Errorinsufficient_balance"
            )
            await screenshots(page, "4-logs")
            // The export holds the same two calls, money in MYR and micro-MYR.
            const logLines = await exported(page)
            expect(logLines[0]).toContain("cost_myr,cost_micro_myr")
            expect(
              logLines.slice(1).map((line) => line.split(",")[5]).sort()
            ).toEqual(["billed", "failed"])

            // The overview shows the call: a bar on the 30-day chart, and today's count.
            await page.getByRole("link", { name: "Overview" }).click()
            await heading(page, "Overview").waitFor()
            await expect.poll(() => page.locator(".recharts-bar-rectangle path, .recharts-bar-rectangle rect").count())
              .toBeGreaterThan(0)
            // Both calls count as requests (the refused one costs nothing).
            expect(await page.locator(".stat", { hasText: "Requests today" }).locator(".stat-value").textContent())
              .toBe(
                "2"
              )
            const spent = Number(await stat(page, "Spent today").getAttribute("data-micro-myr"))
            expect(spent).toBeGreaterThan(0)
            expect(await stat(page, "Available").getAttribute("data-micro-myr")).toBe(String(10_000_000 - spent))
            await screenshots(page, "5-overview")

            await page.getByRole("link", { name: "Usage" }).click()
            await heading(page, "Usage").waitFor()
            await page.getByLabel("API key").selectOption({ label: `e2e live (${apiKey.slice(0, 12)}…)` })
            await expect.poll(() =>
              page.locator(".stat", { hasText: "Requests, key" }).locator(".stat-value").textContent()
            ).toBe("2")
            await expect.poll(() => page.locator(".recharts-bar-rectangle").count()).toBeGreaterThan(0)
            await screenshots(page, "6-usage")
            const usageLines = await exported(page)
            expect(usageLines[0]).toBe(
              "bucket,requests,cost_myr,cost_micro_myr,input_tokens,output_tokens,reasoning_tokens"
            )
            expect(usageLines.slice(1).reduce((sum, line) => sum + Number(line.split(",")[1]), 0)).toBe(2)

            // Delete the key: the dialog names what cannot be undone; the key then answers revoked_api_key.
            await page.getByRole("link", { name: "API keys" }).click()
            await page.getByRole("button", { name: "Delete e2e live" }).click()
            const dialog = page.getByRole("dialog")
            await dialog.waitFor()
            expect(await dialog.textContent()).toContain("cannot be undone")
            await screenshots(page, "7-api-keys-delete")
            await dialog.getByRole("button", { name: "Delete key" }).click()
            await page.getByRole("row", { name: /e2e live.*revoked/ }).waitFor()
            const revoked = await modelCall(baseUrl, apiKey)
            expect(revoked.status).toBe(401)
            expect(revoked.body.error?.code).toBe("revoked_api_key")
            await page.reload()
            await page.getByText("No API keys yet").waitFor()

            // 90 days by hour is over the API's 744 hourly buckets: the page offers it by day instead.
            await page.goto(`${baseUrl}/app/usage`)
            await page.getByLabel("Granularity").selectOption("hour")
            await page.getByLabel("Range").selectOption("90")
            await expect.poll(() => page.getByLabel("Granularity").inputValue()).toBe("day")
            expect(await page.getByRole("option", { name: "By hour" }).isDisabled()).toBe(true)
            // An API error in the page: a custom range over 366 days, by day.
            await page.getByLabel("Range").selectOption("custom")
            await page.getByLabel("From").fill("2020-01-01T00:00")
            const alert = page.getByRole("alert")
            await alert.waitFor()
            expect(await alert.textContent()).toContain("at most 366 daily buckets")
            await screenshots(page, "8-usage-error")

            // The only failed response is the one asked for above; nothing else logged an error or a warning.
            expect(failedResponses).toEqual(["400 /dashboard/usage"])
            // The simulated checkout's plain HTML page (not the dashboard) has no favicon.
            expect(problems).toEqual([
              "error: Failed to load resource: the server responded with a status of 404 (Not Found) /favicon.ico",
              "error: Failed to load resource: the server responded with a status of 400 (Bad Request) /dashboard/usage"
            ])
          })
        }),
      { timeout: 240_000 }
    )
    it.effect("an open dispute shows on the billing page as a suspension", () =>
      Effect.gen(function*() {
        const { baseUrl } = yield* TestServer
        const email = "e2e-disputed@example.com"
        const payment = yield* topUp(yield* devToken(email), 2500)
        const dispute = events.disputeCreated({
          disputeId: `dp_${randomBase62(24)}`,
          chargeId: payment.chargeId,
          paymentIntentId: payment.paymentIntentId,
          amountSen: 1000
        })
        expect((yield* deliverEvent(dispute)).status).toBe(200)
        yield* inBrowser(async (context) => {
          const page = await context.newPage()
          await signIn(page, baseUrl, email)
          await page.getByRole("link", { name: "Billing" }).click()
          const alert = page.getByRole("alert")
          await alert.waitFor()
          expect(await alert.textContent()).toContain("suspended while a payment dispute is open")
          expect(await stat(page, "Available").textContent()).toBe("RM 15.00")
          await page.getByRole("cell", { name: "Chargeback", exact: true }).waitFor()
          await screenshots(page, "9-billing-suspended")
        })
      }), { timeout: 120_000 })
    it.effect(
      "a pasted token signs in once its account is confirmed; signing out forgets it",
      () =>
        Effect.gen(function*() {
          const { baseUrl } = yield* TestServer
          const token = yield* devToken("e2e-handoff@example.com")
          yield* inBrowser(async (context) => {
            // A pasted token is used only once the developer confirms the account it names.
            // (A token in the URL fragment needs the state this browser stored: test/dashboardSignIn.test.ts.)
            const page = await context.newPage()
            await page.goto(`${baseUrl}/app/billing`)
            await page.getByLabel("Session token").fill(token)
            await page.getByRole("button", { name: "Use this token" }).click()
            await page.getByRole("button", { name: "Sign in as e2e-handoff@example.com" }).click()
            await heading(page, "Billing").waitFor()
            expect(await page.evaluate("window.sessionStorage.getItem('nenas.session')")).toBe(token)
            expect(await context.cookies()).toEqual([])
            await page.getByRole("button", { name: "Sign out" }).click()
            await heading(page, "Sign in to nenas").waitFor()
            expect(await page.evaluate("window.sessionStorage.getItem('nenas.session')")).toBeNull()

            // A token the API refuses: its error, and a way back to sign in.
            await page.evaluate("window.sessionStorage.setItem('nenas.session', 'not-a-token')")
            await page.goto(`${baseUrl}/app/logs`)
            const alert = page.getByRole("alert").first()
            await alert.waitFor()
            expect(await alert.textContent()).toContain("authentication_error")
            await alert.getByRole("button", { name: "Sign in again" }).click()
            await heading(page, "Sign in to nenas").waitFor()
          })
        }),
      { timeout: 120_000 }
    )
  }
)

layer(
  TestServerLive({
    authJwksUrl: Option.some("http://127.0.0.1:9/.well-known/jwks.json"),
    authIssuer: Option.some("https://idp.example/"),
    authAudience: Option.some("nenas-dashboard"),
    authAuthorizeUrl: Option.some("https://idp.example/authorize")
  }),
  {
    excludeTestServices: true,
    timeout: 120_000
  }
)("the dashboard with a configured identity provider", (it) => {
  it.effect("offers the provider's hand-off, not the development email sign-in", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      yield* inBrowser(async (context) => {
        const page = await context.newPage()
        await page.goto(`${baseUrl}/app/`)
        await page.getByRole("heading", { name: "Sign in with your identity provider" }).waitFor()
        expect(await page.getByRole("button", { name: "Continue to sign-in" }).count()).toBe(1)
        expect(await page.getByLabel("Email").count()).toBe(0)
        expect(await page.getByLabel("Session token").count()).toBe(1)
        await screenshots(page, "10-sign-in-identity-provider")
      })
    }), { timeout: 120_000 })
})
