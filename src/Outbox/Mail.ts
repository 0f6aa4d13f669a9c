import { SqlClient, SqlSchema } from "@effect/sql"
import { Clock, Context, Duration, Effect, Layer, Option, Redacted, Schedule, Schema } from "effect"
import { AppConfig } from "../AppConfig.js"
import { makeTestLayer } from "../Domain/TestLayer.js"
import { now } from "../Domain/Time.js"
import { DASHBOARD_URL } from "./Events.js"
import { backoffMs, RETRY_WINDOW_MS } from "./Retries.js"

export const MailRow = Schema.Struct({
  id: Schema.String,
  accountId: Schema.String,
  toAddress: Schema.String,
  subject: Schema.String,
  body: Schema.String,
  status: Schema.Literal("pending", "sent", "kept", "failed"),
  createdAt: Schema.DateFromSelf,
  sentAt: Schema.NullOr(Schema.DateFromSelf)
})
export type MailRow = typeof MailRow.Type

const Claimed = Schema.Struct({ ...MailRow.fields, attempts: Schema.Int })
type Claimed = typeof Claimed.Type

const SEND_TIMEOUT = Duration.seconds(30)
const CLAIM_BATCH = 10

/**
 * Sends the emails the outbox holds (written in the transactions that cause
 * them), claimed across instances as webhook deliveries are. With `SMTP_URL`,
 * through `nodemailer`; without it, each is kept in the development mailbox
 * (`/dev/mailbox`), which shows what would have been sent.
 */
export class Mail extends Context.Tag("nenas/Mail")<Mail, {
  readonly runOnce: Effect.Effect<number>
  /** Whether emails go out (SMTP_URL set) rather than into the development mailbox. */
  readonly sending: boolean
  /** The newest emails, sent or kept (a failed read is a defect). */
  readonly recent: (limit: number) => Effect.Effect<ReadonlyArray<MailRow>>
}>() {
  static readonly layer = Layer.effect(
    Mail,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const config = yield* AppConfig
      // Loaded only where emails go out (docs/performance.md, "Modules loaded when used").
      const transport = Option.isNone(config.smtpUrl)
        ? Option.none()
        : Option.some((yield* Effect.promise(() => import("nodemailer"))).default.createTransport(
          Redacted.value(config.smtpUrl.value)
        ))
      const render = (text: string) => text.replaceAll(DASHBOARD_URL, config.dashboardUrl)

      const claim = SqlSchema.findAll({
        Request: Schema.DateFromSelf,
        Result: Claimed,
        execute: (now) =>
          sql`
          UPDATE outbox_emails SET claimed_until = ${new Date(
            now.getTime() + Duration.toMillis(SEND_TIMEOUT) * 2
          )}, attempts = attempts + 1
          WHERE id IN (
            SELECT id FROM outbox_emails
            WHERE status = 'pending' AND next_attempt_at <= ${now} AND (claimed_until IS NULL OR claimed_until < ${now})
            ORDER BY next_attempt_at LIMIT ${CLAIM_BATCH} FOR UPDATE SKIP LOCKED
          )
          RETURNING id, account_id, to_address, subject, body, status, created_at, sent_at, attempts
        `
      })
      const recent = SqlSchema.findAll({
        Request: Schema.Number,
        Result: MailRow,
        execute: (limit) =>
          sql`
            SELECT id, account_id, to_address, subject, body, status, created_at, sent_at
            FROM outbox_emails ORDER BY created_at DESC, id DESC LIMIT ${limit}
          `
      })

      const send = (mail: Claimed) =>
        Effect.gen(function*() {
          const outcome = yield* Option.match(transport, {
            onNone: () => Effect.succeed<"kept" | "sent">("kept"),
            onSome: (smtp) =>
              Effect.tryPromise(() =>
                smtp.sendMail({
                  from: config.emailFrom,
                  to: mail.toAddress,
                  subject: mail.subject,
                  text: render(mail.body)
                })
              ).pipe(
                Effect.timeout(SEND_TIMEOUT),
                Effect.as("sent" as const)
              )
          }).pipe(Effect.either)
          const now = yield* Clock.currentTimeMillis
          if (outcome._tag === "Right") {
            yield* sql`UPDATE outbox_emails SET status = ${outcome.right}, sent_at = ${new Date(
              now
            )}, claimed_until = NULL WHERE id = ${mail.id}`
            return
          }
          const error = String(outcome.left).slice(0, 300)
          yield* Effect.logWarning(`email ${mail.id} was not sent: ${error}`)
          yield* now - mail.createdAt.getTime() >= RETRY_WINDOW_MS
            ? sql`UPDATE outbox_emails SET status = 'failed', last_error = ${error}, claimed_until = NULL WHERE id = ${mail.id}`
            : sql`UPDATE outbox_emails SET next_attempt_at = ${new Date(
              now + backoffMs(mail.attempts)
            )}, last_error = ${error},
                    claimed_until = NULL WHERE id = ${mail.id}`
        }).pipe(Effect.catchAllCause((cause) => Effect.logWarning(`email ${mail.id} was not recorded`, cause)))

      const runOnce = Effect.gen(function*() {
        const claimed = yield* claim(yield* now)
        yield* Effect.forEach(claimed, send, { concurrency: CLAIM_BATCH, discard: true })
        return claimed.length
      }).pipe(Effect.catchAllCause((cause) => Effect.as(Effect.logWarning("email claim failed", cause), 0)))

      return Mail.of({
        runOnce,
        sending: Option.isSome(transport),
        recent: (limit) =>
          recent(limit).pipe(
            Effect.map((rows) => rows.map((row) => ({ ...row, body: render(row.body) }))),
            Effect.orDie,
            Effect.withSpan("Mail.recent")
          )
      })
    })
  )

  /** Sends in the background for the life of the service. */
  static readonly layerRunning = Layer.scopedDiscard(Effect.gen(function*() {
    const mail = yield* Mail
    const config = yield* AppConfig
    yield* Effect.forkScoped(Effect.repeat(mail.runOnce, Schedule.spaced(Duration.millis(config.outboxPollMs))))
  })).pipe(Layer.provideMerge(Mail.layer))

  static readonly Test = makeTestLayer(Mail)
}
