import { HttpApiBuilder } from "@effect/platform"
import { NenasApi } from "../Api.js"
import { notImplemented } from "../Domain/Errors.js"

/** The wallet and Stripe arrive with the money-core issue. */
export const BillingLive = HttpApiBuilder.group(NenasApi, "billing", (handlers) =>
  handlers
    .handle("checkout", () => notImplemented("Checkout"))
    .handle("balance", () => notImplemented("The balance"))
    .handle("transactions", () => notImplemented("The ledger")))

export const WebhooksLive = HttpApiBuilder.group(NenasApi, "webhooks", (handlers) =>
  handlers.handle("stripe", () => notImplemented("The Stripe webhook receiver")))
