import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as HttpApiSchema from "@effect/platform/HttpApiSchema"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import { InvalidRequest, NotFound, wire } from "../Domain/Errors.js"
import { EmailAddress } from "../Domain/Names.js"
import { ADMINS, allowRoles, EVERY_ROLE, Role } from "../Domain/Roles.js"
import { NoUrlParams, SqlString, StrictUrlParams } from "../Domain/Strict.js"

/** Upper bound of a monthly budget: 1 billion MYR keeps micro-MYR a safe integer. */
const MAX_BUDGET_MYR = 1_000_000_000

export const MemberRecord = Schema.Struct({
  id: Schema.String,
  email: Schema.NullOr(Schema.String),
  name: Schema.NullOr(Schema.String),
  role: Role,
  /** Caps the sum of the member's keys' spend this month (in `BUSINESS_TIMEZONE`); null for none. */
  monthly_spend_limit_micro_myr: Schema.NullOr(Schema.Int),
  /** Billed to the member's keys this month as written (settled calls), deleted keys included. */
  month_to_date_spend_micro_myr: Schema.Int,
  /** How many of the account's keys are the member's. */
  key_count: Schema.Int,
  created_at: Schema.String,
  /** The member is the signed-in person. */
  you: Schema.Boolean
}).annotations({
  identifier: "Member",
  examples: [{
    id: "mem_01JD4Q8Z7K3M9X2V5B6N8R1T0Y",
    email: "siti@example.com",
    name: "Siti",
    role: "developer",
    monthly_spend_limit_micro_myr: 100_000_000,
    month_to_date_spend_micro_myr: 12_345_678,
    key_count: 2,
    created_at: "2026-11-01T08:00:00.000Z",
    you: false
  }]
})
export type MemberRecord = typeof MemberRecord.Type

export const MemberList = Schema.Struct({ members: Schema.Array(MemberRecord) })

/** Every field optional: an absent one stays as it is; `monthly_spend_limit_myr: null` removes the budget. */
export const UpdateMemberRequest = Schema.Struct({
  /** Only an owner makes or unmakes an owner; the last owner keeps the role. */
  role: Schema.optional(Role),
  monthly_spend_limit_myr: Schema.optional(
    Schema.NullOr(Schema.Number.pipe(Schema.finite(), Schema.between(0, MAX_BUDGET_MYR)))
  )
}).annotations({ identifier: "UpdateMemberRequest", examples: [{ role: "admin" }, { monthly_spend_limit_myr: 100 }] })

const MemberId = SqlString.pipe(Schema.maxLength(100))

export const RemoveMemberParams = StrictUrlParams({
  /** A member to give the removed member's keys to; absent: the keys are disabled. */
  transfer_keys_to: Schema.optional(MemberId)
})

export const RemovedMember = Schema.Struct({
  ok: Schema.Literal(true),
  /** The removed member's keys, disabled (no `transfer_keys_to`) or now the named member's. */
  keys_disabled: Schema.Array(Schema.String),
  keys_transferred: Schema.Array(Schema.String)
}).annotations({ identifier: "RemovedMember" })

const Email = EmailAddress

export const InviteRequest = Schema.Struct({
  email: Email,
  /** Only an owner invites an owner. */
  role: Role
}).annotations({ identifier: "InviteRequest", examples: [{ email: "siti@example.com", role: "developer" }] })

export const InvitationRecord = Schema.Struct({
  id: Schema.String,
  account_id: Schema.String,
  /** The inviting account's name (its first owner's), when it has one. */
  account_name: Schema.NullOr(Schema.String),
  email: Schema.String,
  role: Role,
  invited_by_email: Schema.NullOr(Schema.String),
  created_at: Schema.String,
  expires_at: Schema.String,
  /** Where the invited person accepts it, in the dashboard. */
  accept_url: Schema.String
}).annotations({ identifier: "Invitation" })
export type InvitationRecord = typeof InvitationRecord.Type

export const InvitationList = Schema.Struct({ invitations: Schema.Array(InvitationRecord) })

export const Ok = Schema.Struct({ ok: Schema.Literal(true) })

/** The `{id}` of a member or an invitation in a path. */
export const IdParam = HttpApiSchema.param("id", MemberId)

/** The account's members and its invitations: whoever is signed in reads them, owners and admins change them. */
export class MembersApi extends HttpApiGroup.make("members")
  .add(
    HttpApiEndpoint.get("list", "/dashboard/members")
      .setUrlParams(NoUrlParams)
      .addSuccess(MemberList)
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.patch("update")`/dashboard/members/${IdParam}`
      .setPayload(UpdateMemberRequest)
      .addSuccess(MemberRecord)
      .addError(wire(NotFound))
      .annotate(
        OpenApi.Description,
        "Changes a member's role or monthly budget. A lowered budget holds on every instance before this answers."
      )
      .pipe(allowRoles(...ADMINS))
  )
  .add(
    HttpApiEndpoint.del("remove")`/dashboard/members/${IdParam}`
      .setUrlParams(RemoveMemberParams)
      .addSuccess(RemovedMember)
      .addError(wire(NotFound))
      .annotate(
        OpenApi.Description,
        "Removes a member: its keys stop working on every instance within a second, or go to `transfer_keys_to`. " +
          "Anyone may remove themselves (leave the account); removing another needs owner or admin. " +
          "An account keeps at least one owner."
      )
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.post("invite", "/dashboard/members/invitations")
      .setPayload(InviteRequest)
      .addSuccess(InvitationRecord, { status: 201 })
      .annotate(
        OpenApi.Description,
        "Invites by email with a role: an email with a link, valid 7 days, revocable. An account sends at most 100 invitations a day, revoked ones included (429 `rate_limit_exceeded` past that)."
      )
      .pipe(allowRoles(...ADMINS))
  )
  .add(
    HttpApiEndpoint.get("invitations", "/dashboard/members/invitations")
      .setUrlParams(NoUrlParams)
      .addSuccess(InvitationList)
      .annotate(OpenApi.Description, "The account's open invitations (not accepted, revoked or expired).")
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.del("revoke")`/dashboard/members/invitations/${IdParam}`
      .addSuccess(Ok)
      .addError(wire(NotFound))
      .pipe(allowRoles(...ADMINS))
  )
  .addError(wire(InvalidRequest))
  .middleware(DashboardAuth)
  .annotate(
    OpenApi.Description,
    "The people of the account named by `Nenas-Account` (else yours): roles, budgets, invitations."
  )
{}
