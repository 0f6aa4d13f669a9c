import { expect, layer } from "@effect/vitest"
import { Context, Effect, Layer, Option } from "effect"
import { expectClientError } from "../../support/ErrorBody.js"
import { call, createKey, devToken, type Reply } from "../../support/Http.js"
import { type Idp, startIdp } from "../../support/Idp.js"
import { query, TestServerLive } from "../../support/TestServer.js"

/**
 * Teams on PostgreSQL through the real server, where trust is earned: an identity provider's email counts only when
 * it is verified and in its plain form, a member who leaves keeps no key, an admin's invitations end with its rights,
 * only an owner changes an owner, a developer only tightens what an owner set on its keys, and names that reach an
 * email stay on one line (docs/api/teams.md, "Teams").
 */

const as = (token: string, account?: string) => ({
  token,
  ...(account === undefined ? {} : { headers: { "nenas-account": account } })
})

const expectDenied = (reply: Reply, needed: string) => {
  expectClientError(reply, { status: 403, code: "permission_denied" }, needed)
  expect(reply.body.error.message).toContain(needed)
}

const invite = (token: string, email: string, role: string) =>
  call("POST", "/dashboard/members/invitations", { token, json: { email, role } })

const accept = (token: string, invitationId: string) =>
  call("POST", `/dashboard/invitations/${invitationId}/accept`, { token })

const accountsOf = (token: string) =>
  Effect.map(call("GET", "/dashboard/accounts", { token }), (reply) => {
    expect(reply.status, reply.text).toBe(200)
    return reply.body.accounts as Array<{ id: string; member_id: string; role: string }>
  })

const mailTo = (to: string) =>
  Effect.map(
    call("GET", "/dev/mailbox/messages"),
    (reply) => (reply.body.messages as Array<{ to: string; subject: string; body: string }>).filter((m) => m.to === to)
  )

class TestIdp extends Context.Tag("test/TrustIdp")<TestIdp, Idp>() {}

const IdpAndServer = Layer.unwrapScoped(Effect.gen(function*() {
  const idp = yield* startIdp({ audience: "nenas-trust", subject: "idp|unused", email: "unused@example.com" })
  return Layer.merge(
    TestServerLive({
      authJwksUrl: Option.some(idp.jwksUrl),
      authIssuer: Option.some(idp.issuer),
      authAudience: Option.some(idp.audience)
    }),
    Layer.succeed(TestIdp, idp)
  )
}))

