import * as OpenApi from "@effect/platform/OpenApi"
import { Context, Schema } from "effect"
import { PermissionDenied } from "./Errors.js"

/** A member's role in an account (DESIGN.md, Teams), strongest first. */
export const Role = Schema.Literal("owner", "admin", "developer", "billing", "viewer")
export type Role = typeof Role.Type

export const ROLES: ReadonlyArray<Role> = Role.literals

/**
 * The roles a dashboard endpoint allows, declared on it in its contract
 * (`allowRoles`). The request guard refuses every other role before the
 * endpoint reads its body; an endpoint without it refuses everyone.
 */
export class AllowedRoles extends Context.Tag("nenas/AllowedRoles")<AllowedRoles, ReadonlyArray<Role>>() {}

/** Every role: reads (viewers read everything but secrets) and what each person does for themselves. */
export const EVERY_ROLE: ReadonlyArray<Role> = ROLES

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
      : `This needs the role ${listed(allowed)} in this account; you are ${role === "admin" || role === "owner" ? "an" : "a"} ${role}.`,
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
