import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { Webhook } from "standardwebhooks"
import { call, createKey } from "../../support/Http.js"
import { modelCall } from "../../support/Models.js"
import { simulatedTopUp } from "../../support/Stripe.js"
import { query } from "../../support/TestServer.js"
import { ASK, Instances, on, outcome } from "../../support/TwoInstances.js"
import { developer } from "../../support/Wallet.js"
import { eventually, TwoInstancesWithReceiver, WebhookReceiver } from "../../support/WebhookReceiver.js"

/**
 * Low-balance alerts: a developer's threshold, crossed by usage
 * settled on two instances at once, is announced exactly once — one
 * `balance.low` event, one email (kept in the development mailbox, as no
 * SMTP_URL is set), one webhook delivery — and the dashboard shows a banner.
 * A top-up above the threshold re-arms it.
 */

const Two = TwoInstancesWithReceiver("lowbal")

const balanceMicro = (token: string) =>
  Effect.map(
    call("GET", "/dashboard/billing/balance", { token }),
    (reply) => (reply.body.wallet.availableMicroMyr as number) + (reply.body.wallet.reservedMicroMyr as number)
  )

const setThreshold = (token: string, micro: number) =>
  Effect.map(
    call("PUT", "/dashboard/billing/settings", { token, json: { low_balance_threshold_myr: micro / 1e6 } }),
    (reply) => {
      expect(reply.status, reply.text).toBe(200)
      return reply.body
    }
  )

const lowEvents = (accountId: string) =>
  query<{ id: string }>(
    "SELECT id FROM outbox_events WHERE account_id = $1 AND type = 'balance.low' ORDER BY created_at",
    [accountId]
  )

