import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import { Effect } from "effect"
import { NenasApi } from "../Api.js"
import { AppConfig } from "../AppConfig.js"
import { AuditLog } from "../Audit/Repo.js"
import { CurrentAccount } from "../Auth/Api.js"
import type { SignedIn } from "../Domain/Account.js"
import { InvalidRequest, NotFound, RateLimitExceeded } from "../Domain/Errors.js"
import { fromMyr, microMyr, toMyrString } from "../Domain/Money.js"
import { emailForm, quotedName } from "../Domain/Names.js"
import { type MemberAction, memberActionRefusal, type Role } from "../Domain/Roles.js"
import { now } from "../Domain/Time.js"
import type { Environment } from "../Keys/Api.js"
import { generateKey, hashKey, keyPrefix } from "../Keys/ApiKeys.js"
import { KeyCache } from "../Keys/KeyCache.js"
import { KeysRepo } from "../Keys/Repo.js"
import { DASHBOARD_URL, emailAddress } from "../Outbox/Events.js"
import { Spending } from "../Wallet/Spending.js"
import { WebhookEndpoints } from "../Webhooks/Endpoints.js"
import type { MemberRecord } from "./Api.js"
import { INVITATION_DAYS, invitationUrl, toInvitation } from "./InvitationView.js"
import { type MemberRow, MembersRepo } from "./Repo.js"

const noSuchMember = (id: string) =>
  new NotFound({ message: `No member with id '${id}' in this account.`, param: "id" })

const lastOwner = new InvalidRequest({
  message: "An account keeps at least one owner: make another member an owner first.",
  param: "role"
})

/** What `actor` may do to `target` (docs/api/teams.md, "Roles that hold"), refused before anything is written. */
const allowed = (actor: SignedIn, target: { readonly id: string; readonly role: Role }, action: MemberAction) => {
  const refusal = memberActionRefusal(actor.member, target, action)
  return refusal === undefined ? Effect.void : Effect.fail(refusal)
}

/** A transferred key's new secret, which nobody is shown: its new holder rotates the key to get one of its own. */
const unseenSecret = (environment: Environment) => {
  const secret = generateKey(environment)
  return { keyHash: hashKey(secret), prefix: keyPrefix(secret) }
}

const article = (role: Role) => role === "owner" || role === "admin" ? "an" : "a"

