import { SqlClient, type SqlError, SqlSchema } from "@effect/sql"
import { Context, Effect, Layer, Option, Schema } from "effect"
import type { Account, Identity, Member } from "../Domain/Account.js"
import { newId } from "../Domain/Ids.js"
import { Role } from "../Domain/Roles.js"
import { makeTestLayer } from "../Domain/TestLayer.js"
import { handOverKeys, type NewSecret, revokeInvitationsBy } from "./Handover.js"
import {
  AccountOfRow,
  AlreadyThere,
  InvitationRow,
  LastOwner,
  MemberRow,
  MembershipRow,
  NoSuchMember,
  NotAcceptable,
  toMember,
  TooFrequent,
  TooMany
} from "./Rows.js"

export { type AccountOfRow, type InvitationRow, type MemberRow } from "./Rows.js"

/** At most this many members in one account, and open invitations: every list here is bounded. */
export const MAX_MEMBERS = 200
export const MAX_OPEN_INVITATIONS = 100
/** Invitations an account may send in 24 hours, revoked and accepted ones included: each is an email to an address the caller chose. */
export const MAX_INVITATIONS_PER_DAY = 100

export interface MemberChange {
  readonly role?: Role | undefined
  /** null removes the budget. */
  readonly monthlySpendLimitMicroMyr?: number | null | undefined
}

const MEMBER_COLUMNS =
  "m.id, m.account_id, m.issuer, m.subject, m.email, m.name, m.role, m.monthly_spend_limit_micro_myr, m.created_at"

/**
 * Members and invitations (docs/api/teams.md, "Members and invitations"): the `members` and `invitations` tables
 * are read and written here only.
 */
