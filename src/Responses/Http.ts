import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Effect } from "effect"
import { NenasApi } from "../Api.js"
import { AuditLog } from "../Audit/Repo.js"
import { CurrentApiKey } from "../Auth/Api.js"
import { keyPrefix } from "../Keys/ApiKeys.js"
import { CallLimits } from "../Models/Admission/RateLimits.js"
import { inputItemsPage, renderStored, StoredConversations } from "../Models/OpenAi/StoredConversations.js"
import { currentRequestId } from "../Request/Context.js"

const JSON_TYPE = { contentType: "application/json" }

/** Stored responses: read, listed and deleted by any key of their account, each counted against the key's rate limits. */
export const StoredResponsesLive = HttpApiBuilder.group(
  NenasApi,
  "storedResponses",
  (handlers) =>
    Effect.gen(function*() {
      const limits = yield* CallLimits
      const stored = yield* StoredConversations
      const audit = yield* AuditLog
      /** The calling key's prefix, as the dashboard lists it: the audit log names the key that deleted. */
      const callerPrefix = Effect.map(
        HttpServerRequest.HttpServerRequest,
        (request) => keyPrefix((request.headers["authorization"] ?? "").replace(/^bearer\s+/i, ""))
      )
      /** `use` with the key's account, holding a rate-limit slot. */
      const admitted = <A, E, R>(use: (accountId: string) => Effect.Effect<A, E, R>) =>
        Effect.flatMap(
          Effect.zip(CurrentApiKey, currentRequestId),
          ([key, requestId]) => Effect.scoped(Effect.zipRight(limits.admit(key.keyId, requestId), use(key.accountId)))
        )
      return handlers
        .handle(
          "retrieve",
          ({ path }) =>
            admitted((accountId) =>
              Effect.map(stored.own(accountId, path.response_id), (response) =>
                HttpServerResponse.text(JSON.stringify(renderStored(response)), JSON_TYPE))
            )
        )
        .handle(
          "inputItems",
          ({ path, urlParams }) =>
            admitted((accountId) =>
              Effect.map(stored.own(accountId, path.response_id), (response) =>
                HttpServerResponse.text(JSON.stringify(inputItemsPage(response, urlParams)), JSON_TYPE))
            )
        )
        .handle("remove", ({ path }) =>
          Effect.flatMap(callerPrefix, (prefix) =>
            admitted((accountId) =>
              Effect.as(
                audit.withinAsKey(stored.remove(accountId, path.response_id), () => ({
                  action: "response.deleted",
                  targetType: "response",
                  targetId: path.response_id,
                  details: { actor_api_key_prefix: prefix }
                })),
                { id: path.response_id, object: "response" as const, deleted: true as const }
              )
            )))
    })
)
