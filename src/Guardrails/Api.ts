import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { DashboardAuth } from "../Auth/Api.js"
import { InvalidRequest, wire } from "../Domain/Errors.js"
import { allowRoles, EVERY_ROLE } from "../Domain/Roles.js"
import { SqlString } from "../Domain/Strict.js"

/**
 * Guardrail policies: the account's, a key's override, and the "try it" endpoint (docs/api/guardrails.md,
 * "Guardrails").
 */

/** The personal-data detectors (docs/api/guardrails.md, "Detectors"). */
export const PII_TYPE_NAMES = ["email", "phone", "mykad", "card", "ip"] as const

export const GuardrailAction = Schema.Literal("off", "flag", "redact", "block")
export type GuardrailAction = typeof GuardrailAction.Type

/** A custom filter: its label names it in findings and becomes its placeholder (`[LABEL]`). */
export const GuardrailFilter = Schema.Struct({
  label: Schema.String,
  /** Stored as given: a NUL or a lone surrogate, which PostgreSQL cannot keep, is refused. */
  pattern: SqlString,
  action: GuardrailAction
}).annotations({ identifier: "GuardrailFilter" })

const strict = { parseOptions: { onExcessProperty: "error" as const } }

const PiiRule = Schema.Struct({
  action: GuardrailAction,
  types: Schema.optionalWith(Schema.Array(Schema.Literal(...PII_TYPE_NAMES)), {
    default: () => [...PII_TYPE_NAMES]
  })
}).annotations(strict)
const InjectionRule = Schema.Struct({ action: Schema.Literal("off", "flag", "block") }).annotations(strict)
const Filters = Schema.Array(GuardrailFilter.annotations(strict))
const Directions = Schema.Array(Schema.Literal("input", "output"))

/** A whole policy: a missing part is off, `types` all five, `filters` none, `apply_to` both directions. */
export const GuardrailPolicy = Schema.Struct({
  pii: Schema.optionalWith(PiiRule, { default: () => ({ action: "off" as const, types: [...PII_TYPE_NAMES] }) }),
  injection: Schema.optionalWith(InjectionRule, { default: () => ({ action: "off" as const }) }),
  filters: Schema.optionalWith(Filters, { default: () => [] }),
  apply_to: Schema.optionalWith(Directions, { default: () => ["input", "output"] as const })
}).annotations({
  identifier: "GuardrailPolicy",
  ...strict,
  examples: [{
    pii: { action: "redact", types: ["email", "phone", "mykad", "card", "ip"] },
    injection: { action: "block" },
    filters: [{ label: "PROJECT", pattern: "(?i)project\\s+nenas", action: "redact" }],
    apply_to: ["input", "output"]
  }]
})
export type GuardrailPolicy = typeof GuardrailPolicy.Type

/** Every rule off: an account's policy until it sets one. */
export const allOff: GuardrailPolicy = {
  pii: { action: "off", types: [...PII_TYPE_NAMES] },
  injection: { action: "off" },
  filters: [],
  apply_to: ["input", "output"]
}

/** A key's override: the parts it names replace the account's; the rest stay the account's. */
export const GuardrailOverride = Schema.Struct({
  pii: Schema.optionalWith(PiiRule, { exact: true }),
  injection: Schema.optionalWith(InjectionRule, { exact: true }),
  filters: Schema.optionalWith(Filters, { exact: true }),
  apply_to: Schema.optionalWith(Directions, { exact: true })
}).annotations({ identifier: "GuardrailOverride", ...strict })
export type GuardrailOverride = typeof GuardrailOverride.Type

/** What a call's log keeps of its guardrails: rule names and counts, never a matched value. */
export const LoggedGuardrails = Schema.Struct({
  outcome: Schema.Literal("passed", "flagged", "redacted", "blocked"),
  rules: Schema.Array(Schema.Struct({
    rule: Schema.String,
    /** The detector (`email`, …, `injection`) or the filter's label. */
    type: Schema.String,
    action: Schema.Literal("flag", "redact", "block"),
    direction: Schema.Literal("input", "output"),
    count: Schema.Int
  }))
}).annotations({ identifier: "LoggedGuardrails" })
export type LoggedGuardrails = typeof LoggedGuardrails.Type

/** The account's policy, and when it was last changed (null: never). */
export const GuardrailPolicyView = Schema.Struct({
  policy: GuardrailPolicy,
  updated_at: Schema.NullOr(Schema.String)
}).annotations({ identifier: "GuardrailPolicyView" })

/**
 * The most text one test scans: 128 Ki characters, a "try it" box's worth. Twenty hostile filters take about
 * 0.6 s of an instance's event loop on 1 MiB; on this much, under 0.1 s.
 */
export const MAX_TEST_TEXT = 131_072

export const GuardrailTestRequest = Schema.Struct({
  text: SqlString.pipe(Schema.maxLength(MAX_TEST_TEXT)),
  /** Absent: the account's own policy. */
  policy: Schema.optional(GuardrailPolicy)
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
    HttpApiEndpoint.get("get", "/dashboard/guardrails")
      .addSuccess(GuardrailPolicyView)
      .annotate(
        OpenApi.Description,
        "The account's guardrail policy: what every key's calls run under, unless the key overrides it."
      )
      .pipe(allowRoles(...EVERY_ROLE))
  )
  .add(
    HttpApiEndpoint.put("put", "/dashboard/guardrails")
      .setPayload(GuardrailPolicy)
      .addSuccess(GuardrailPolicyView)
      .annotate(
        OpenApi.Description,
        "Replaces the account's policy whole (a missing part is off). It applies to the next call on every " +
          "instance within a second, and is audited."
      )
      .pipe(allowRoles("owner", "admin"))
  )
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
