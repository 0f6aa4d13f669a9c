import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import { Effect, Either } from "effect"
import { NenasApi } from "../Api.js"
import { InvalidRequest } from "../Domain/Errors.js"
import type { GuardrailAction, GuardrailPolicy } from "./Api.js"
import { compileFilters, type Finding, redact, scanFilters, scanInjection, scanPii } from "./Detectors.js"

type Found = Finding & { readonly action: GuardrailAction }

/** Every rule of `policy` that is not off, run on `text`, each finding with its rule's action. */
const findingsOf = (text: string, policy: GuardrailPolicy) =>
  Effect.gen(function*() {
    // Every filter given is checked, one that is off too; labels name findings, so each is the policy's own.
    const checked = compileFilters(policy.filters)
    if (Either.isLeft(checked)) {
      const { field, index, message } = checked.left
      return yield* new InvalidRequest({ message, param: `policy.filters[${index}].${field}` })
    }
    const labels = policy.filters.map((filter) => filter.label)
    const twice = labels.findIndex((label, index) => labels.indexOf(label) !== index)
    if (twice >= 0) {
      return yield* new InvalidRequest({
        message: `filter ${twice}: the label ${labels[twice]} is another filter's too; each label names one filter`,
        param: `policy.filters[${twice}].label`
      })
    }
    const filters = policy.filters.filter((filter) => filter.action !== "off")
    const compiled = compileFilters(filters)
    const actionOf = new Map(filters.map((filter) => [filter.label, filter.action]))
    const found: Array<Found> = []
    if (policy.pii.action !== "off") {
      for (const finding of scanPii(text, new Set(policy.pii.types))) {
        found.push({ ...finding, action: policy.pii.action })
      }
    }
    if (policy.injection.action !== "off") {
      for (const finding of scanInjection(text)) {
        found.push({ ...finding, action: policy.injection.action })
      }
    }
    for (const finding of Either.isRight(compiled) ? scanFilters(text, compiled.right) : []) {
      found.push({ ...finding, action: actionOf.get(finding.label ?? "") ?? "flag" })
    }
    return found.sort((a, b) => a.start - b.start || b.end - a.end)
  })

export const GuardrailsLive = HttpApiBuilder.group(
  NenasApi,
  "guardrails",
  (handlers) =>
    handlers.handle("test", ({ payload }) =>
      Effect.map(findingsOf(payload.text, payload.policy), (findings) => ({
        redacted_text: redact(payload.text, findings.filter((finding) => finding.action === "redact")),
        findings: findings.map(({ action, end, label, start, type }) =>
          label === undefined ? { type, start, end, action } : { type, label, start, end, action }
        ),
        blocked: findings.some((finding) => finding.action === "block")
      })))
)
