import { expect, layer } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { createServer } from "node:net"
import { randomBase62 } from "../../../src/Domain/Ids.js"
import { ProviderKeys } from "../../../src/ProviderKeys/ProviderKeys.js"
import { expectClientError } from "../../support/ErrorBody.js"
import { call, type Reply } from "../../support/Http.js"
import { ProviderStandIn, ProviderStandInLive } from "../../support/ProviderStandIn.js"
import { realSleep } from "../../support/RealTime.js"
import { query, TestServerLive } from "../../support/TestServer.js"
import { developer } from "../../support/Wallet.js"

/**
 * Provider keys through the real server (docs/api/provider-keys.md, "Adding a key"): the four endpoints, who may
 * change them, the check on save against a stand-in provider on 127.0.0.1 (allowed by PROVIDER_ALLOWED_HOSTS), the
 * address guard before any connection, the bound, and the API key absent from every answer and audit entry.
 */

const MODELS = { general: "stand-in-general", reasoning: "stand-in-reasoning" }

const freshApiKey = () => `sk-standin-${randomBase62(32)}`

/** A new key the stand-in accepts. */
const acceptedKey = Effect.map(ProviderStandIn, (standIn) => {
  const apiKey = freshApiKey()
  standIn.accept(apiKey)
  return apiKey
})

const create = (token: string, json: Record<string, unknown>) =>
  call("POST", "/dashboard/provider-keys", { token, json })

/** A key's body for POST, on the stand-in, with an API key it accepts. */
const body = (apiKey: string, baseUrl: string, extra: Record<string, unknown> = {}) => ({
  name: "team vLLM",
  base_url: baseUrl,
  api_key: apiKey,
  models: MODELS,
  mode: "first",
  ...extra
})

const created = (reply: Reply) => {
  expect(reply.status, reply.text).toBe(201)
  return reply.body.provider_key as { id: string; last4: string; status: string; base_url: string }
}

/** A port nothing listens on. */
const closedPort = Effect.promise(() =>
  new Promise<number>((resolve) => {
    const probe = createServer()
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address() as { port: number }
      probe.close(() => resolve(port))
    })
  })
)

const Server = Layer.merge(
  TestServerLive({ providerAllowedHosts: new Set(["127.0.0.1"]) }),
  ProviderStandInLive
)