export class MembersRepo extends Context.Tag("nenas/MembersRepo")<MembersRepo, {
  /**
   * The person's membership in `accountId`, or (null) in their personal account (the one their identity opened),
   * else in the account they joined first; none when they belong to no such account.
   */
  readonly membership: (identity: Identity, accountId: string | null) => Effect.Effect<
    Option.Option<{ readonly account: Account; readonly member: Member }>
  >
  /** The accounts the person belongs to, the personal one first. */
  readonly accountsOf: (identity: Identity) => Effect.Effect<ReadonlyArray<AccountOfRow>>
  /** The account's members, owners first. */
  readonly list: (accountId: string) => Effect.Effect<ReadonlyArray<MemberRow>>
  readonly find: (accountId: string, memberId: string) => Effect.Effect<MemberRow | undefined>
  /** Changes a member's role or budget; refuses (`LastOwner`) to demote the last owner. Undefined: no such member. */
  readonly update: (
    accountId: string,
    memberId: string,
    change: MemberChange
  ) => Effect.Effect<{ readonly before: MemberRow; readonly after: MemberRow } | undefined, LastOwner>
  /**
   * Removes a member: its keys are disabled, or transferred (each with a new secret) to `transfer.to`; its open
   * invitations are revoked. Refuses to remove the last owner. An account whose identity was the removed person's
   * is detached from it: their next sign-in opens a new personal account.
   */
  readonly remove: (
    accountId: string,
    memberId: string,
    transfer: { readonly to: string; readonly newSecret: NewSecret } | null
  ) => Effect.Effect<
    { readonly member: MemberRow; readonly keys: ReadonlyArray<string> } | undefined,
    LastOwner | NoSuchMember
  >
  readonly invite: (invitation: {
    readonly accountId: string
    readonly email: string
    readonly role: Role
    readonly invitedBy: string
    readonly expiresAt: Date
  }) => Effect.Effect<InvitationRow, TooMany | TooFrequent | AlreadyThere>
  /** The account's open invitations (not accepted, revoked or expired). */
  readonly invitations: (accountId: string) => Effect.Effect<ReadonlyArray<InvitationRow>>
  /** The open invitations to an email, from any account. */
  readonly invitationsTo: (email: string) => Effect.Effect<ReadonlyArray<InvitationRow>>
  /** Revokes an open invitation; undefined when the account has no such open invitation. */
  readonly revoke: (accountId: string, invitationId: string) => Effect.Effect<InvitationRow | undefined>
  /** Accepts an invitation to `identity`'s email: exactly one of two concurrent accepts makes the member. */
  readonly accept: (invitationId: string, identity: Identity) => Effect.Effect<
    { readonly invitation: InvitationRow; readonly member: MemberRow },
    NotAcceptable | TooMany
  >
  /** The first member of a new account, its owner: written in the account's own transaction. */
  readonly addOwner: (accountId: string, identity: Identity) => Effect.Effect<void>
  /** A legacy account claimed by its first verified sign-in: its owner gets the issuer too. */
  readonly claimOwner: (accountId: string, identity: Identity) => Effect.Effect<void>
}>() {
  static readonly layer = Layer.effect(
    MembersRepo,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const columns = sql.literal(MEMBER_COLUMNS)
      const invitationColumns = sql.literal(
        "i.id, i.account_id, COALESCE(NULLIF(a.name, ''), a.email) AS account_name, i.email, i.role, i.invited_by, b.email AS invited_by_email, i.created_at, i.expires_at"
      )

      const findMembership = SqlSchema.findOne({
        Request: Schema.Struct({
          issuer: Schema.String,
          subject: Schema.String,
          accountId: Schema.NullOr(Schema.String)
        }),
        Result: MembershipRow,
        execute: ({ accountId, issuer, subject }) =>
          sql`
            SELECT ${columns}, a.issuer AS account_issuer, a.subject AS account_subject, a.email AS account_email, a.suspended_at
            FROM members m JOIN accounts a ON a.id = m.account_id
            WHERE m.issuer = ${issuer} AND m.subject = ${subject} AND m.removed_at IS NULL
              ${accountId === null ? sql`` : sql`AND m.account_id = ${accountId}`}
            ORDER BY (a.issuer = ${issuer} AND a.subject = ${subject}) DESC, m.created_at, m.id
            LIMIT 1
          `
      })
      const accountsOf = SqlSchema.findAll({
        Request: Schema.Struct({ issuer: Schema.String, subject: Schema.String }),
        Result: AccountOfRow,
        execute: ({ issuer, subject }) =>
          sql`
            SELECT a.id AS account_id, a.name AS account_name, a.email AS account_email, m.id AS member_id, m.role,
              (a.issuer = ${issuer} AND a.subject = ${subject}) AS personal, m.created_at
            FROM members m JOIN accounts a ON a.id = m.account_id
            WHERE m.issuer = ${issuer} AND m.subject = ${subject} AND m.removed_at IS NULL
            ORDER BY personal DESC, m.created_at, m.id
            LIMIT ${MAX_MEMBERS}
          `
      })
      const listMembers = SqlSchema.findAll({
        Request: Schema.String,
        Result: MemberRow,
        execute: (accountId) =>
          sql`
            SELECT ${columns} FROM members m WHERE m.account_id = ${accountId} AND m.removed_at IS NULL
            ORDER BY array_position(ARRAY['owner', 'admin', 'developer', 'billing', 'viewer'], m.role), m.created_at, m.id
            LIMIT ${MAX_MEMBERS}
          `
      })
      const findMember = SqlSchema.findOne({
        Request: Schema.Struct({ accountId: Schema.String, memberId: Schema.String }),
        Result: MemberRow,
        execute: ({ accountId, memberId }) =>
          sql`SELECT ${columns} FROM members m WHERE m.id = ${memberId} AND m.account_id = ${accountId} AND m.removed_at IS NULL`
      })
      /** Every member row of the account locked, so that two changes cannot each leave the other its last owner. */
      const lockMembers = SqlSchema.findAll({
        Request: Schema.String,
        Result: MemberRow,
        execute: (accountId) =>
          sql`SELECT ${columns} FROM members m WHERE m.account_id = ${accountId} AND m.removed_at IS NULL ORDER BY m.id FOR UPDATE`
      })
      const decodeMember = Schema.decodeUnknown(MemberRow)
      const updateMember = (memberId: string, { monthlySpendLimitMicroMyr, role }: MemberChange) => {
        const set = {
          ...(role === undefined ? {} : { role }),
          ...(monthlySpendLimitMicroMyr === undefined
            ? {}
            : { monthly_spend_limit_micro_myr: monthlySpendLimitMicroMyr })
        }
        const statement = Object.keys(set).length === 0
          ? sql`SELECT ${columns} FROM members m WHERE m.id = ${memberId}`
          : sql`UPDATE members m SET ${sql.update(set)} WHERE m.id = ${memberId} RETURNING ${columns}`
        return Effect.flatMap(statement, (rows) => decodeMember(rows[0]))
      }
      const openInvitations = SqlSchema.findAll({
        Request: Schema.Struct({ accountId: Schema.NullOr(Schema.String), email: Schema.NullOr(Schema.String) }),
        Result: InvitationRow,
        execute: ({ accountId, email }) =>
          sql`
            SELECT ${invitationColumns}
            FROM invitations i JOIN accounts a ON a.id = i.account_id LEFT JOIN members b ON b.id = i.invited_by
            WHERE i.accepted_at IS NULL AND i.revoked_at IS NULL AND i.expires_at > now()
              ${accountId === null ? sql`` : sql`AND i.account_id = ${accountId}`}
              ${email === null ? sql`` : sql`AND i.email = ${email}`}
            ORDER BY i.created_at DESC, i.id DESC
            LIMIT ${MAX_OPEN_INVITATIONS}
          `
      })
      const invitationById = SqlSchema.findOne({
        Request: Schema.String,
        Result: InvitationRow,
        execute: (id) =>
          sql`
            SELECT ${invitationColumns}
            FROM invitations i JOIN accounts a ON a.id = i.account_id LEFT JOIN members b ON b.id = i.invited_by
            WHERE i.id = ${id}
          `
      })
      const InvitationState = Schema.Struct({
        email: Schema.String,
        accountId: Schema.String,
        role: Role,
        expired: Schema.Boolean,
        acceptedAt: Schema.NullOr(Schema.DateFromSelf),
        revokedAt: Schema.NullOr(Schema.DateFromSelf)
      })
      const lockInvitation = SqlSchema.findOne({
        Request: Schema.String,
        Result: InvitationState,
        execute: (id) =>
          sql`
            SELECT email, account_id, role, expires_at <= now() AS expired, accepted_at, revoked_at
            FROM invitations WHERE id = ${id} FOR UPDATE
          `
      })
      const countOf = (query: Effect.Effect<ReadonlyArray<{ readonly count: number }>, SqlError.SqlError>) =>
        Effect.map(query, (rows) => Number(rows[0]?.count ?? 0))

      const addMember = (accountId: string, identity: Identity, role: Role) =>
        Effect.gen(function*() {
          const id = newId("mem")
          const rows = yield* sql<MemberRow>`
            INSERT INTO members (id, account_id, issuer, subject, email, name, role)
            VALUES (${id}, ${accountId}, ${identity.issuer}, ${identity.subject}, ${identity.email}, ${identity.name}, ${role})
            RETURNING id, account_id, issuer, subject, email, name, role, monthly_spend_limit_micro_myr, created_at
          `
          return yield* decodeMember(rows[0])
        })

      return MembersRepo.of({
        membership: (identity, accountId) =>
          findMembership({ issuer: identity.issuer, subject: identity.subject, accountId }).pipe(
            Effect.map(Option.map((row) => ({
              account: {
                id: row.accountId,
                issuer: row.accountIssuer,
                subject: row.accountSubject,
                email: row.accountEmail,
                suspended: row.suspendedAt !== null
              },
              member: toMember(row)
            }))),
            Effect.orDie,
            Effect.withSpan("MembersRepo.membership")
          ),
        accountsOf: (identity) =>
          accountsOf({ issuer: identity.issuer, subject: identity.subject }).pipe(
            Effect.orDie,
            Effect.withSpan("MembersRepo.accountsOf")
          ),
        list: (accountId) => listMembers(accountId).pipe(Effect.orDie, Effect.withSpan("MembersRepo.list")),
        find: (accountId, memberId) =>
          findMember({ accountId, memberId }).pipe(
            Effect.map(Option.getOrUndefined),
            Effect.orDie,
            Effect.withSpan("MembersRepo.find")
          ),
        update: (accountId, memberId, change) =>
          sql.withTransaction(Effect.gen(function*() {
            const members = yield* lockMembers(accountId)
            const before = members.find((member) => member.id === memberId)
            if (before === undefined) return undefined
            const owners = members.filter((member) => member.role === "owner").length
            if (before.role === "owner" && change.role !== undefined && change.role !== "owner" && owners <= 1) {
              return yield* new LastOwner()
            }
            const after = yield* updateMember(memberId, change)
            // A demoted member's invitations end with the right to send them.
            if (after.role !== before.role) yield* revokeInvitationsBy(sql, memberId, after.role)
            return { before, after }
          })).pipe(
            Effect.catchTags({ SqlError: Effect.die, ParseError: Effect.die }),
            Effect.withSpan("MembersRepo.update")
          ),
        remove: (accountId, memberId, transfer) =>
          sql.withTransaction(Effect.gen(function*() {
            const members = yield* lockMembers(accountId)
            const member = members.find((row) => row.id === memberId)
            if (member === undefined) return undefined
            if (member.role === "owner" && members.filter((row) => row.role === "owner").length <= 1) {
              return yield* new LastOwner()
            }
            if (transfer !== null && (transfer.to === memberId || !members.some((row) => row.id === transfer.to))) {
              return yield* new NoSuchMember({ id: transfer.to })
            }
            yield* sql`UPDATE members SET removed_at = now() WHERE id = ${memberId}`
            yield* revokeInvitationsBy(sql, memberId, null)
            const keys = transfer === null
              ? (yield* sql<{ id: string }>`
                UPDATE api_keys SET disabled_at = COALESCE(disabled_at, now())
                WHERE member_id = ${memberId} AND account_id = ${accountId} RETURNING id`).map((key) => key.id)
              : yield* handOverKeys(sql, accountId, memberId, transfer.to, transfer.newSecret)
            // The removed person's identity no longer opens this account: their next sign-in opens a personal one.
            yield* sql`
              UPDATE accounts SET issuer = 'nenas:detached', subject = id
              WHERE id = ${accountId} AND issuer IS NOT DISTINCT FROM ${member.issuer} AND subject = ${member.subject}
            `
            return { member, keys }
          })).pipe(
            Effect.catchTags({ SqlError: Effect.die, ParseError: Effect.die }),
            Effect.withSpan("MembersRepo.remove")
          ),
        invite: (invitation) =>
          sql.withTransaction(Effect.gen(function*() {
            const { accountId, email } = invitation
            // The account's row locked: concurrent invitations count one at a time.
            yield* sql`SELECT id FROM accounts WHERE id = ${accountId} FOR UPDATE`
            const members = yield* countOf(sql<{ count: number }>`
              SELECT count(*)::int AS count FROM members WHERE account_id = ${accountId} AND removed_at IS NULL`)
            if (members >= MAX_MEMBERS) return yield* new TooMany({ what: "members", limit: MAX_MEMBERS })
            const isMember = yield* countOf(sql<{ count: number }>`
              SELECT count(*)::int AS count FROM members
              WHERE account_id = ${accountId} AND removed_at IS NULL AND lower(email) = ${email}`)
            if (isMember > 0) return yield* new AlreadyThere({ what: "member" })
            // An expired invitation no longer counts: it is revoked so that a new one may take its place.
            yield* sql`
              UPDATE invitations SET revoked_at = now()
              WHERE account_id = ${accountId} AND accepted_at IS NULL AND revoked_at IS NULL AND expires_at <= now()`
            const open = yield* countOf(sql<{ count: number }>`
              SELECT count(*)::int AS count FROM invitations
              WHERE account_id = ${accountId} AND accepted_at IS NULL AND revoked_at IS NULL`)
            if (open >= MAX_OPEN_INVITATIONS) {
              return yield* new TooMany({ what: "invitations", limit: MAX_OPEN_INVITATIONS })
            }
            const [sent] = yield* sql<{ count: number; retryAfterMs: number | null }>`
              SELECT count(*)::int AS count,
                     ceil(extract(epoch FROM min(created_at) + interval '1 day' - now()) * 1000)::int AS retry_after_ms
              FROM invitations WHERE account_id = ${accountId} AND created_at > now() - interval '1 day'`
            if (sent !== undefined && sent.count >= MAX_INVITATIONS_PER_DAY) {
              return yield* new TooFrequent({
                limit: MAX_INVITATIONS_PER_DAY,
                retryAfterMs: Math.max(0, sent.retryAfterMs ?? 0)
              })
            }
            const id = newId("inv")
            const inserted = yield* sql<{ id: string }>`
              INSERT INTO invitations (id, account_id, email, role, invited_by, expires_at)
              VALUES (${id}, ${accountId}, ${email}, ${invitation.role}, ${invitation.invitedBy}, ${invitation.expiresAt})
              ON CONFLICT (account_id, email) WHERE accepted_at IS NULL AND revoked_at IS NULL DO NOTHING
              RETURNING id`
            if (inserted.length === 0) {
              return yield* new AlreadyThere({ what: "invitation" })
            }
            return yield* Effect.flatten(invitationById(id))
          })).pipe(
            Effect.catchTags({ SqlError: Effect.die, ParseError: Effect.die, NoSuchElementException: Effect.die }),
            Effect.withSpan("MembersRepo.invite")
          ),
        invitations: (accountId) =>
          openInvitations({ accountId, email: null }).pipe(Effect.orDie, Effect.withSpan("MembersRepo.invitations")),
        invitationsTo: (email) =>
          openInvitations({ accountId: null, email: email.toLowerCase() }).pipe(
            Effect.orDie,
            Effect.withSpan("MembersRepo.invitationsTo")
          ),
        revoke: (accountId, invitationId) =>
          Effect.gen(function*() {
            const revoked = yield* sql<{ id: string }>`
              UPDATE invitations SET revoked_at = now()
              WHERE id = ${invitationId} AND account_id = ${accountId}
                AND accepted_at IS NULL AND revoked_at IS NULL AND expires_at > now()
              RETURNING id`
            if (revoked.length === 0) return undefined
            return Option.getOrUndefined(yield* invitationById(invitationId))
          }).pipe(Effect.orDie, Effect.withSpan("MembersRepo.revoke")),
        accept: (invitationId, identity) =>
          sql.withTransaction(Effect.gen(function*() {
            // The inviter's row first, shared, as a demotion locks members before invitations: it waits for this accept, or this for it.
            const inviter = yield* sql<{ role: Role }>`
              SELECT m.role FROM invitations i JOIN members m ON m.id = i.invited_by AND m.removed_at IS NULL
              WHERE i.id = ${invitationId} FOR SHARE OF m`
            // Locked: of two concurrent accepts, the second waits here and then finds it accepted.
            const found = yield* lockInvitation(invitationId)
            if (Option.isNone(found)) return yield* new NotAcceptable({ reason: "unknown" })
            const state = found.value
            // Another person's invitation is as unknown to this one as a made-up id.
            if (identity.email === null || state.email !== identity.email.toLowerCase()) {
              return yield* new NotAcceptable({ reason: "other_email" })
            }
            if (state.acceptedAt !== null) return yield* new NotAcceptable({ reason: "accepted" })
            if (state.revokedAt !== null) return yield* new NotAcceptable({ reason: "revoked" })
            if (state.expired) return yield* new NotAcceptable({ reason: "expired" })
            // Accepted only while its inviter may still send it: an owner, or an admin for any role but owner.
            const role = inviter[0]?.role
            if (role !== "owner" && (role !== "admin" || state.role === "owner")) {
              return yield* new NotAcceptable({ reason: "inviter_may_not" })
            }
            yield* sql`SELECT id FROM accounts WHERE id = ${state.accountId} FOR UPDATE`
            const already = yield* countOf(sql<{ count: number }>`
              SELECT count(*)::int AS count FROM members
              WHERE account_id = ${state.accountId} AND issuer = ${identity.issuer} AND subject = ${identity.subject}
                AND removed_at IS NULL`)
            if (already > 0) return yield* new NotAcceptable({ reason: "already_member" })
            const members = yield* countOf(sql<{ count: number }>`
              SELECT count(*)::int AS count FROM members WHERE account_id = ${state.accountId} AND removed_at IS NULL`)
            if (members >= MAX_MEMBERS) return yield* new TooMany({ what: "members", limit: MAX_MEMBERS })
            const member = yield* addMember(state.accountId, identity, state.role)
            yield* sql`UPDATE invitations SET accepted_at = now(), accepted_by = ${member.id} WHERE id = ${invitationId}`
            const invitation = yield* Effect.flatten(invitationById(invitationId))
            return { invitation, member }
          })).pipe(
            Effect.catchTags({ SqlError: Effect.die, ParseError: Effect.die, NoSuchElementException: Effect.die }),
            Effect.withSpan("MembersRepo.accept")
          ),
        addOwner: (accountId, identity) =>
          addMember(accountId, identity, "owner").pipe(
            Effect.asVoid,
            Effect.orDie,
            Effect.withSpan("MembersRepo.addOwner")
          ),
        claimOwner: (accountId, identity) =>
          sql`
            UPDATE members SET issuer = ${identity.issuer}
            WHERE account_id = ${accountId} AND issuer IS NULL AND subject = ${identity.subject}
          `.pipe(Effect.asVoid, Effect.orDie, Effect.withSpan("MembersRepo.claimOwner"))
      })
    })
  )
  /** Only the members a test gives; any other dies when used. */
  static readonly Test = makeTestLayer(MembersRepo)
}
