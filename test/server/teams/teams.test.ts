import type { SqlClient } from "@effect/sql"
import { expect, layer } from "@effect/vitest"
import { Effect, Layer, Option, Redacted } from "effect"
import { IpLimits } from "../../../src/Addresses/IpLimits.js"
import { AppConfig } from "../../../src/AppConfig.js"
import { AuditLog } from "../../../src/Audit/Repo.js"
import { DatabaseLive } from "../../../src/Database/Database.js"
import { newId } from "../../../src/Domain/Ids.js"
import { makeTestLayer } from "../../../src/Domain/TestLayer.js"
import { emailAccount } from "../../../src/Outbox/Events.js"
import { expectClientError } from "../../support/ErrorBody.js"
import { call, createKey, devToken, type Reply } from "../../support/Http.js"
import { query, TestServer, TestServerLive } from "../../support/TestServer.js"

/**
 * Teams (docs/api/teams.md, "Teams") on PostgreSQL through the real server: invitations (and their
 * races), the last owner, roles refused before anything changes, and the audit log written exactly
 * once, in the change's transaction.
 */

const as = (token: string, account?: string) => ({
  token,
  ...(account === undefined ? {} : { headers: { "nenas-account": account } })
})

/** The personal account of a new person, and their session. */
const person = (email: string) =>
  Effect.gen(function*() {
    const token = yield* devToken(email)
    const accounts = (yield* call("GET", "/dashboard/accounts", { token })).body.accounts as Array<
      { id: string; member_id: string; role: string }
    >
    expect(accounts.length).toBe(1)
    return { token, account: accounts[0]!.id, member: accounts[0]!.member_id }
  })

const invite = (token: string, email: string, role: string) =>
  call("POST", "/dashboard/members/invitations", { token, json: { email, role } })

/** `email` joins `owner`'s account as `role`: invited, then accepted. */
const join = (owner: { token: string }, email: string, role: string) =>
  Effect.gen(function*() {
    const joiner = yield* person(email)
    const invitation = yield* invite(owner.token, email, role)
    expect(invitation.status, invitation.text).toBe(201)
    const accepted = yield* call("POST", `/dashboard/invitations/${invitation.body.id}/accept`, { token: joiner.token })
    expect(accepted.status, accepted.text).toBe(200)
    return {
      ...joiner,
      memberId: accepted.body.account.member_id as string,
      teamAccount: accepted.body.account.id as string
    }
  })

const auditOf = (accountId: string) =>
  query<
    {
      action: string
      member_id: string | null
      target_id: string | null
      client_address: string | null
      request_id: string | null
    }
  >(
    "SELECT action, member_id, target_id, client_address, request_id FROM audit_log WHERE account_id = $1 ORDER BY created_at, id",
    [accountId]
  )

/** `effect` on the test server's database, as another process of the service would run it. */
const onDatabase = <A, E>(effect: Effect.Effect<A, E, AuditLog | SqlClient.SqlClient>) =>
  Effect.gen(function*() {
    const { databaseUrl } = yield* TestServer
    const config = AppConfig.layerWith({
      databaseUrl: Option.some(Redacted.make(databaseUrl)),
      instanceId: newId("test")
    })
    return yield* effect.pipe(
      Effect.provide(AuditLog.layer.pipe(
        Layer.provideMerge(DatabaseLive),
        Layer.provide(makeTestLayer(IpLimits)({})),
        Layer.provide(config)
      )),
      Effect.scoped,
      Effect.orDie
    )
  })

const expectDenied = (reply: Reply, needed: string) => {
  expectClientError(reply, { status: 403, code: "permission_denied" }, needed)
  expect(reply.body.error.message).toContain(needed)
}

