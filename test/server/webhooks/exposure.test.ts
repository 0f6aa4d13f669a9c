import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { call, devToken } from "../../support/Http.js"
import { query, TestServerLive } from "../../support/TestServer.js"

/**
 * Webhook endpoints as each role sees them: a URL's path and query often carry the receiver's token, so only
 * those who manage webhooks read them whole; an endpoint made by a member who is later removed stops receiving
 * events until an owner or admin looks at it; every payload names its account as the dashboard does.
 */

const SECRET_URL = "https://hooks.example.com/services/T0/B1/tok-super-secret?token=abc123"
const MASKED = "https://hooks.example.com/…"

const as = (token: string, account: string) => ({ token, headers: { "nenas-account": account } })

const person = (email: string) =>
  Effect.gen(function*() {
    const token = yield* devToken(email)
    const accounts = (yield* call("GET", "/dashboard/accounts", { token })).body.accounts as Array<
      { id: string; member_id: string }
    >
    return { token, account: accounts[0]?.id ?? "", member: accounts[0]?.member_id ?? "" }
  })

/** `email` joins `owner`'s account as `role`: its session and member id there. */
const join = (owner: { token: string; account: string }, email: string, role: string) =>
  Effect.gen(function*() {
    const joiner = yield* person(email)
    const invitation = yield* call("POST", "/dashboard/members/invitations", {
      token: owner.token,
      json: { email, role }
    })
    expect(invitation.status, invitation.text).toBe(201)
    const accepted = yield* call("POST", `/dashboard/invitations/${invitation.body.id}/accept`, { token: joiner.token })
    expect(accepted.status, accepted.text).toBe(200)
    return { token: joiner.token, memberId: accepted.body.account.member_id as string }
  })

const createEndpoint = (token: string, account: string, url: string) =>
  Effect.map(
    call("POST", "/dashboard/webhooks", { ...as(token, account), json: { url, events: ["topup.succeeded"] } }),
    (reply) => {
      expect(reply.status, reply.text).toBe(201)
      return reply.body.endpoint.id as string
    }
  )

layer(TestServerLive({ ipDevSessionsPerMinute: 1000 }), { excludeTestServices: true, timeout: 120_000 })(
  "webhook exposure",
  (it) => {
    it.effect("a viewer, a developer and billing see a webhook's URL with its path and query masked, in the list, one endpoint and the audit log; admins see it whole", () =>
      Effect.gen(function*() {
        const owner = yield* person("exposure-owner@example.com")
        const id = yield* createEndpoint(owner.token, owner.account, SECRET_URL)
        const admin = yield* join(owner, "exposure-admin@example.com", "admin")
        for (
          const [role, email] of [
            ["viewer", "exposure-viewer@example.com"],
            ["developer", "exposure-dev@example.com"],
            ["billing", "exposure-billing@example.com"]
          ]
        ) {
          const member = yield* join(owner, email!, role!)
          const list = yield* call("GET", "/dashboard/webhooks", as(member.token, owner.account))
          expect(list.status, list.text).toBe(200)
          expect(list.body.endpoints[0].url, role).toBe(MASKED)
          const one = yield* call("GET", `/dashboard/webhooks/${id}`, as(member.token, owner.account))
          expect(one.body.url, role).toBe(MASKED)
          const audit = yield* call("GET", "/dashboard/audit-log", as(member.token, owner.account))
          expect(audit.status, audit.text).toBe(200)
          expect(audit.text, role).not.toContain("tok-super-secret")
          expect(list.text + one.text, role).not.toContain("abc123")
        }
        for (const manager of [owner.token, admin.token]) {
          const list = yield* call("GET", "/dashboard/webhooks", as(manager, owner.account))
          expect(list.body.endpoints[0].url).toBe(SECRET_URL)
          const one = yield* call("GET", `/dashboard/webhooks/${id}`, as(manager, owner.account))
          expect(one.body.url).toBe(SECRET_URL)
        }
      }))

    it.effect("removing an admin disables the webhooks it made, flagged and audited; the others' stay enabled; an owner may enable it again", () =>
      Effect.gen(function*() {
        const owner = yield* person("removal-owner@example.com")
        const admin = yield* join(owner, "removal-admin@example.com", "admin")
        const kept = yield* createEndpoint(owner.token, owner.account, "https://hooks.example.com/owner")
        const made = yield* createEndpoint(admin.token, owner.account, "https://exfil.example.net/collect")
        const removed = yield* call("DELETE", `/dashboard/members/${admin.memberId}`, as(owner.token, owner.account))
        expect(removed.status, removed.text).toBe(200)
        const list = yield* call("GET", "/dashboard/webhooks", as(owner.token, owner.account))
        const byId = new Map(
          (list.body.endpoints as Array<{ id: string }>).map((e) => [e.id, e as Record<string, unknown>])
        )
        expect(byId.get(made)).toMatchObject({ status: "disabled", created_by_removed: true })
        expect(String(byId.get(made)?.["disabled_reason"])).toMatch(/removed/)
        expect(byId.get(kept)).toMatchObject({ status: "enabled", created_by_removed: false })
        const audit = yield* query<{ action: string; target_id: string | null; member_id: string | null }>(
          "SELECT action, target_id, member_id FROM audit_log WHERE account_id = $1 AND action = 'webhook.disabled'",
          [owner.account]
        )
        expect(audit).toEqual([{ action: "webhook.disabled", target_id: made, member_id: owner.member }])
        // No event is queued for it while disabled.
        const queued = yield* query<{ n: number }>(
          "SELECT count(*)::int AS n FROM webhook_endpoints WHERE id = $1 AND disabled_at IS NOT NULL",
          [made]
        )
        expect(queued[0]?.n).toBe(1)
        const enabled = yield* call("PATCH", `/dashboard/webhooks/${made}`, {
          ...as(owner.token, owner.account),
          json: { disabled: false }
        })
        expect(enabled.status, enabled.text).toBe(200)
        expect(enabled.body).toMatchObject({ status: "enabled", created_by_removed: true })
      }))

    it.effect("a personal account's events name it as the dashboard does, not null", () =>
      Effect.gen(function*() {
        const owner = yield* person("personal-name@example.com")
        const id = yield* createEndpoint(owner.token, owner.account, "https://hooks.example.com/personal")
        const sent = yield* call("POST", `/dashboard/webhooks/${id}/test`, as(owner.token, owner.account))
        expect(sent.status, sent.text).toBe(202)
        const rows = yield* query<{ payload: { account: { id: string; name: string | null } } }>(
          "SELECT payload FROM outbox_events WHERE id = $1",
          [sent.body.event_id]
        )
        expect(rows[0]?.payload.account).toEqual({ id: owner.account, name: "Personal" })
      }))
  }
)
