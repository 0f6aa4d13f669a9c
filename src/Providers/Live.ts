import { Effect, Layer, Option } from "effect"
import { AppConfig } from "../AppConfig.js"
import { Metrics } from "../Observability/Metrics.js"
import { ProviderKeys } from "../ProviderKeys/ProviderKeys.js"
import { Breakers } from "./Breakers.js"
import { makeAttempts, makeFallbackProvider, type RecordAttempt } from "./Fallback.js"
import { makeOwnKeys, OwnKeyRouting } from "./OwnKeys.js"
import { Provider } from "./Provider.js"
import { simulatedProvider } from "./Simulated.js"

/** Each attempt counted and timed by target and outcome (a team's provider keys all under `provider_key`). */
const recordAttempt = (metrics: Metrics): RecordAttempt => (target, outcome, seconds) =>
  Effect.sync(() => {
    metrics.upstreamAttempts.inc({ target, outcome })
    metrics.upstreamAttemptLatency.observe({ target, outcome }, seconds)
  })

/**
 * A team's own provider keys around whichever provider nenas runs (OwnKeys.ts), on the same breakers and
 * metrics as nenas's upstreams.
 */
export const OwnKeyRoutingLive = Layer.effect(
  OwnKeyRouting,
  Effect.gen(function*() {
    const config = yield* AppConfig
    const providerKeys = yield* ProviderKeys
    const attempts = yield* makeAttempts(
      yield* Breakers,
      recordAttempt(yield* Metrics),
      Option.isSome(config.otlpEndpoint)
    )
    return makeOwnKeys(
      attempts,
      { firstByteTimeoutMs: config.upstreamFirstByteTimeoutMs, totalTimeoutMs: config.upstreamTotalTimeoutMs },
      providerKeys.report
    )
  })
)

/**
 * The upstreams when `UPSTREAMS` or `UPSTREAM_BASE_URL` is set, tried in order with fallbacks
 * (Fallback.ts); else the simulated model, which production refuses.
 */
export const ProviderLive = Layer.unwrapEffect(Effect.gen(function*() {
  const config = yield* AppConfig
  if (config.upstreams.length > 0) {
    return Layer.effect(
      Provider,
      Effect.gen(function*() {
        const breakers = yield* Breakers
        const metrics = yield* Metrics
        return yield* makeFallbackProvider(
          {
            upstreams: config.upstreams,
            firstByteTimeoutMs: config.upstreamFirstByteTimeoutMs,
            totalTimeoutMs: config.upstreamTotalTimeoutMs,
            traced: Option.isSome(config.otlpEndpoint)
          },
          breakers,
          recordAttempt(metrics)
        )
      })
    )
  }
  if (config.production) {
    return yield* Effect.dieMessage(
      "NODE_ENV=production needs UPSTREAM_BASE_URL or UPSTREAMS: the simulated model does not run in production."
    )
  }
  return Layer.succeed(Provider, simulatedProvider)
}))
