import * as FetchHttpClient from "@effect/platform/FetchHttpClient"
import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import * as HttpClient from "@effect/platform/HttpClient"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import { Clock, Effect, Layer, Redacted, Schema } from "effect"
import Stripe from "stripe"
import { IpLimits } from "../Addresses/IpLimits.js"
import { NenasApi } from "../Api.js"
import { AppConfig } from "../AppConfig.js"
import { AuditLog } from "../Audit/Repo.js"
import { CurrentAccount } from "../Auth/Api.js"
import { AuthenticationError, InvalidRequest, NotFound } from "../Domain/Errors.js"
import { MICRO_PER_SEN, microMyr, toMyrNumber } from "../Domain/Money.js"
import { jsonDeeperThan, MAX_JSON_DEPTH } from "../Domain/Strict.js"
import { Documents } from "../Invoices/Documents.js"
import { taxOn } from "../Invoices/Tax.js"
import { Metrics } from "../Observability/Metrics.js"
import { AutoTopups } from "../Wallet/AutoTopupAttempts.js"
import { WalletRepo } from "../Wallet/Repo.js"
import { WalletSettings } from "../Wallet/Settings.js"
import { Spending } from "../Wallet/Spending.js"
import { TOPUP_OPTIONS_SEN } from "./Api.js"
import { AutoTopupOutcomes, AutoTopupWorker } from "./AutoTopupCharges.js"
import { CardProcessor, simulatedSetupIntent, TEST_CARDS } from "./CardProcessor.js"
import { Cards } from "./Cards.js"
import {
  type CheckoutOutcome,
  checkoutPage,
  deliver,
  refundEvent,
  resultPage,
  sessionEvent,
  setupEvent,
  setupPage,
  setupResultPage
} from "./DevCheckout.js"
import { PaymentProcessor, SIMULATED_SAVING_PREFIX } from "./PaymentProcessor.js"
import { Payments, StripeEvent } from "./Payments.js"
import { PaymentsRepo } from "./Repo.js"
import { autoTopupGap, toCard, toChange, toSettings } from "./SettingsView.js"

