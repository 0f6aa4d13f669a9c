import { Data, Schema } from "effect"
import type { Member } from "../Domain/Account.js"
import { Role } from "../Domain/Roles.js"

/** The rows `MembersRepo` reads, decoded, and the refusals it answers with. */

export const MemberRow = Schema.Struct({
  id: Schema.String,
  accountId: Schema.String,
  issuer: Schema.NullOr(Schema.String),
  subject: Schema.String,
  email: Schema.NullOr(Schema.String),
  name: Schema.NullOr(Schema.String),
  role: Role,
  monthlySpendLimitMicroMyr: Schema.NullOr(Schema.Number),
  createdAt: Schema.DateFromSelf
})
export interface MemberRow extends Schema.Schema.Type<typeof MemberRow> {}

export const MembershipRow = Schema.Struct({
  ...MemberRow.fields,
  accountIssuer: Schema.NullOr(Schema.String),
  accountSubject: Schema.String,
  accountEmail: Schema.NullOr(Schema.String),
  suspendedAt: Schema.NullOr(Schema.DateFromSelf)
})

export const AccountOfRow = Schema.Struct({
  accountId: Schema.String,
  accountName: Schema.NullOr(Schema.String),
  accountEmail: Schema.NullOr(Schema.String),
  memberId: Schema.String,
  role: Role,
  personal: Schema.Boolean,
  createdAt: Schema.DateFromSelf
})
export interface AccountOfRow extends Schema.Schema.Type<typeof AccountOfRow> {}

export const InvitationRow = Schema.Struct({
  id: Schema.String,
  accountId: Schema.String,
  accountName: Schema.NullOr(Schema.String),
  email: Schema.String,
  role: Role,
  invitedBy: Schema.NullOr(Schema.String),
  invitedByEmail: Schema.NullOr(Schema.String),
  createdAt: Schema.DateFromSelf,
  expiresAt: Schema.DateFromSelf
})
export interface InvitationRow extends Schema.Schema.Type<typeof InvitationRow> {}

export const toMember = (row: MemberRow): Member => ({
  id: row.id,
  role: row.role,
  email: row.email,
  name: row.name,
  monthlySpendLimitMicroMyr: row.monthlySpendLimitMicroMyr
})

/** The change would leave the account without an owner. */
export class LastOwner extends Data.TaggedError("LastOwner")<{}> {}
/** The account has as many members, or open invitations, as it may. */
export class TooMany
  extends Data.TaggedError("TooMany")<{ readonly what: "members" | "invitations"; readonly limit: number }>
{}
/** The account sent its day's invitations: the next may go once the oldest of them is a day old. */
export class TooFrequent
  extends Data.TaggedError("TooFrequent")<{ readonly limit: number; readonly retryAfterMs: number }>
{}
/** The invited email already belongs to a member, or has an open invitation. */
export class AlreadyThere extends Data.TaggedError("AlreadyThere")<{ readonly what: "member" | "invitation" }> {}
/** A key transfer names a member that is not one of the account's, or the member being removed. */
export class NoSuchMember extends Data.TaggedError("NoSuchMember")<{ readonly id: string }> {}
/** Why an invitation cannot be accepted now. */
export class NotAcceptable extends Data.TaggedError("NotAcceptable")<{
  readonly reason: "unknown" | "expired" | "revoked" | "accepted" | "other_email" | "already_member" | "inviter_may_not"
}> {}
