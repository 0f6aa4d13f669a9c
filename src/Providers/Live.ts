import { Effect, Layer, Option } from "effect"
import { AppConfig } from "../AppConfig.js"
import { makeOpenAiCompatible } from "./OpenAiCompatible.js"
import { Provider } from "./Provider.js"
import { simulatedProvider } from "./Simulated.js"

/** The upstream when `UPSTREAM_BASE_URL` is set; else the simulated model, which production refuses. */
export const ProviderLive = Layer.unwrapEffect(Effect.gen(function*() {
  const config = yield* AppConfig
  if (Option.isSome(config.upstreamBaseUrl)) {
    return Layer.effect(
      Provider,
      makeOpenAiCompatible({
        baseUrl: config.upstreamBaseUrl.value,
        apiKey: config.upstreamApiKey,
        firstByteTimeoutMs: config.upstreamFirstByteTimeoutMs,
        totalTimeoutMs: config.upstreamTotalTimeoutMs
      })
    )
  }
  if (config.production) {
    return yield* Effect.dieMessage("NODE_ENV=production needs UPSTREAM_BASE_URL: the simulated model does not run in production.")
  }
  return Layer.succeed(Provider, simulatedProvider)
}))
