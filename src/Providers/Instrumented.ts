import { type Context, Effect, Exit, Layer, Option } from "effect"
import { AppConfig } from "../AppConfig.js"
import { Metrics } from "../Observability/Metrics.js"
import { Provider, type ProviderShape } from "./Provider.js"

type AnyFunction = (...args: ReadonlyArray<unknown>) => unknown

/** The service with every Effect it returns (or is) wrapped in a span named `prefix.method`. */
const withSpans = <S extends object>(prefix: string, service: S): S => {
  const traced: Record<string, unknown> = {}
  for (const [name, value] of Object.entries(service)) {
    const span = `${prefix}.${name}`
    if (typeof value === "function") {
      traced[name] = (...args: ReadonlyArray<unknown>) => {
        const result = (value as AnyFunction)(...args)
        return Effect.isEffect(result) ? Effect.withSpan(result, span) : result
      }
    } else {
      traced[name] = Effect.isEffect(value) ? Effect.withSpan(value, span) : value
    }
  }
  return traced as S
}

/**
 * `layer`'s service with a span around each of its calls, when traces are
 * exported (`OTEL_EXPORTER_OTLP_ENDPOINT`); otherwise `layer` itself, so an
 * untraced service pays nothing.
 */
export const traced = <I, S extends object, E, R>(
  tag: Context.Tag<I, S>,
  prefix: string,
  layer: Layer.Layer<I, E, R>
) =>
  Layer.unwrapEffect(Effect.map(AppConfig, ({ otlpEndpoint }) =>
    Option.isNone(otlpEndpoint)
      ? layer
      : Layer.effect(tag, Effect.map(tag, (service) => withSpans(prefix, service))).pipe(Layer.provide(layer))))

/** Upstream latency for the operator: to the whole answer (embeddings' too), or to a stream's first byte. */
const measured = (provider: ProviderShape, metrics: Metrics): ProviderShape => {
  const timed = <A, E>(phase: "complete" | "first_byte", effect: Effect.Effect<A, E>) =>
    Effect.suspend(() => {
      const started = performance.now()
      return Effect.onExit(effect, (exit) =>
        Effect.sync(() =>
          metrics.upstreamLatency.observe(
            { phase, outcome: Exit.isSuccess(exit) ? "ok" : "error" },
            (performance.now() - started) / 1000
          )
        ))
    })
  return {
    complete: (request) => timed("complete", provider.complete(request)),
    stream: (request) => timed("first_byte", provider.stream(request)),
    embed: (request) => timed("complete", provider.embed(request))
  }
}

/** The configured provider, measured, and traced when traces are exported. */
export const instrumentedProvider = <E, R>(layer: Layer.Layer<Provider, E, R>) =>
  traced(
    Provider,
    "provider",
    Layer.effect(Provider, Effect.zipWith(Provider, Metrics, measured)).pipe(Layer.provide(layer))
  )
