/**
 * What each role may do, in one place: the roles each route allows come from
 * the contract (`ROUTE_ROLES`, the routes' `x-nenas-roles`); the two rules the
 * service checks beyond them (a developer changes only its own keys; only an
 * owner makes, changes or removes an owner) are here too. Pages ask these and
 * offer nothing the service would refuse with 403.
 */
// With extensions, as Node resolves them: the tests import this module outside the bundler.
import { ROUTE_ROLES, type Schemas } from "./contract.js"

/** A member's role in an account. */
export type Role = Schemas["AccountSummary"]["role"]

/** The routes a session calls as a member of an account: each declares the roles it allows. */
export type MemberRoute = keyof typeof ROUTE_ROLES

/** Every role, strongest first: the compiler refuses the list while it misses one the contract has. */
const everyRole = <const L extends ReadonlyArray<Role>>(
  list: L & ([Exclude<Role, L[number]>] extends [never] ? unknown : { readonly missing: Exclude<Role, L[number]> })
): ReadonlyArray<Role> => list
export const ROLES = everyRole(["owner", "admin", "developer", "billing", "viewer"])

/** Who the signed-in person is in the current account. */
export interface Membership {
  readonly role: Role
  readonly memberId: string
}

/** Whether `role` may call `route` at all. */
export const allows = (role: Role, route: MemberRoute): boolean =>
  (ROUTE_ROLES[route] as ReadonlyArray<Role>).includes(role)

/** The roles that may call `route`, strongest first. */
export const rolesFor = (route: MemberRoute): ReadonlyArray<Role> => ROLES.filter((role) => allows(role, route))

/** The roles that may call `route`, as a sentence names them: `owner or billing`, `owner, admin or developer`. */
export const neededRoles = (route: MemberRoute): string => {
  const roles = rolesFor(route)
  return roles.length <= 1 ? roles.join("") : `${roles.slice(0, -1).join(", ")} or ${roles[roles.length - 1]}`
}

/** What each role is for (docs/api/teams.md, "Teams"), shown where roles are chosen. */
export const ROLE_DUTIES: Record<Role, string> = {
  owner: "does everything, including making other owners",
  admin: "manages members, keys, billing settings and webhooks",
  developer: "creates and manages its own keys, and reads the account's logs and usage",
  billing: "tops up, saves the card, sets auto top-up and reads the ledger",
  viewer: "reads everything but secrets"
}

type KeyChange =
  | "PATCH /dashboard/api-keys/{id}"
  | "POST /dashboard/api-keys/{id}/rotate"
  | "DELETE /dashboard/api-keys/{id}"

/** Whether the member may change this key: a developer only the keys it made. */
export const mayChangeKey = (me: Membership, key: Pick<Schemas["ApiKey"], "member_id">, route: KeyChange): boolean =>
  allows(me.role, route) && (me.role !== "developer" || key.member_id === me.memberId)

/** The roles `role` may give, by invitation or change: only an owner gives `owner`. */
export const grantableRoles = (role: Role): ReadonlyArray<Role> =>
  allows(role, "POST /dashboard/members/invitations") ? ROLES.filter((one) => one !== "owner" || role === "owner") : []

/** Whether `role` may change the role or budget of a member who is `target`: only an owner touches an owner. */
export const mayChangeMember = (role: Role, target: Role): boolean =>
  allows(role, "PATCH /dashboard/members/{id}") && (target !== "owner" || role === "owner")

/**
 * Whether `role` may remove another member who is `target`. Anyone may remove themselves (leave), so the
 * route allows every role; removing another takes what changing one does (the service checks it so).
 */
export const mayRemoveMember = (role: Role, target: Role): boolean =>
  allows(role, "PATCH /dashboard/members/{id}") && (target !== "owner" || role === "owner")
