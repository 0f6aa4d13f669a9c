import { Context, Effect, Either, Layer } from "effect"
import { DEFAULT_PRICES } from "../../src/Domain/Prices.js"
import { parseUpstreams, type UpstreamConfig, withUpstreamPrices } from "../../src/Domain/Upstreams.js"
import { startUpstream, type UpstreamServer } from "./Upstream.js"

/**
 * Two upstream stand-ins for fallback tests: `alpha`, the category's first
 * target (cheap), and `beta`, its fallback (dear), each with its own prices.
 */
export class Alpha extends Context.Tag("test/Alpha")<Alpha, UpstreamServer>() {}
export class Beta extends Context.Tag("test/Beta")<Beta, UpstreamServer>() {}

const standIn = <I>(tag: Context.Tag<I, UpstreamServer>) =>
  Layer.scoped(
    tag,
    Effect.acquireRelease(Effect.promise(() => startUpstream()), (server) => Effect.promise(() => server.close()))
  )

/** Both stand-ins, each listening on a port of its own. */
export const AlphaAndBeta = Layer.merge(standIn(Alpha), standIn(Beta))

export const CHEAP = { inputPerMillion: 1_000_000, cachedInputPerMillion: 250_000, outputPerMillion: 2_000_000 }
export const DEAR = { inputPerMillion: 5_000_000, cachedInputPerMillion: 1_250_000, outputPerMillion: 20_000_000 }

/** `UPSTREAMS` naming alpha then beta, as an operator writes it. */
export const upstreamsJson = (alphaUrl: string, betaUrl: string) =>
  JSON.stringify([
    {
      name: "alpha",
      base_url: alphaUrl,
      api_key: "sk-alpha",
      models: { general: ["alpha-mini"], reasoning: ["alpha-think"] },
      prices: { "alpha-mini": CHEAP }
    },
    {
      name: "beta",
      base_url: betaUrl,
      api_key: "sk-beta",
      models: { general: ["beta-large"], reasoning: ["beta-think"] },
      prices: { "beta-large": DEAR }
    }
  ])

export const upstreamsOf = (alphaUrl: string, betaUrl: string): ReadonlyArray<UpstreamConfig> =>
  Either.getOrThrow(parseUpstreams(upstreamsJson(alphaUrl, betaUrl)))

/** The price table with alpha's and beta's own prices. */
export const TWO_UPSTREAM_PRICES = withUpstreamPrices(DEFAULT_PRICES, upstreamsOf("http://a/v1", "http://b/v1"))
