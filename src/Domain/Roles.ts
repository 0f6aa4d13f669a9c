import * as OpenApi from "@effect/platform/OpenApi"
import { Context, Schema } from "effect"
import { InvalidRequest, PermissionDenied } from "./Errors.js"

/** A member's role in an account (docs/api/teams.md, "Teams"), strongest first. */
export const Role = Schema.Literal("owner", "admin", "developer", "billing", "viewer")
export type Role = typeof Role.Type

/**
 * The roles a dashboard endpoint allows, declared on it in its contract
 * (`allowRoles`). The request guard refuses every other role before the
 * endpoint reads its body; an endpoint without it refuses everyone.
 */
export class AllowedRoles extends Context.Tag("nenas/AllowedRoles")<AllowedRoles, ReadonlyArray<Role>>() {}

/** Every role: reads (viewers read everything but secrets) and what each person does for themselves. */
export const EVERY_ROLE: ReadonlyArray<Role> = Role.literals

interface Annotatable<Self> {
  annotate<I, S>(tag: Context.Tag<I, S>, value: S): Self
}

/** Declares the roles an endpoint allows, for the guard and in OpenAPI (`x-nenas-roles`). */
export const allowRoles = (...roles: ReadonlyArray<Role>) => <Self extends Annotatable<Self>>(endpoint: Self): Self =>
  endpoint
    .annotate(AllowedRoles, roles)
    .annotate(OpenApi.Override, { "x-nenas-roles": roles })

const listed = (roles: ReadonlyArray<Role>): string =>
  roles.length === 1 ? roles[0]! : `${roles.slice(0, -1).join(", ")} or ${roles[roles.length - 1]}`

/** Whether `role` may use an endpoint that allows `allowed`. */
export const permits = (allowed: ReadonlyArray<Role>, role: Role): boolean => allowed.includes(role)

/** The refusal of `role` on an endpoint that allows `allowed`: it names the roles needed and who can grant them. */
export const roleRefusal = (allowed: ReadonlyArray<Role>, role: Role): PermissionDenied =>
  new PermissionDenied({
    message: allowed.length === 0
      ? "No role may do this through the dashboard API."
      : `This needs the role ${listed(allowed)} in this account; you are ${
        role === "admin" || role === "owner" ? "an" : "a"
      } ${role}.`,
    guidance: allowed.length === 0
      ? "This endpoint declares no role."
      : `Ask an owner or admin of the account to give you the role ${listed(allowed)} (PATCH /dashboard/members/{id}).`,
    action: "/members"
  })

/** Who makes and manages keys (a developer, its own only: the keys' handlers check). */
export const KEY_MAKERS: ReadonlyArray<Role> = ["owner", "admin", "developer"]
/** Who manages members, webhooks and the account's settings. */
export const ADMINS: ReadonlyArray<Role> = ["owner", "admin"]
/** Who pays: top-ups and the saved card. */
export const PAYERS: ReadonlyArray<Role> = ["owner", "billing"]
/** Who changes billing settings: the low-balance alert and auto top-up. */
export const SETTINGS_MAKERS: ReadonlyArray<Role> = ["owner", "admin", "billing"]

/** Who acts, or is acted on: a member of the account and its role. */
export interface MemberRef {
  readonly id: string
  readonly role: Role
}

/** What a dashboard request does to a member: changes its role or budget, or removes it (giving its keys over, or not). */
export type MemberAction =
  | { readonly _tag: "Update"; readonly role?: Role | undefined; readonly budget: boolean }
  | { readonly _tag: "Remove"; readonly transfer: boolean }

const an = (role: Role) => role === "owner" || role === "admin" ? "an" : "a"

const ownersOnlyRefusal = (actor: Role) =>
  new PermissionDenied({
    message: `Only an owner makes, changes or removes an owner; you are ${an(actor)} ${actor}.`,
    guidance: "Ask an owner of the account to make this change.",
    action: "/members"
  })

/**
 * Whether `actor` may do `action` to `target`, decided before anything is read or written (docs/api/teams.md, "Roles that hold"):
 * anyone leaves, but its keys are then disabled, never handed over; removing or changing another member is an
 * owner's or admin's; only an owner changes an owner in any way, or makes one. The last owner is the repository's.
 */
export const memberActionRefusal = (
  actor: MemberRef,
  target: MemberRef,
  action: MemberAction
): PermissionDenied | InvalidRequest | undefined => {
  const leaving = action._tag === "Remove" && actor.id === target.id
  if (!leaving && !ADMINS.includes(actor.role)) return roleRefusal(ADMINS, actor.role)
  const touchesOwner = target.role === "owner" || (action._tag === "Update" && action.role === "owner")
  if (touchesOwner && actor.role !== "owner") return ownersOnlyRefusal(actor.role)
  if (leaving && action._tag === "Remove" && action.transfer) {
    return new InvalidRequest({
      message: "A member who leaves cannot hand its keys to anyone: they are disabled. " +
        "An owner or admin may remove you instead and give your keys to another member.",
      param: "transfer_keys_to"
    })
  }
  return undefined
}

/**
 * Whether `actor` may change, rotate or delete a key `keyMemberId` made: owners and admins any of the account's,
 * a developer only its own, nobody else any.
 */
export const keyChangeRefusal = (
  actor: MemberRef,
  keyId: string,
  keyMemberId: string | null
): PermissionDenied | undefined => {
  if (!KEY_MAKERS.includes(actor.role)) return roleRefusal(KEY_MAKERS, actor.role)
  if (actor.role !== "developer" || keyMemberId === actor.id) return undefined
  return new PermissionDenied({
    message: `A developer changes only the keys it created; key '${keyId}' is another member's.`,
    guidance:
      "Ask an owner or admin of the account to change this key, or to make you an admin (PATCH /dashboard/members/{id}).",
    action: "/api-keys"
  })
}