export const BillingLive = HttpApiBuilder.group(NenasApi, "billing", (handlers) =>
  Effect.gen(function*() {
    const wallets = yield* WalletRepo
    const spending = yield* Spending
    const payments = yield* PaymentsRepo
    const processor = yield* PaymentProcessor
    const ipLimits = yield* IpLimits
    const cards = yield* Cards
    const cardProcessor = yield* CardProcessor
    const settings = yield* WalletSettings
    const audit = yield* AuditLog
    const config = yield* AppConfig
    /** The account's Stripe customer, made once: the card a top-up saves is attached to it. */
    const customerOf = (accountId: string, email: string | null) =>
      Effect.gen(function*() {
        const known = yield* cards.find(accountId)
        const customerId = yield* cardProcessor.ensureCustomer(accountId, email, known?.customerId ?? null)
        yield* cards.saveCustomer(accountId, customerId)
        return customerId
      })
    const read = (accountId: string) =>
      Effect.flatMap(settings.get(accountId), (row) =>
        row === undefined ? Effect.dieMessage(`no wallet for account ${accountId}`) : Effect.succeed(row))
    const cardOf = (accountId: string) =>
      Effect.map(cards.find(accountId), toCard)
    const current = (accountId: string) => Effect.zipWith(read(accountId), cardOf(accountId), toSettings)
    return handlers
      .handle("checkout", ({ payload }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          // Each session costs a call to the payment processor and a pending row: limited per client address.
          yield* ipLimits.take("checkouts", yield* ipLimits.client)
          const saveCardFor = payload.save_card === true ? yield* customerOf(account.id, account.email) : null
          const pending = yield* payments.createPending(account.id, payload.amount_sen, config.sstRateBps)
          const transactionId = pending.id
          const session = yield* processor.createCheckout({
            transactionId,
            accountId: account.id,
            amountSen: pending.amountSen,
            taxSen: pending.taxSen,
            taxRateBps: pending.rateBps,
            email: account.email,
            saveCardFor
          }).pipe(Effect.tapError(() => Effect.orDie(payments.fail(transactionId))))
          const money = { amount_sen: pending.amountSen, tax_sen: pending.taxSen, total_sen: pending.totalSen }
          yield* audit.within(payments.attachSession(transactionId, session.sessionId), () => ({
            action: "billing.checkout_created",
            targetType: "checkout",
            targetId: transactionId,
            details: { ...money, session_id: session.sessionId, save_card: saveCardFor !== null }
          }))
          return { url: session.url, session_id: session.sessionId, transaction_id: transactionId, ...money }
        }))
      .handle("balance", () =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const wallet = yield* spending.balance(account.id)
          return {
            wallet,
            balance_myr: toMyrNumber(microMyr(wallet.availableMicroMyr)),
            reserved_myr: toMyrNumber(microMyr(wallet.reservedMicroMyr)),
            lifetime_topup_myr: toMyrNumber(microMyr(wallet.lifetimeTopupMicroMyr)),
            lifetime_spend_myr: toMyrNumber(microMyr(wallet.lifetimeSpendMicroMyr)),
            topup_options_sen: TOPUP_OPTIONS_SEN,
            topup_options: TOPUP_OPTIONS_SEN.map((amount) => {
              const taxed = taxOn(amount, config.sstRateBps)
              return { amount_sen: taxed.amountSen, tax_sen: taxed.taxSen, total_sen: taxed.totalSen }
            }),
            sst_rate_bps: config.sstRateBps,
            account_suspended: account.suspended
          }
        }))
      .handle("transactions", ({ urlParams }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          yield* spending.settled
          const rows = yield* wallets.ledger(account.id, urlParams)
          const ids = [...new Set(rows.flatMap((row) => row.paymentTransactionId ?? []))]
          const paid = new Map((yield* Effect.orDie(payments.findMany(account.id, ids))).map((t) => [t.id, t]))
          return {
            ledger: rows.map(({ createdAt, paymentTransactionId, ...row }) => {
              const payment = paymentTransactionId === null ? undefined : paid.get(paymentTransactionId)
              return {
                ...row,
                createdAt: createdAt.toISOString(),
                payment: payment === undefined ? null : {
                  transaction_id: payment.id,
                  amount_sen: payment.amountSen,
                  tax_sen: payment.taxSen,
                  total_sen: payment.amountSen + payment.taxSen
                }
              }
            }),
            page: urlParams.page,
            limit: urlParams.limit
          }
        }))
      .handle("settings", () => Effect.flatMap(CurrentAccount, (account) => current(account.id)))
      .handle("updateSettings", ({ payload }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const change = toChange(payload)
          if (change.autoTopupEnabled === true) {
            const before = yield* read(account.id)
            const missing = autoTopupGap(before, change, yield* cardOf(account.id))
            if (missing !== undefined) {
              return yield* new InvalidRequest({ message: missing.message, param: missing.param })
            }
          }
          yield* audit.within(settings.set(account.id, change), () => ({
            action: "billing.settings_updated",
            targetType: "billing",
            targetId: null,
            details: { ...payload }
          }))
          return yield* current(account.id)
        }))
      .handle("saveCard", () =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          // A setup-mode Checkout Session costs what a top-up's does: counted in the same per-address budget.
          yield* ipLimits.take("checkouts", yield* ipLimits.client)
          const customerId = yield* customerOf(account.id, account.email)
          const setupId = yield* audit.within(cards.openSetup(account.id), (id) => ({
            action: "billing.card_setup_started",
            targetType: "card",
            targetId: id,
            details: {}
          }))
          const session = yield* cardProcessor.createSetupCheckout({ accountId: account.id, customerId, setupId })
          yield* cards.attachSetupSession(setupId, session.sessionId)
          return { session_id: session.sessionId, url: session.url }
        }))
      .handle("forgetCard", () =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          yield* audit.within(
            Effect.zipLeft(cards.forget(account.id), settings.set(account.id, { autoTopupEnabled: false })),
            (forgotten) =>
              forgotten
                ? { action: "billing.card_removed", targetType: "card", targetId: null, details: { auto_topup: false } }
                : undefined
          )
          return yield* current(account.id)
        }))
  }))

const WEBHOOK_GUIDANCE =
  "Stripe signs each delivery with the endpoint's signing secret (STRIPE_WEBHOOK_SECRET); deliver the body unchanged."

