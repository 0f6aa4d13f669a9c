import { Effect } from "effect"
import { NotFound } from "../Domain/Errors.js"
import type { KeysRepo } from "./Repo.js"

/** A filter's `api_key_id`: logs of deleted keys stay visible; an id the account never had answers 404. */
export const requireAccountKey = (keys: typeof KeysRepo.Service, accountId: string, keyId: string | undefined) =>
  keyId === undefined ? Effect.void : Effect.flatMap(
    keys.isAccountKey(accountId, keyId),
    (found) =>
      found
        ? Effect.void
        : Effect.fail(new NotFound({ message: `No API key with id '${keyId}'.`, param: "api_key_id" }))
  )
