import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import { SqlClient } from "@effect/sql"
import { Effect, Option, Redacted } from "effect"
import { timingSafeEqual } from "node:crypto"
import { NenasApi } from "../Api.js"
import { AppConfig } from "../AppConfig.js"
import { AuthenticationError, ProviderUnavailable } from "../Domain/Errors.js"
import { EInvoiceWorker } from "../Invoices/EInvoiceWorker.js"
import { Metrics, renderMetrics } from "../Observability/Metrics.js"
import { Breakers } from "../Providers/Breakers.js"
import { upstreamBreakers } from "../Providers/BreakerTypes.js"
import { WalletRepo } from "../Wallet/Repo.js"

const sameSecret = (given: string, expected: string): boolean => {
  const a = Buffer.from(given)
  const b = Buffer.from(expected)
  return a.length === b.length && timingSafeEqual(a, b)
}

export const HealthLive = HttpApiBuilder.group(NenasApi, "health", (handlers) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const { metricsToken } = yield* AppConfig
    const metrics = yield* Metrics
    const wallet = yield* WalletRepo
    const breakers = yield* Breakers
    const eInvoices = yield* EInvoiceWorker
    const ok = { status: "ok" as const }
    // nenas's own upstreams' breakers: a team's own keys are its own business, shown on its keys' status.
    const notClosed = Effect.map(breakers.notClosed, upstreamBreakers)
    const upstreams = Effect.map(notClosed, (states) => ({
      open: states.map(({ halfOpenAt, state, target }) => ({
        target,
        state,
        half_open_at: new Date(halfOpenAt).toISOString()
      }))
    }))
    const authorized = Effect.gen(function*() {
      if (Option.isNone(metricsToken)) return
      const header = (yield* HttpServerRequest.HttpServerRequest).headers["authorization"] ?? ""
      const given = header.startsWith("Bearer ") ? header.slice("Bearer ".length) : ""
      if (!sameSecret(given, Redacted.value(metricsToken.value))) {
        return yield* new AuthenticationError({
          message: "GET /metrics needs `Authorization: Bearer <METRICS_TOKEN>`."
        })
      }
    })
    return handlers
      .handle("healthz", () => Effect.succeed(ok))
      .handle("readyz", () =>
        sql`SELECT 1`.pipe(
          Effect.timeoutFail({
            duration: "2 seconds",
            onTimeout: () => new ProviderUnavailable({ message: "The database did not answer within 2 seconds." })
          }),
          Effect.catchTag(
            "SqlError",
            () => new ProviderUnavailable({ message: "The database is unreachable.", retry_after_seconds: 5 })
          ),
          Effect.zipRight(upstreams),
          Effect.map((upstreams) => ({ ...ok, upstreams }))
        ))
      .handle("metrics", () =>
        Effect.zipRight(
          authorized,
          // Overdue e-invoices are counted at scrape time, across every instance, as open holds are.
          Effect.zipRight(
            eInvoices.countOverdue,
            renderMetrics(wallet.openHolds, notClosed).pipe(Effect.provideService(Metrics, metrics))
          )
        ))
  }))
