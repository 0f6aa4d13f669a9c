import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import { Effect, Layer } from "effect"
import { NenasApi } from "../Api.js"
import { AppConfig } from "../AppConfig.js"
import { AuditLog } from "../Audit/Repo.js"
import { CurrentAccount } from "../Auth/Api.js"
import { InvalidRequest, NotFound, RateLimitExceeded } from "../Domain/Errors.js"
import { EVENT_TYPES } from "../Domain/EventTypes.js"
import { ADMINS, type Role } from "../Domain/Roles.js"
import { HostResolver } from "../Search/Fetch.js"
import type { WebhookDelivery, WebhookEndpoint } from "./Api.js"
import {
  type AttemptRow,
  type DeliveryRow,
  type EndpointRow,
  MANUAL_SENDS_PER_MINUTE,
  WebhookEndpoints
} from "./Endpoints.js"
import { maskedUrl } from "./MaskedUrl.js"
import { NOT_ALLOWED, refusedWebhookUrl } from "./SignedPost.js"

const SECRET_WARNING =
  "Store this signing secret now: it is shown only once. Verify every delivery with it (Standard Webhooks)."
const MAX_ENDPOINTS = 20

/** Whether `role` reads webhook URLs whole: those who manage webhooks. */
const seesWholeUrls = (role: Role): boolean => ADMINS.includes(role)

const toEndpoint = (row: EndpointRow, role: Role): typeof WebhookEndpoint.Type => ({
  id: row.id,
  url: seesWholeUrls(role) ? row.url : maskedUrl(row.url),
  description: row.description,
  events: row.events,
  status: row.disabledAt === null ? "enabled" : "disabled",
  disabled_reason: row.disabledReason,
  failing_since: row.failingSince?.toISOString() ?? null,
  created_by_removed: row.creatorRemovedAt !== null,
  created_at: row.createdAt.toISOString(),
  updated_at: row.updatedAt.toISOString()
})

const toDelivery = (
  row: DeliveryRow & { readonly attemptLog: ReadonlyArray<AttemptRow> }
): typeof WebhookDelivery.Type => ({
  id: row.id,
  event_id: row.eventId,
  event_type: row.eventType,
  status: row.status,
  attempts: row.attempts,
  next_attempt_at: row.status === "pending" ? row.nextAttemptAt.toISOString() : null,
  created_at: row.createdAt.toISOString(),
  delivered_at: row.deliveredAt?.toISOString() ?? null,
  attempt_log: row.attemptLog.map((a) => ({
    attempt: a.attempt,
    attempted_at: a.attemptedAt.toISOString(),
    status_code: a.statusCode,
    latency_ms: a.latencyMs,
    ok: a.ok,
    error: a.error,
    response_excerpt: a.responseExcerpt
  }))
})

const noSuchEndpoint = (id: string) => new NotFound({ message: `No webhook endpoint with id '${id}'.`, param: "id" })