export const MembersLive = HttpApiBuilder.group(NenasApi, "members", (handlers) =>
  Effect.gen(function*() {
    const repo = yield* MembersRepo
    const keys = yield* KeysRepo
    const cache = yield* KeyCache
    const spending = yield* Spending
    const audit = yield* AuditLog
    const webhooks = yield* WebhookEndpoints
    const config = yield* AppConfig

    /** Each member's record: its keys counted, and what they were billed this month. */
    const records = (account: SignedIn, rows: ReadonlyArray<MemberRow>) =>
      Effect.gen(function*() {
        const [accountKeys, spent] = yield* Effect.all([
          keys.list(account.id),
          spending.spentThisMonthByMember(account.id)
        ])
        return rows.map((row): MemberRecord => ({
          id: row.id,
          email: row.email,
          name: row.name,
          role: row.role,
          monthly_spend_limit_micro_myr: row.monthlySpendLimitMicroMyr,
          month_to_date_spend_micro_myr: spent.get(row.id) ?? 0,
          key_count: accountKeys.filter((key) => key.memberId === row.id).length,
          created_at: row.createdAt.toISOString(),
          you: row.id === account.member.id
        }))
      })

    return handlers
      .handle("list", () =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          return { members: yield* records(account, yield* repo.list(account.id)) }
        }))
      .handle("update", ({ path, payload }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const target = yield* repo.find(account.id, path.id)
          if (target === undefined) return yield* noSuchMember(path.id)
          yield* allowed(account, target, {
            _tag: "Update",
            role: payload.role,
            budget: payload.monthly_spend_limit_myr !== undefined
          })
          const limit = payload.monthly_spend_limit_myr
          const changed = yield* audit.within(
            repo.update(account.id, path.id, {
              role: payload.role,
              monthlySpendLimitMicroMyr: limit === undefined ? undefined : limit === null ? null : fromMyr(limit)
            }),
            (result) =>
              result === undefined ? undefined : {
                action: "member.updated",
                targetType: "member",
                targetId: path.id,
                details: {
                  email: result.after.email,
                  ...(payload.role === undefined ? {} : { role: { from: result.before.role, to: result.after.role } }),
                  ...(limit === undefined ? {} : {
                    monthly_spend_limit_myr: {
                      from: result.before.monthlySpendLimitMicroMyr === null
                        ? null
                        : toMyrString(microMyr(result.before.monthlySpendLimitMicroMyr)),
                      to: result.after.monthlySpendLimitMicroMyr === null
                        ? null
                        : toMyrString(microMyr(result.after.monthlySpendLimitMicroMyr))
                    }
                  })
                }
              }
          ).pipe(Effect.catchTag("LastOwner", () => Effect.fail(lastOwner)))
          if (changed === undefined) return yield* noSuchMember(path.id)
          // Every instance hears of it through the member's NOTIFY within moments; this one knows at once.
          yield* cache.forgetAccount(account.id)
          // A budget counts what the member's calls on credit grants hold, on every instance, before this answers.
          if (typeof limit === "number") yield* spending.memberLimitSet(account.id, path.id)
          const [record] = yield* records(account, [changed.after])
          return record!
        }))
      .handle("remove", ({ path, urlParams }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const transferTo = urlParams.transfer_keys_to ?? null
          // Anyone may leave (its role is then no matter); removing another is an owner's or admin's.
          const leaving = path.id === account.member.id
          yield* allowed(account, leaving ? account.member : { id: path.id, role: "viewer" }, {
            _tag: "Remove",
            transfer: transferTo !== null
          })
          const target = yield* repo.find(account.id, path.id)
          if (target === undefined) return yield* noSuchMember(path.id)
          yield* allowed(account, target, { _tag: "Remove", transfer: transferTo !== null })
          const removed = yield* audit.within(
            repo.remove(account.id, path.id, transferTo === null ? null : { to: transferTo, newSecret: unseenSecret })
              .pipe(
                Effect.tap((gone) =>
                  gone === undefined ? Effect.void : webhooks.creatorRemoved(account.id, path.id, audit.record)
                )
              ),
            (result) =>
              result === undefined ? undefined : {
                action: "member.removed",
                targetType: "member",
                targetId: path.id,
                details: {
                  email: result.member.email,
                  role: result.member.role,
                  ...(transferTo === null
                    ? { keys_disabled: result.keys }
                    : { keys_transferred_to: transferTo, keys: result.keys })
                }
              }
          ).pipe(
            Effect.catchTags({
              LastOwner: () => Effect.fail(lastOwner),
              NoSuchMember: ({ id }) =>
                Effect.fail(
                  new InvalidRequest({
                    message: `'transfer_keys_to' must name another member of this account; '${id}' does not.`,
                    param: "transfer_keys_to"
                  })
                )
            })
          )
          if (removed === undefined) return yield* noSuchMember(path.id)
          // Other instances hear of the keys' change through their NOTIFY within a second; this one knows at once.
          yield* cache.forgetAccount(account.id)
          // The recipient's budget counts the keys' calls in flight on grants, on every instance, before this answers.
          if (transferTo !== null && removed.keys.length > 0) yield* spending.memberLimitSet(account.id, transferTo)
          return {
            ok: true,
            keys_disabled: transferTo === null ? removed.keys : [],
            keys_transferred: transferTo === null ? [] : removed.keys
          } as const
        }))
      .handle("invite", ({ payload }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          // Inviting someone as an owner makes an owner: only an owner does.
          yield* allowed(account, { id: "", role: payload.role }, { _tag: "Update", budget: false })
          const at = yield* now
          const email = emailForm(payload.email) ?? payload.email.toLowerCase()
          const inviter = quotedName(account.identity.name ?? account.identity.email ?? "A member")
          const invitation = yield* audit.within(
            Effect.tap(
              repo.invite({
                accountId: account.id,
                email,
                role: payload.role,
                invitedBy: account.member.id,
                expiresAt: new Date(at.getTime() + INVITATION_DAYS * 86_400_000)
              }),
              (row) =>
                emailAddress(account.id, email, {
                  subject: `${inviter} invited you to ${quotedName(row.accountName ?? row.accountId)} on nenas`,
                  body: `${inviter} invited you to join the nenas account ${
                    quotedName(row.accountName ?? row.accountId)
                  } as ${article(row.role)} ${row.role}.\n\nSign in with this email address (${email}) and accept:\n${
                    invitationUrl(DASHBOARD_URL, row.id)
                  }\n\nThe invitation expires on ${row.expiresAt.toISOString()}.`
                }, at).pipe(Effect.orDie)
            ),
            (row) => ({
              action: "member.invited",
              targetType: "invitation",
              targetId: row.id,
              details: { email: row.email, role: row.role, expires_at: row.expiresAt.toISOString() }
            })
          ).pipe(
            Effect.catchTags({
              TooMany: ({ limit, what }) =>
                Effect.fail(
                  new InvalidRequest({
                    message: what === "members"
                      ? `An account has at most ${limit} members.`
                      : `An account has at most ${limit} open invitations; revoke one first.`
                  })
                ),
              TooFrequent: ({ limit, retryAfterMs }) =>
                Effect.fail(
                  new RateLimitExceeded({
                    message: `An account sends at most ${limit} invitations a day, revoked ones included.`,
                    retry_after_seconds: Math.max(1, Math.ceil(retryAfterMs / 1000))
                  })
                ),
              AlreadyThere: ({ what }) =>
                Effect.fail(
                  new InvalidRequest({
                    message: what === "member"
                      ? `${email} is already a member of this account.`
                      : `${email} already has an open invitation to this account; revoke it to invite again.`,
                    param: "email"
                  })
                )
            })
          )
          return toInvitation(config.dashboardUrl)(invitation)
        }))
      .handle("invitations", () =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          return { invitations: (yield* repo.invitations(account.id)).map(toInvitation(config.dashboardUrl)) }
        }))
      .handle("revoke", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const revoked = yield* audit.within(
            repo.revoke(account.id, path.id),
            (row) =>
              row === undefined ? undefined : {
                action: "member.invitation_revoked",
                targetType: "invitation",
                targetId: row.id,
                details: { email: row.email, role: row.role }
              }
          )
          if (revoked === undefined) {
            return yield* new NotFound({
              message: `No open invitation with id '${path.id}' in this account.`,
              param: "id"
            })
          }
          return { ok: true } as const
        }))
  }))
