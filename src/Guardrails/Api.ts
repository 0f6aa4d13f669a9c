import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import { InvalidRequest, wire } from "../Domain/Errors.js"
import { allowRoles, EVERY_ROLE } from "../Domain/Roles.js"
import { SqlString } from "../Domain/Strict.js"

/**
 * A guardrail policy and the "try it" endpoint (docs/api/guardrails.md, "Guardrails"). The policy's shape is
 * the one accounts and keys will carry; today it is given with each test.
 */

/** The personal-data detectors (docs/api/guardrails.md, "Detectors"). */
export const PII_TYPE_NAMES = ["email", "phone", "mykad", "card", "ip"] as const

export const GuardrailAction = Schema.Literal("off", "flag", "redact", "block")
export type GuardrailAction = typeof GuardrailAction.Type

/** A custom filter: its label names it in findings and becomes its placeholder (`[LABEL]`). */
export const GuardrailFilter = Schema.Struct({
  label: Schema.String,
  pattern: Schema.String,
  action: GuardrailAction
}).annotations({ identifier: "GuardrailFilter" })

const strict = { parseOptions: { onExcessProperty: "error" as const } }

export const GuardrailPolicy = Schema.Struct({
  pii: Schema.optionalWith(
    Schema.Struct({
      action: GuardrailAction,
      types: Schema.optionalWith(Schema.Array(Schema.Literal(...PII_TYPE_NAMES)), {
        default: () => [...PII_TYPE_NAMES]
      })
    }).annotations(strict),
    { default: () => ({ action: "off" as const, types: [...PII_TYPE_NAMES] }) }
  ),
  injection: Schema.optionalWith(
    Schema.Struct({ action: Schema.Literal("off", "flag", "block") }).annotations(strict),
    { default: () => ({ action: "off" as const }) }
  ),
  filters: Schema.optionalWith(Schema.Array(GuardrailFilter.annotations(strict)), { default: () => [] }),
  apply_to: Schema.optionalWith(Schema.Array(Schema.Literal("input", "output")), {
    default: () => ["input", "output"] as const
  })
}).annotations({ identifier: "GuardrailPolicy", ...strict })
export type GuardrailPolicy = typeof GuardrailPolicy.Type

/**
 * The most text one test scans: 128 Ki characters, a "try it" box's worth. Twenty hostile filters take about
 * 0.6 s of an instance's event loop on 1 MiB; on this much, under 0.1 s.
 */
export const MAX_TEST_TEXT = 131_072

export const GuardrailTestRequest = Schema.Struct({
  text: SqlString.pipe(Schema.maxLength(MAX_TEST_TEXT)),
  policy: GuardrailPolicy
}).annotations({ identifier: "GuardrailTestRequest", ...strict })

export const GuardrailFinding = Schema.Struct({
  type: Schema.Literal(...PII_TYPE_NAMES, "injection", "filter"),
  /** A custom filter's label. */
  label: Schema.optional(Schema.String),
  /** UTF-16 offsets into `text`, end exclusive. */
  start: Schema.Int,
  end: Schema.Int,
  action: GuardrailAction
}).annotations({ identifier: "GuardrailFinding" })

export const GuardrailTestResponse = Schema.Struct({
  /** `text` with every `redact` finding replaced by its placeholder (`[EMAIL]`, `[PHONE]`, `[MYKAD]`, …). */
  redacted_text: Schema.String,
  findings: Schema.Array(GuardrailFinding),
  /** True when a `block` rule matched: a call would be refused with `content_blocked`. */
  blocked: Schema.Boolean
}).annotations({ identifier: "GuardrailTestResponse" })

export class GuardrailsApi extends HttpApiGroup.make("guardrails")
  .add(
    HttpApiEndpoint.post("test", "/dashboard/guardrails/test")
      .setPayload(GuardrailTestRequest)
      .addSuccess(GuardrailTestResponse)
      .annotate(
        OpenApi.Description,
        "Runs a policy's detectors and filters on a text: what a call's text would become, and what matched. " +
          "Nothing is kept; the findings give positions, never the matched text."
      )
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .addError(wire(InvalidRequest))
  .middleware(DashboardAuth)
  .annotate(OpenApi.Description, "Guardrails: personal data and injection detectors, and a team's own filters.")
{}
