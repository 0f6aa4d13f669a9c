import { expect, layer } from "@effect/vitest"
import { Effect, Layer, Option, Redacted } from "effect"
import { COMPANY_PROFILE } from "../../support/BillingProfile.js"
import { call } from "../../support/Http.js"
import { MyInvoisStandIn, MyInvoisStandInLive } from "../../support/MyInvoisStandIn.js"
import { realSleep } from "../../support/RealTime.js"
import { simulatedTopUp } from "../../support/Stripe.js"
import { Instances, on, TwoInstancesLive } from "../../support/TwoInstances.js"
import { developer } from "../../support/Wallet.js"

/**
 * Two instances submitting e-invoices from one database (docs/api/e-invoices.md, "How submission works"):
 * every e-invoice is claimed by one instance at a time, so top-ups taken on either instance are each submitted
 * to MyInvois exactly once, and each becomes valid.
 */

const TOP_UPS = 12

const Both = Layer.unwrapEffect(Effect.map(MyInvoisStandIn, (standIn) =>
  TwoInstancesLive("einvoice", {
    myinvoisBaseUrl: Option.some(standIn.url),
    myinvoisClientId: Option.some("nenas-erp"),
    myinvoisClientSecret: Option.some(Redacted.make("erp-secret")),
    eInvoicePollMs: 50,
    ipCheckoutsPerMinute: 1_000_000,
    ipDevSessionsPerMinute: 1_000_000
  }))).pipe(Layer.provideMerge(MyInvoisStandInLive))

layer(Both, { timeout: 120_000 })("e-invoices on two instances", (it) => {
  it.effect("top-ups on either instance: each e-invoice submitted once, all valid", () =>
    Effect.gen(function*() {
      const standIn = yield* MyInvoisStandIn
      const { a, b } = yield* Instances
      const { token } = yield* developer("einvoice-two@example.my")
      expect((yield* call("PUT", "/dashboard/billing/profile", { token, json: COMPANY_PROFILE })).status).toBe(200)
      yield* Effect.forEach(
        Array.from({ length: TOP_UPS }, (_, index) => index),
        (index) => on(index % 2 === 0 ? a : b)(simulatedTopUp(token, 1000)),
        { concurrency: 4, discard: true }
      )
      let valid = 0
      for (let tries = 0; tries < 300 && valid < TOP_UPS; tries++) {
        const list = yield* call("GET", "/dashboard/billing/invoices?limit=100", { token })
        valid = (list.body.data as Array<{ e_invoice: { status: string } }>)
          .filter((document) => document.e_invoice.status === "valid").length
        if (valid < TOP_UPS) yield* realSleep(100)
      }
      expect(valid).toBe(TOP_UPS)
      const numbers = standIn.submissions.flatMap((submission) => submission.codeNumbers)
      expect(numbers).toHaveLength(TOP_UPS)
      expect(new Set(numbers).size, "no number sent twice").toBe(TOP_UPS)
      expect(standIn.sim.documents()).toHaveLength(TOP_UPS)
    }))
})
