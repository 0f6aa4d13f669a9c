import { describe, expect, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import { microMyr, myrAsSet, myrDown, myrUp } from "../../../src/Domain/Money.js"
import { PUBLIC_MODEL } from "../../../src/Models/OpenAi/Api.js"
import { booksOf } from "../../support/Books.js"
import { call } from "../../support/Http.js"
import { caller, modelCall, TestServerWithUpstream, walletOf } from "../../support/Models.js"
import { query } from "../../support/TestServer.js"
import { eventually } from "../../support/WebhookReceiver.js"

/**
 * A low balance in words never reads as the threshold it is below: the balance is rounded down, the threshold
 * shown as it was set (in the email's subject, rounded up: "below RM X" stays true).
 */

describe("money in words", () => {
  it("rounds a balance down, an upper bound up, and shows a threshold as it was set", () => {
    expect(myrDown(microMyr(4_998_074))).toBe("4.99")
    expect(myrDown(microMyr(5_000_000))).toBe("5.00")
    expect(myrDown(microMyr(-1_000))).toBe("-0.01")
    expect(myrUp(microMyr(4_996_500))).toBe("5.00")
    expect(myrUp(microMyr(4_990_000))).toBe("4.99")
    expect(myrAsSet(microMyr(5_000_000))).toBe("5.00")
    expect(myrAsSet(microMyr(4_996_500))).toBe("4.9965")
    expect(myrAsSet(microMyr(5_100_000))).toBe("5.10")
  })
})

layer(TestServerWithUpstream(), { excludeTestServices: true, timeout: 90_000 })(
  "a balance just below its threshold",
  (it) => {
    it.effect("the email and the banner read RM 9.99 below the RM 10.00 set, not RM 10.00 below RM 10.00; the books are exact", () =>
      Effect.gen(function*() {
        const { accountId, apiKey, token } = yield* caller("rounding@example.com", { sen: 1000 })
        const set = yield* call("PUT", "/dashboard/billing/settings", {
          token,
          json: { low_balance_threshold_myr: 10 }
        })
        expect(set.status, set.text).toBe(200)
        const reply = yield* modelCall(apiKey, "/v1/chat/completions", {
          model: PUBLIC_MODEL,
          messages: [{ role: "user", content: "Hi" }]
        })
        expect(reply.status, reply.text).toBe(200)
        const books = yield* booksOf(reply.headers.get("x-request-id") ?? "")
        const cost = Number(books.log.cost_micro_myr)
        expect(cost).toBeGreaterThan(0)
        // Less than half a sen: rounded to the nearest sen, the balance would read RM 10.00.
        expect(cost).toBeLessThan(5_000)
        expect(books.ledger).toEqual([-cost])
        expect(books.hold.map((hold) => hold.status)).toEqual(["captured"])
        const wallet = yield* walletOf(accountId)
        expect(wallet.available + wallet.reserved).toBe(10_000_000 - cost)

        const mail = yield* eventually(
          "the low-balance email",
          query<{ subject: string; body: string }>("SELECT subject, body FROM outbox_emails WHERE account_id = $1", [
            accountId
          ]),
          (rows) => rows.length > 0
        )
        expect(mail[0]?.subject).toBe("Your nenas balance is below RM 10.00")
        expect(mail[0]?.body).toContain("Your prepaid balance is now RM 9.99, below the RM 10.00 you set.")
        const event = yield* query<{ payload: { data: { balance_myr: number; threshold_myr: number } } }>(
          "SELECT payload FROM outbox_events WHERE account_id = $1 AND type = 'balance.low'",
          [accountId]
        )
        expect(event[0]?.payload.data).toMatchObject({ balance_myr: (10_000_000 - cost) / 1e6, threshold_myr: 10 })

        const alerts = yield* call("GET", "/dashboard/alerts", { token })
        const banner = (alerts.body.banners as Array<{ kind: string; message: string }>).find((b) =>
          b.kind === "balance_low"
        )
        expect(banner?.message).toContain("Your balance is RM 9.99, below the RM 10.00 you set.")
      }))
  }
)
