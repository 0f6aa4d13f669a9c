import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema, OpenApi } from "@effect/platform"
import { Schema } from "effect"
import { AuthenticationError, ProviderUnavailable, wire } from "../Domain/Errors.js"

export const Health = Schema.Struct({ status: Schema.Literal("ok") })

export class HealthApi extends HttpApiGroup.make("health")
  .add(HttpApiEndpoint.get("healthz", "/healthz").addSuccess(Health))
  .add(HttpApiEndpoint.get("readyz", "/readyz").addSuccess(Health).addError(wire(ProviderUnavailable)))
  .add(
    HttpApiEndpoint.get("metrics", "/metrics")
      .addSuccess(HttpApiSchema.Text({ contentType: "text/plain; version=0.0.4; charset=utf-8" }))
      .addError(wire(AuthenticationError))
      .annotate(OpenApi.Description, "Prometheus metrics; `Authorization: Bearer <METRICS_TOKEN>` when that is set.")
  )
  .annotate(
    OpenApi.Description,
    "Liveness (the process answers), readiness (the database answers) and the operator's metrics."
  )
{}
