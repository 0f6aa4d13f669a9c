import { expect, layer } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import { randomBase62 } from "../../../src/Domain/Ids.js"
import { ProviderKeys } from "../../../src/ProviderKeys/ProviderKeys.js"
import { call } from "../../support/Http.js"
import { makeProviderStandIn } from "../../support/ProviderStandIn.js"
import { TestServer } from "../../support/TestServer.js"
import { DEADLINE_MS, on, seenWithin, twoInstances } from "../../support/TwoInstances.js"
import { developer } from "../../support/Wallet.js"

/**
 * A provider key added, changed or deleted through one instance is in, changed in or out of the other's memory
 * within a second (docs/api/provider-keys.md, "Adding a key"): the table announces each change on
 * `nenas_provider_keys`, and every instance reloads that account.
 */

class Both extends Context.Tag("test/ProviderKeysBoth")<Both, {
  readonly a: string
  readonly b: string
  /** Each instance's own memory of the provider keys, as the call path reads it. */
  readonly first: ProviderKeys["Type"]
  readonly second: ProviderKeys["Type"]
  readonly standInBaseUrl: string
  readonly accept: (apiKey: string) => void
}>() {}

const BothLive = Layer.scopedContext(Effect.gen(function*() {
  const standIn = yield* makeProviderStandIn
  const { a, b, clock, database, first, second, settled } = yield* twoInstances("provider-keys", {
    providerAllowedHosts: new Set(["127.0.0.1"])
  })
  return Context.make(Both, {
    a,
    b,
    first: Context.get(first, ProviderKeys),
    second: Context.get(second, ProviderKeys),
    standInBaseUrl: standIn.baseUrl,
    accept: standIn.accept
  }).pipe(Context.add(TestServer, { baseUrl: a, databaseUrl: database.url, clock, settled }))
}))

layer(BothLive, { excludeTestServices: true, timeout: 120_000 })((it) => {
  it.effect("a key created, changed and deleted through one instance is seen so by the other within a second", () =>
    Effect.gen(function*() {
      const { a, b, accept, first, second, standInBaseUrl } = yield* Both
      const { accountId, token } = yield* on(a)(developer("pk-two@example.com"))
      const apiKey = `sk-two-${randomBase62(32)}`
      accept(apiKey)
      expect(second.forAccount(accountId)).toEqual([])

      const createdAt = Date.now()
      const created = yield* on(a)(call("POST", "/dashboard/provider-keys", {
        token,
        json: {
          name: "two",
          base_url: standInBaseUrl,
          api_key: apiKey,
          models: { general: "g", reasoning: "r" },
          mode: "first"
        }
      }))
      expect(created.status, created.text).toBe(201)
      const id = created.body.provider_key.id as string
      // The instance that took it has it at once; the other within the deadline.
      expect(first.forAccount(accountId).map((key) => key.id)).toEqual([id])
      const seenIn = yield* seenWithin(
        createdAt,
        Effect.sync(() => second.forAccount(accountId).map((key) => key.id)),
        (ids) => ids.length === 1 && ids[0] === id
      )
      expect(seenIn).toBeLessThanOrEqual(DEADLINE_MS)
      const version = second.forAccount(accountId)[0]?.version

      // A change through the other instance, seen by the first.
      const changedAt = Date.now()
      const changed = yield* on(b)(call("PATCH", `/dashboard/provider-keys/${id}`, {
        token,
        json: { mode: "only", models: { general: "g2", reasoning: "r2" } }
      }))
      expect(changed.status, changed.text).toBe(200)
      const changedIn = yield* seenWithin(
        changedAt,
        Effect.sync(() => first.forAccount(accountId)[0]),
        (key) => key?.mode === "only" && key.models.general === "g2"
      )
      expect(changedIn).toBeLessThanOrEqual(DEADLINE_MS)
      expect(first.forAccount(accountId)[0]?.version).not.toBe(version)

      const deletedAt = Date.now()
      const deleted = yield* on(a)(call("DELETE", `/dashboard/provider-keys/${id}`, { token }))
      expect(deleted.status, deleted.text).toBe(204)
      expect(first.forAccount(accountId)).toEqual([])
      const goneIn = yield* seenWithin(
        deletedAt,
        Effect.sync(() => second.forAccount(accountId).length),
        (count) => count === 0
      )
      expect(goneIn).toBeLessThanOrEqual(DEADLINE_MS)
    }))
})
