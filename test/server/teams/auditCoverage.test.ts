import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { keyPrefix } from "../../../src/Keys/ApiKeys.js"
import { PUBLIC_MODEL } from "../../../src/Models/OpenAi/Api.js"
import { call } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream } from "../../support/Models.js"
import { query } from "../../support/TestServer.js"

/**
 * Changes that were not audited: grouping tags, checkouts, webhook test events and resends, and a stored
 * response deleted by an API key. Each writes exactly one entry, naming who did it (the member, or the key).
 */

interface Entry extends Record<string, unknown> {
  readonly action: string
  readonly target_type: string
  readonly target_id: string | null
  readonly member_id: string | null
  readonly details: Record<string, unknown>
}

const entries = (accountId: string, action: string) =>
  query<Entry>(
    "SELECT action, target_type, target_id, member_id, details FROM audit_log WHERE account_id = $1 AND action = $2 ORDER BY created_at, id",
    [accountId, action]
  )

const memberOf = (token: string) =>
  Effect.map(call("GET", "/dashboard/accounts", { token }), (reply) => reply.body.accounts[0].member_id as string)

layer(TestServerWithUpstream(), { excludeTestServices: true, timeout: 90_000 })("audit coverage", (it) => {
  it.effect("grouping tags set and a checkout created are audited as the member who did them", () =>
    Effect.gen(function*() {
      const { accountId, token } = yield* caller("audit-tags@example.com")
      const member = yield* memberOf(token)
      const tags = yield* call("PUT", "/dashboard/usage/grouping-tags", {
        token,
        json: { tag_keys: ["team", "feature"] }
      })
      expect(tags.status, tags.text).toBe(200)
      expect(yield* entries(accountId, "usage.grouping_tags_updated")).toEqual([{
        action: "usage.grouping_tags_updated",
        target_type: "usage",
        target_id: null,
        member_id: member,
        details: { tag_keys: ["team", "feature"] }
      }])
      const checkout = yield* call("POST", "/dashboard/billing/checkout", { token, json: { amount_sen: 2500 } })
      expect(checkout.status, checkout.text).toBe(200)
      expect(yield* entries(accountId, "billing.checkout_created")).toEqual([{
        action: "billing.checkout_created",
        target_type: "checkout",
        target_id: checkout.body.transaction_id,
        member_id: member,
        details: {
          amount_sen: 2500,
          tax_sen: 0,
          total_sen: 2500,
          session_id: checkout.body.session_id,
          save_card: false
        }
      }])
    }))

  it.effect("a webhook test event and a resend are audited with the endpoint and what was sent", () =>
    Effect.gen(function*() {
      const { accountId, token } = yield* caller("audit-webhooks@example.com")
      const member = yield* memberOf(token)
      const created = yield* call("POST", "/dashboard/webhooks", {
        token,
        json: { url: "https://hooks.example.com/x", events: ["topup.succeeded"] }
      })
      expect(created.status, created.text).toBe(201)
      const id = created.body.endpoint.id as string
      const sent = yield* call("POST", `/dashboard/webhooks/${id}/test`, { token })
      expect(sent.status, sent.text).toBe(202)
      expect(yield* entries(accountId, "webhook.test_sent")).toEqual([{
        action: "webhook.test_sent",
        target_type: "webhook",
        target_id: id,
        member_id: member,
        details: { event_id: sent.body.event_id }
      }])
      const deliveries = yield* call("GET", `/dashboard/webhooks/${id}/deliveries`, { token })
      const deliveryId = deliveries.body.deliveries[0].id as string
      const resent = yield* call("POST", `/dashboard/webhooks/${id}/deliveries/${deliveryId}/resend`, { token })
      expect(resent.status, resent.text).toBe(202)
      const missing = yield* call("POST", `/dashboard/webhooks/${id}/deliveries/whd_missing/resend`, { token })
      expect(missing.status, missing.text).toBe(404)
      expect(yield* entries(accountId, "webhook.delivery_resent")).toEqual([{
        action: "webhook.delivery_resent",
        target_type: "webhook",
        target_id: id,
        member_id: member,
        details: { delivery_id: deliveryId }
      }])
    }))

  it.effect("DELETE /v1/responses/{id} is audited with the API key as the actor; a missing one writes nothing", () =>
    Effect.gen(function*() {
      const { accountId, apiKey, keyId } = yield* caller("audit-responses@example.com", { sen: 1000 })
      const answer = yield* modelCall(apiKey, "/v1/responses", { model: PUBLIC_MODEL, input: "Hello" })
      expect(answer.status, answer.text).toBe(200)
      const id = answer.body.id as string
      const deleted = yield* call("DELETE", `/v1/responses/${id}`, { token: apiKey })
      expect(deleted.status, deleted.text).toBe(200)
      const again = yield* call("DELETE", `/v1/responses/${id}`, { token: apiKey })
      expect(again.status, again.text).toBe(404)
      const found = yield* entries(accountId, "response.deleted")
      expect(found).toEqual([{
        action: "response.deleted",
        target_type: "response",
        target_id: id,
        member_id: null,
        details: { actor_api_key_id: keyId, actor_api_key_prefix: keyPrefix(apiKey) }
      }])
    }))
})
