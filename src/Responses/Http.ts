import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Effect } from "effect"
import { NenasApi } from "../Api.js"
import { CurrentApiKey } from "../Auth/Api.js"
import { CallLimits } from "../Models/RateLimits.js"
import { inputItemsPage, renderStored, StoredConversations } from "../Models/StoredConversations.js"
import { currentRequestId } from "../Request/Context.js"

const JSON_TYPE = { contentType: "application/json" }

/** Stored responses: read, listed and deleted by any key of their account, each counted against the key's rate limits. */
export const StoredResponsesLive = HttpApiBuilder.group(NenasApi, "storedResponses", (handlers) =>
  Effect.gen(function*() {
    const limits = yield* CallLimits
    const stored = yield* StoredConversations
    /** `use` with the key's account, holding a rate-limit slot. */
    const admitted = <A, E>(use: (accountId: string) => Effect.Effect<A, E>) =>
      Effect.flatMap(Effect.zip(CurrentApiKey, currentRequestId), ([key, requestId]) =>
        Effect.scoped(Effect.zipRight(limits.admit(key.keyId, requestId), use(key.accountId))))
    return handlers
      .handle("retrieve", ({ path }) =>
        admitted((accountId) =>
          Effect.map(stored.own(accountId, path.response_id), (response) =>
            HttpServerResponse.text(JSON.stringify(renderStored(response)), JSON_TYPE))))
      .handle("inputItems", ({ path, urlParams }) =>
        admitted((accountId) =>
          Effect.map(stored.own(accountId, path.response_id), (response) =>
            HttpServerResponse.text(JSON.stringify(inputItemsPage(response, urlParams)), JSON_TYPE))))
      .handle("remove", ({ path }) =>
        admitted((accountId) =>
          Effect.as(stored.remove(accountId, path.response_id), { id: path.response_id, object: "response" as const, deleted: true as const })))
  }))
