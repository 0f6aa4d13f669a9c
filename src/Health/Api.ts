import { HttpApiEndpoint, HttpApiGroup, OpenApi } from "@effect/platform"
import { Schema } from "effect"
import { ProviderUnavailable, wire } from "../Domain/Errors.js"

export const Health = Schema.Struct({ status: Schema.Literal("ok") })

export class HealthApi extends HttpApiGroup.make("health")
  .add(HttpApiEndpoint.get("healthz", "/healthz").addSuccess(Health))
  .add(HttpApiEndpoint.get("readyz", "/readyz").addSuccess(Health).addError(wire(ProviderUnavailable)))
  .annotate(OpenApi.Description, "Liveness (the process answers) and readiness (the database answers).")
{}