/** Stripe's own message, to its first sentence: the rest is advice for framework users. */
const signatureRefused = (reason: string) =>
  new AuthenticationError({
    message: `The Stripe-Signature header does not verify this body: ${reason.split(/(?<=\.)\s/)[0]?.trim() ?? reason}`,
    guidance: WEBHOOK_GUIDANCE
  })

/** Verifies the raw body against `Stripe-Signature`, then applies the event once. */
export const StripeWebhookLive = HttpApiBuilder.group(NenasApi, "stripeWebhook", (handlers) =>
  Effect.gen(function*() {
    const processor = yield* PaymentProcessor
    const payments = yield* Payments
    const metrics = yield* Metrics
    // Events that never reached `apply` (no signature, a bad one, a body of the wrong shape) have no trusted type.
    const rejected = () => Effect.sync(() => metrics.webhookEvents.inc({ type: "unverified", result: "rejected" }))
    return handlers.handle("stripe", () =>
      Effect.gen(function*() {
        const request = yield* HttpServerRequest.HttpServerRequest
        const signature = request.headers["stripe-signature"]
        if (signature === undefined || signature === "") {
          return yield* new AuthenticationError({
            message: "The Stripe-Signature header is missing.",
            guidance: WEBHOOK_GUIDANCE
          })
        }
        const body = new Uint8Array(yield* Effect.orDie(request.arrayBuffer))
        const receivedAt = yield* Clock.currentTimeMillis
        const verified = yield* Effect.tryPromise({
          try: () =>
            Stripe.webhooks.constructEventAsync(
              body,
              signature,
              Redacted.value(processor.webhookSecret),
              undefined,
              undefined,
              receivedAt
            ),
          // The signature is checked before the body is parsed: a SyntaxError means a signed body that is not JSON.
          catch: (error) =>
            error instanceof SyntaxError
              ? new InvalidRequest({ message: "The event body is not JSON." })
              : signatureRefused(error instanceof Error ? error.message : "verification failed")
        })
        // Parsed, but deep nesting would overflow the stack of whatever walks it next (storing, decoding).
        if (jsonDeeperThan(new TextDecoder().decode(body), MAX_JSON_DEPTH)) {
          return yield* new InvalidRequest({ message: `The event nests deeper than ${MAX_JSON_DEPTH} levels.` })
        }
        const event = yield* Schema.decodeUnknown(StripeEvent)(verified).pipe(
          Effect.mapError(() => new InvalidRequest({ message: "The event has no id, type or data.object." }))
        )
        const processed = yield* payments.apply(event).pipe(
          Effect.tapError((error) =>
            Effect.logError(`Stripe event ${event.id} (${event.type}) was not applied`, error)
          ),
          Effect.catchTag("MalformedEvent", (malformed) =>
            new InvalidRequest({
              message:
                `The event's data.object does not have the shape of a ${malformed.eventType.slice(0, 60)} event; ` +
                "it was kept for an operator and nothing was applied."
            })),
          Effect.tapErrorTag(
            "SqlError",
            () => Effect.sync(() => metrics.webhookEvents.inc({ type: event.type, result: "failed" }))
          ),
          Effect.catchTag("SqlError", Effect.die)
        )
        metrics.webhookEvents.inc({ type: event.type, result: processed ? "processed" : "ignored" })
        yield* Effect.logInfo("webhook").pipe(Effect.annotateLogs({ eventId: event.id, type: event.type, processed }))
        return { received: true, processed }
      }).pipe(Effect.tapError(rejected)))
  }))

