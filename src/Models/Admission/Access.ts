import { Effect } from "effect"
import { CurrentApiKey } from "../../Auth/Api.js"
import { accountSuspended } from "../../Domain/Errors.js"

/**
 * A model call may run only for an account in good standing: while a payment
 * dispute is open the account is suspended
 * (docs/money.md, "Payments (Stripe)"). The wallet checks it again under its
 * lock when it reserves.
 */
export const requireActiveAccount = Effect.flatMap(CurrentApiKey, (key) =>
  key.accountSuspended
    ? Effect.fail(accountSuspended())
    : Effect.void)
