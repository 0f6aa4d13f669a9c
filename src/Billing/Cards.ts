import { SqlClient, SqlSchema } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Context, Effect, Layer, Option, Schema } from "effect"
import { AuditLog } from "../Audit/Repo.js"
import { newId } from "../Domain/Ids.js"
import { makeTestLayer } from "../Domain/TestLayer.js"
import { now } from "../Domain/Time.js"
import type { SavedCard } from "./CardProcessor.js"

export const CardRow = Schema.Struct({
  customerId: Schema.String,
  paymentMethodId: Schema.NullOr(Schema.String),
  brand: Schema.NullOr(Schema.String),
  last4: Schema.NullOr(Schema.String),
  expMonth: Schema.NullOr(Schema.Number),
  expYear: Schema.NullOr(Schema.Number)
})
export type CardRow = typeof CardRow.Type

export const CardSetup = Schema.Struct({
  id: Schema.String,
  accountId: Schema.String,
  sessionId: Schema.NullOr(Schema.String),
  status: Schema.Literal("open", "complete")
})
export type CardSetup = typeof CardSetup.Type

/**
 * The account's Stripe customer and saved card, and the setup sessions that save one.
 * `saveCard`, `findSetup` and `completeSetup` run in the Stripe webhook's transaction, whose
 * handler counts a failed event by its `SqlError`: they keep it; the others make it a defect.
 */
export class Cards extends Context.Tag("nenas/Cards")<Cards, {
  readonly find: (accountId: string) => Effect.Effect<CardRow | undefined>
  readonly saveCustomer: (accountId: string, customerId: string) => Effect.Effect<void>
  readonly saveCard: (accountId: string, card: SavedCard) => Effect.Effect<void, SqlError.SqlError>
  /** Forgets the card (the customer stays); false when none was saved. */
  readonly forget: (accountId: string) => Effect.Effect<boolean>
  readonly openSetup: (accountId: string) => Effect.Effect<string>
  readonly attachSetupSession: (setupId: string, sessionId: string) => Effect.Effect<void>
  readonly findSetup: (sessionId: string) => Effect.Effect<CardSetup | undefined, SqlError.SqlError>
  /** Marks an open setup complete (locks it); false when it was complete already. */
  readonly completeSetup: (setupId: string) => Effect.Effect<boolean, SqlError.SqlError>
}>() {
  static readonly layer = Layer.effect(
    Cards,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const audit = yield* AuditLog
      const findCard = SqlSchema.findOne({
        Request: Schema.String,
        Result: CardRow,
        execute: (accountId) =>
          sql`SELECT customer_id, payment_method_id, brand, last4, exp_month, exp_year FROM billing_cards WHERE account_id = ${accountId}`
      })
      const findSetup = SqlSchema.findOne({
        Request: Schema.String,
        Result: CardSetup,
        execute: (sessionId) =>
          sql`SELECT id, account_id, session_id, status FROM card_setups WHERE session_id = ${sessionId}`
      })
      return Cards.of({
        find: (accountId) =>
          findCard(accountId).pipe(Effect.map(Option.getOrUndefined), Effect.orDie, Effect.withSpan("Cards.find")),
        saveCustomer: (accountId, customerId) =>
          Effect.flatMap(
            now,
            (at) =>
              sql`INSERT INTO billing_cards (account_id, customer_id, updated_at) VALUES (${accountId}, ${customerId}, ${at})
                ON CONFLICT (account_id) DO NOTHING`
          ).pipe(Effect.asVoid, Effect.orDie, Effect.withSpan("Cards.saveCustomer")),
        saveCard: (accountId, card) =>
          Effect.flatMap(
            now,
            (at) =>
              sql`UPDATE billing_cards SET payment_method_id = ${card.paymentMethodId}, brand = ${card.brand}, last4 = ${card.last4},
                  exp_month = ${card.expMonth}, exp_year = ${card.expYear}, updated_at = ${at}
                WHERE account_id = ${accountId}`
          ).pipe(
            // Saved by Stripe's event, in its transaction: the service did it, not a member.
            Effect.zipRight(audit.write(
              { accountId, memberId: null, actorEmail: null, clientAddress: null, requestId: null },
              {
                action: "billing.card_saved",
                targetType: "card",
                targetId: null,
                details: { brand: card.brand, last4: card.last4 }
              }
            ))
          ),
        forget: (accountId) =>
          Effect.map(
            sql`UPDATE billing_cards SET payment_method_id = NULL, brand = NULL, last4 = NULL, exp_month = NULL, exp_year = NULL
                WHERE account_id = ${accountId} AND payment_method_id IS NOT NULL RETURNING account_id`,
            (rows) => rows.length > 0
          ).pipe(Effect.orDie, Effect.withSpan("Cards.forget")),
        openSetup: (accountId) =>
          Effect.gen(function*() {
            const id = newId("cset")
            yield* sql`INSERT INTO card_setups (id, account_id, status, created_at) VALUES (${id}, ${accountId}, 'open', ${yield* now})`
            return id
          }).pipe(Effect.orDie, Effect.withSpan("Cards.openSetup")),
        attachSetupSession: (setupId, sessionId) =>
          sql`UPDATE card_setups SET session_id = ${sessionId} WHERE id = ${setupId}`.pipe(
            Effect.asVoid,
            Effect.orDie,
            Effect.withSpan("Cards.attachSetupSession")
          ),
        findSetup: (sessionId) =>
          findSetup(sessionId).pipe(
            Effect.map(Option.getOrUndefined),
            Effect.catchTag("ParseError", Effect.die),
            Effect.withSpan("Cards.findSetup")
          ),
        completeSetup: (setupId) =>
          Effect.map(
            sql`UPDATE card_setups SET status = 'complete' WHERE id = ${setupId} AND status = 'open' RETURNING id`,
            (rows) => rows.length > 0
          )
      })
    })
  )

  static readonly Test = makeTestLayer(Cards)
}
