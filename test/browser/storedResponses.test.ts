import { layer } from "@effect/vitest"
import { Effect } from "effect"
import { beforeAll, expect } from "vitest"
import { ensureDashboardBuilt, inBrowser, signIn } from "../support/Browser.js"
import { call } from "../support/Http.js"
import { caller, modelCall } from "../support/Models.js"
import { TestServer, TestServerLive } from "../support/TestServer.js"

/**
 * A stored response in the dashboard: the request log links to it,
 * and the log's details show the conversation up to it; a call made with
 * `store: false` links to nothing. Through the API, then in Chromium.
 */

const MODEL = "svc/nenas-flash"

interface Log {
  readonly requestId: string
  readonly storedResponseId: string | null
}

beforeAll(ensureDashboardBuilt, 120_000)

layer(TestServerLive(), { excludeTestServices: true, timeout: 120_000 })("stored responses in the dashboard", (it) => {
  it.effect("the log links to the stored response; its details show the conversation", () =>
    Effect.gen(function*() {
      const email = "stored-dashboard@example.com"
      const { apiKey, token } = yield* caller(email, { environment: "test" })
      const first = yield* modelCall(apiKey, "/v1/responses", {
        model: MODEL,
        instructions: "Be brief.",
        input: "Nasi lemak or roti canai?"
      })
      const second = yield* modelCall(apiKey, "/v1/responses", {
        model: MODEL,
        previous_response_id: first.body.id,
        input: "Why?"
      })
      const unstored = yield* modelCall(apiKey, "/v1/responses", { model: MODEL, input: "Not kept.", store: false })
      expect([first.status, second.status, unstored.status]).toEqual([200, 200, 200])

      const logs = (yield* call("GET", "/dashboard/logs", { token })).body.logs as ReadonlyArray<Log>
      const link = (reply: { body: { request_id: string } }) =>
        logs.find((log) => log.requestId === reply.body.request_id)?.storedResponseId
      expect(link(first)).toBe(first.body.id)
      expect(link(second)).toBe(second.body.id)
      expect(link(unstored)).toBeNull()

      const conversation = yield* call("GET", `/dashboard/logs/${second.body.request_id}/conversation`, { token })
      expect(conversation.status, conversation.text).toBe(200)
      expect(conversation.body.lines.map((line: { role: string; text: string }) => [line.role, line.text])).toEqual([
        ["user", "Nasi lemak or roti canai?"],
        ["assistant", first.body.output_text],
        ["user", "Why?"],
        ["assistant", second.body.output_text]
      ])
      expect((yield* call("GET", `/dashboard/logs/${unstored.body.request_id}/conversation`, { token })).status).toBe(
        404
      )
      // Another developer sees nothing of it.
      const other = yield* caller("stored-dashboard-other@example.com", { environment: "test" })
      expect(
        (yield* call("GET", `/dashboard/logs/${second.body.request_id}/conversation`, { token: other.token })).status
      ).toBe(404)

      const { baseUrl } = yield* TestServer
      yield* inBrowser(async (context) => {
        const page = await context.newPage()
        await signIn(page, baseUrl, email)
        await page.getByRole("link", { name: "Logs" }).click()
        await page.getByRole("heading", { level: 1, name: "Logs" }).waitFor()
        await expect.poll(() => page.getByRole("row", { name: /\/v1\/responses/ }).count()).toBe(3)
        // The newest stored call is the second row (the unstored one is newest of all).
        await page.getByRole("row", { name: /\/v1\/responses/ }).nth(1).getByRole("button").click()
        const lines = page.locator(".conversation-lines li")
        await expect.poll(() => lines.count()).toBe(4)
        expect(await page.locator(".details").textContent()).toContain(`Stored response${second.body.id}`)
        expect(await lines.nth(2).textContent()).toBe("user Why?")
        expect(await lines.nth(3).textContent()).toBe(`assistant ${second.body.output_text}`)
      })
    }))
})