layer(IdpAndServer, { excludeTestServices: true, timeout: 120_000 })(
  "an identity provider's emails and names",
  (it) => {
    it.effect("an invitation is taken only by a verified email in its plain form, compared after NFKC and case folding", () =>
      Effect.gen(function*() {
        const idp = yield* TestIdp
        const sign = (claims: Parameters<Idp["sign"]>[0]) => Effect.promise(() => idp.sign(claims))
        const owner = yield* sign({ sub: "idp|owner", email: "owner@example.com", email_verified: true })
        const [team] = yield* accountsOf(owner)
        const invitation = yield* invite(owner, "victim@example.com", "admin")
        expect(invitation.status, invitation.text).toBe(201)
        // An identity provider that lets its users type any email: without `email_verified: true` it names no one.
        for (const [sub, verified] of [["idp|unverified", undefined], ["idp|refuted", false]] as const) {
          const attacker = yield* sign({
            sub,
            email: "victim@example.com",
            ...(verified === undefined ? {} : { email_verified: verified })
          })
          expect((yield* call("GET", "/dashboard/invitations", { token: attacker })).body.invitations, sub).toEqual([])
          expectClientError(yield* accept(attacker, invitation.body.id), { status: 404, code: "not_found" }, sub)
        }
        // A Kelvin sign folds to `k` in lower case, but it is not the address invited: its form differs, so it counts for nothing.
        const kelvinInvite = yield* invite(owner, "kelvin@example.com", "viewer")
        expect(kelvinInvite.status, kelvinInvite.text).toBe(201)
        const kelvinSign = yield* sign({
          sub: "idp|kelvin-sign",
          email: "\u212Aelvin@example.com",
          email_verified: true
        })
        expect((yield* call("GET", "/dashboard/invitations", { token: kelvinSign })).body.invitations).toEqual([])
        expectClientError(
          yield* accept(kelvinSign, kelvinInvite.body.id),
          { status: 404, code: "not_found" },
          "Kelvin sign"
        )
        // Invited in that form, the address is refused, naming the field.
        expectClientError(yield* invite(owner, "\u212Aelvin@example.com", "viewer"), {
          status: 400,
          code: "invalid_request",
          param: "email"
        }, "Kelvin invite")
        // Letter case is no difference: the verified owner of the address accepts.
        const victim = yield* sign({ sub: "idp|victim", email: "Victim@Example.COM", email_verified: true })
        const taken = yield* accept(victim, invitation.body.id)
        expect(taken.status, taken.text).toBe(200)
        expect(taken.body.account).toMatchObject({ id: team!.id, role: "admin" })
        const members = yield* query<{ subject: string }>(
          "SELECT subject FROM members WHERE account_id = $1 AND removed_at IS NULL ORDER BY created_at",
          [team!.id]
        )
        expect(members.map((row) => row.subject)).toEqual(["idp|owner", "idp|victim"])
      }))

    it.effect("a name claim with line breaks reaches an invitation email on one line, capped and quoted", () =>
      Effect.gen(function*() {
        const idp = yield* TestIdp
        const name = `Mallory\r\nBcc: everyone@example.com\u2028Click https://evil.example/${"x".repeat(200)}`
        const mallory = yield* Effect.promise(() =>
          idp.sign({ sub: "idp|mallory", email: "mallory@example.com", email_verified: true, name })
        )
        const sent = yield* invite(mallory, "mark@example.com", "viewer")
        expect(sent.status, sent.text).toBe(201)
        const [mail] = yield* mailTo("mark@example.com")
        expect(mail).toBeDefined()
        expect(mail!.subject).not.toMatch(/[\r\n\u2028]/)
        const firstLine = mail!.body.split("\n").find((line) => line.includes("invited you")) ?? ""
        expect(firstLine).toContain("\"Mallory Bcc: everyone@example.com Click https://evil.example/")
        expect(mail!.body).not.toContain("\nBcc")
        expect(mail!.body).not.toContain("x".repeat(150))
        const [stored] = yield* query<{ name: string }>("SELECT name FROM accounts WHERE subject = 'idp|mallory'")
        expect(stored!.name.length).toBeLessThanOrEqual(100)
        expect(stored!.name).not.toMatch(/[\r\n\u2028]/)
      }))
  }
)

/** The personal account of a new person, and their session. */
const person = (email: string) =>
  Effect.gen(function*() {
    const token = yield* devToken(email)
    const [own] = yield* accountsOf(token)
    return { token, account: own!.id, member: own!.member_id }
  })

/** `email` joins `owner`'s account as `role`: invited, then accepted. */
const join = (owner: { token: string }, email: string, role: string) =>
  Effect.gen(function*() {
    const joiner = yield* person(email)
    const invitation = yield* invite(owner.token, email, role)
    expect(invitation.status, invitation.text).toBe(201)
    const accepted = yield* accept(joiner.token, invitation.body.id)
    expect(accepted.status, accepted.text).toBe(200)
    return { ...joiner, memberId: accepted.body.account.member_id as string }
  })

const keyRows = (ids: ReadonlyArray<string>) =>
  query<{ id: string; member_id: string; disabled: boolean }>(
    "SELECT id, member_id, disabled_at IS NOT NULL AS disabled FROM api_keys WHERE id = ANY($1) ORDER BY name",
    [[...ids]]
  )

