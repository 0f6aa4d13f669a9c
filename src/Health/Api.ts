import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as HttpApiSchema from "@effect/platform/HttpApiSchema"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { AuthenticationError, ProviderUnavailable, wire } from "../Domain/Errors.js"

export const Health = Schema.Struct({ status: Schema.Literal("ok") })

/** A circuit breaker not closed: its target is skipped (open) or tried by one probe call (half-open). */
export const OpenBreaker = Schema.Struct({
  target: Schema.String.annotations({ description: "`upstream/model`, e.g. `openai/gpt-4.1-mini`." }),
  state: Schema.Literal("open", "half_open"),
  half_open_at: Schema.String.annotations({ description: "When the breaker half-opens (or did), ISO 8601." })
})

/**
 * Ready: the database answers. Open breakers do not make the service unready (calls go on through the
 * other targets); they are listed for the operator.
 */
export const Readiness = Schema.Struct({
  status: Schema.Literal("ok"),
  upstreams: Schema.Struct({ open: Schema.Array(OpenBreaker) })
})

export class HealthApi extends HttpApiGroup.make("health")
  .add(HttpApiEndpoint.get("healthz", "/healthz").addSuccess(Health))
  .add(HttpApiEndpoint.get("readyz", "/readyz").addSuccess(Readiness).addError(wire(ProviderUnavailable)))
  .add(
    HttpApiEndpoint.get("metrics", "/metrics")
      .addSuccess(HttpApiSchema.Text({ contentType: "text/plain; version=0.0.4; charset=utf-8" }))
      .addError(wire(AuthenticationError))
      .annotate(OpenApi.Description, "Prometheus metrics; `Authorization: Bearer <METRICS_TOKEN>` when that is set.")
  )
  .annotate(
    OpenApi.Description,
    "Liveness (the process answers), readiness (the database answers, with the upstream targets whose circuit breakers are not closed) and the operator's metrics."
  )
{}
