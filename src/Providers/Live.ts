import { Effect, Layer, Option } from "effect"
import { AppConfig } from "../AppConfig.js"
import { Metrics } from "../Observability/Metrics.js"
import { Breakers } from "./Breakers.js"
import { makeFallbackProvider } from "./Fallback.js"
import { Provider } from "./Provider.js"
import { simulatedProvider } from "./Simulated.js"

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
          (target, outcome, seconds) =>
            Effect.sync(() => {
              metrics.upstreamAttempts.inc({ target, outcome })
              metrics.upstreamAttemptLatency.observe({ target, outcome }, seconds)
            })
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
