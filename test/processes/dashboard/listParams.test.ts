import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { expectClientError } from "../../support/ErrorBody.js"
import { call } from "../../support/Http.js"
import { caller, modelCall } from "../../support/Models.js"
import { TestServerLive } from "../../support/TestServer.js"
import { ASK } from "../../support/TwoInstances.js"

/**
 * The logs filter by `tag=key:value`
 * (docs/api/dashboard.md, "Dashboard analytics: rollups, paging, tags and export"),
 * and no dashboard list drops a query parameter it does not take: it answers
 * 400 naming it.
 */

const HOOK_HOST = "127.0.0.1:9"

const logsOf = (token: string, path: string) =>
  Effect.map(call("GET", path, { token }), (reply) => {
    expect(reply.status, reply.text).toBe(200)
    return reply.body as { logs: ReadonlyArray<{ metadata: Record<string, string> | null }>; total: number }
  })

/** The data lines of a CSV export, each a log. */
const exportedRows = (token: string, query: string) =>
  Effect.map(call("GET", `/dashboard/logs/export?${query}`, { token }), (reply) => {
    expect(reply.status, reply.text).toBe(200)
    return reply.text.trim().split("\n").slice(1)
  })

layer(TestServerLive({ webhookAllowedHosts: new Set([HOOK_HOST]) }), { excludeTestServices: true, timeout: 120_000 })(
  "dashboard list parameters",
  (it) => {
    it.effect("GET /dashboard/logs?tag=key:value filters by that tag, as does the export; a value may hold colons", () =>
      Effect.gen(function*() {
        const dev = yield* caller("list-tags@example.com", { environment: "test" })
        for (const metadata of [{ team: "a" }, { team: "a" }, { team: "b" }, { team: "x:y" }, undefined]) {
          const reply = yield* modelCall(dev.apiKey, "/v1/responses", {
            ...ASK,
            ...(metadata === undefined ? {} : { metadata })
          })
          expect(reply.status, reply.text).toBe(200)
        }
        expect((yield* logsOf(dev.token, "/dashboard/logs")).total).toBe(5)
        const teamA = yield* logsOf(dev.token, `/dashboard/logs?${new URLSearchParams({ tag: "team:a" })}`)
        expect(teamA.total).toBe(2)
        expect(teamA.logs.map((entry) => entry.metadata)).toEqual([{ team: "a" }, { team: "a" }])
        const colons = yield* logsOf(dev.token, `/dashboard/logs?${new URLSearchParams({ tag: "team:x:y" })}`)
        expect(colons.logs.map((entry) => entry.metadata)).toEqual([{ team: "x:y" }])
        // tag_key/tag_value stay, and agree with tag.
        expect((yield* logsOf(dev.token, "/dashboard/logs?tag_key=team&tag_value=a")).total).toBe(2)
        expect(yield* exportedRows(dev.token, new URLSearchParams({ tag: "team:a" }).toString())).toHaveLength(2)
        expect(yield* exportedRows(dev.token, new URLSearchParams({ tag: "team:b" }).toString())).toHaveLength(1)
        expect(yield* exportedRows(dev.token, "")).toHaveLength(5)
      }))

    it.effect("a tag that is not key:value, or given beside tag_key, answers 400 with param tag", () =>
      Effect.gen(function*() {
        const { token } = yield* caller("list-tag-bad@example.com", { environment: "test" })
        for (const query of ["tag=team", "tag=%3Aa", "tag=team:a&tag_key=team", `tag=${"k".repeat(65)}:v`]) {
          for (const path of ["/dashboard/logs", "/dashboard/logs/export"]) {
            expectClientError(yield* call("GET", `${path}?${query}`, { token }), {
              status: 400,
              code: "invalid_request",
              param: "tag"
            }, `${path}?${query}`)
          }
        }
      }))

    it.effect("every dashboard list answers 400 naming a query parameter it does not take", () =>
      Effect.gen(function*() {
        const { token } = yield* caller("list-bogus@example.com", { environment: "test" })
        const hook = yield* call("POST", "/dashboard/webhooks", {
          token,
          json: { url: `http://${HOOK_HOST}/hook`, events: ["balance.low"] }
        })
        expect(hook.status, hook.text).toBe(201)
        // Each list with a parameter it does take, to show that one known beside an unknown hides nothing.
        const lists: ReadonlyArray<readonly [string, string]> = [
          ["/dashboard/logs", "status=billed"],
          ["/dashboard/logs/export", "format=csv"],
          ["/dashboard/usage", "granularity=hour"],
          ["/dashboard/usage/export", "environment=live"],
          ["/dashboard/billing/transactions", "page=1"],
          ["/dashboard/api-keys", ""],
          ["/dashboard/webhooks", ""],
          [`/dashboard/webhooks/${hook.body.endpoint.id}/deliveries`, ""]
        ]
        for (const [path, known] of lists) {
          expect((yield* call("GET", `${path}?${known}`, { token })).status, `${path}?${known}`).toBe(200)
          const refused = yield* call("GET", `${path}?${known}&bogus=1`, { token })
          expectClientError(refused, { status: 400, code: "invalid_request", param: "bogus" }, path)
          expect(refused.body.error.message, path).toMatch(/'bogus'/)
        }
        // A filter spelt in another case is not the filter: refused, not ignored.
        expectClientError(yield* call("GET", "/dashboard/logs?Tag=team:a", { token }), {
          status: 400,
          code: "invalid_request",
          param: "Tag"
        })
      }))
  }
)
