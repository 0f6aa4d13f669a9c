import { describe, expect, it } from "@effect/vitest"
import { Cause, Effect, Exit, Option, Redacted } from "effect"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AppConfig, type AppConfigShape } from "../../src/AppConfig.js"
import { PaymentProcessor, PaymentProcessorLive } from "../../src/Billing/PaymentProcessor.js"

const build = (overrides: Partial<AppConfigShape>) =>
  Effect.scoped(Effect.gen(function*() {
    const dataDir = yield* Effect.acquireRelease(
      Effect.promise(() => mkdtemp(join(tmpdir(), "nenas-pp-"))),
      (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
    )
    return yield* PaymentProcessor.pipe(
      Effect.provide(PaymentProcessorLive),
      Effect.provide(AppConfig.layerWith({ dataDir, ...overrides })),
      Effect.exit
    )
  }))

const defectMessage = (exit: Exit.Exit<unknown, unknown>) =>
  Exit.isFailure(exit) ? Cause.pretty(exit.cause) : "it started"

describe("choosing the payment processor", () => {
  it.effect("without Stripe: the simulated checkout, with a development webhook secret", () =>
    Effect.gen(function*() {
      const exit = yield* build({ stripeSecretKey: Option.none(), stripeWebhookSecret: Option.none() })
      expect(Exit.isSuccess(exit)).toBe(true)
      if (Exit.isSuccess(exit)) {
        expect(exit.value.simulated).toBe(true)
        expect(Redacted.value(exit.value.webhookSecret)).toMatch(/^whsec_dev_[0-9A-Za-z]{32}$/)
      }
    }))

  it.effect("the development webhook secret survives a restart", () =>
    Effect.gen(function*() {
      const dataDir = yield* Effect.promise(() => mkdtemp(join(tmpdir(), "nenas-pp-")))
      const secret = Effect.map(
        PaymentProcessor.pipe(
          Effect.provide(PaymentProcessorLive),
          Effect.provide(
            AppConfig.layerWith({ dataDir, stripeSecretKey: Option.none(), stripeWebhookSecret: Option.none() })
          )
        ),
        (processor) => Redacted.value(processor.webhookSecret)
      )
      const first = yield* secret
      const second = yield* secret
      yield* Effect.promise(() => rm(dataDir, { recursive: true, force: true }))
      expect(second).toBe(first)
    }))

  it.effect("with a Stripe secret key: Stripe, verified with STRIPE_WEBHOOK_SECRET", () =>
    Effect.gen(function*() {
      const exit = yield* build({
        stripeSecretKey: Option.some(Redacted.make("sk_test_x")),
        stripeWebhookSecret: Option.some(Redacted.make("whsec_given"))
      })
      expect(Exit.isSuccess(exit)).toBe(true)
      if (Exit.isSuccess(exit)) {
        expect(exit.value.simulated).toBe(false)
        expect(Redacted.value(exit.value.webhookSecret)).toBe("whsec_given")
      }
    }))

  it.effect("a Stripe secret key without a webhook secret is refused at start-up", () =>
    Effect.gen(function*() {
      const exit = yield* build({
        stripeSecretKey: Option.some(Redacted.make("sk_test_x")),
        stripeWebhookSecret: Option.none()
      })
      expect(Exit.isFailure(exit)).toBe(true)
      expect(defectMessage(exit)).toContain("STRIPE_WEBHOOK_SECRET must be set")
    }))

  it.effect("production refuses the simulated checkout", () =>
    Effect.gen(function*() {
      const exit = yield* build({ production: true, stripeSecretKey: Option.none() })
      expect(Exit.isFailure(exit)).toBe(true)
      expect(defectMessage(exit)).toContain("STRIPE_SECRET_KEY must be set when NODE_ENV=production")
    }))
})
