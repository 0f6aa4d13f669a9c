import { layer } from "@effect/vitest"
import { Effect } from "effect"
import { readFile } from "node:fs/promises"
import type { BrowserContext, Page } from "playwright-core"
import { beforeAll, describe, expect, it } from "vitest"
import { ROUTE_ROLES } from "../../web/src/contract.js"
import {
  allows,
  grantableRoles,
  mayChangeKey,
  mayChangeMember,
  mayRemoveMember,
  type Role,
  ROLES
} from "../../web/src/roles.js"
import {
  ensureDashboardBuilt,
  heading,
  inBrowser,
  launchBrowser,
  PHONE,
  screenshots,
  signIn,
  watchedPage
} from "../support/Browser.js"
import { call, createKey, devToken } from "../support/Http.js"
import { TestServer, TestServerLive } from "../support/TestServer.js"

/**
 * Teams in the dashboard, in a real browser (Debian's Chromium via playwright-core) against the whole
 * service: the account switcher, the Members page (invite, accept in a second browser, change, remove),
 * the Audit log, and every page offering a role only what the service allows it. Screenshots at
 * desktop and phone width go to test-results/dashboard/.
 */

beforeAll(ensureDashboardBuilt, 180_000)

describe("what each role may do (web/src/roles.ts)", () => {
  const key = (memberId: string | null) => ({ member_id: memberId })
  it.each(ROLES.map((role) => [role]))("%s", (role: Role) => {
    expect(allows(role, "GET /dashboard/audit-log")).toBe(true)
    expect(allows(role, "POST /dashboard/api-keys")).toBe(["owner", "admin", "developer"].includes(role))
    expect(allows(role, "POST /dashboard/billing/checkout")).toBe(["owner", "billing"].includes(role))
    expect(allows(role, "PUT /dashboard/billing/settings")).toBe(["owner", "admin", "billing"].includes(role))
    expect(allows(role, "POST /dashboard/members/invitations")).toBe(["owner", "admin"].includes(role))
    // Only an owner makes, changes or removes an owner.
    expect(grantableRoles(role)).toEqual(
      role === "owner" ? ROLES : role === "admin" ? ROLES.filter((r) => r !== "owner") : []
    )
    expect(mayChangeMember(role, "owner")).toBe(role === "owner")
    expect(mayRemoveMember(role, "developer")).toBe(["owner", "admin"].includes(role))
    // A developer changes only the keys it made.
    const me = { role, memberId: "mem_me" }
    expect(mayChangeKey(me, key("mem_me"), "PATCH /dashboard/api-keys/{id}")).toBe(
      ["owner", "admin", "developer"].includes(role)
    )
    expect(mayChangeKey(me, key("mem_other"), "DELETE /dashboard/api-keys/{id}")).toBe(
      ["owner", "admin"].includes(role)
    )
  })
})

/** A watched page whose console errors and warnings (React's among them) are collected with its uncaught errors. */
const strictPage = async (context: BrowserContext) => {
  const watched = await watchedPage(context)
  watched.page.on("console", (message) => {
    if (message.type() === "error" || message.type() === "warning") {
      watched.problems.push(`${message.type()}: ${message.text()}`)
    }
  })
  return watched
}

/** The account switcher's role badge: "Your role: owner". */
const roleShown = (page: Page) => page.locator(".account .badge.role").textContent()

/** The names of the buttons on the page now. */
const buttons = (page: Page) => page.getByRole("button").allTextContents()

/** The page is as wide as the screen: nothing to scroll sideways. */
const noSidewaysScroll = async (page: Page) => {
  await page.setViewportSize(PHONE)
  await page.waitForTimeout(200)
  expect(await page.evaluate<number>("document.documentElement.scrollWidth - window.innerWidth")).toBeLessThanOrEqual(0)
  await page.setViewportSize({ width: 1280, height: 800 })
}

const goTo = async (page: Page, link: string, title: string = link) => {
  await page.getByRole("navigation", { name: "Dashboard" }).getByRole("link", { name: link, exact: true }).click()
  await heading(page, title).waitFor()
}

/** The person's session, their personal account and member id there. */
const person = (email: string) =>
  Effect.gen(function*() {
    const token = yield* devToken(email)
    const accounts = (yield* call("GET", "/dashboard/accounts", { token })).body.accounts as Array<
      { id: string; member_id: string }
    >
    return { token, account: accounts[0]!.id, member: accounts[0]!.member_id }
  })

