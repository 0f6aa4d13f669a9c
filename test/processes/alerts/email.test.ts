import { expect, layer } from "@effect/vitest"
import { Effect, Layer, Option, Redacted } from "effect"
import { call, createKey } from "../../support/Http.js"
import { modelCall } from "../../support/Models.js"
import { SmtpServer, SmtpServerLive } from "../../support/SmtpServer.js"
import { simulatedTopUp } from "../../support/Stripe.js"
import { query, TestServer, TestServerLive } from "../../support/TestServer.js"
import { ASK } from "../../support/TwoInstances.js"
import { developer } from "../../support/Wallet.js"

/**
 * With `SMTP_URL` set, alert emails go out through `nodemailer` (to a local
 * SMTP server here), and the development mailbox does not exist.
 */

const Server = Layer.unwrapEffect(
  Effect.map(SmtpServer, (smtp) =>
    TestServerLive({
      smtpUrl: Option.some(Redacted.make(smtp.url)),
      emailFrom: "nenas alerts <alerts@nenas.test>",
      outboxPollMs: 50
    }))
)
  .pipe(Layer.provideMerge(SmtpServerLive))

layer(Server, { excludeTestServices: true, timeout: 120_000 })("alert email through SMTP_URL", (it) => {
  it.effect("a low-balance crossing is emailed through SMTP once; /dev/mailbox is 404", () =>
    Effect.gen(function*() {
      const smtp = yield* SmtpServer
      const { baseUrl } = yield* TestServer
      const { accountId, token } = yield* developer("smtp-alert@example.com")
      yield* simulatedTopUp(token, 1000)
      const key = yield* createKey(token, { name: "smtp" })
      const put = yield* call("PUT", "/dashboard/billing/settings", {
        token,
        json: { low_balance_threshold_myr: 9.999999 }
      })
      expect(put.status, put.text).toBe(200)
      for (let i = 0; i < 3; i++) expect((yield* modelCall(key.full_key, "/v1/responses", ASK)).status).toBe(200)
      const until = Date.now() + 15_000
      while (smtp.received().length === 0 && Date.now() < until) yield* Effect.sleep("50 millis")
      yield* Effect.sleep("300 millis")
      const mails = smtp.received()
      expect(mails.length).toBe(1)
      expect(mails[0]!.from).toBe("alerts@nenas.test")
      expect(mails[0]!.to).toEqual(["smtp-alert@example.com"])
      expect(mails[0]!.data).toMatch(/Subject: Your nenas balance is below RM 10\.00/)
      // The dashboard's address is put in at sending time.
      expect(mails[0]!.data).toContain(`${baseUrl}/app/billing`)
      const rows = yield* query<{ status: string }>("SELECT status FROM outbox_emails WHERE account_id = $1", [
        accountId
      ])
      expect(rows).toEqual([{ status: "sent" }])
      expect((yield* call("GET", "/dev/mailbox")).status).toBe(404)
      expect((yield* call("GET", "/dev/mailbox/messages")).body.error.code).toBe("not_found")
    }))
})
