import { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql"
import { Clock, Context, Effect, Layer } from "effect"
import { newId } from "../Domain/Ids.js"
import type { SavedCard } from "./CardProcessor.js"

export interface CardRow {
  readonly customerId: string
  readonly paymentMethodId: string | null
  readonly brand: string | null
  readonly last4: string | null
  readonly expMonth: number | null
  readonly expYear: number | null
}

export interface CardSetup {
  readonly id: string
  readonly accountId: string
  readonly sessionId: string | null
  readonly status: "open" | "complete"
}

const now = Effect.map(Clock.currentTimeMillis, (ms) => new Date(ms))

/** The account's Stripe customer and saved card, and the setup sessions that save one. */
export class Cards extends Context.Tag("nenas/Cards")<Cards, {
  readonly find: (accountId: string) => Effect.Effect<CardRow | undefined, SqlError.SqlError>
  readonly saveCustomer: (accountId: string, customerId: string) => Effect.Effect<void, SqlError.SqlError>
  readonly saveCard: (accountId: string, card: SavedCard) => Effect.Effect<void, SqlError.SqlError>
  /** Forgets the card (the customer stays); false when none was saved. */
  readonly forget: (accountId: string) => Effect.Effect<boolean, SqlError.SqlError>
  readonly openSetup: (accountId: string) => Effect.Effect<string, SqlError.SqlError>
  readonly attachSetupSession: (setupId: string, sessionId: string) => Effect.Effect<void, SqlError.SqlError>
  readonly findSetup: (sessionId: string) => Effect.Effect<CardSetup | undefined, SqlError.SqlError>
  /** Marks an open setup complete (locks it); false when it was complete already. */
  readonly completeSetup: (setupId: string) => Effect.Effect<boolean, SqlError.SqlError>
}>() {
  static readonly layer = Layer.effect(
    Cards,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      return Cards.of({
        find: (accountId) =>
          Effect.map(
            sql<CardRow>`SELECT customer_id, payment_method_id, brand, last4, exp_month, exp_year FROM billing_cards WHERE account_id = ${accountId}`,
            (rows) => rows[0]
          ),
        saveCustomer: (accountId, customerId) =>
          Effect.flatMap(now, (at) =>
            sql`INSERT INTO billing_cards (account_id, customer_id, updated_at) VALUES (${accountId}, ${customerId}, ${at})
                ON CONFLICT (account_id) DO NOTHING`),
        saveCard: (accountId, card) =>
          Effect.flatMap(now, (at) =>
            sql`UPDATE billing_cards SET payment_method_id = ${card.paymentMethodId}, brand = ${card.brand}, last4 = ${card.last4},
                  exp_month = ${card.expMonth}, exp_year = ${card.expYear}, updated_at = ${at}
                WHERE account_id = ${accountId}`),
        forget: (accountId) =>
          Effect.map(
            sql`UPDATE billing_cards SET payment_method_id = NULL, brand = NULL, last4 = NULL, exp_month = NULL, exp_year = NULL
                WHERE account_id = ${accountId} AND payment_method_id IS NOT NULL RETURNING account_id`,
            (rows) => rows.length > 0
          ),
        openSetup: (accountId) =>
          Effect.gen(function*() {
            const id = newId("cset")
            yield* sql`INSERT INTO card_setups (id, account_id, status, created_at) VALUES (${id}, ${accountId}, 'open', ${yield* now})`
            return id
          }),
        attachSetupSession: (setupId, sessionId) => Effect.asVoid(sql`UPDATE card_setups SET session_id = ${sessionId} WHERE id = ${setupId}`),
        findSetup: (sessionId) =>
          Effect.map(sql<CardSetup>`SELECT id, account_id, session_id, status FROM card_setups WHERE session_id = ${sessionId}`, (rows) => rows[0]),
        completeSetup: (setupId) =>
          Effect.map(
            sql`UPDATE card_setups SET status = 'complete' WHERE id = ${setupId} AND status = 'open' RETURNING id`,
            (rows) => rows.length > 0
          )
      })
    })
  )
}