layer(TestServerLive({ ipDevSessionsPerMinute: 1000 }), { excludeTestServices: true, timeout: 120_000 })(
  "roles that hold",
  (it) => {
    it.effect("the development identity provider refuses a multi-line name, naming it", () =>
      Effect.gen(function*() {
        for (const name of ["Acme\nClick https://evil.example", "Acme\u2028Ops", "x".repeat(101)]) {
          const reply = yield* call("POST", "/dev/session", { json: { email: "named@example.com", name } })
          expectClientError(reply, { status: 400, code: "invalid_request", param: "name" }, JSON.stringify(name))
        }
        expect((yield* call("POST", "/dev/session", { json: { email: "named@example.com", name: "Acme Ops" } })).status)
          .toBe(200)
      }))

    it.effect("a member who leaves cannot hand its keys to anyone: they are disabled", () =>
      Effect.gen(function*() {
        const owner = yield* person("leave-owner@example.com")
        const leaver = yield* join(owner, "leave-dev@example.com", "developer")
        const admin = yield* join(owner, "leave-admin@example.com", "admin")
        const key = yield* call("POST", "/dashboard/api-keys", {
          ...as(leaver.token, owner.account),
          json: { name: "leaver's", environment: "test" }
        })
        const adminKey = yield* call("POST", "/dashboard/api-keys", {
          ...as(admin.token, owner.account),
          json: { name: "admin's", environment: "test" }
        })
        for (
          const [who, to] of [[leaver, admin.memberId], [leaver, owner.member], [admin, owner.member], [
            admin,
            admin.memberId
          ]] as const
        ) {
          const refused = yield* call(
            "DELETE",
            `/dashboard/members/${who.memberId}?transfer_keys_to=${to}`,
            as(who.token, owner.account)
          )
          expectClientError(
            refused,
            { status: 400, code: "invalid_request", param: "transfer_keys_to" },
            `${who.memberId} to ${to}`
          )
        }
        expect(yield* keyRows([key.body.key.id, adminKey.body.key.id])).toEqual([
          { id: adminKey.body.key.id, member_id: admin.memberId, disabled: false },
          { id: key.body.key.id, member_id: leaver.memberId, disabled: false }
        ])
        const left = yield* call("DELETE", `/dashboard/members/${leaver.memberId}`, as(leaver.token, owner.account))
        expect(left.body).toEqual({ ok: true, keys_disabled: [key.body.key.id], keys_transferred: [] })
        expect((yield* keyRows([key.body.key.id]))[0]).toMatchObject({ member_id: leaver.memberId, disabled: true })
      }))

    it.effect("a transferred key's secret is rotated: the old one answers revoked_api_key at once, the recipient rotates to use it", () =>
      Effect.gen(function*() {
        const owner = yield* person("move-owner@example.com")
        const gone = yield* join(owner, "move-gone@example.com", "developer")
        const heir = yield* join(owner, "move-heir@example.com", "developer")
        const made = yield* call("POST", "/dashboard/api-keys", {
          ...as(gone.token, owner.account),
          json: { name: "moving", environment: "test", rate_limit_rpm: 30 }
        })
        const oldSecret = made.body.full_key as string
        expect((yield* call("GET", "/v1/models", { token: oldSecret })).status).toBe(200)
        const moved = yield* call("DELETE", `/dashboard/members/${gone.memberId}?transfer_keys_to=${heir.memberId}`, {
          token: owner.token
        })
        expect(moved.body).toEqual({ ok: true, keys_disabled: [], keys_transferred: [made.body.key.id] })
        expect(moved.text).not.toContain("nns_")
        const old = yield* call("GET", "/v1/models", { token: oldSecret })
        expectClientError(old, { status: 401, code: "revoked_api_key" }, "the leaver's secret")
        // The recipient's now: it rotates the key to get a secret only it holds.
        const rotated = yield* call("POST", `/dashboard/api-keys/${made.body.key.id}/rotate`, {
          ...as(heir.token, owner.account),
          json: {}
        })
        expect(rotated.status, rotated.text).toBe(200)
        expect((yield* call("GET", "/v1/models", { token: rotated.body.full_key })).status).toBe(200)
        expect((yield* keyRows([made.body.key.id]))[0]).toMatchObject({ member_id: heir.memberId, disabled: false })
        // Given over by an owner, the key's limits are the owner's: the developer who got it tightens them only.
        const keyPath = `/dashboard/api-keys/${made.body.key.id}`
        expectDenied(
          yield* call("PATCH", keyPath, { ...as(heir.token, owner.account), json: { rate_limit_rpm: 60 } }),
          "owner or admin"
        )
        expect(
          (yield* call("PATCH", keyPath, { ...as(heir.token, owner.account), json: { rate_limit_rpm: 10 } })).status
        ).toBe(200)
      }))

    it.effect("a removed or demoted admin's open invitations are revoked; one is accepted only while its inviter may still invite", () =>
      Effect.gen(function*() {
        const owner = yield* person("inv-owner@example.com")
        const removedAdmin = yield* join(owner, "inv-removed@example.com", "admin")
        const demotedAdmin = yield* join(owner, "inv-demoted@example.com", "admin")
        const quietAdmin = yield* join(owner, "inv-quiet@example.com", "admin")
        const byRemoved = yield* call("POST", "/dashboard/members/invitations", {
          ...as(removedAdmin.token, owner.account),
          json: { email: "inv-a@example.com", role: "admin" }
        })
        const byDemoted = yield* call("POST", "/dashboard/members/invitations", {
          ...as(demotedAdmin.token, owner.account),
          json: { email: "inv-b@example.com", role: "developer" }
        })
        const byQuiet = yield* call("POST", "/dashboard/members/invitations", {
          ...as(quietAdmin.token, owner.account),
          json: { email: "inv-c@example.com", role: "developer" }
        })
        for (const sent of [byRemoved, byDemoted, byQuiet]) expect(sent.status, sent.text).toBe(201)
        expect((yield* call("DELETE", `/dashboard/members/${removedAdmin.memberId}`, { token: owner.token })).status)
          .toBe(200)
        expect(
          (yield* call("PATCH", `/dashboard/members/${demotedAdmin.memberId}`, {
            token: owner.token,
            json: { role: "developer" }
          })).status
        ).toBe(200)
        const open = (yield* call("GET", "/dashboard/members/invitations", { token: owner.token })).body.invitations
        expect(open.map((i: { id: string }) => i.id)).toEqual([byQuiet.body.id])
        for (const [email, sent] of [["inv-a@example.com", byRemoved], ["inv-b@example.com", byDemoted]] as const) {
          const invitee = yield* person(email)
          const refused = yield* accept(invitee.token, sent.body.id)
          expectClientError(refused, { status: 400, code: "invalid_request" }, email)
          expect(refused.body.error.message).toContain("revoked")
        }
        // Had the revocation been missed, the accept itself checks that the inviter may still invite.
        yield* query("UPDATE members SET role = 'viewer' WHERE id = $1", [quietAdmin.memberId])
        const late = yield* person("inv-c@example.com")
        const refused = yield* accept(late.token, byQuiet.body.id)
        expectClientError(refused, { status: 400, code: "invalid_request" }, "inviter no longer an admin")
        const members = yield* query<{ n: number }>(
          "SELECT count(*)::int AS n FROM members WHERE account_id = $1 AND email LIKE 'inv-_@example.com'",
          [owner.account]
        )
        expect(members[0]!.n).toBe(0)
      }))

    it.effect("only an owner changes an owner: an admin may not set an owner's budget", () =>
      Effect.gen(function*() {
        const owner = yield* person("own-owner@example.com")
        const admin = yield* join(owner, "own-admin@example.com", "admin")
        const dev = yield* join(owner, "own-dev@example.com", "developer")
        expectDenied(
          yield* call("PATCH", `/dashboard/members/${owner.member}`, {
            ...as(admin.token, owner.account),
            json: { monthly_spend_limit_myr: 0 }
          }),
          "Only an owner"
        )
        expectDenied(
          yield* call("DELETE", `/dashboard/members/${owner.member}`, as(admin.token, owner.account)),
          "Only an owner"
        )
        const [row] = yield* query<{ limit: string | null }>(
          "SELECT monthly_spend_limit_micro_myr::text AS limit FROM members WHERE id = $1",
          [owner.member]
        )
        expect(row!.limit).toBeNull()
        // An admin still sets another member's budget; an owner sets its own.
        expect(
          (yield* call("PATCH", `/dashboard/members/${dev.memberId}`, {
            ...as(admin.token, owner.account),
            json: { monthly_spend_limit_myr: 5 }
          })).status
        ).toBe(200)
        expect(
          (yield* call("PATCH", `/dashboard/members/${owner.member}`, {
            token: owner.token,
            json: { monthly_spend_limit_myr: 50 }
          })).status
        ).toBe(200)
      }))

    it.effect("a developer tightens but never loosens what an owner set on its key; what it set itself it changes freely", () =>
      Effect.gen(function*() {
        const owner = yield* person("ctl-owner@example.com")
        const dev = yield* join(owner, "ctl-dev@example.com", "developer")
        const devAs = as(dev.token, owner.account)
        const made = yield* call("POST", "/dashboard/api-keys", {
          ...devAs,
          json: { name: "controlled", environment: "test", rate_limit_concurrent: 2 }
        })
        const path = `/dashboard/api-keys/${made.body.key.id}`
        const patch = (who: typeof devAs | { token: string }, json: Record<string, unknown>) =>
          call("PATCH", path, { ...who, json })
        expect(
          (yield* patch({ token: owner.token }, { disabled: true, monthly_spend_limit_myr: 10, rate_limit_rpm: 60 }))
            .status
        ).toBe(200)
        for (
          const [json, param] of [
            [{ disabled: false }, "disabled"],
            [{ monthly_spend_limit_myr: 20 }, "monthly_spend_limit_myr"],
            [{ monthly_spend_limit_myr: null }, "monthly_spend_limit_myr"],
            [{ rate_limit_rpm: 120 }, "rate_limit_rpm"],
            [{ rate_limit_rpm: null }, "rate_limit_rpm"]
          ] as const
        ) {
          const refused = yield* patch(devAs, json)
          expectDenied(refused, "owner or admin")
          expect(refused.body.error.message, JSON.stringify(json)).toContain(param)
        }
        const [still] = yield* query<{ disabled: boolean; limit: string; rpm: number }>(
          "SELECT disabled_at IS NOT NULL AS disabled, monthly_spend_limit_micro_myr::text AS limit, rate_limit_rpm AS rpm FROM api_keys WHERE id = $1",
          [made.body.key.id]
        )
        expect(still).toEqual({ disabled: true, limit: "10000000", rpm: 60 })
        // Tighter is always allowed, and what the developer set itself it loosens again.
        expect((yield* patch(devAs, { disabled: true, monthly_spend_limit_myr: 5, rate_limit_rpm: 30 })).status).toBe(
          200
        )
        expect((yield* patch(devAs, { rate_limit_concurrent: 4, name: "renamed" })).status).toBe(200)
        // Once the owner lifts its control, the developer is free again.
        expect((yield* patch({ token: owner.token }, { disabled: false })).status).toBe(200)
        expect((yield* patch(devAs, { disabled: true })).status).toBe(200)
        expect((yield* patch(devAs, { disabled: false })).status).toBe(200)
      }))

    it.effect("a developer makes at most 10 keys of the account's 50; an owner may make more", () =>
      Effect.gen(function*() {
        const owner = yield* person("quota-owner@example.com")
        const dev = yield* join(owner, "quota-dev@example.com", "developer")
        for (let i = 0; i < 10; i++) {
          const made = yield* call("POST", "/dashboard/api-keys", {
            ...as(dev.token, owner.account),
            json: { name: `dev ${i}`, environment: "test" }
          })
          expect(made.status, made.text).toBe(201)
        }
        const refused = yield* call("POST", "/dashboard/api-keys", {
          ...as(dev.token, owner.account),
          json: { name: "one more", environment: "test" }
        })
        expectClientError(refused, { status: 400, code: "invalid_request" }, "the 11th key of a developer")
        expect(refused.body.error.message).toContain("10")
        yield* createKey(owner.token, { name: "owner's", environment: "test" })
      }))
  }
)
