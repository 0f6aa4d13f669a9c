/**
 * Every Stripe event type the service acts on: a Stripe webhook endpoint must send each
 * (docs/operations.md, "Using real services" lists them).
 */
export const STRIPE_EVENT_TYPES = [
  "checkout.session.completed",
  "checkout.session.async_payment_succeeded",
  "checkout.session.async_payment_failed",
  "checkout.session.expired",
  "charge.refunded",
  "charge.dispute.created",
  "charge.dispute.funds_withdrawn",
  "charge.dispute.funds_reinstated",
  "charge.dispute.closed",
  "payment_intent.succeeded",
  "payment_intent.payment_failed"
] as const
export type StripeEventType = typeof STRIPE_EVENT_TYPES[number]
export const isHandled = (type: string): type is StripeEventType =>
  (STRIPE_EVENT_TYPES as ReadonlyArray<string>).includes(type)
