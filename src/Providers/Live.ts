import { Effect, Layer } from "effect"
import { AppConfig } from "../AppConfig.js"
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
      // Per-target metrics: `recordAttempt` (Fallback.ts) until issue 26 part A's are passed here as the third argument.
      Effect.flatMap(Breakers, (breakers) =>
        makeFallbackProvider({
          upstreams: config.upstreams,
          firstByteTimeoutMs: config.upstreamFirstByteTimeoutMs,
          totalTimeoutMs: config.upstreamTotalTimeoutMs
        }, breakers))
    )
  }
  if (config.production) {
    return yield* Effect.dieMessage("NODE_ENV=production needs UPSTREAM_BASE_URL or UPSTREAMS: the simulated model does not run in production.")
  }
  return Layer.succeed(Provider, simulatedProvider)
}))