/** `email` joins `owner`'s account as `role` through the API: invited, then accepted. */
const joins = (owner: { token: string }, email: string, role: Role) =>
  Effect.gen(function*() {
    const joiner = yield* person(email)
    const invitation = yield* call("POST", "/dashboard/members/invitations", {
      token: owner.token,
      json: { email, role }
    })
    expect(invitation.status, invitation.text).toBe(201)
    const accepted = yield* call("POST", `/dashboard/invitations/${invitation.body.id}/accept`, { token: joiner.token })
    expect(accepted.status, accepted.text).toBe(200)
    return { ...joiner, teamMember: accepted.body.account.member_id as string }
  })

const WEBHOOK_HOST = "127.0.0.1:9"

layer(TestServerLive({ webhookAllowedHosts: new Set([WEBHOOK_HOST]) }), {
  excludeTestServices: true,
  timeout: 180_000
})("teams in the dashboard", (it) => {
  it.effect("the roles the dashboard offers are the ones the service declares (x-nenas-roles in /openapi.json)", () =>
    Effect.gen(function*() {
      const spec = (yield* call("GET", "/openapi.json")).body as {
        paths: Record<string, Record<string, { "x-nenas-roles"?: Array<string> }>>
      }
      const declared: Record<string, Array<string>> = {}
      for (const [path, item] of Object.entries(spec.paths)) {
        for (const [method, operation] of Object.entries(item)) {
          const roles = operation["x-nenas-roles"]
          if (path.startsWith("/dashboard/") && roles !== undefined) declared[`${method.toUpperCase()} ${path}`] = roles
        }
      }
      expect(ROUTE_ROLES).toEqual(declared)
    }))

  it.effect("Members: invite, accept in a second browser, change the role and budget, remove with the keys given over", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      yield* inBrowser(async (context) => {
        const { page, problems } = await strictPage(context)
        await signIn(page, baseUrl, "team-ui-owner@example.com")
        expect(await roleShown(page)).toBe("Your role: owner")

        await goTo(page, "Members")
        await page.getByRole("row", { name: /team-ui-owner@example\.com \(you\)/ }).waitFor()
        await page.getByLabel("Email address").fill("team-ui-dev@example.com")
        await page.getByLabel("Role", { exact: true }).selectOption("developer")
        await page.getByRole("button", { name: "Send invitation" }).click()
        const sent = page.getByRole("status").filter({ hasText: "Invited team-ui-dev@example.com as developer" })
        const acceptUrl = await sent.locator("code").textContent()
        expect(acceptUrl).toMatch(/\/app\/invitations\?id=inv_/)
        await page.getByRole("row", { name: /team-ui-dev@example\.com/ }).getByRole("button", { name: /Revoke/ })
          .waitFor()
        await screenshots(page, "40-members-invited")

        // The invited person follows the email's link in a browser of their own, signs in, and accepts.
        const second = await launchBrowser()
        // Kept outside the try, so that a failure reports what the invitee's page logged.
        let inviteeProblems: Array<string> = []
        try {
          const watched = await strictPage(second.context)
          const invitee = watched.page
          inviteeProblems = watched.problems
          await invitee.goto(`${baseUrl}${new URL(acceptUrl ?? "").pathname}${new URL(acceptUrl ?? "").search}`)
          await invitee.getByLabel("Email").fill("team-ui-dev@example.com")
          await invitee.getByRole("button", { name: "Sign in", exact: true }).click()
          await heading(invitee, "Your invitations").waitFor()
          const card = invitee.getByRole("article", { name: /^Invitation to .*team-ui-owner@example\.com$/ })
          await card.getByRole("heading", { name: /^Join .*team-ui-owner@example\.com as developer$/ }).waitFor()
          await screenshots(invitee, "41-invitation")
          await card.getByRole("button", { name: "Accept invitation" }).click()
          await invitee.getByText("You joined team-ui-owner@example.com as developer.").waitFor()
          // The account is in the switcher now; switching shows the team's overview as a developer.
          await invitee.getByRole("button", { name: "Switch to team-ui-owner@example.com" }).click()
          await heading(invitee, "Overview").waitFor()
          expect(await roleShown(invitee)).toBe("Your role: developer")
          expect(await invitee.getByLabel("Account", { exact: true }).inputValue()).not.toBe("")
          // A developer makes keys in the team's account.
          await goTo(invitee, "API keys")
          await invitee.getByLabel("Name", { exact: true }).fill("dev team key")
          await invitee.getByLabel("Environment").selectOption("test")
          await invitee.getByRole("button", { name: "Create key" }).click()
          await invitee.getByRole("button", { name: "I have saved it" }).click()
          await invitee.getByRole("row", { name: /dev team key/ }).waitFor()
          expect(inviteeProblems).toEqual([])

          // The owner sees the new member, and changes their role and budget.
          await page.getByRole("button", { name: "Refresh" }).click()
          const row = page.getByRole("row", { name: /team-ui-dev@example\.com/ }).filter({
            has: page.getByRole("button", { name: /Change/ })
          })
          await expect.poll(() => row.textContent()).toContain("developer")
          await row.getByRole("button", { name: "Change team-ui-dev@example.com" }).click()
          const change = page.getByRole("dialog", { name: "Change team-ui-dev@example.com" })
          await change.getByLabel("Role").selectOption("admin")
          await change.getByLabel("Monthly budget (RM)").fill("50")
          await screenshots(page, "42-members-change")
          await change.getByRole("button", { name: "Save changes" }).click()
          await change.waitFor({ state: "detached" })
          await expect.poll(() => row.textContent()).toContain("admin")
          expect(await row.textContent()).toContain("of RM 50.00")
          await screenshots(page, "43-members-changed")
          await invitee.reload()
          await heading(invitee, "API keys").waitFor()
          expect(await roleShown(invitee)).toBe("Your role: admin")

          // Removed, with their key given to the owner: the key stays, now the owner's.
          await row.getByRole("button", { name: "Remove team-ui-dev@example.com" }).click()
          const remove = page.getByRole("dialog", { name: "Remove team-ui-dev@example.com?" })
          await remove.getByLabel("Give them to another member").check()
          await remove.getByLabel("Give the keys to").selectOption({ label: "team-ui-owner@example.com (owner)" })
          await screenshots(page, "44-members-remove")
          await remove.getByRole("button", { name: "Remove member" }).click()
          await page.getByText("team-ui-dev@example.com was removed; 1 of their keys were given to another member.")
            .waitFor()
          await expect.poll(() => page.getByRole("row", { name: /team-ui-dev@example\.com/ }).count()).toBe(0)
          await goTo(page, "API keys")
          const given = page.getByRole("row", { name: /dev team key/ })
          expect(await given.textContent()).toContain("active")

          // The removed person's browser falls back to their personal account.
          await invitee.reload()
          await heading(invitee, "API keys").waitFor()
          expect(await roleShown(invitee)).toBe("Your role: owner")
          await invitee.getByText("No API keys yet.").waitFor()
          await noSidewaysScroll(invitee)
          expect(inviteeProblems).toEqual([])
        } catch (error) {
          // The second browser's pages (inBrowser adds the first's): address, text, and what they logged.
          const shown = await Promise.all(
            second.context.pages().map(async (open) => {
              await open.screenshot({ path: "test-results/dashboard/invitee-failed.png" }).catch(() => undefined)
              const text = await open.locator("body").innerText({ timeout: 2_000 }).catch(() => "(unreadable)")
              return `${open.url()}\n${text.slice(0, 1_500)}`
            })
          )
          if (error instanceof Error) {
            error.message += `\n\nThe invited person's browser:\n${shown.join("\n---\n")}\nIts console errors: ${
              JSON.stringify(inviteeProblems)
            }`
          }
          throw error
        } finally {
          await second.close()
        }
        await goTo(page, "Members")
        await noSidewaysScroll(page)
        expect(problems).toEqual([])
      })
    }))

  it.effect("Audit log: the changes with who, what and where, filtered by action and exported", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      const owner = yield* person("audit-ui@example.com")
      const key = yield* createKey(owner.token, { name: "audited key", environment: "test" })
      const changed = yield* call("PATCH", `/dashboard/api-keys/${key.key.id}`, {
        token: owner.token,
        json: { monthly_spend_limit_myr: 20 }
      })
      expect(changed.status, changed.text).toBe(200)
      const invited = yield* call("POST", "/dashboard/members/invitations", {
        token: owner.token,
        json: { email: "audit-guest@example.com", role: "viewer" }
      })
      expect(invited.status, invited.text).toBe(201)
      yield* inBrowser(async (context) => {
        const { page, problems } = await strictPage(context)
        await signIn(page, baseUrl, "audit-ui@example.com")
        await goTo(page, "Audit log")
        const rows = page.locator("table.audit tbody tr")
        await expect.poll(() => rows.count()).toBe(3)
        // Newest first: who, what, the target and the change, from which address and in which request.
        expect(await rows.nth(0).textContent()).toContain("Member invited")
        expect(await rows.nth(0).textContent()).toContain("audit-guest@example.com")
        expect(await rows.nth(1).textContent()).toContain("Key changed")
        expect(await rows.nth(1).textContent()).toContain(key.key.id)
        expect(await rows.nth(1).textContent()).toMatch(/monthly_?spend_?limit_?myr: 20/i)
        expect(await rows.nth(2).textContent()).toContain("Key created")
        for (let n = 0; n < 3; n++) {
          const text = await rows.nth(n).textContent()
          expect(text).toContain("audit-ui@example.com")
          expect(text).toContain("127.0.0.1")
          expect(text).toMatch(/req_/)
        }
        await page.getByText("3 entries").waitFor()
        await screenshots(page, "45-audit-log")

        await page.getByLabel("Action").selectOption({ label: "Key changed" })
        await expect.poll(() => rows.count()).toBe(1)
        expect(await rows.nth(0).textContent()).toContain("Key changed")
        await page.getByText("1 entries").waitFor()
        await screenshots(page, "46-audit-log-filtered")

        // The export takes the same filter.
        const [download] = await Promise.all([
          page.waitForEvent("download"),
          page.getByRole("button", { name: "Export CSV" }).click()
        ])
        expect(download.suggestedFilename()).toBe("nenas-audit-log.csv")
        const lines = (await readFile(await download.path(), "utf8")).trim().split(/\r?\n/)
        expect(lines.length).toBe(2)
        expect(lines[1]).toContain("api_key.updated")
        expect(lines[1]).toContain(key.key.id)

        await page.getByLabel("Action").selectOption({ label: "Any" })
        await expect.poll(() => rows.count()).toBe(3)
        await noSidewaysScroll(page)
        expect(problems).toEqual([])
      })
    }))

  it.effect("the account switcher changes what Overview and API keys show, and is remembered", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      const team = yield* person("switch-team@example.com")
      yield* createKey(team.token, { name: "team key one", environment: "test" })
      yield* createKey(team.token, { name: "team key two", environment: "test" })
      const member = yield* joins(team, "switch-member@example.com", "developer")
      yield* createKey(member.token, { name: "my own key", environment: "test" })
      yield* inBrowser(async (context) => {
        const { page, problems } = await strictPage(context)
        await signIn(page, baseUrl, "switch-member@example.com")
        const keysStat = page.locator(".stat").filter({ hasText: "API keys" })
        // Without a choice: the personal account, where they are the owner.
        expect(await roleShown(page)).toBe("Your role: owner")
        await expect.poll(() => keysStat.textContent()).toContain("1 active")
        const switcher = page.getByLabel("Account", { exact: true })
        expect(await switcher.locator("option").allTextContents()).toEqual([
          "switch-member@example.com (personal)",
          "switch-team@example.com"
        ])

        await switcher.selectOption(team.account)
        await expect.poll(() => roleShown(page)).toBe("Your role: developer")
        await expect.poll(() => keysStat.textContent()).toContain("2 active")
        await screenshots(page, "47-switcher-team-overview")
        await goTo(page, "API keys")
        await page.getByRole("row", { name: /team key one/ }).waitFor()
        expect(await page.getByRole("row", { name: /my own key/ }).count()).toBe(0)

        // Switching reloads the page it is on; the choice outlasts a reload.
        await switcher.selectOption(member.account)
        await page.getByRole("row", { name: /my own key/ }).waitFor()
        expect(await page.getByRole("row", { name: /team key one/ }).count()).toBe(0)
        await switcher.selectOption(team.account)
        await page.getByRole("row", { name: /team key two/ }).waitFor()
        await page.reload()
        await page.getByRole("row", { name: /team key two/ }).waitFor()
        expect(await roleShown(page)).toBe("Your role: developer")
        await screenshots(page, "48-switcher-team-keys")
        await noSidewaysScroll(page)
        expect(problems).toEqual([])
      })
    }))

  it.effect("a viewer is offered no button that changes keys, billing, webhooks or members; a developer only its own keys", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TestServer
      const owner = yield* person("viewer-team@example.com")
      const ownerKey = yield* createKey(owner.token, { name: "the owner's key", environment: "test" })
      const hook = yield* call("POST", "/dashboard/webhooks", {
        token: owner.token,
        json: { url: `http://${WEBHOOK_HOST}/teams`, events: ["balance.low"] }
      })
      expect(hook.status, hook.text).toBe(201)
      yield* joins(owner, "viewer-ui@example.com", "viewer")
      const developer = yield* joins(owner, "developer-ui@example.com", "developer")
      // A key the developer makes in the team's account (named by the header) is the team's and the developer's.
      const teamKey = yield* call("POST", "/dashboard/api-keys", {
        token: developer.token,
        headers: { "nenas-account": owner.account },
        json: { name: "the developer's team key", environment: "test" }
      })
      expect(teamKey.status, teamKey.text).toBe(201)

      yield* inBrowser(async (context) => {
        const { page, problems } = await strictPage(context)
        await signIn(page, baseUrl, "viewer-ui@example.com")
        await page.getByLabel("Account", { exact: true }).selectOption(owner.account)
        await expect.poll(() => roleShown(page)).toBe("Your role: viewer")
        // Overview: the balance, but no way to top up.
        await page.locator(".stat").filter({ hasText: "Available" }).waitFor()
        expect(await page.getByRole("link", { name: "Top up" }).count()).toBe(0)

        await goTo(page, "API keys")
        await page.getByRole("row", { name: /the owner's key/ }).waitFor()
        await page.getByRole("row", { name: /the developer's team key/ }).waitFor()
        expect(await page.getByRole("heading", { name: "Create a key" }).count()).toBe(0)
        expect(await buttons(page)).toEqual(["Sign out"])
        await screenshots(page, "49-viewer-api-keys")

        await goTo(page, "Billing")
        await page.getByRole("heading", { name: "Auto top-up" }).waitFor()
        await page.getByText("Topping up needs the role owner or billing in this account.").waitFor()
        expect(await buttons(page)).toEqual(["Sign out", "Refresh", "Previous", "Next"])
        await screenshots(page, "50-viewer-billing")

        await goTo(page, "Webhooks")
        // A viewer reads a webhook's URL masked past its host (docs/api/teams.md, "Teams": webhooks and members).
        await page.getByRole("article", { name: `Endpoint http://${WEBHOOK_HOST}/…` }).waitFor()
        expect(await page.getByText(`http://${WEBHOOK_HOST}/teams`).count()).toBe(0)
        await page.getByText("Adding and changing endpoints needs the role owner or admin in this account.").waitFor()
        expect(await buttons(page)).toEqual(["Sign out", "Show deliveries"])
        await page.getByRole("button", { name: "Show deliveries" }).click()
        await page.getByText("No deliveries yet.").waitFor()
        await screenshots(page, "51-viewer-webhooks")

        await goTo(page, "Members")
        await page.getByRole("row", { name: /developer-ui@example\.com/ }).waitFor()
        await page.getByRole("heading", { name: "Open invitations" }).waitFor()
        await page.getByText("No open invitations.").waitFor()
        expect(await buttons(page)).toEqual(["Sign out", "Refresh"])
        await screenshots(page, "52-viewer-members")
        expect(problems).toEqual([])
      })

      yield* inBrowser(async (context) => {
        const { page, problems } = await strictPage(context)
        await signIn(page, baseUrl, "developer-ui@example.com")
        await page.getByLabel("Account", { exact: true }).selectOption(owner.account)
        await expect.poll(() => roleShown(page)).toBe("Your role: developer")
        await goTo(page, "API keys")
        await page.getByRole("button", { name: "Create key" }).waitFor()
        const mine = page.getByRole("row", { name: /the developer's team key/ })
        const theirs = page.getByRole("row", { name: /the owner's key/ })
        await mine.getByRole("button", { name: "Edit the developer's team key" }).waitFor()
        expect(await mine.getByRole("button").allTextContents()).toEqual(["Edit", "Rotate", "Delete"])
        expect(await theirs.getByRole("button").count()).toBe(0)
        // A link to edit another member's key opens no dialog, and says why.
        await page.goto(`${baseUrl}/app/api-keys?edit=${ownerKey.key.id}`)
        await page.getByText(
          "You cannot change the key “the owner's key”: a developer changes only the keys it created."
        ).waitFor()
        expect(await page.getByRole("dialog").count()).toBe(0)
        await screenshots(page, "53-developer-api-keys")
        expect(problems).toEqual([])
      })
    }))
})
