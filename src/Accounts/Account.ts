/** The signed-in developer account. */
export interface Account {
  readonly id: string
  readonly subject: string
  readonly email: string | null
  readonly suspended: boolean
}

/** What a verified session token tells us about the developer. */
export interface Identity {
  readonly subject: string
  readonly email: string | null
  readonly name: string | null
}
