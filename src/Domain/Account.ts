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
