import * as FetchHttpClient from "@effect/platform/FetchHttpClient"
import { Config, Effect, Layer, Option } from "effect"
import { AppConfig } from "../AppConfig.js"

/** OpenTelemetry's standard base URL gets the traces path appended, as its own exporters do. */
export const tracesUrl = (endpoint: string): string => `${endpoint.replace(/\/+$/, "")}/v1/traces`

/**
 * With `OTEL_EXPORTER_OTLP_ENDPOINT` set, spans (requests, SQL statements,
 * the call's steps) go there over OTLP/HTTP in batches. Unset, no tracer is
 * installed, so no span is made and nothing is paid for them; the exporter's
 * modules are not even loaded (some 17 MB of heap: docs/performance.md, "Modules loaded when used").
 */
export const TracingLive = Layer.unwrapEffect(
  Effect.gen(function*() {
    const { otlpEndpoint } = yield* AppConfig
    const serviceName = yield* Config.string("OTEL_SERVICE_NAME").pipe(Config.withDefault("nenas"))
    return Option.match(otlpEndpoint, {
      onNone: () => Layer.setTracerEnabled(false),
      onSome: (endpoint) =>
        Layer.unwrapEffect(Effect.map(
          Effect.promise(() => import("@effect/opentelemetry")),
          ({ OtlpSerialization, OtlpTracer }) =>
            OtlpTracer.layer({
              url: tracesUrl(endpoint),
              resource: { serviceName },
              exportInterval: "1 second"
            }).pipe(Layer.provide([OtlpSerialization.layerJson, FetchHttpClient.layer]))
        ))
    })
  })
)
