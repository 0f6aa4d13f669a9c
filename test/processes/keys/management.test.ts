import { describe, expect, layer } from "@effect/vitest"
import { Effect, Option } from "effect"
import { createDecipheriv, createHash } from "node:crypto"
import { newId } from "../../../src/Domain/Ids.js"
import { call, createKey, type Reply } from "../../support/Http.js"
import { modelCall } from "../../support/Models.js"
import { topUp } from "../../support/Stripe.js"
import { query, TestServer } from "../../support/TestServer.js"
import {
  ASK,
  bothListening,
  DEADLINE_MS,
  Instances,
  on,
  outcome,
  seenWithin,
  TwoInstancesLive
} from "../../support/TwoInstances.js"
import { developer } from "../../support/Wallet.js"

describe("keys managed in place, across two instances", () => {
  // Two whole services in this process on one database, sharing rate limits through Redis.
  const instances = TwoInstancesLive("keymgmt", {
    redisUrl: Option.some("redis://127.0.0.1:6379"),
    rateLimitRpmMax: Option.some(1_000)
  })
  layer(instances, { excludeTestServices: true, timeout: 120_000 })((it) => {
    const bothSee = (
      since: number,
      probe: Effect.Effect<Reply, never, TestServer>,
      expected: string,
      deadline = DEADLINE_MS
    ) =>
      Effect.flatMap(Instances, ({ a, b }) =>
        Effect.all(
          [a, b].map((base) => seenWithin(since, on(base)(probe), (reply) => outcome(reply) === expected, deadline)),
          { concurrency: 2 }
        ))

    /** Both instances answer 200 (and so remember the key) before the change under test. */
    const warm = (probe: Effect.Effect<Reply, never, TestServer>) =>
      Effect.gen(function*() {
        const { a, b } = yield* Instances
        for (const base of [a, b, a, b]) expect(outcome(yield* on(base)(probe))).toBe("200")
      })

    const patch = (token: string, id: string, json: unknown) =>
      call("PATCH", `/dashboard/api-keys/${id}`, { token, json })

    it.effect("a key disabled through one instance answers permission_denied on both within a second, and enabled serves again", () =>
      Effect.gen(function*() {
        yield* bothListening
        const { a } = yield* Instances
        const { token } = yield* on(a)(developer("km-disable@example.com"))
        const created = yield* on(a)(createKey(token, { name: "to disable", environment: "test" }))
        const respond = modelCall(created.full_key, "/v1/responses", ASK)
        yield* warm(respond)
        const disabledAt = Date.now()
        const disabled = yield* on(a)(patch(token, created.key.id, { disabled: true }))
        expect(disabled.status).toBe(200)
        expect(disabled.body).toMatchObject({ id: created.key.id, status: "disabled", name: "to disable" })
        const refused = yield* bothSee(disabledAt, respond, "permission_denied")
        expect(Math.max(...refused)).toBeLessThanOrEqual(DEADLINE_MS)
        const reply = yield* on(a)(respond)
        expect(reply.status).toBe(403)
        expect(reply.body.error.guidance).toContain("disabled")
        expect(reply.body.error.action_url).toBe(`${a}/app/api-keys?edit=${created.key.id}`)
        const listed = (yield* on(a)(call("GET", "/dashboard/api-keys", { token }))).body.keys
        expect(listed.find((key: { id: string }) => key.id === created.key.id).status).toBe("disabled")
        const enabledAt = Date.now()
        expect((yield* on(a)(patch(token, created.key.id, { disabled: false }))).body.status).toBe("active")
        const served = yield* bothSee(enabledAt, respond, "200")
        expect(Math.max(...served)).toBeLessThanOrEqual(DEADLINE_MS)
      }))

    it.effect("a monthly limit set below the key's month-to-date spend refuses its next call on both instances", () =>
      Effect.gen(function*() {
        yield* bothListening
        const { a, b } = yield* Instances
        const { token } = yield* on(a)(developer("km-limit@example.com"))
        yield* on(a)(topUp(token, 1000))
        // No limit: its calls may run on a credit grant, without a reservation of their own.
        const created = yield* on(a)(createKey(token, { name: "unlimited", environment: "live" }))
        const respond = modelCall(created.full_key, "/v1/responses", ASK)
        yield* warm(respond)
        yield* (yield* TestServer).settled
        const [row] = yield* query<{ spent: string }>(
          "SELECT COALESCE(-SUM(amount_micro_myr), 0)::text AS spent FROM ledger_entries WHERE api_key_id = $1 AND type = 'usage'",
          [created.key.id]
        )
        const spent = Number(row?.spent ?? 0)
        expect(spent).toBeGreaterThan(1)
        const limitMicro = Math.floor(spent / 2)
        const limitedAt = Date.now()
        const patched = yield* on(b)(patch(token, created.key.id, { monthly_spend_limit_myr: limitMicro / 1_000_000 }))
        expect(patched.status).toBe(200)
        expect(patched.body.monthly_spend_limit_micro_myr).toBe(limitMicro)
        const limited = yield* bothSee(limitedAt, respond, "spend_limit_exceeded")
        expect(Math.max(...limited)).toBeLessThanOrEqual(DEADLINE_MS)
        // `null` removes the limit again.
        expect(
          (yield* on(a)(patch(token, created.key.id, { monthly_spend_limit_myr: null }))).body
            .monthly_spend_limit_micro_myr
        )
          .toBeNull()
        yield* bothSee(Date.now(), respond, "200")
      }))

    it.effect("a rotation with a grace period: both secrets work on both instances, then only the new one", () =>
      Effect.gen(function*() {
        yield* bothListening
        const { a, b } = yield* Instances
        const { token } = yield* on(a)(developer("km-rotate@example.com"))
        const created = yield* on(a)(createKey(token, { name: "rotated", environment: "test", rate_limit_rpm: 500 }))
        const old = call("GET", "/v1/models", { token: created.full_key })
        yield* warm(old)
        const graceSeconds = 3
        const rotate = call("POST", `/dashboard/api-keys/${created.key.id}/rotate`, {
          token,
          json: { grace_seconds: graceSeconds },
          headers: { "idempotency-key": newId("idem") }
        })
        const rotated = yield* on(b)(rotate)
        const rotatedAt = Date.now()
        expect(rotated.status).toBe(200)
        const fresh: string = rotated.body.full_key
        expect(fresh).toMatch(/^nns_test_[0-9A-Za-z]{40}$/)
        expect(fresh).not.toBe(created.full_key)
        expect(rotated.body.key).toMatchObject({
          id: created.key.id,
          name: "rotated",
          prefix: fresh.slice(0, 12),
          rate_limit_rpm: 500
        })
        expect(Date.parse(rotated.body.previous_key_valid_until) - rotatedAt).toBeGreaterThan(1_000)
        const current = call("GET", "/v1/models", { token: fresh })
        for (const base of [a, b]) {
          expect(outcome(yield* on(base)(old))).toBe("200")
          expect(outcome(yield* on(base)(current))).toBe("200")
        }
        // Within the deadline after the grace period ends (with slack for a loaded machine).
        const revoked = yield* bothSee(rotatedAt + graceSeconds * 1_000, old, "revoked_api_key", DEADLINE_MS + 1_000)
        // Not before the grace period ends (the database set its end a little before `rotatedAt`).
        expect(Math.min(...revoked)).toBeGreaterThanOrEqual(-500)
        for (const base of [a, b]) expect(outcome(yield* on(base)(current))).toBe("200")
      }))

    it.effect("a rotation repeated with its Idempotency-Key answers the same secret; without grace the old one stops at once", () =>
      Effect.gen(function*() {
        yield* bothListening
        const { a, b } = yield* Instances
        const { token } = yield* on(a)(developer("km-repeat@example.com"))
        const created = yield* on(a)(createKey(token, { name: "repeat", environment: "test" }))
        const old = call("GET", "/v1/models", { token: created.full_key })
        yield* warm(old)
        const idempotencyKey = newId("idem")
        const rotate = call("POST", `/dashboard/api-keys/${created.key.id}/rotate`, {
          token,
          json: {},
          headers: { "idempotency-key": idempotencyKey }
        })
        const rotatedAt = Date.now()
        const first = yield* on(a)(rotate)
        const again = yield* on(b)(rotate)
        expect(first.status).toBe(200)
        expect(again.status).toBe(200)
        expect(again.body.full_key).toBe(first.body.full_key)
        expect(first.body.previous_key_valid_until).toBeNull()
        yield* bothSee(rotatedAt, old, "revoked_api_key")
        const current = call("GET", "/v1/models", { token: first.body.full_key })
        for (const base of [a, b]) expect(outcome(yield* on(base)(current))).toBe("200")
        // The secret is never kept readable: the database holds only its hash and a seal.
        const [stored] = yield* query<{ text: string }>(
          "SELECT row_to_json(k)::text AS text FROM api_keys k WHERE id = $1",
          [created.key.id]
        )
        expect(stored?.text).not.toContain(first.body.full_key.slice(12))
        // Another Idempotency-Key is another rotation.
        const other = yield* on(a)(call("POST", `/dashboard/api-keys/${created.key.id}/rotate`, {
          token,
          json: { grace_seconds: 60 },
          headers: { "idempotency-key": newId("idem") }
        }))
        expect(other.body.full_key).not.toBe(first.body.full_key)
      }))

    it.effect("a rotation's Idempotency-Key has 16 characters or more; its stored seal does not open with the Idempotency-Key alone", () =>
      Effect.gen(function*() {
        const { a, b } = yield* Instances
        const { token } = yield* on(a)(developer("km-seal@example.com"))
        const created = yield* on(a)(createKey(token, { name: "sealed", environment: "test" }))
        const rotate = (idempotencyKey: string) =>
          call("POST", `/dashboard/api-keys/${created.key.id}/rotate`, {
            token,
            json: {},
            headers: { "idempotency-key": idempotencyKey }
          })
        const short = yield* on(a)(rotate("rotate-42"))
        expect(short.status).toBe(400)
        expect(short.body.error).toMatchObject({ code: "invalid_request", param: "Idempotency-Key" })
        // Nothing was rotated: the first secret still works.
        expect(outcome(yield* on(a)(call("GET", "/v1/models", { token: created.full_key })))).toBe("200")
        // Long enough, though guessable: what a database dump and the guess give an attacker.
        const guessable = "rotate-0000000042"
        const first = yield* on(a)(rotate(guessable))
        expect(first.status).toBe(200)
        const [row] = yield* query<{ sealed: Buffer }>("SELECT rotation_sealed AS sealed FROM api_keys WHERE id = $1", [
          created.key.id
        ])
        const sealed = row?.sealed
        expect(sealed?.length ?? 0).toBeGreaterThan(28)
        if (sealed === undefined) return
        // The seal as it was made before `ROTATION_SEAL_SECRET`: a key derived from the key id and the
        // Idempotency-Key only.
        const fromDumpAlone = (() => {
          try {
            const key = createHash("sha256").update(`nenas:rotation:seal:${created.key.id}:${guessable}`, "utf8")
              .digest()
            const decipher = createDecipheriv("aes-256-gcm", key, sealed.subarray(0, 12))
            decipher.setAuthTag(sealed.subarray(12, 28))
            return Buffer.concat([decipher.update(sealed.subarray(28)), decipher.final()]).toString("utf8")
          } catch {
            return undefined
          }
        })()
        expect(fromDumpAlone).toBeUndefined()
        // The service, holding its secret, still answers a repeat with the same secret, on either instance.
        const again = yield* on(b)(rotate(guessable))
        expect(again.status).toBe(200)
        expect(again.body.full_key).toBe(first.body.full_key)
      }))

    it.effect("a change to a rotated key reaches its old secret, cached on the other instance, within a second", () =>
      Effect.gen(function*() {
        yield* bothListening
        const { a, b } = yield* Instances
        const { token } = yield* on(a)(developer("km-old-secret@example.com"))
        const created = yield* on(a)(createKey(token, { name: "old secret", environment: "test" }))
        const rotated = yield* on(a)(call("POST", `/dashboard/api-keys/${created.key.id}/rotate`, {
          token,
          json: { grace_seconds: 600 },
          headers: { "idempotency-key": newId("idem") }
        }))
        expect(rotated.status).toBe(200)
        const old = call("GET", "/v1/models", { token: created.full_key })
        // The old secret is remembered by b once a lookup after the rotation's announcement answers from it.
        yield* seenWithin(Date.now(), on(b)(old), (reply) => outcome(reply) === "200")
        for (let i = 0; i < 3; i++) expect(outcome(yield* on(b)(old))).toBe("200")
        const disabledAt = Date.now()
        expect((yield* on(a)(patch(token, created.key.id, { disabled: true }))).status).toBe(200)
        const refused = yield* seenWithin(disabledAt, on(b)(old), (reply) => outcome(reply) === "permission_denied")
        expect(refused).toBeLessThanOrEqual(DEADLINE_MS)
        const enabledAt = Date.now()
        expect((yield* on(a)(patch(token, created.key.id, { disabled: false }))).status).toBe(200)
        yield* seenWithin(enabledAt, on(b)(old), (reply) => outcome(reply) === "200")
        // A rate limit set through a reaches the old secret on b too.
        for (let i = 0; i < 3; i++) expect(outcome(yield* on(b)(old))).toBe("200")
        const limitedAt = Date.now()
        expect((yield* on(a)(patch(token, created.key.id, { rate_limit_rpm: 1 }))).status).toBe(200)
        const limited = yield* seenWithin(
          limitedAt,
          on(b)(old),
          (reply) => reply.headers.get("x-ratelimit-limit-requests") === "1"
        )
        expect(limited).toBeLessThanOrEqual(DEADLINE_MS)
      }))

    it.effect("per-key requests per minute are shared by both instances; above the operator's ceiling is refused", () =>
      Effect.gen(function*() {
        yield* bothListening
        const { a, b } = yield* Instances
        const { token } = yield* on(a)(developer("km-rpm@example.com"))
        const tooMany = yield* on(a)(
          call("POST", "/dashboard/api-keys", { token, json: { name: "x", rate_limit_rpm: 1_001 } })
        )
        expect(tooMany.status).toBe(400)
        expect(tooMany.body.error).toMatchObject({ code: "invalid_request", param: "rate_limit_rpm" })
        const created = yield* on(a)(createKey(token, { name: "slow", environment: "test", rate_limit_rpm: 3 }))
        const respond = modelCall(created.full_key, "/v1/responses", ASK)
        const answers: Array<string> = []
        for (const base of [a, b, a, b]) answers.push(outcome(yield* on(base)(respond)))
        expect(answers).toEqual(["200", "200", "200", "rate_limit_exceeded"])
        const limited = yield* on(a)(respond)
        expect(limited.headers.get("x-ratelimit-limit-requests")).toBe("3")
        // Raised (under the ceiling) through one instance: both apply it.
        const raised = yield* on(b)(call("PATCH", `/dashboard/api-keys/${created.key.id}`, {
          token,
          json: { rate_limit_rpm: 900, rate_limit_concurrent: 2 }
        }))
        expect(raised.body).toMatchObject({ rate_limit_rpm: 900, rate_limit_concurrent: 2 })
        const since = Date.now()
        yield* bothSee(since, respond, "200")
        // The concurrency ceiling without an operator's is 10× RATE_LIMIT_CONCURRENT (500): more is refused.
        const concurrent = yield* on(a)(
          call("PATCH", `/dashboard/api-keys/${created.key.id}`, { token, json: { rate_limit_concurrent: 501 } })
        )
        expect(concurrent.body.error).toMatchObject({ code: "invalid_request", param: "rate_limit_concurrent" })
      }))

    it.effect("another account's key answers 404; bad input answers the spec's error", () =>
      Effect.gen(function*() {
        const { a } = yield* Instances
        const owner = yield* on(a)(developer("km-owner@example.com"))
        const stranger = yield* on(a)(developer("km-stranger@example.com"))
        const created = yield* on(a)(createKey(owner.token, { name: "mine", environment: "test" }))
        const path = `/dashboard/api-keys/${created.key.id}`
        const patched = yield* on(a)(call("PATCH", path, { token: stranger.token, json: { disabled: true } }))
        expect(patched.status).toBe(404)
        expect(patched.body.error.code).toBe("not_found")
        const rotated = yield* on(a)(call("POST", `${path}/rotate`, { token: stranger.token, json: {} }))
        expect(rotated.status).toBe(404)
        const listed = (yield* on(a)(call("GET", "/dashboard/api-keys", { token: owner.token }))).body.keys
        expect(listed[0]).toMatchObject({ id: created.key.id, status: "active" })
        for (
          const [json, param] of [
            [{ disabled: "yes" }, "disabled"],
            [{ monthly_spend_limit_myr: -1 }, "monthly_spend_limit_myr"],
            [{ expires_at: "2020-01-01T00:00:00Z" }, "expires_at"],
            [{ name: "" }, "name"],
            [{ rate_limit_rpm: 0 }, "rate_limit_rpm"]
          ] as const
        ) {
          const reply = yield* on(a)(call("PATCH", path, { token: owner.token, json }))
          expect(reply.status, JSON.stringify(json)).toBe(400)
          expect(reply.body.type).toBe("error")
          expect(reply.body.error.code).toBe("invalid_request")
          expect(String(reply.body.error.param ?? reply.body.error.message)).toContain(param)
        }
        const grace = yield* on(a)(
          call("POST", `${path}/rotate`, { token: owner.token, json: { grace_seconds: 86_401 } })
        )
        expect(grace.status).toBe(400)
        expect(grace.body.error.code).toBe("invalid_request")
      }))

    it.effect("/openapi.json lists the new endpoints and fields, with examples", () =>
      Effect.gen(function*() {
        const { a } = yield* Instances
        const document = (yield* on(a)(call("GET", "/openapi.json"))).body
        expect(document.paths["/dashboard/api-keys/{id}"].patch).toBeDefined()
        expect(document.paths["/dashboard/api-keys/{id}/rotate"].post).toBeDefined()
        const text = JSON.stringify(document)
        for (
          const field of [
            "grace_seconds",
            "rate_limit_rpm",
            "rate_limit_concurrent",
            "disabled",
            "previous_key_valid_until"
          ]
        ) {
          expect(text).toContain(field)
        }
        const schemas = document.components.schemas
        expect(schemas.UpdateApiKeyRequest.examples?.length ?? 0).toBeGreaterThan(0)
        expect(schemas.RotateApiKeyRequest.examples?.length ?? 0).toBeGreaterThan(0)
        expect(schemas.ApiKey.examples?.length ?? 0).toBeGreaterThan(0)
      }))
  })
})
