/** The events a developer's webhook endpoint may subscribe to (docs/api/alerts.md, "Never run dry: alerts, auto top-up and webhooks"). */
export const EVENT_TYPES = [
  "balance.low",
  "topup.succeeded",
  "topup.failed",
  "auto_topup.failed",
  "key.limit_reached",
  "key.expiring",
  "account.suspended",
  "account.reinstated",
  "invoice.issued",
  "e_invoice.validated",
  "e_invoice.rejected"
] as const
export type EventType = typeof EVENT_TYPES[number]

/** Sent only to one endpoint, on the developer's request; no endpoint subscribes to it. */
export const TEST_EVENT = "webhook.test"
