import { Context, Effect, Layer, Option } from "effect"
import { AppConfig, type AppConfigShape } from "../AppConfig.js"
import { Metrics } from "../Observability/Metrics.js"
import { type BreakerSettings, DEFAULT_BREAKER_SETTINGS } from "./BreakerCounts.js"
import { type BreakerGaugeValue, makeBreakers, memoryOpenStore } from "./BreakerService.js"
import { type RedisBreakersOptions, redisOpenStore } from "./BreakersRedis.js"
import type { BreakersShape } from "./BreakerTypes.js"

/**
 * Circuit breakers, one per upstream target (`upstream/model`, e.g.
 * `openai/gpt-4.1-mini`). A target that keeps failing is skipped without a
 * request until its cool-down ends; then one probe call may try it
 * (half-open): its success closes the breaker, its failure opens it again.
 * Open state is shared across instances through Redis when `REDIS_URL` is
 * set, in memory otherwise.
 *
 * For the caller: `admit` before each attempt (a closed target costs a map
 * lookup); `record` each attempt's outcome as soon as it is known (the first
 * byte, or the failure), so a probe reports within its lease; never `record`
 * a target skipped because it was `Open`. While a breaker is half-open the
 * first outcome recorded for it decides (there is no probe token).
 */

/** The `BREAKER_*` settings; a probe may take the first-byte deadline and a second before another may go. */
export const breakerSettings = (config: AppConfigShape): BreakerSettings => ({
  failures: config.breakerFailures,
  errorRate: config.breakerErrorRate,
  windowMs: config.breakerWindowMs,
  minCalls: config.breakerMinCalls,
  cooldownMs: config.breakerCooldownMs,
  probeLeaseMs: config.upstreamFirstByteTimeoutMs + 1_000
})

type OnState = (target: string, value: BreakerGaugeValue) => void

export class Breakers extends Context.Tag("nenas/Breakers")<Breakers, BreakersShape>() {
  /** Breakers in this process's memory; settings default to `BREAKER_*`'s defaults. */
  static readonly memory = (settings: Partial<BreakerSettings> = {}, onState?: OnState) =>
    Layer.sync(Breakers, () => makeBreakers({ ...DEFAULT_BREAKER_SETTINGS, ...settings }, memoryOpenStore(), onState))

  /** Breakers whose open state every instance on the same Redis (and prefix) shares. */
  static readonly redis = (
    options: RedisBreakersOptions & { readonly settings?: Partial<BreakerSettings>; readonly onState?: OnState }
  ) =>
    Layer.scoped(
      Breakers,
      Effect.map(redisOpenStore(options), (store) =>
        makeBreakers({ ...DEFAULT_BREAKER_SETTINGS, ...options.settings }, store, options.onState))
    )

  /** From configuration: shared through Redis when `REDIS_URL` is set, else in memory; state changes kept on the gauge. */
  static readonly layer = Layer.unwrapEffect(Effect.gen(function*() {
    const config = yield* AppConfig
    const metrics = yield* Metrics
    const settings = breakerSettings(config)
    const onState: OnState = (target, value) => metrics.upstreamBreakerState.set({ target }, value)
    return Option.match(config.redisUrl, {
      onNone: () => Breakers.memory(settings, onState),
      onSome: (url) => Breakers.redis({ url, prefix: config.breakerKeyPrefix, settings, onState })
    })
  }))
}