layer(Server, { excludeTestServices: true })("provider keys", (it) => {
  it.effect("create, list, patch and delete; the API key only as last4, in no answer and no audit entry", () =>
    Effect.gen(function*() {
      const standIn = yield* ProviderStandIn
      const { accountId, token } = yield* developer("pk-crud@example.com")
      const apiKey = yield* acceptedKey
      const before = standIn.requests().length
      const made = yield* create(token, body(apiKey, `${standIn.baseUrl}/`, { models: { ...MODELS, embedding: "e5" } }))
      const key = created(made)
      expect(made.body.provider_key).toEqual({
        id: key.id,
        name: "team vLLM",
        base_url: standIn.baseUrl,
        models: { general: "stand-in-general", reasoning: "stand-in-reasoning", embedding: "e5" },
        mode: "first",
        last4: apiKey.slice(-4),
        status: "ok",
        last_error: null,
        created_at: expect.any(String)
      })
      expect(key.id).toMatch(/^pk_/)
      // The check on save: one GET {base_url}/models with the key.
      expect(standIn.requests().slice(before)).toEqual([
        { method: "GET", path: "/v1/models", authorization: `Bearer ${apiKey}` }
      ])

      const listed = yield* call("GET", "/dashboard/provider-keys", { token })
      expect(listed.status, listed.text).toBe(200)
      expect(listed.body).toEqual({ provider_keys: [made.body.provider_key] })

      // A change of name or mode makes no request to the provider.
      const renamed = yield* call("PATCH", `/dashboard/provider-keys/${key.id}`, {
        token,
        json: { name: "renamed", mode: "fallback" }
      })
      expect(renamed.status, renamed.text).toBe(200)
      expect(renamed.body.provider_key).toMatchObject({ name: "renamed", mode: "fallback", last4: apiKey.slice(-4) })
      expect(standIn.requests().length).toBe(before + 1)

      // A new API key is checked with itself; only its last four are kept in clear.
      const rotatedKey = yield* acceptedKey
      const rekeyed = yield* call("PATCH", `/dashboard/provider-keys/${key.id}`, {
        token,
        json: { api_key: rotatedKey, models: { general: "g2", reasoning: "r2" } }
      })
      expect(rekeyed.status, rekeyed.text).toBe(200)
      expect(rekeyed.body.provider_key).toMatchObject({
        last4: rotatedKey.slice(-4),
        status: "ok",
        models: { general: "g2", reasoning: "r2", embedding: null }
      })
      expect(standIn.requests().at(-1)?.authorization).toBe(`Bearer ${rotatedKey}`)

      // The same base URL written another way is no change: no check.
      const same = yield* call("PATCH", `/dashboard/provider-keys/${key.id}`, {
        token,
        json: { base_url: `${standIn.baseUrl}//` }
      })
      expect(same.status, same.text).toBe(200)
      expect(standIn.requests().length).toBe(before + 2)
      // A new base URL is checked with the stored key.
      const moved = yield* call("PATCH", `/dashboard/provider-keys/${key.id}`, {
        token,
        json: { base_url: `http://127.0.0.1:${standIn.port}/alt/v1` }
      })
      expect(moved.status, moved.text).toBe(200)
      expect(moved.body.provider_key.base_url).toBe(`http://127.0.0.1:${standIn.port}/alt/v1`)
      expect(standIn.requests().at(-1)).toEqual({
        method: "GET",
        path: "/alt/v1/models",
        authorization: `Bearer ${rotatedKey}`
      })

      const deleted = yield* call("DELETE", `/dashboard/provider-keys/${key.id}`, { token })
      expect(deleted.status, deleted.text).toBe(204)
      expect(deleted.text).toBe("")
      expect((yield* call("GET", "/dashboard/provider-keys", { token })).body).toEqual({ provider_keys: [] })
      expectClientError(yield* call("DELETE", `/dashboard/provider-keys/${key.id}`, { token }), {
        status: 404,
        code: "not_found"
      })
      expectClientError(
        yield* call("PATCH", `/dashboard/provider-keys/${key.id}`, { token, json: { name: "gone" } }),
        { status: 404, code: "not_found" }
      )

      // Every change audited, with name, base URL, mode and last4: never a key.
      const audit = yield* call("GET", `/dashboard/audit-log?target_id=${key.id}`, { token })
      expect(audit.status, audit.text).toBe(200)
      const entries = audit.body.entries as Array<{ action: string; target_type: string; details: object }>
      // The same base URL written another way changed nothing: no entry.
      expect(entries.map((entry) => entry.action).sort()).toEqual([
        "provider_key.created",
        "provider_key.deleted",
        "provider_key.updated",
        "provider_key.updated",
        "provider_key.updated"
      ])
      expect(entries.every((entry) => entry.target_type === "provider_key")).toBe(true)
      const createdEntry = entries.find((entry) => entry.action === "provider_key.created")
      expect(createdEntry?.details).toEqual({
        name: "team vLLM",
        base_url: standIn.baseUrl,
        mode: "first",
        models: { general: "stand-in-general", reasoning: "stand-in-reasoning", embedding: "e5" },
        last4: apiKey.slice(-4)
      })
      const rekeyedEntry = entries.find((entry) => "last4" in entry.details && entry.action === "provider_key.updated")
      expect(rekeyedEntry?.details).toMatchObject({ last4: rotatedKey.slice(-4) })

      for (const secret of [apiKey, rotatedKey]) {
        for (const reply of [made, listed, renamed, rekeyed, same, moved, audit]) {
          expect(reply.text).not.toContain(secret)
        }
      }
      const rows = yield* query<{ count: number }>(
        "SELECT count(*)::int AS count FROM provider_keys WHERE account_id = $1",
        [accountId]
      )
      expect(rows[0]?.count).toBe(0)
    }))

  it.effect("a developer of the account reads the keys but may not add, change or delete one (403)", () =>
    Effect.gen(function*() {
      const standIn = yield* ProviderStandIn
      const owner = yield* developer("pk-owner@example.com")
      const key = created(yield* create(owner.token, body(yield* acceptedKey, standIn.baseUrl)))
      const invited = yield* call("POST", "/dashboard/members/invitations", {
        token: owner.token,
        json: { email: "pk-dev@example.com", role: "developer" }
      })
      expect(invited.status, invited.text).toBe(201)
      const dev = yield* developer("pk-dev@example.com")
      const accepted = yield* call("POST", `/dashboard/invitations/${invited.body.id}/accept`, { token: dev.token })
      expect(accepted.status, accepted.text).toBe(200)
      const headers = { "nenas-account": owner.accountId }

      const listed = yield* call("GET", "/dashboard/provider-keys", { token: dev.token, headers })
      expect(listed.status, listed.text).toBe(200)
      expect(listed.body.provider_keys.map((one: { id: string }) => one.id)).toEqual([key.id])

      const requests = standIn.requests().length
      const refusals = [
        yield* call("POST", "/dashboard/provider-keys", {
          token: dev.token,
          headers,
          json: body(yield* acceptedKey, standIn.baseUrl)
        }),
        yield* call("PATCH", `/dashboard/provider-keys/${key.id}`, {
          token: dev.token,
          headers,
          json: { api_key: yield* acceptedKey }
        }),
        yield* call("DELETE", `/dashboard/provider-keys/${key.id}`, { token: dev.token, headers })
      ]
      for (const refused of refusals) {
        expectClientError(refused, { status: 403, code: "permission_denied" })
        expect(refused.body.error.message).toContain("owner or admin")
      }
      // Refused before any check: the provider heard nothing.
      expect(standIn.requests().length).toBe(requests)
      const still = yield* call("GET", "/dashboard/provider-keys", { token: owner.token })
      expect(still.body.provider_keys).toHaveLength(1)
    }))

  it.effect("a key the provider refuses answers 400 param api_key naming its status; nothing is saved", () =>
    Effect.gen(function*() {
      const standIn = yield* ProviderStandIn
      const { token } = yield* developer("pk-refused@example.com")
      const refusedKey = freshApiKey()
      const reply = yield* create(token, body(refusedKey, standIn.baseUrl))
      expectClientError(reply, { status: 400, code: "invalid_request", param: "api_key" })
      expect(reply.body.error.message).toContain("HTTP 401")
      expect(reply.text).not.toContain(refusedKey)
      expect((yield* call("GET", "/dashboard/provider-keys", { token })).body.provider_keys).toEqual([])

      // On PATCH, a refused new key leaves the stored one in place.
      const key = created(yield* create(token, body(yield* acceptedKey, standIn.baseUrl)))
      const patched = yield* call("PATCH", `/dashboard/provider-keys/${key.id}`, {
        token,
        json: { api_key: refusedKey }
      })
      expectClientError(patched, { status: 400, code: "invalid_request", param: "api_key" })
      expect(patched.text).not.toContain(refusedKey)
      const listed = yield* call("GET", "/dashboard/provider-keys", { token })
      expect(listed.body.provider_keys[0].last4).toBe(key.last4)
    }))

  it.effect("an unreachable provider (nothing listening, or a 5xx) answers 400 saying so, param base_url", () =>
    Effect.gen(function*() {
      const standIn = yield* ProviderStandIn
      const { token } = yield* developer("pk-unreachable@example.com")
      const port = yield* closedPort
      const nobody = yield* create(token, body(yield* acceptedKey, `http://127.0.0.1:${port}/v1`))
      expectClientError(nobody, { status: 400, code: "invalid_request", param: "base_url" })
      expect(nobody.body.error.message).toContain("could not be reached")
      expect(nobody.body.error.message).toContain("ECONNREFUSED")

      standIn.setMode("down")
      const down = yield* create(token, body(yield* acceptedKey, standIn.baseUrl)).pipe(
        Effect.ensuring(Effect.sync(() => standIn.setMode("byKey")))
      )
      expectClientError(down, { status: 400, code: "invalid_request", param: "base_url" })
      expect(down.body.error.message).toContain("could not be reached")
      expect(down.body.error.message).toContain("HTTP 500")

      // Not the API's root: its /models is not there.
      const wrong = yield* create(token, body(yield* acceptedKey, `http://127.0.0.1:${standIn.port}/v2`))
      expectClientError(wrong, { status: 400, code: "invalid_request", param: "base_url" })
      expect(wrong.body.error.message).toContain("HTTP 404")
      expect((yield* call("GET", "/dashboard/provider-keys", { token })).body.provider_keys).toEqual([])
    }))

  it.effect("the address guard refuses a private address or http outside PROVIDER_ALLOWED_HOSTS, before any connection", () =>
    Effect.gen(function*() {
      const standIn = yield* ProviderStandIn
      const { token } = yield* developer("pk-guard@example.com")
      const apiKey = yield* acceptedKey
      const connections = standIn.connections()
      const requests = standIn.requests().length
      for (
        const baseUrl of [
          // `localhost` is not an allowed host, and resolves to loopback: the stand-in itself.
          `https://localhost:${standIn.port}/v1`,
          "https://10.1.2.3/v1",
          "https://[::1]:8443/v1",
          "https://169.254.169.254/latest",
          // http is refused outside the allowed hosts, before any name is resolved.
          "http://api.example.com/v1",
          `http://localhost:${standIn.port}/v1`
        ]
      ) {
        const reply = yield* create(token, body(apiKey, baseUrl))
        expectClientError(reply, { status: 400, code: "invalid_request", param: "base_url" }, baseUrl)
        expect(reply.body.error.message, baseUrl).toContain("is refused")
        // What the host resolves to is the log's, never the answer's.
        expect(reply.body.error.message, baseUrl).not.toMatch(/127\.0\.0\.1|::1|loopback|private/)
      }
      for (
        const [baseUrl, says] of [
          ["not a url", "absolute URL"],
          ["ftp://files.example.com/v1", "http or https"],
          [`http://user:pass@127.0.0.1:${standIn.port}/v1`, "credentials"],
          [`${standIn.baseUrl}?key=1`, "query"],
          [`${standIn.baseUrl}#top`, "fragment"]
        ] as const
      ) {
        const reply = yield* create(token, body(apiKey, baseUrl))
        expectClientError(reply, { status: 400, code: "invalid_request", param: "base_url" }, baseUrl)
        expect(reply.body.error.message, baseUrl).toContain(says)
      }
      yield* realSleep(50)
      expect(standIn.connections()).toBe(connections)
      expect(standIn.requests().length).toBe(requests)
    }))

  it.effect("unknown fields, a bad mode or models answer 400 naming the field; a malformed api_key is not quoted", () =>
    Effect.gen(function*() {
      const standIn = yield* ProviderStandIn
      const { token } = yield* developer("pk-fields@example.com")
      const apiKey = yield* acceptedKey
      const cases: ReadonlyArray<readonly [string, Record<string, unknown>, string]> = [
        ["an unknown field", { ...body(apiKey, standIn.baseUrl), organization: "org-1" }, "organization"],
        [
          "an unknown field of models",
          body(apiKey, standIn.baseUrl, { models: { ...MODELS, vision: "v" } }),
          "models.vision"
        ],
        ["a bad mode", body(apiKey, standIn.baseUrl, { mode: "always" }), "mode"],
        ["models without general", body(apiKey, standIn.baseUrl, { models: { reasoning: "r" } }), "models.general"],
        [
          "an empty model",
          body(apiKey, standIn.baseUrl, { models: { ...MODELS, reasoning: " " } }),
          "models.reasoning"
        ],
        ["no mode", { name: "x", base_url: standIn.baseUrl, api_key: apiKey, models: MODELS }, "mode"],
        ["an empty name", body(apiKey, standIn.baseUrl, { name: "" }), "name"]
      ]
      for (const [what, json, param] of cases) {
        expectClientError(yield* create(token, json), { status: 400, code: "invalid_request", param }, what)
      }
      const malformed = "sk-with a space-and-secret-XYZ"
      const bad = yield* create(token, body(malformed, standIn.baseUrl))
      expectClientError(bad, { status: 400, code: "invalid_request", param: "api_key" })
      expect(bad.text).not.toContain("secret-XYZ")
      const made = created(yield* create(token, body(apiKey, standIn.baseUrl)))
      const patched = yield* call("PATCH", `/dashboard/provider-keys/${made.id}`, {
        token,
        json: { mode: "sometimes" }
      })
      expectClientError(patched, { status: 400, code: "invalid_request", param: "mode" })
      const unknown = yield* call("PATCH", `/dashboard/provider-keys/${made.id}`, {
        token,
        json: { status: "ok" }
      })
      expectClientError(unknown, { status: 400, code: "invalid_request", param: "status" })
    }))

  it.effect("the 11th key of an account is refused (400), before any request to its provider", () =>
    Effect.gen(function*() {
      const standIn = yield* ProviderStandIn
      const { token } = yield* developer("pk-bound@example.com")
      const apiKey = yield* acceptedKey
      for (let i = 0; i < 10; i++) created(yield* create(token, body(apiKey, standIn.baseUrl, { name: `key ${i}` })))
      const requests = standIn.requests().length
      const eleventh = yield* create(token, body(apiKey, standIn.baseUrl, { name: "key 10" }))
      expectClientError(eleventh, { status: 400, code: "invalid_request" })
      expect(eleventh.body.error.message).toContain("at most 10 provider keys")
      expect(standIn.requests().length).toBe(requests)
      expect((yield* call("GET", "/dashboard/provider-keys", { token })).body.provider_keys).toHaveLength(10)
    }))

  it.effect("the call path's view: the key in memory, opened; its version moves; report writes a change once", () =>
    Effect.gen(function*() {
      const standIn = yield* ProviderStandIn
      const keys = yield* ProviderKeys
      const { accountId, token } = yield* developer("pk-memory@example.com")
      expect(keys.forAccount(accountId)).toEqual([])
      const apiKey = yield* acceptedKey
      const key = created(yield* create(token, body(apiKey, standIn.baseUrl, { mode: "only" })))
      // The instance that took the change uses it at once.
      const [resolved] = keys.forAccount(accountId)
      expect(resolved).toMatchObject({
        id: key.id,
        accountId,
        name: "team vLLM",
        baseUrl: standIn.baseUrl,
        models: { general: "stand-in-general", reasoning: "stand-in-reasoning", embedding: null },
        mode: "only",
        // An allowed host: nothing to check at connection.
        lookup: undefined
      })
      expect(Redacted.value(resolved!.apiKey)).toBe(apiKey)
      expect(String(resolved!.apiKey)).not.toContain(apiKey)

      yield* call("PATCH", `/dashboard/provider-keys/${key.id}`, { token, json: { name: "renamed" } })
      const [renamed] = keys.forAccount(accountId)
      expect(renamed?.name).toBe("renamed")
      expect(renamed?.version).not.toBe(resolved?.version)

      const statusOf = Effect.map(
        query<{ status: string; last_error: string | null }>(
          "SELECT status, last_error FROM provider_keys WHERE id = $1",
          [key.id]
        ),
        (rows) => rows[0]
      )
      const until = (status: string) =>
        Effect.gen(function*() {
          for (let i = 0; i < 100; i++) {
            const row = yield* statusOf
            if (row?.status === status) return row
            yield* realSleep(20)
          }
          return yield* statusOf
        })
      yield* keys.report(key.id, { _tag: "Refused", message: "the provider answered HTTP 401" })
      expect(yield* until("refused")).toEqual({ status: "refused", last_error: "the provider answered HTTP 401" })
      const listed = yield* call("GET", "/dashboard/provider-keys", { token })
      expect(listed.body.provider_keys[0]).toMatchObject({
        status: "refused",
        last_error: "the provider answered HTTP 401"
      })
      // The version stays: a status is no change of the key.
      expect(keys.forAccount(accountId)[0]?.version).toBe(renamed?.version)
      yield* keys.report(key.id, { _tag: "Ok" })
      expect(yield* until("ok")).toEqual({ status: "ok", last_error: null })
      // Reporting an unknown key, or failing to write, never fails the caller.
      yield* keys.report("pk_unknown", { _tag: "Failing", message: "HTTP 503" })
    }))

  it.effect("check asks the provider again with the stored key: ok, refused once revoked, failing while down", () =>
    Effect.gen(function*() {
      const standIn = yield* ProviderStandIn
      const { token } = yield* developer("pk-check@example.com")
      const apiKey = yield* acceptedKey
      const key = created(yield* create(token, body(apiKey, standIn.baseUrl)))
      const check = () => call("POST", `/dashboard/provider-keys/${key.id}/check`, { token })
      const before = standIn.requests().length
      const ok = yield* check()
      expect(ok.status, ok.text).toBe(200)
      expect(ok.body.provider_key).toMatchObject({ id: key.id, status: "ok", last_error: null })
      expect(standIn.requests().slice(before).map((r) => [r.path, r.authorization])).toEqual([[
        "/v1/models",
        `Bearer ${apiKey}`
      ]])

      standIn.revoke(apiKey)
      const refused = yield* check()
      expect(refused.status, refused.text).toBe(200)
      expect(refused.body.provider_key.status).toBe("refused")
      expect(refused.body.provider_key.last_error).toContain("HTTP 401")
      expect(refused.text).not.toContain(apiKey)

      standIn.setMode("down")
      const failing = yield* check()
      standIn.setMode("byKey")
      expect(failing.body.provider_key.status).toBe("failing")
      expect(failing.body.provider_key.last_error).toContain("HTTP 500")
      const listed = yield* call("GET", "/dashboard/provider-keys", { token })
      expect(listed.body.provider_keys[0]).toMatchObject({ status: "failing" })
      expectClientError(yield* call("POST", "/dashboard/provider-keys/pk_nope/check", { token }), {
        status: 404,
        code: "not_found"
      })
    }))

  it.effect("an account makes at most 10 checks a minute: the 11th answers 429 before any request goes out", () =>
    Effect.gen(function*() {
      const standIn = yield* ProviderStandIn
      const { token } = yield* developer("pk-pace@example.com")
      const apiKey = yield* acceptedKey
      const key = created(yield* create(token, body(apiKey, standIn.baseUrl)))
      for (let i = 0; i < 9; i++) {
        const reply = yield* call("POST", `/dashboard/provider-keys/${key.id}/check`, { token })
        expect(reply.status, reply.text).toBe(200)
      }
      const before = standIn.requests().length
      const paced = yield* call("POST", `/dashboard/provider-keys/${key.id}/check`, { token })
      expectClientError(paced, { status: 429, code: "rate_limit_exceeded" })
      expect(paced.body.error.retry_after_seconds).toBeGreaterThan(0)
      const patched = yield* call("PATCH", `/dashboard/provider-keys/${key.id}`, { token, json: { api_key: apiKey } })
      expectClientError(patched, { status: 429, code: "rate_limit_exceeded" })
      expect(standIn.requests().length, "no request went out").toBe(before)
      // A change that needs no check is not paced.
      const renamed = yield* call("PATCH", `/dashboard/provider-keys/${key.id}`, { token, json: { mode: "only" } })
      expect(renamed.status, renamed.text).toBe(200)
    }))
})
