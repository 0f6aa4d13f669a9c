import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { call, createKey, devToken } from "../../support/Http.js"
import { TestServer, TestServerLive } from "../../support/TestServer.js"

layer(TestServerLive(), { excludeTestServices: true })("API keys", (it) => {
  it.effect("creates a key whose full value is shown once, hashed at rest", () =>
    Effect.gen(function*() {
      const token = yield* devToken("keys-create@example.com")
      const reply = yield* call("POST", "/dashboard/api-keys", {
        token,
        json: { name: "  prod server  ", monthly_spend_limit_myr: 12.5 }
      })
      expect(reply.status).toBe(201)
      const { key, full_key, warning } = reply.body
      expect(full_key).toMatch(/^nns_live_[0-9A-Za-z]{40}$/)
      expect(key).toMatchObject({
        name: "prod server",
        prefix: full_key.slice(0, 12),
        environment: "live",
        status: "active",
        last_used_at: null,
        monthly_spend_limit_micro_myr: 12_500_000,
        expires_at: null
      })
      expect(warning).toContain("only once")
      const list = yield* call("GET", "/dashboard/api-keys", { token })
      expect(list.status).toBe(200)
      expect(list.body.keys).toHaveLength(1)
      expect(JSON.stringify(list.body)).not.toContain(full_key)
      expect(list.body.keys[0].id).toBe(key.id)
    }))

  it.effect("test keys use the nns_test_ prefix", () =>
    Effect.gen(function*() {
      const token = yield* devToken("keys-test-env@example.com")
      const created = yield* createKey(token, { name: "ci", environment: "test" })
      expect(created.full_key.startsWith("nns_test_")).toBe(true)
      expect(created.key.prefix).toBe(created.full_key.slice(0, 12))
    }))

  it.effect("authenticates /v1 calls and reports last use", () =>
    Effect.gen(function*() {
      const token = yield* devToken("keys-use@example.com")
      const { full_key, key } = yield* createKey(token)
      const models = yield* call("GET", "/v1/models", { token: full_key })
      expect(models.status).toBe(200)
      const list = yield* call("GET", "/dashboard/api-keys", { token })
      const listed = list.body.keys.find((k: { id: string }) => k.id === key.id)
      expect(listed.last_used_at).not.toBeNull()
    }))

  it.effect("a deleted key disappears for good and answers revoked_api_key", () =>
    Effect.gen(function*() {
      const token = yield* devToken("keys-delete@example.com")
      const { full_key, key } = yield* createKey(token)
      const deleted = yield* call("DELETE", `/dashboard/api-keys/${key.id}`, { token })
      expect(deleted.status).toBe(200)
      expect(deleted.body).toEqual({ ok: true })
      const list = yield* call("GET", "/dashboard/api-keys", { token })
      expect(list.body.keys).toEqual([])
      const used = yield* call("GET", "/v1/models", { token: full_key })
      expect(used.status).toBe(401)
      expect(used.body.error.code).toBe("revoked_api_key")
      const again = yield* call("DELETE", `/dashboard/api-keys/${key.id}`, { token })
      expect(again.status).toBe(404)
      expect(again.body.error.code).toBe("not_found")
    }))

  it.effect("a key past expires_at answers expired_api_key and is listed as expired", () =>
    Effect.gen(function*() {
      const { clock } = yield* TestServer
      const token = yield* devToken("keys-expiry@example.com")
      const expiresAt = new Date(clock.unsafeCurrentTimeMillis() + 60 * 60 * 1000).toISOString()
      const { full_key, key } = yield* createKey(token, { name: "short-lived", expires_at: expiresAt })
      expect(key.status).toBe("active")
      expect((yield* call("GET", "/v1/models", { token: full_key })).status).toBe(200)
      clock.advance("61 minutes")
      const used = yield* call("GET", "/v1/models", { token: full_key })
      expect(used.status).toBe(401)
      expect(used.body.error.code).toBe("expired_api_key")
      const list = yield* call("GET", "/dashboard/api-keys", { token })
      expect(list.body.keys.find((k: { id: string }) => k.id === key.id).status).toBe("expired")
    }))

  it.effect("unknown and missing keys", () =>
    Effect.gen(function*() {
      const missing = yield* call("GET", "/v1/models")
      expect(missing.status).toBe(401)
      expect(missing.body.error.code).toBe("authentication_error")
      const unknown = yield* call("GET", "/v1/models", { token: "nns_live_" + "x".repeat(40) })
      expect(unknown.status).toBe(401)
      expect(unknown.body.error.code).toBe("invalid_api_key")
      expect(unknown.body.error.message).not.toContain("x".repeat(40))
    }))

  describe("isolation between accounts", () => {
    it.effect("account B can neither list nor delete account A's keys", () =>
      Effect.gen(function*() {
        const alice = yield* devToken("alice@example.com")
        const bob = yield* devToken("bob@example.com")
        const { key, full_key } = yield* createKey(alice, { name: "alice's" })
        const bobsList = yield* call("GET", "/dashboard/api-keys", { token: bob })
        expect(bobsList.body.keys).toEqual([])
        const bobDeletes = yield* call("DELETE", `/dashboard/api-keys/${key.id}`, { token: bob })
        expect(bobDeletes.status).toBe(404)
        expect(bobDeletes.body.error.code).toBe("not_found")
        expect((yield* call("GET", "/v1/models", { token: full_key })).status).toBe(200)
        const alicesList = yield* call("GET", "/dashboard/api-keys", { token: alice })
        expect(alicesList.body.keys.map((k: { id: string }) => k.id)).toEqual([key.id])
      }))
  })

  it.effect("at most 50 keys per account, even when created concurrently", () =>
    Effect.gen(function*() {
      const token = yield* devToken("keys-many@example.com")
      const replies = yield* Effect.forEach(
        Array.from({ length: 60 }, (_, i) => i),
        (i) => call("POST", "/dashboard/api-keys", { token, json: { name: `key ${i}` } }),
        { concurrency: 20 }
      )
      expect(replies.filter((r) => r.status === 201)).toHaveLength(50)
      const refused = replies.filter((r) => r.status !== 201)
      expect(refused).toHaveLength(10)
      for (const r of refused) expect(r.body.error.code).toBe("invalid_request")
      const list = yield* call("GET", "/dashboard/api-keys", { token })
      expect(list.body.keys).toHaveLength(50)
    }))

  it.effect("with the ceilings unset, a key may be given up to 10× the default limits", () =>
    Effect.gen(function*() {
      const token = yield* devToken("keys-ceiling@example.com")
      const { key } = yield* createKey(token, { name: "fast" })
      const patch = (json: Record<string, number>) => call("PATCH", `/dashboard/api-keys/${key.id}`, { token, json })
      const raised = yield* patch({ rate_limit_rpm: 1_000, rate_limit_concurrent: 500 })
      expect(raised.status, raised.text).toBe(200)
      expect(raised.body).toMatchObject({ rate_limit_rpm: 1_000, rate_limit_concurrent: 500 })
      for (const [field, value] of [["rate_limit_rpm", 6_001], ["rate_limit_concurrent", 501]] as const) {
        const over = yield* patch({ [field]: value })
        expect(over.status, over.text).toBe(400)
        expect(over.body.error).toMatchObject({ code: "invalid_request", param: field })
      }
    }))

  it.effect("error messages name every allowed value and no internal schema names", () =>
    Effect.gen(function*() {
      const token = yield* devToken("keys-messages@example.com")
      const staging = yield* call("POST", "/dashboard/api-keys", { token, json: { name: "a", environment: "staging" } })
      expect(staging.body.error.param).toBe("environment")
      expect(staging.body.error.message).toBe(`Invalid 'environment': Expected "live" or "test", actual "staging"`)
      const array = yield* call("POST", "/dashboard/api-keys", { token, json: [] })
      expect(array.body.error.param).toBeNull()
      expect(array.body.error.message).toBe("Invalid request: Expected a JSON object, actual []")
    }))
})
