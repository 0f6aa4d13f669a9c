import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import { Effect } from "effect"
import { NenasApi } from "../Api.js"
import { AppConfig } from "../AppConfig.js"
import { AuditLog } from "../Audit/Repo.js"
import { CurrentAccount } from "../Auth/Api.js"
import { InvalidRequest, NotFound } from "../Domain/Errors.js"
import { INVITATION_DAYS, toInvitation } from "../Members/InvitationView.js"
import { type AccountOfRow, MembersRepo } from "../Members/Repo.js"
import type { AccountSummary } from "./Api.js"

const toSummary = (row: AccountOfRow): typeof AccountSummary.Type => ({
  id: row.accountId,
  name: row.accountName ?? row.accountEmail,
  role: row.role,
  member_id: row.memberId,
  personal: row.personal
})

export const AccountsLive = HttpApiBuilder.group(NenasApi, "accounts", (handlers) =>
  Effect.gen(function*() {
    const repo = yield* MembersRepo
    const audit = yield* AuditLog
    const config = yield* AppConfig
    return handlers
      .handle("list", () =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          return { accounts: (yield* repo.accountsOf(account.identity)).map(toSummary) }
        }))
      .handle("invitations", () =>
        Effect.gen(function*() {
          const { identity } = yield* CurrentAccount
          const open = identity.email === null ? [] : yield* repo.invitationsTo(identity.email)
          return { invitations: open.map(toInvitation(config.dashboardUrl)) }
        }))
      .handle("accept", ({ path }) =>
        Effect.gen(function*() {
          const { identity } = yield* CurrentAccount
          const accepted = yield* audit.within(
            repo.accept(path.id, identity),
            ({ invitation, member }) => ({
              action: "member.joined",
              targetType: "member",
              targetId: member.id,
              details: { email: member.email, role: member.role, invitation_id: invitation.id },
              as: { accountId: invitation.accountId, memberId: member.id }
            })
          ).pipe(
            Effect.catchTags({
              NotAcceptable: ({ reason }) =>
                Effect.fail(
                  reason === "unknown" || reason === "other_email"
                    ? new NotFound({
                      message: `No invitation with id '${path.id}' to your email address.`,
                      param: "id"
                    })
                    : new InvalidRequest({
                      message: {
                        accepted: "This invitation was already accepted.",
                        revoked: "This invitation was revoked; ask the account's owner or admin for a new one.",
                        inviter_may_not: "This invitation was revoked: the member who sent it may no longer invite. " +
                          "Ask the account's owner or admin for a new one.",
                        expired:
                          `This invitation expired (they last ${INVITATION_DAYS} days); ask the account's owner or admin for a new one.`,
                        already_member: "You are already a member of this account."
                      }[reason],
                      param: "id"
                    })
                ),
              TooMany: ({ limit }) =>
                Effect.fail(new InvalidRequest({ message: `The account already has ${limit} members, its most.` }))
            })
          )
          const mine = yield* repo.accountsOf(identity)
          const summary = mine.find((row) => row.accountId === accepted.invitation.accountId)
          if (summary === undefined) {
            return yield* Effect.dieMessage("an accepted invitation's account is not among the person's")
          }
          return { account: toSummary(summary) }
        }))
  }))
