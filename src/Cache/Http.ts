import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import { Effect } from "effect"
import { NenasApi } from "../Api.js"
import { CurrentAccount } from "../Auth/Api.js"
import { ResponseCache } from "./ResponseCache.js"

export const CacheLive = HttpApiBuilder.group(
  NenasApi,
  "cache",
  (handlers) =>
    Effect.map(
      ResponseCache,
      (cache) =>
        handlers.handle("clear", () =>
          Effect.flatMap(CurrentAccount, (account) =>
            Effect.map(Effect.orDie(cache.clear(account.id)), (deleted) => ({ deleted }))))
    )
)
