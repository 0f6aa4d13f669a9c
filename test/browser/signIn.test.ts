import { layer } from "@effect/vitest"
import { Context, Effect, Layer, Option } from "effect"
import type { Page } from "playwright-core"
import { beforeAll, expect } from "vitest"
import { ensureDashboardBuilt, heading, inBrowser } from "../support/Browser.js"
import { type Idp, startIdp } from "../support/Idp.js"
import { TestServer, TestServerLive } from "../support/TestServer.js"

/**
 * The dashboard's sign-in with a real identity provider, in a browser: only a
 * redirect this browser started (its state and nonce) signs in; a link someone
 * else made is ignored; a pasted token needs the developer to confirm its account.
 * And the API reference at /docs renders, sandboxed away from the dashboard's storage.
 */

beforeAll(ensureDashboardBuilt, 180_000)

class TestIdp extends Context.Tag("test/TestIdp")<TestIdp, Idp>() {}

const IdpAndServer = Layer.unwrapScoped(Effect.gen(function*() {
  const idp = yield* startIdp({
    audience: "nenas-dashboard-client",
    subject: "idp|developer",
    email: "developer@example.com"
  })
  return Layer.merge(
    TestServerLive({
      authJwksUrl: Option.some(idp.jwksUrl),
      authIssuer: Option.some(idp.issuer),
      authAudience: Option.some(idp.audience),
      authAuthorizeUrl: Option.some(idp.authorizeUrl)
    }),
    Layer.succeed(TestIdp, idp)
  )
}))

const storedSession = (page: Page) => page.evaluate<string | null>("window.sessionStorage.getItem('nenas.session')")

layer(IdpAndServer, { excludeTestServices: true, timeout: 120_000 })("signing in to the dashboard", (it) => {
  it.effect("a fragment token without the state this browser stored is ignored", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      const idp = yield* TestIdp
      // A valid token for the attacker's own account, as a login-CSRF link would carry it.
      const attackers = yield* Effect.promise(() =>
        idp.sign({ sub: "idp|attacker", email: "attacker@example.com", nonce: "attacker-nonce" })
      )
      yield* inBrowser(async (context) => {
        const page = await context.newPage()
        for (const fragment of [`id_token=${attackers}`, `token=${attackers}&state=attacker-nonce`]) {
          // From another page: a fragment change on the loaded app is no new load, and signs nothing in either.
          await page.goto("about:blank")
          await page.goto(`${baseUrl}/app/#${fragment}`)
          await heading(page, "Sign in to nenas").waitFor()
          expect(await page.getByRole("alert").textContent()).toContain("not started from this browser")
          expect(await storedSession(page)).toBeNull()
          // The token does not stay in the address bar.
          expect(new URL(page.url()).hash).toBe("")
        }
        // A sign-in this browser started, but a token issued for another one: its nonce differs.
        await page.evaluate("window.sessionStorage.setItem('nenas.signin.nonce', 'this-browsers-nonce')")
        await page.goto("about:blank")
        await page.goto(`${baseUrl}/app/#id_token=${attackers}&state=this-browsers-nonce`)
        await heading(page, "Sign in to nenas").waitFor()
        expect(await page.getByRole("alert").textContent()).toContain("not issued for this sign-in")
        expect(await storedSession(page)).toBeNull()
      })
    }))

  it.effect("the provider's redirect back, with this browser's state and nonce, signs in", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      yield* inBrowser(async (context) => {
        const page = await context.newPage()
        await page.goto(`${baseUrl}/app/`)
        await page.getByRole("button", { name: "Continue to sign-in" }).click()
        await heading(page, "Overview").waitFor()
        expect(await storedSession(page)).toMatch(/^ey/)
        expect(new URL(page.url()).hash).toBe("")
        // The nonce is spent: the same redirect a second time signs nothing in.
        expect(await page.evaluate("window.sessionStorage.getItem('nenas.signin.nonce')")).toBeNull()
      })
    }))

  it.effect("a pasted token shows the account it signs into and is used only once confirmed", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      const idp = yield* TestIdp
      const token = yield* Effect.promise(() => idp.sign({ sub: "idp|pasted", email: "pasted@example.com" }))
      yield* inBrowser(async (context) => {
        const page = await context.newPage()
        await page.goto(`${baseUrl}/app/`)
        await page.getByLabel("Session token").fill(token)
        await page.getByRole("button", { name: "Use this token" }).click()
        const confirm = page.getByRole("group", { name: "Confirm the account" })
        await confirm.waitFor()
        expect(await confirm.textContent()).toContain("pasted@example.com")
        expect(await confirm.textContent()).toContain(idp.issuer)
        expect(await storedSession(page)).toBeNull()
        await page.getByRole("button", { name: "Cancel" }).click()
        expect(await storedSession(page)).toBeNull()
        await page.getByRole("button", { name: "Use this token" }).click()
        await page.getByRole("button", { name: "Sign in as pasted@example.com" }).click()
        await heading(page, "Overview").waitFor()
        expect(await storedSession(page)).toBe(token)
      })
    }))

  it.effect("the API reference renders under its sandbox, and cannot read the dashboard's storage", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      yield* inBrowser(async (context) => {
        const dashboard = await context.newPage()
        await dashboard.goto(`${baseUrl}/app/`)
        await dashboard.evaluate("window.sessionStorage.setItem('nenas.session', 'secret-session')")
        const page = await context.newPage()
        const violations: Array<string> = []
        page.on("console", (message) => {
          if (message.text().includes("Content Security Policy")) violations.push(message.text())
        })
        page.on("pageerror", (error) => violations.push(`pageerror: ${error.message}`))
        await page.goto(`${baseUrl}/docs`)
        await page.getByText("/v1/chat/completions").first().waitFor({ timeout: 30_000 })
        await page.getByRole("heading", { name: "modelCalls" }).first().waitFor()
        expect(await page.evaluate("window.origin")).toBe("null")
        // The sandbox refuses the origin's storage; the page runs on an empty one in memory instead.
        const storage = await page.evaluate<string>(
          "(() => { try { return window.sessionStorage.getItem('nenas.session') ?? 'empty' } catch (error) { return 'denied: ' + error.name } })()"
        )
        expect(storage).toBe("empty")
        await page.screenshot({ path: "test-results/dashboard/docs-sandboxed.png" })
        expect(violations).toEqual([])
      })
    }))
})
