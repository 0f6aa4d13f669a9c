import { describe, expect, it } from "@effect/vitest"
import { readFileSync } from "node:fs"
import { STRIPE_EVENT_TYPES } from "../../src/Billing/StripeEvents.js"

/**
 * docs/operations.md tells an operator which events to send to the Stripe webhook
 * endpoint: every type the receiver acts on must be there, or its
 * money is never moved (`payment_intent.succeeded` was missing).
 */
describe("the Stripe webhook events of docs/operations.md", () => {
  it("list every event type the receiver handles, where it says how to point the endpoint at the service", () => {
    const readme = readFileSync(new URL("../../docs/operations.md", import.meta.url), "utf8")
    const start = readme.indexOf("Point a Stripe webhook endpoint at")
    expect(start).toBeGreaterThan(-1)
    const paragraph = readme.slice(start, readme.indexOf("\n- ", start))
    const listed = new Set([...paragraph.matchAll(/`([a-z_]+(?:\.[a-z_]+)+)`/g)].map((match) => match[1]))
    expect(STRIPE_EVENT_TYPES.filter((type) => !listed.has(type))).toEqual([])
    expect(STRIPE_EVENT_TYPES).toContain("payment_intent.succeeded")
  })
})
