import { SqlClient, type SqlError } from "@effect/sql"
import { Context, Effect, Layer, Schema } from "effect"
import { now } from "../Domain/Time.js"
import { GuardrailPolicy } from "./Api.js"

/**
 * The accounts' guardrail policies (`guardrail_policies`): this module is the table's only reader and
 * writer. The policy is read as text and decoded here: the client's name transform would rename the keys
 * inside the jsonb (`apply_to`). A write is announced by the table's trigger, so every instance reads the
 * new policy with its next call (docs/api/guardrails.md, "Policies").
 */

export interface StoredPolicy {
  readonly policy: GuardrailPolicy
  readonly updatedAt: Date
}

const decodePolicy = Schema.decodeUnknownSync(Schema.parseJson(GuardrailPolicy))

export class GuardrailsRepo extends Context.Tag("nenas/GuardrailsRepo")<GuardrailsRepo, {
  readonly find: (accountId: string) => Effect.Effect<StoredPolicy | undefined, SqlError.SqlError>
  /** Saves the policy whole, in the caller's transaction when there is one. */
  readonly save: (
    accountId: string,
    policy: GuardrailPolicy,
    memberId: string | null
  ) => Effect.Effect<StoredPolicy, SqlError.SqlError>
}>() {
  static readonly layer = Layer.effect(
    GuardrailsRepo,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      return GuardrailsRepo.of({
        find: (accountId) =>
          Effect.map(
            sql<{ readonly policy: string; readonly updatedAt: Date }>`
              SELECT policy::text AS policy, updated_at FROM guardrail_policies WHERE account_id = ${accountId}
            `,
            (rows) => {
              const row = rows[0]
              return row === undefined ? undefined : { policy: decodePolicy(row.policy), updatedAt: row.updatedAt }
            }
          ),
        save: (accountId, policy, memberId) =>
          Effect.gen(function*() {
            const at = yield* now
            yield* sql`
              INSERT INTO guardrail_policies (account_id, policy, updated_at, updated_by)
              VALUES (${accountId}, ${JSON.stringify(policy)}::jsonb, ${at}, ${memberId})
              ON CONFLICT (account_id) DO UPDATE
                SET policy = EXCLUDED.policy, updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by
            `
            return { policy, updatedAt: at }
          })
      })
    })
  )
}