export const WebhooksLive = HttpApiBuilder.group(NenasApi, "webhooks", (handlers) =>
  Effect.gen(function*() {
    const endpoints = yield* WebhookEndpoints
    const audit = yield* AuditLog
    const config = yield* AppConfig
    const resolver = yield* HostResolver
    /**
     * The address guard deliveries apply, at registration: a refused URL is a 400, not a silent failure later.
     * Its answer never says why (what the host resolves to would be an internal DNS oracle); the log does.
     */
    const checkUrl = (url: string) =>
      Effect.flatMap(refusedWebhookUrl(resolver, config.webhookAllowedHosts, url), (refused) =>
        refused === undefined ? Effect.void : Effect.zipRight(
          Effect.logInfo(`webhook URL refused: ${url.slice(0, 300)}: ${refused}`),
          new InvalidRequest({
            message: `The webhook URL is refused: ${NOT_ALLOWED}.`,
            param: "url",
            guidance:
              "Use a public https URL. A receiver on this machine or a private network must be listed in WEBHOOK_ALLOWED_HOSTS by the operator."
          })
        ))
    /** Test events and resends are the account's to ask for, 10 a minute: each is an outbound request we make. */
    const manualSend = (accountId: string) =>
      Effect.flatMap(endpoints.countManualSend(accountId), ({ resetsInMs, sends }) =>
        sends <= MANUAL_SENDS_PER_MINUTE ? Effect.void : new RateLimitExceeded({
          message: `At most ${MANUAL_SENDS_PER_MINUTE} webhook test events and resends a minute per account.`,
          retry_after_seconds: Math.max(1, Math.ceil(resetsInMs / 1000))
        }))
    const found = <A>(id: string, value: A | undefined) =>
      value === undefined ? Effect.fail(noSuchEndpoint(id)) : Effect.succeed(value)
    return handlers
      .handle("create", ({ payload }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          yield* checkUrl(payload.url)
          const existing = yield* endpoints.list(account.id)
          if (existing.length >= MAX_ENDPOINTS) {
            return yield* new InvalidRequest({
              message: `An account may have at most ${MAX_ENDPOINTS} webhook endpoints.`
            })
          }
          const created = yield* audit.within(
            endpoints.create(account.id, {
              url: payload.url,
              description: payload.description,
              events: [...new Set(payload.events)],
              createdBy: account.member.id
            }),
            // Every role reads the audit log: the URL's token stays out of it.
            ({ endpoint }) => ({
              action: "webhook.created",
              targetType: "webhook",
              targetId: endpoint.id,
              details: { url: maskedUrl(endpoint.url), events: endpoint.events }
            })
          )
          return {
            endpoint: toEndpoint(created.endpoint, account.member.role),
            secret: created.secret,
            warning: SECRET_WARNING
          }
        }))
      .handle("list", () =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          return {
            endpoints: (yield* endpoints.list(account.id)).map((row) =>
              toEndpoint(row, account.member.role)
            )
          }
        }))
      .handle("events", () =>
        Effect.succeed({ event_types: EVENT_TYPES }))
      .handle("get", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          return toEndpoint(yield* found(path.id, yield* endpoints.find(account.id, path.id)), account.member.role)
        }))
      .handle("update", ({ path, payload }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          if (payload.url !== undefined) {
            yield* checkUrl(payload.url)
          }
          const events = payload.events === undefined ? undefined : [...new Set(payload.events)]
          const row = yield* audit.within(
            endpoints.update(account.id, path.id, { ...payload, events }),
            (updated) =>
              updated === undefined ? undefined : {
                action: "webhook.updated",
                targetType: "webhook",
                targetId: updated.id,
                details: payload.url === undefined
                  ? { ...payload }
                  : Object.assign({}, payload, { url: maskedUrl(payload.url) })
              }
          )
          return toEndpoint(yield* found(path.id, row), account.member.role)
        }))
      .handle("delete", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const removed = yield* audit.within(
            endpoints.remove(account.id, path.id),
            (gone) =>
              gone ? { action: "webhook.deleted", targetType: "webhook", targetId: path.id, details: {} } : undefined
          )
          if (!removed) {
            return yield* noSuchEndpoint(path.id)
          }
          return { ok: true as const }
        }))
      .handle("rotate", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          const rotated = yield* audit.within(
            endpoints.rotateSecret(account.id, path.id),
            (secret) =>
              secret === undefined
                ? undefined
                : { action: "webhook.secret_rotated", targetType: "webhook", targetId: path.id, details: {} }
          )
          const secret = yield* found(path.id, rotated)
          return { secret, warning: SECRET_WARNING }
        }))
      .handle("test", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          yield* manualSend(account.id)
          const sent = yield* audit.within(
            endpoints.sendTest(account.id, path.id),
            (eventId) =>
              eventId === undefined ? undefined : {
                action: "webhook.test_sent",
                targetType: "webhook",
                targetId: path.id,
                details: { event_id: eventId }
              }
          )
          const eventId = yield* found(path.id, sent)
          return { event_id: eventId }
        }))
      .handle("deliveries", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          yield* found(path.id, yield* endpoints.find(account.id, path.id))
          const rows = yield* endpoints.deliveries(account.id, path.id, 50)
          return { deliveries: rows.map(toDelivery) }
        }))
      .handle("resend", ({ path }) =>
        Effect.gen(function*() {
          const account = yield* CurrentAccount
          yield* manualSend(account.id)
          const resent = yield* audit.within(
            endpoints.resend(account.id, path.id, path.delivery_id),
            (done) =>
              done
                ? {
                  action: "webhook.delivery_resent",
                  targetType: "webhook",
                  targetId: path.id,
                  details: { delivery_id: path.delivery_id }
                }
                : undefined
          )
          if (!resent) {
            return yield* new NotFound({
              message: `No delivery '${path.delivery_id}' of webhook endpoint '${path.id}'.`,
              param: "delivery_id"
            })
          }
          return { ok: true as const }
        }))
  })).pipe(Layer.provide(HostResolver.system))
