import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import { Effect } from "effect"
import { NenasApi } from "../Api.js"
import { AppConfig } from "../AppConfig.js"
import { CurrentAccount } from "../Auth/Api.js"
import { NotFound } from "../Domain/Errors.js"
import { ADMINS } from "../Domain/Roles.js"
import { Mail } from "../Outbox/Mail.js"
import { WalletSettings } from "../Wallet/Settings.js"
import { Spending } from "../Wallet/Spending.js"
import { WebhookEndpoints } from "../Webhooks/Endpoints.js"
import { bannersOf } from "./Banners.js"
import { mailboxPage } from "./Mailbox.js"

export const AlertsLive = HttpApiBuilder.group(NenasApi, "alerts", (handlers) =>
  Effect.gen(function*() {
    const settings = yield* WalletSettings
    const spending = yield* Spending
    const endpoints = yield* WebhookEndpoints
    return handlers.handle("banners", () =>
      Effect.gen(function*() {
        const account = yield* CurrentAccount
        const wallet = yield* spending.balance(account.id)
        const row = yield* settings.get(account.id)
        if (row === undefined) return yield* Effect.dieMessage(`no wallet for account ${account.id}`)
        const list = yield* endpoints.list(account.id)
        return { banners: bannersOf(wallet, row, list, ADMINS.includes(account.member.role)) }
      }))
  }))

/** The development mailbox; 404 while SMTP_URL is set or in production. */
export const DevMailboxLive = HttpApiBuilder.group(NenasApi, "devMailbox", (handlers) =>
  Effect.gen(function*() {
    const mail = yield* Mail
    const config = yield* AppConfig
    const open = mail.sending || config.production
      ? Effect.fail(new NotFound({ message: "The development mailbox exists only while SMTP_URL is unset." }))
      : Effect.void
    const recent = Effect.zipRight(open, mail.recent(100))
    return handlers
      .handle("page", () => Effect.map(recent, mailboxPage))
      .handle("messages", () =>
        Effect.map(recent, (rows) => ({
          messages: rows.map((m) => ({
            id: m.id,
            to: m.toAddress,
            subject: m.subject,
            body: m.body,
            status: m.status,
            created_at: m.createdAt.toISOString()
          }))
        })))
  }))