/** The simulated checkout's page and its Pay and Cancel; 404 while Stripe is configured. */
export const DevCheckoutLive = HttpApiBuilder.group(NenasApi, "devCheckout", (handlers) =>
  Effect.gen(function*() {
    const config = yield* AppConfig
    const processor = yield* PaymentProcessor
    const payments = yield* PaymentsRepo
    const cards = yield* Cards
    const client = yield* HttpClient.HttpClient
    const find = (sessionId: string) =>
      Effect.gen(function*() {
        const transaction = processor.simulated ? yield* Effect.orDie(payments.findBySession(sessionId)) : undefined
        if (transaction === undefined) {
          return yield* new NotFound({ message: `No simulated checkout session ${sessionId}.`, param: "session_id" })
        }
        return transaction
      })
    /** The test card a form posted: one of Stripe's test numbers, else refused. */
    const postedCard = Effect.gen(function*() {
      const form = new URLSearchParams(yield* Effect.orDie((yield* HttpServerRequest.HttpServerRequest).text))
      const number = (form.get("card_number") ?? "").replace(/[\s-]/g, "")
      if (TEST_CARDS[number] !== undefined) return number
      return yield* new InvalidRequest({
        message: `${number.slice(0, 19)} is not one of the simulated test cards: ${
          Object.keys(TEST_CARDS).join(", ")
        }.`,
        param: "card_number"
      })
    })
    const finish = (sessionId: string, outcome: CheckoutOutcome) =>
      Effect.gen(function*() {
        const transaction = yield* find(sessionId)
        // A top-up saving its card is paid with one; a cancel needs none.
        const saving = outcome === "checkout.session.completed" && sessionId.startsWith(SIMULATED_SAVING_PREFIX)
        const cardNumber = saving ? yield* postedCard : null
        // As on Stripe's page, only an open session can be paid or cancelled.
        if (transaction.status === "pending") {
          const created = Math.floor((yield* Clock.currentTimeMillis) / 1000)
          yield* deliver(
            client,
            config,
            processor.webhookSecret,
            sessionEvent(transaction, sessionId, outcome, created, cardNumber)
          )
        }
        const settled = yield* find(sessionId)
        const returnUrl = outcome === "checkout.session.completed"
          ? `${config.dashboardUrl}/billing?checkout=success&session_id=${encodeURIComponent(sessionId)}`
          : `${config.dashboardUrl}/billing?checkout=cancelled`
        return resultPage(settled, returnUrl)
      })
    const findSetup = (sessionId: string) =>
      Effect.flatMap(Effect.orDie(cards.findSetup(sessionId)), (setup) =>
        setup === undefined || !processor.simulated
          ? Effect.fail(new NotFound({ message: `No simulated setup session ${sessionId}.`, param: "session_id" }))
          : Effect.succeed(setup))
    return handlers
      .handle(
        "setupPage",
        ({ path }) =>
          Effect.map(findSetup(path.session_id), (setup) => setupPage(path.session_id, setup.status === "open"))
      )
      .handle("setupSave", ({ path }) =>
        Effect.gen(function*() {
          const setup = yield* findSetup(path.session_id)
          const number = yield* postedCard
          if (setup.status === "open") {
            const created = Math.floor((yield* Clock.currentTimeMillis) / 1000)
            yield* deliver(
              client,
              config,
              processor.webhookSecret,
              setupEvent(path.session_id, setup.accountId, simulatedSetupIntent(number), created)
            )
          }
          return setupResultPage(`${config.dashboardUrl}/billing?card=saved`)
        }))
      .handle("page", ({ path }) => Effect.map(find(path.session_id), (t) => checkoutPage(t, path.session_id)))
      .handle("refund", ({ path, payload }) =>
        Effect.gen(function*() {
          const transaction = yield* find(path.session_id)
          if (transaction.status !== "succeeded" || transaction.paymentIntentId === null) {
            return yield* new InvalidRequest({ message: "Only a paid checkout can be refunded.", param: "session_id" })
          }
          const paid = transaction.amountSen + transaction.taxSen
          const refunded = Math.min(paid, transaction.refundedMicroMyr / MICRO_PER_SEN + payload.amount_sen)
          const event = refundEvent(transaction, refunded, Math.floor((yield* Clock.currentTimeMillis) / 1000))
          yield* deliver(client, config, processor.webhookSecret, event)
          return { charge_id: event.data.object.id, amount_refunded_sen: refunded }
        }))
      .handle("pay", ({ path }) => finish(path.session_id, "checkout.session.completed"))
      .handle("cancel", ({ path }) => finish(path.session_id, "checkout.session.expired"))
  })).pipe(Layer.provide(FetchHttpClient.layer))

/** The payment services the handlers above use. */
export const PaymentsServicesLive = Layer.merge(Payments.layer, AutoTopupWorker).pipe(
  Layer.provideMerge(AutoTopupOutcomes.layer),
  Layer.provideMerge(
    Layer.mergeAll(
      PaymentsRepo.layer,
      Cards.layer,
      CardProcessor.layer,
      AutoTopups.layer,
      WalletSettings.layer,
      Documents.layer
    )
  )
)