layer(Two, { excludeTestServices: true, timeout: 180_000 })("low-balance alerts on two instances", (it) => {
  it.effect("a crossing under concurrent calls on both instances: one alert, one email, one balance.low; re-armed by a top-up", () =>
    Effect.gen(function*() {
      const { a, b } = yield* Instances
      const receiver = yield* WebhookReceiver
      const { accountId, token } = yield* on(a)(developer("lowbal@example.com"))
      yield* on(a)(simulatedTopUp(token, 1000))
      const key = yield* on(a)(createKey(token, { name: "burst" }))
      const { secret } = (yield* on(a)(call("POST", "/dashboard/webhooks", {
        token,
        json: { url: receiver.url("/low"), events: ["balance.low"] }
      }))).body as { secret: string }
      // One call's price, to put the threshold a few calls below the balance.
      const start = yield* on(a)(balanceMicro(token))
      expect(outcome(yield* on(a)(modelCall(key.full_key, "/v1/responses", ASK)))).toBe("200")
      const afterOne = yield* on(a)(balanceMicro(token))
      const price = start - afterOne
      expect(price).toBeGreaterThan(0)
      const settings = yield* on(b)(setThreshold(token, afterOne - Math.round(3.5 * price)))
      expect(settings.low_balance_threshold_myr).toBeCloseTo((afterOne - Math.round(3.5 * price)) / 1e6, 6)
      expect((yield* on(a)(call("GET", "/dashboard/alerts", { token }))).body.banners).toEqual([])
      // A burst on both instances at once takes the balance through the threshold.
      const burst = (base: string) =>
        Effect.forEach(Array.from({ length: 8 }), () => on(base)(modelCall(key.full_key, "/v1/responses", ASK)), {
          concurrency: 4
        })
      const replies = yield* Effect.all([burst(a), burst(b)], { concurrency: 2 })
      expect(replies.flat().map(outcome).filter((o) => o !== "200")).toEqual([])
      const events = yield* eventually("one balance.low", lowEvents(accountId), (rows) => rows.length >= 1)
      expect(events.length).toBe(1)
      const deliveredLow = yield* eventually(
        "webhook",
        Effect.map(WebhookReceiver, (r) => r.received().filter((x) => x.path === "/low")),
        (x) => x.length >= 1
      )
      const payload = new Webhook(secret).verify(
        deliveredLow[0]!.body,
        deliveredLow[0]!.headers as Record<string, string>
      ) as {
        type: string
        data: { balance_myr: number; threshold_myr: number }
      }
      expect(payload.type).toBe("balance.low")
      expect(payload.data.balance_myr).toBeLessThan(payload.data.threshold_myr)
      const mailbox = yield* eventually(
        "email kept",
        Effect.map(
          on(b)(call("GET", "/dev/mailbox/messages")),
          (r) =>
            (r.body.messages as Array<{ to: string; subject: string; status: string; body: string }>)
              .filter((m) => m.to === "lowbal@example.com")
        ),
        (m) => m.length >= 1 && m.every((x) => x.status === "kept")
      )
      expect(mailbox.length).toBe(1)
      expect(mailbox[0]!.subject).toMatch(/^Your nenas balance is below RM \d+\.\d\d$/)
      expect(mailbox[0]!.body).toContain(`${a}/app/billing`)
      // It names the account it is about: a person may belong to several.
      expect(mailbox[0]!.body).toMatch(/^Account: lowbal@example\.com \(acct_/)
      const page = yield* on(a)(call("GET", "/dev/mailbox"))
      expect(page.text).toContain(mailbox[0]!.subject)
      const banners = (yield* on(b)(call("GET", "/dashboard/alerts", { token }))).body.banners as Array<
        { kind: string; action_url: string }
      >
      expect(banners.map((x) => x.kind)).toEqual(["balance_low"])
      // More usage below the threshold is not a new crossing.
      yield* burst(b)
      yield* Effect.sleep("300 millis")
      expect((yield* lowEvents(accountId)).length).toBe(1)
      expect(receiver.received().filter((x) => x.path === "/low").length).toBe(1)
      // A top-up lifts the balance above the threshold: the banner goes, and the next crossing alerts again.
      yield* on(a)(simulatedTopUp(token, 1000))
      expect((yield* on(a)(call("GET", "/dashboard/alerts", { token }))).body.banners).toEqual([])
      const lifted = yield* on(a)(balanceMicro(token))
      yield* on(a)(setThreshold(token, lifted - Math.round(2.5 * price)))
      yield* Effect.all([burst(a), burst(b)], { concurrency: 2 })
      yield* eventually("second crossing", lowEvents(accountId), (rows) => rows.length >= 2)
      yield* Effect.sleep("300 millis")
      expect((yield* lowEvents(accountId)).length).toBe(2)
      yield* eventually(
        "second webhook",
        Effect.sync(() => receiver.received().filter((x) => x.path === "/low").length),
        (n) => n >= 2
      )
      const emails = yield* query<{ n: string }>("SELECT count(*) AS n FROM outbox_emails WHERE account_id = $1", [
        accountId
      ])
      expect(emails[0]?.n).toBe("2")
    }))

  it.effect("a key's monthly limit refusing calls on both instances is announced once: one key.limit_reached, one email", () =>
    Effect.gen(function*() {
      const { a, b } = yield* Instances
      const { accountId, token } = yield* on(a)(developer("limit-reached@example.com"))
      yield* on(a)(simulatedTopUp(token, 1000))
      const key = yield* on(a)(createKey(token, { name: "capped", monthly_spend_limit_myr: 0.000001 }))
      const burst = (base: string) =>
        Effect.forEach(Array.from({ length: 6 }), () => on(base)(modelCall(key.full_key, "/v1/responses", ASK)), {
          concurrency: 3
        })
      const replies = (yield* Effect.all([burst(a), burst(b)], { concurrency: 2 })).flat().map(outcome)
      expect(replies.filter((o) => o === "spend_limit_exceeded").length).toBeGreaterThan(0)
      const events = yield* query<{ payload: { data: { api_key_id: string } } }>(
        "SELECT payload FROM outbox_events WHERE account_id = $1 AND type = 'key.limit_reached'",
        [accountId]
      )
      expect(events.map((e) => e.payload.data.api_key_id)).toEqual([key.key.id])
      const mails = yield* query<{ subject: string }>("SELECT subject FROM outbox_emails WHERE account_id = $1", [
        accountId
      ])
      expect(mails.map((m) => m.subject)).toEqual(["Your API key \"capped\" reached its monthly spend limit"])
    }))

  it.effect("settings: bad thresholds are refused; null removes the alert; auto top-up needs a saved card", () =>
    Effect.gen(function*() {
      const { a } = yield* Instances
      const { token } = yield* on(a)(developer("lowbal-settings@example.com"))
      const initial = yield* on(a)(call("GET", "/dashboard/billing/settings", { token }))
      expect(initial.body).toEqual({
        low_balance_threshold_myr: null,
        auto_topup: {
          enabled: false,
          threshold_myr: null,
          amount_myr: null,
          max_per_day: 3,
          disabled_reason: null,
          action_url: null
        },
        card: null
      })
      for (const bad of [-1, "5", Number.MAX_SAFE_INTEGER]) {
        const reply = yield* on(a)(
          call("PUT", "/dashboard/billing/settings", { token, json: { low_balance_threshold_myr: bad } })
        )
        expect(reply.status, JSON.stringify(bad)).toBe(400)
        expect(reply.body.error.code).toBe("invalid_request")
      }
      expect((yield* on(a)(setThreshold(token, 5_000_000))).low_balance_threshold_myr).toBe(5)
      const cleared = yield* on(a)(
        call("PUT", "/dashboard/billing/settings", { token, json: { low_balance_threshold_myr: null } })
      )
      expect(cleared.body.low_balance_threshold_myr).toBeNull()
      const noCard = yield* on(a)(
        call("PUT", "/dashboard/billing/settings", {
          token,
          json: { auto_topup: { enabled: true, threshold_myr: 5, amount_myr: 25 } }
        })
      )
      expect(noCard.status).toBe(400)
      expect(noCard.body.error.param).toBe("auto_topup.enabled")
    }))
})