layer(TestServerLive({ ipDevSessionsPerMinute: 1000 }), { excludeTestServices: true, timeout: 120_000 })(
  "teams",
  (it) => {
    it.effect("an invitation is emailed with its link, accepted by the invited email only, and the account is then named with Nenas-Account", () =>
      Effect.gen(function*() {
        const owner = yield* person("team-owner@example.com")
        const stranger = yield* person("team-stranger@example.com")
        const invitee = yield* person("Team-Dev@Example.com")
        const invitation = yield* invite(owner.token, "team-dev@example.com", "developer")
        expect(invitation.status).toBe(201)
        expect(invitation.body).toMatchObject({
          email: "team-dev@example.com",
          role: "developer",
          account_id: owner.account
        })
        expect(invitation.body.accept_url).toContain(`/invitations?id=${invitation.body.id}`)
        const mail = (yield* call("GET", "/dev/mailbox/messages")).body.messages.filter((m: { to: string }) =>
          m.to === "team-dev@example.com"
        )
        expect(mail.length).toBe(1)
        expect(mail[0].body).toContain(invitation.body.accept_url)
        // Another person's invitation is as unknown to them as a made-up id.
        expect((yield* call("GET", "/dashboard/invitations", { token: stranger.token })).body.invitations).toEqual([])
        expectClientError(
          yield* call("POST", `/dashboard/invitations/${invitation.body.id}/accept`, { token: stranger.token }),
          { status: 404, code: "not_found" },
          "stranger accepts"
        )
        const mine = (yield* call("GET", "/dashboard/invitations", { token: invitee.token })).body.invitations
        expect(mine.map((i: { id: string }) => i.id)).toEqual([invitation.body.id])
        const accepted = yield* call("POST", `/dashboard/invitations/${invitation.body.id}/accept`, {
          token: invitee.token
        })
        expect(accepted.status).toBe(200)
        expect(accepted.body.account).toMatchObject({ id: owner.account, role: "developer", personal: false })
        const accounts = (yield* call("GET", "/dashboard/accounts", { token: invitee.token })).body.accounts
        expect(accounts.map((a: { id: string; personal: boolean }) => [a.id, a.personal])).toEqual([[
          invitee.account,
          true
        ], [owner.account, false]])
        // Without the header: their own account; with it: the team's, as a developer.
        const own = yield* call("GET", "/dashboard/members", { token: invitee.token })
        expect(own.body.members.map((m: { role: string }) => m.role)).toEqual(["owner"])
        const team = yield* call("GET", "/dashboard/members", as(invitee.token, owner.account))
        expect(team.body.members.map((m: { email: string; role: string; you: boolean }) => [m.email, m.role, m.you]))
          .toEqual([
            ["team-owner@example.com", "owner", false],
            ["team-dev@example.com", "developer", true]
          ])
        // A developer's key in the team's account is the team's and the developer's.
        const key = yield* call("POST", "/dashboard/api-keys", {
          ...as(invitee.token, owner.account),
          json: { name: "dev key", environment: "test" }
        })
        expect(key.status).toBe(201)
        const [row] = yield* query<{ account_id: string; member_id: string }>(
          "SELECT account_id, member_id FROM api_keys WHERE id = $1",
          [key.body.key.id]
        )
        expect(row).toEqual({ account_id: owner.account, member_id: accepted.body.account.member_id })
        // An account the person does not belong to, named in the header, is refused.
        expectDenied(yield* call("GET", "/dashboard/members", as(invitee.token, stranger.account)), "not a member")
        const audit = yield* auditOf(owner.account)
        expect(audit.map((entry) => entry.action)).toEqual(["member.invited", "member.joined", "api_key.created"])
        expect(audit[1]).toMatchObject({ member_id: accepted.body.account.member_id })
        expect(audit[2]).toMatchObject({
          member_id: accepted.body.account.member_id,
          target_id: key.body.key.id,
          client_address: "127.0.0.1"
        })
        expect(audit[2]!.request_id).toMatch(/^req_/)
      }))

    it.effect("two accepts at once make one member; an expired or revoked invitation is refused", () =>
      Effect.gen(function*() {
        const owner = yield* person("race-owner@example.com")
        const invitee = yield* person("race-dev@example.com")
        const invitation = yield* invite(owner.token, "race-dev@example.com", "viewer")
        const replies = yield* Effect.all(
          [1, 2, 3].map(() =>
            call("POST", `/dashboard/invitations/${invitation.body.id}/accept`, { token: invitee.token })
          ),
          { concurrency: "unbounded" }
        )
        expect(replies.map((r) => r.status).sort()).toEqual([200, 400, 400])
        for (const refused of replies.filter((r) => r.status === 400)) {
          expect(refused.body.error.message).toContain("already accepted")
        }
        const members = yield* query<{ n: number }>(
          "SELECT count(*)::int AS n FROM members WHERE account_id = $1 AND email = 'race-dev@example.com' AND removed_at IS NULL",
          [owner.account]
        )
        expect(members[0]!.n).toBe(1)
        const joined = (yield* auditOf(owner.account)).filter((entry) => entry.action === "member.joined")
        expect(joined.length).toBe(1)

        const other = yield* person("race-late@example.com")
        const expiring = yield* invite(owner.token, "race-late@example.com", "viewer")
        yield* query("UPDATE invitations SET expires_at = now() - interval '1 second' WHERE id = $1", [
          expiring.body.id
        ])
        const expired = yield* call("POST", `/dashboard/invitations/${expiring.body.id}/accept`, { token: other.token })
        expectClientError(expired, { status: 400, code: "invalid_request" }, "expired")
        expect(expired.body.error.message).toContain("expired")
        // An expired invitation no longer blocks a new one, which a revocation then ends.
        const again = yield* invite(owner.token, "race-late@example.com", "viewer")
        expect(again.status).toBe(201)
        expect(
          (yield* call("DELETE", `/dashboard/members/invitations/${again.body.id}`, { token: owner.token })).status
        ).toBe(200)
        const revoked = yield* call("POST", `/dashboard/invitations/${again.body.id}/accept`, { token: other.token })
        expect(revoked.body.error.message).toContain("revoked")
        expectClientError(
          yield* call("DELETE", `/dashboard/members/invitations/${again.body.id}`, { token: owner.token }),
          { status: 404, code: "not_found" },
          "revoked twice"
        )
        expect((yield* auditOf(owner.account)).filter((entry) => entry.action === "member.invitation_revoked").length)
          .toBe(1)
      }))

    it.effect("an invite-and-revoke loop sends at most 100 invitations a day: the next answers 429 until the oldest is a day old", () =>
      Effect.gen(function*() {
        const owner = yield* person("pace-owner@example.com")
        for (let i = 0; i < 3; i++) {
          const sent = yield* invite(owner.token, "pace-target@example.com", "viewer")
          expect(sent.status, sent.text).toBe(201)
          expect(
            (yield* call("DELETE", `/dashboard/members/invitations/${sent.body.id}`, { token: owner.token })).status
          ).toBe(200)
        }
        // 97 more in the last 23 hours, revoked as the loop leaves them: the oldest turns a day old in an hour.
        yield* query(
          `INSERT INTO invitations (id, account_id, email, role, invited_by, expires_at, created_at, revoked_at)
         SELECT 'inv_pace' || n, $1, 'pace-target@example.com', 'viewer', $2, now() + interval '6 days',
                now() - interval '23 hours' + n * interval '1 minute', now()
         FROM generate_series(1, 97) AS n`,
          [owner.account, owner.member]
        )
        const rows = () =>
          query<{ n: number }>("SELECT count(*)::int AS n FROM invitations WHERE account_id = $1", [owner.account])
        const refused = yield* invite(owner.token, "pace-other@example.com", "viewer")
        expectClientError(refused, { status: 429, code: "rate_limit_exceeded" }, "the 101st invitation of the day")
        expect(refused.body.error.message).toContain("100 invitations a day")
        const retryAfter = Number(refused.headers.get("retry-after"))
        expect(retryAfter).toBeGreaterThan(3500)
        expect(retryAfter).toBeLessThanOrEqual(3660)
        expect(refused.body.error.retry_after_seconds).toBe(retryAfter)
        // Refused before anything was written: no invitation, so no email and no audit entry.
        expect((yield* rows())[0]!.n).toBe(100)
        expect((yield* auditOf(owner.account)).filter((entry) => entry.action === "member.invited").length).toBe(3)
        // A day after the oldest was sent, the next may go.
        yield* query("UPDATE invitations SET created_at = created_at - interval '2 hours' WHERE id = 'inv_pace1'")
        const later = yield* invite(owner.token, "pace-other@example.com", "viewer")
        expect(later.status, later.text).toBe(201)
      }))

    it.effect("the last owner can be neither demoted nor removed; of two owners demoting each other at once, one stays", () =>
      Effect.gen(function*() {
        const owner = yield* person("last-owner@example.com")
        const demote = (token: string, id: string, account?: string) =>
          call("PATCH", `/dashboard/members/${id}`, { ...as(token, account), json: { role: "admin" } })
        const alone = yield* demote(owner.token, owner.member)
        expectClientError(alone, { status: 400, code: "invalid_request" }, "last owner demoted")
        expect(alone.body.error.message).toContain("at least one owner")
        expectClientError(
          yield* call("DELETE", `/dashboard/members/${owner.member}`, { token: owner.token }),
          { status: 400, code: "invalid_request" },
          "last owner removed"
        )
        // Refused changes leave no audit entry.
        expect((yield* auditOf(owner.account)).length).toBe(0)
        const second = yield* join(owner, "second-owner@example.com", "admin")
        // Only an owner makes an owner: an admin may not promote itself.
        expectDenied(
          yield* call("PATCH", `/dashboard/members/${second.memberId}`, {
            ...as(second.token, owner.account),
            json: { role: "owner" }
          }),
          "Only an owner"
        )
        expect(
          (yield* call("PATCH", `/dashboard/members/${second.memberId}`, {
            token: owner.token,
            json: { role: "owner" }
          })).status
        ).toBe(200)
        const both = yield* Effect.all([
          demote(owner.token, second.memberId),
          demote(second.token, owner.member, owner.account)
        ], { concurrency: 2 })
        // One wins. The other is refused as the last owner (400), or, when the first demoted its caller
        // before it was read, as no longer an owner (403).
        const [won, lost] = both.map((r) => r.status).sort()
        expect(won).toBe(200)
        expect([400, 403]).toContain(lost)
        const owners = yield* query<{ n: number }>(
          "SELECT count(*)::int AS n FROM members WHERE account_id = $1 AND role = 'owner' AND removed_at IS NULL",
          [owner.account]
        )
        expect(owners[0]!.n).toBe(1)
      }))

    it.effect("roles: a viewer reads but changes nothing (it may leave), billing pays but makes no keys, a developer changes only its own keys", () =>
      Effect.gen(function*() {
        const owner = yield* person("roles-owner@example.com")
        const ownersKey = yield* createKey(owner.token, { name: "owner's", environment: "test" })
        const viewer = yield* join(owner, "roles-viewer@example.com", "viewer")
        const billing = yield* join(owner, "roles-billing@example.com", "billing")
        const developer = yield* join(owner, "roles-dev@example.com", "developer")
        const team = owner.account
        for (
          const path of [
            "/dashboard/api-keys",
            "/dashboard/members",
            "/dashboard/billing/balance",
            "/dashboard/logs",
            "/dashboard/audit-log"
          ]
        ) {
          expect((yield* call("GET", path, as(viewer.token, team))).status, path).toBe(200)
        }
        expectDenied(
          yield* call("POST", "/dashboard/api-keys", { ...as(viewer.token, team), json: { name: "no" } }),
          "owner, admin or developer"
        )
        expectDenied(
          yield* call("PUT", "/dashboard/billing/settings", {
            ...as(viewer.token, team),
            json: { low_balance_threshold_myr: 5 }
          }),
          "owner, admin or billing"
        )
        expectDenied(
          yield* call("POST", "/dashboard/api-keys", { ...as(billing.token, team), json: { name: "no" } }),
          "owner, admin or developer"
        )
        expect(
          (yield* call("PUT", "/dashboard/billing/settings", {
            ...as(billing.token, team),
            json: { low_balance_threshold_myr: 5 }
          })).status
        ).toBe(200)
        expectDenied(
          yield* call("POST", "/dashboard/members/invitations", {
            ...as(developer.token, team),
            json: { email: "x@example.com", role: "viewer" }
          }),
          "owner or admin"
        )
        const devKey = yield* call("POST", "/dashboard/api-keys", {
          ...as(developer.token, team),
          json: { name: "mine", environment: "test" }
        })
        expect(devKey.status).toBe(201)
        expect(
          (yield* call("PATCH", `/dashboard/api-keys/${devKey.body.key.id}`, {
            ...as(developer.token, team),
            json: { name: "still mine" }
          })).status
        ).toBe(200)
        const others = yield* call("PATCH", `/dashboard/api-keys/${ownersKey.key.id}`, {
          ...as(developer.token, team),
          json: { disabled: true }
        })
        expectDenied(others, "only the keys it created")
        expectDenied(
          yield* call("DELETE", `/dashboard/api-keys/${ownersKey.key.id}`, as(developer.token, team)),
          "only the keys it created"
        )
        // A refusal is answered before the body is read, and changes nothing.
        const [key] = yield* query<{ disabled_at: Date | null }>("SELECT disabled_at FROM api_keys WHERE id = $1", [
          ownersKey.key.id
        ])
        expect(key!.disabled_at).toBeNull()
        // Anyone may leave; removing another member is an owner's or admin's.
        expectDenied(
          yield* call("DELETE", `/dashboard/members/${developer.memberId}`, as(viewer.token, team)),
          "owner or admin"
        )
        const left = yield* call("DELETE", `/dashboard/members/${viewer.memberId}`, as(viewer.token, team))
        expect(left.body).toEqual({ ok: true, keys_disabled: [], keys_transferred: [] })
        expectDenied(yield* call("GET", "/dashboard/members", as(viewer.token, team)), "not a member")
        // Their own account is still theirs.
        expect((yield* call("GET", "/dashboard/members", { token: viewer.token })).status).toBe(200)
      }))

    it.effect("removing a member disables its keys, or gives them to another member; its entry lists them", () =>
      Effect.gen(function*() {
        const owner = yield* person("remove-owner@example.com")
        const leaver = yield* join(owner, "remove-dev@example.com", "developer")
        const stayer = yield* join(owner, "remove-stay@example.com", "developer")
        const key = yield* call("POST", "/dashboard/api-keys", {
          ...as(leaver.token, owner.account),
          json: { name: "leaver's", environment: "test" }
        })
        const other = yield* call("POST", "/dashboard/api-keys", {
          ...as(stayer.token, owner.account),
          json: { name: "stayer's", environment: "test" }
        })
        const removed = yield* call("DELETE", `/dashboard/members/${leaver.memberId}`, { token: owner.token })
        expect(removed.body).toEqual({ ok: true, keys_disabled: [key.body.key.id], keys_transferred: [] })
        expectDenied(yield* call("GET", "/dashboard/members", as(leaver.token, owner.account)), "not a member")
        const transferred = yield* call(
          "DELETE",
          `/dashboard/members/${stayer.memberId}?transfer_keys_to=${owner.member}`,
          { token: owner.token }
        )
        expect(transferred.body).toEqual({ ok: true, keys_disabled: [], keys_transferred: [other.body.key.id] })
        const rows = yield* query<{ id: string; member_id: string; disabled: boolean }>(
          "SELECT id, member_id, disabled_at IS NOT NULL AS disabled FROM api_keys WHERE id = ANY($1) ORDER BY name",
          [[key.body.key.id, other.body.key.id]]
        )
        expect(rows).toEqual([
          { id: key.body.key.id, member_id: leaver.memberId, disabled: true },
          { id: other.body.key.id, member_id: owner.member, disabled: false }
        ])
        const entries = (yield* auditOf(owner.account)).filter((entry) => entry.action === "member.removed")
        expect(entries.map((entry) => entry.target_id)).toEqual([leaver.memberId, stayer.memberId])
      }))

    it.effect("an audit entry is rolled back with its change, and a change is rolled back with its entry", () =>
      Effect.gen(function*() {
        const owner = yield* person("audit-rollback@example.com")
        // The audit log refuses this key's name: the entry fails, so the key it records must not exist.
        yield* query(`
        CREATE OR REPLACE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.details->>'name' = 'refused by the audit log' THEN RAISE EXCEPTION 'audit write refused'; END IF;
          RETURN NEW;
        END $$`)
        yield* query("DROP TRIGGER IF EXISTS refuse_audit ON audit_log")
        yield* query(
          "CREATE TRIGGER refuse_audit BEFORE INSERT ON audit_log FOR EACH ROW EXECUTE FUNCTION refuse_audit()"
        )
        const refused = yield* call("POST", "/dashboard/api-keys", {
          token: owner.token,
          json: { name: "refused by the audit log" }
        })
        yield* query("DROP TRIGGER refuse_audit ON audit_log")
        expect(refused.status).toBe(500)
        const keys = yield* query<{ n: number }>("SELECT count(*)::int AS n FROM api_keys WHERE account_id = $1", [
          owner.account
        ])
        expect(keys[0]!.n).toBe(0)
        const made = yield* createKey(owner.token, { name: "kept" })
        // A rotation repeated with its Idempotency-Key changes nothing the second time: one entry.
        const rotate = call("POST", `/dashboard/api-keys/${made.key.id}/rotate`, {
          token: owner.token,
          json: {},
          headers: { "idempotency-key": "rotation-0123456789abcdef" }
        })
        const [first, repeat] = [yield* rotate, yield* rotate]
        expect(repeat.body.full_key).toBe(first.body.full_key)
        expect((yield* auditOf(owner.account)).map((entry) => [entry.action, entry.target_id])).toEqual([
          ["api_key.created", made.key.id],
          ["api_key.rotated", made.key.id]
        ])
      }))

    it.effect("the audit log pages and filters, and exports the same entries as CSV", () =>
      Effect.gen(function*() {
        const owner = yield* person("audit-pages@example.com")
        const made: Array<string> = []
        for (let i = 0; i < 3; i++) {
          made.push((yield* createKey(owner.token, { name: `key ${i}`, environment: "test" })).key.id)
        }
        yield* call("PATCH", `/dashboard/api-keys/${made[0]}`, { token: owner.token, json: { name: "renamed" } })
        const first = yield* call("GET", "/dashboard/audit-log?limit=2", { token: owner.token })
        expect(first.body).toMatchObject({ total: 4, has_more: true })
        expect(first.body.entries.map((e: { action: string }) => e.action)).toEqual([
          "api_key.updated",
          "api_key.created"
        ])
        expect(first.body.entries[0].details).toMatchObject({ name: "renamed" })
        const created = yield* call("GET", "/dashboard/audit-log?action=api_key.created", { token: owner.token })
        expect(created.body.entries.map((e: { target_id: string }) => e.target_id)).toEqual([...made].reverse())
        expectClientError(
          yield* call("GET", "/dashboard/audit-log?action=api_key.exploded", { token: owner.token }),
          { status: 400, code: "invalid_request" },
          "unknown action"
        )
        const csv = yield* call("GET", "/dashboard/audit-log/export?format=csv&action=api_key.created", {
          token: owner.token
        })
        expect(csv.headers.get("content-type")).toContain("text/csv")
        const lines = csv.text.trim().split("\r\n")
        expect(lines[0]).toBe(
          "id,created_at,action,target_type,target_id,member_id,actor_email,client_address,request_id,details"
        )
        expect(lines.length).toBe(4)
        for (const id of made) expect(csv.text).toContain(id)
      }))

    it.effect("an alert's email goes to every owner and billing member, naming the account; entries older than a year are purged", () =>
      Effect.gen(function*() {
        const owner = yield* person("mail-owner@example.com")
        yield* join(owner, "mail-billing@example.com", "billing")
        yield* join(owner, "mail-viewer@example.com", "viewer")
        const subject = `alert ${newId("t")}`
        yield* onDatabase(emailAccount(owner.account, { subject, body: "The balance is low." }, new Date()))
        const sent = yield* query<{ to_address: string; body: string }>(
          "SELECT to_address, body FROM outbox_emails WHERE subject = $1 ORDER BY to_address",
          [subject]
        )
        expect(sent.map((row) => row.to_address)).toEqual(["mail-billing@example.com", "mail-owner@example.com"])
        for (const row of sent) {
          expect(row.body).toBe(`Account: mail-owner@example.com (${owner.account})\n\nThe balance is low.`)
        }

        yield* query(
          `INSERT INTO audit_log (id, account_id, action, target_type, created_at)
         VALUES ('aud_old', $1, 'api_key.created', 'api_key', now() - interval '366 days'),
                ('aud_young', $1, 'api_key.created', 'api_key', now() - interval '364 days')`,
          [owner.account]
        )
        const purged = yield* onDatabase(Effect.flatMap(AuditLog, (log) => log.purge))
        expect(purged).toBeGreaterThanOrEqual(1)
        const left = yield* query<{ id: string }>("SELECT id FROM audit_log WHERE id IN ('aud_old', 'aud_young')")
        expect(left.map((row) => row.id)).toEqual(["aud_young"])
      }))
  }
)
