import { HttpApiBuilder } from "@effect/platform"
import { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import { NenasApi } from "../Api.js"
import { ProviderUnavailable } from "../Domain/Errors.js"

export const HealthLive = HttpApiBuilder.group(NenasApi, "health", (handlers) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const ok = { status: "ok" as const }
    return handlers
      .handle("healthz", () => Effect.succeed(ok))
      .handle("readyz", () =>
        sql`SELECT 1`.pipe(
          Effect.timeoutFail({
            duration: "2 seconds",
            onTimeout: () => new ProviderUnavailable({ message: "The database did not answer within 2 seconds." })
          }),
          Effect.catchTag("SqlError", () =>
            new ProviderUnavailable({ message: "The database is unreachable.", retry_after_seconds: 5 })),
          Effect.as(ok)
        ))
  }))
