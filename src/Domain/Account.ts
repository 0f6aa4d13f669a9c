import type { Role } from "./Roles.js"

/** The signed-in developer account. */
export interface Account {
  readonly id: string
  /** Null for an account made before issuers were recorded, until its first sign-in claims it. */
  readonly issuer: string | null
  readonly subject: string
  readonly email: string | null
  readonly suspended: boolean
}

/** What a verified session token tells us about the developer. */
export interface Identity {
  /** Who issued the token (the configured `AUTH_ISSUER`): accounts are keyed by issuer and subject. */
  readonly issuer: string
  readonly subject: string
  readonly email: string | null
  readonly name: string | null
}

/** A person's place in an account (docs/api/teams.md, "Teams"). */
export interface Member {
  readonly id: string
  readonly role: Role
  readonly email: string | null
  readonly name: string | null
  /** Caps the sum of the member's keys' spend this month; null for none. */
  readonly monthlySpendLimitMicroMyr: number | null
}

/**
 * Who a dashboard request acts as: the account it names (`Nenas-Account`, else
 * the person's personal one) and the person's membership in it.
 */
export interface SignedIn extends Account {
  readonly member: Member
  readonly identity: Identity
}
