import { Effect, Either } from "effect"
import { InvalidRequest } from "../Domain/Errors.js"
import type { GuardrailAction, GuardrailOverride, GuardrailPolicy, LoggedGuardrails } from "./Api.js"
import { allOff } from "./Api.js"
import type { CompiledFilters, Finding, PiiType } from "./Detectors.js"
import { compileFilters, LONGEST_MATCH, redact, scanFilters, scanInjection, scanPii } from "./Detectors.js"

/**
 * A policy as calls apply it (docs/api/guardrails.md, "Policies"): the account's, with a key's override
 * laid over it, compiled once per distinct pair and split by direction. A direction with no rule on is
 * `undefined`, and a policy with neither is no policy: the call does no guardrail work.
 */

export type Direction = "input" | "output"
/** An action that does something: `off` rules are not compiled. */
export type LiveAction = Exclude<GuardrailAction, "off">

/** A finding with the action of the rule that made it. */
export interface Found extends Finding {
  readonly action: LiveAction
}

/** The rules of one direction, compiled. */
export interface Scanner {
  readonly pii: { readonly action: LiveAction; readonly types: ReadonlySet<PiiType> } | undefined
  readonly injection: "flag" | "block" | undefined
  readonly filters: CompiledFilters | undefined
  readonly filterActions: ReadonlyMap<string, LiveAction>
  /**
   * How far a finding's verdict can reach from where it starts: its longest match and the characters
   * read beside it (docs/api/guardrails.md, "Longest matches"). What streamed output holds back.
   */
  readonly reach: number
}

export interface ActivePolicy {
  readonly input: Scanner | undefined
  readonly output: Scanner | undefined
}

/** The account's policy with a key's override over it: each part the override names replaces the account's. */
export const effectivePolicy = (
  account: GuardrailPolicy | null,
  override: GuardrailOverride | null
): GuardrailPolicy => {
  const base = account ?? allOff
  if (override === null) return base
  return {
    pii: override.pii ?? base.pii,
    injection: override.injection ?? base.injection,
    filters: override.filters ?? base.filters,
    apply_to: override.apply_to ?? base.apply_to
  }
}

/** An email's verdict reads 65 units before its `@` and 254 after (its local part is at most 64); others 2 each side. */
const REACH: Readonly<Record<PiiType | "injection" | "filter", number>> = {
  email: 64 + 1 + 254 + 2,
  phone: LONGEST_MATCH.phone + 2,
  mykad: LONGEST_MATCH.mykad + 2,
  card: LONGEST_MATCH.card + 2,
  ip: LONGEST_MATCH.ip + 2,
  injection: LONGEST_MATCH.injection + 2,
  // A filter's match is cut at 256 units; its anchors see two more.
  filter: 256 + 2
}

/**
 * How far a PII finding's verdict reaches: its own reach, or further when a longer finding that overlaps it
 * (and so replaces it) can start anywhere inside it and reach as far as its own type does. A phone is
 * dropped for an overlapping MyKad or card number even when only phones are asked for.
 */
const piiReach = (types: ReadonlySet<PiiType>): number => {
  const overlapping = new Set<PiiType>(types)
  if (types.has("phone")) {
    overlapping.add("card")
    overlapping.add("mykad")
  }
  const longest = Math.max(...[...types].map((type) => LONGEST_MATCH[type]))
  return longest + Math.max(...[...overlapping].map((type) => REACH[type]))
}

/** The rules of `policy` that are on, compiled; `undefined` when none is. Filters were checked when saved. */
const scannerOf = (policy: GuardrailPolicy): Scanner | undefined => {
  const filters = policy.filters.filter((filter) => filter.action !== "off")
  const pii = policy.pii.action === "off" || policy.pii.types.length === 0
    ? undefined
    : { action: policy.pii.action, types: new Set(policy.pii.types) }
  const injection = policy.injection.action === "off" ? undefined : policy.injection.action
  if (pii === undefined && injection === undefined && filters.length === 0) return undefined
  const compiled = compileFilters(filters)
  // A stored policy was compiled when it was saved; one that no longer compiles is a defect, not a pass.
  if (Either.isLeft(compiled)) throw new Error(`a stored guardrail filter does not compile: ${compiled.left.message}`)
  const reaches = [
    ...(pii === undefined ? [] : [piiReach(pii.types)]),
    ...(injection === undefined ? [] : [REACH.injection]),
    ...(filters.length === 0 ? [] : [REACH.filter])
  ]
  return {
    pii,
    injection,
    filters: filters.length === 0 ? undefined : compiled.right,
    filterActions: new Map(filters.map((filter) => [filter.label, filter.action as LiveAction])),
    reach: Math.max(...reaches)
  }
}

/** Whether a rule of `scanner` changes what passes (redacts or blocks), not only counts it. */
export const changesText = (scanner: Scanner): boolean =>
  [scanner.pii?.action, scanner.injection, ...scanner.filterActions.values()].some((action) =>
    action === "redact" || action === "block"
  )

/** Every rule of `policy` that is on, whatever its `apply_to`: what the "try it" endpoint runs. */
export const testScanner = scannerOf

/**
 * Refuses filters that do not compile (each is checked, an `off` one too) or that share a label (a label
 * names its findings and placeholder), naming the field under `prefix` (`filters[1].pattern`).
 */
export const checkedFilters = (
  filters: GuardrailPolicy["filters"],
  prefix: string
): Effect.Effect<void, InvalidRequest> => {
  const checked = compileFilters(filters)
  if (Either.isLeft(checked)) {
    const { field, index, message } = checked.left
    return Effect.fail(new InvalidRequest({ message, param: `${prefix}[${index}].${field}` }))
  }
  const labels = filters.map((filter) => filter.label)
  const twice = labels.findIndex((label, index) => labels.indexOf(label) !== index)
  if (twice < 0) return Effect.void
  return Effect.fail(
    new InvalidRequest({
      message: `filter ${twice}: the label ${labels[twice]} is another filter's too; each label names one filter`,
      param: `${prefix}[${twice}].label`
    })
  )
}

/** The parts of a policy that differ between `before` and `after`, by name (what the audit log keeps). */
export const partsChanged = (before: GuardrailPolicy, after: Partial<GuardrailPolicy>): ReadonlyArray<string> =>
  (["pii", "injection", "filters", "apply_to"] as const).filter((part) =>
    after[part] !== undefined && JSON.stringify(before[part]) !== JSON.stringify(after[part])
  )

/** A policy compiled for calls; `undefined` when it does nothing. */
export const activePolicy = (policy: GuardrailPolicy): ActivePolicy | undefined => {
  const scanner = scannerOf(policy)
  if (scanner === undefined) return undefined
  const input = policy.apply_to.includes("input") ? scanner : undefined
  const output = policy.apply_to.includes("output") ? scanner : undefined
  return input === undefined && output === undefined ? undefined : { input, output }
}

/** What every rule of `scanner` finds in `text`, sorted by start (the longer first). */
export const scanWith = (scanner: Scanner, text: string): ReadonlyArray<Found> => {
  const found: Array<Found> = []
  if (scanner.pii !== undefined) {
    const action = scanner.pii.action
    for (const finding of scanPii(text, scanner.pii.types)) found.push(Object.assign({ action }, finding))
  }
  if (scanner.injection !== undefined) {
    const action = scanner.injection
    for (const finding of scanInjection(text)) found.push(Object.assign({ action }, finding))
  }
  if (scanner.filters !== undefined) {
    for (const finding of scanFilters(text, scanner.filters)) {
      found.push(Object.assign({ action: scanner.filterActions.get(finding.label ?? "") ?? "block" }, finding))
    }
  }
  return found.sort((a, b) => a.start - b.start || b.end - a.end)
}

/** `text` with its `redact` findings replaced by their placeholders. */
export const redactFound = (text: string, found: ReadonlyArray<Found>): string => {
  const redacting = found.filter((finding) => finding.action === "redact")
  return redacting.length === 0 ? text : redact(text, redacting)
}

/** The rule a finding counts under in logs: `pii` with its detector, `injection`, or `filter` with its label. */
const ruleOf = (finding: Found) =>
  finding.type === "filter"
    ? { rule: "filter", type: finding.label ?? "" }
    : finding.type === "injection"
    ? { rule: "injection", type: "injection" }
    : { rule: "pii", type: finding.type }

/**
 * What the guardrails did to one call, as its log keeps it: rules and counts, never a matched value.
 * Counts are kept by direction, rule, type and action.
 */
export class Tally {
  private readonly counts = new Map<string, number>()

  add(direction: Direction, found: ReadonlyArray<Found>): void {
    for (const finding of found) {
      const { rule, type } = ruleOf(finding)
      const key = `${direction}\u0000${rule}\u0000${type}\u0000${finding.action}`
      this.counts.set(key, (this.counts.get(key) ?? 0) + 1)
    }
  }

  /** The log's `guardrails`: the strongest action taken (`blocked`, `redacted`, `flagged`, else `passed`) and the rules. */
  logged(): LoggedGuardrails {
    const rules = [...this.counts].map(([key, count]) => {
      const [direction, rule, type, action] = key.split("\u0000") as [Direction, string, string, LiveAction]
      return { rule, type, action, direction, count }
    })
    const actions = new Set(rules.map((rule) => rule.action))
    const outcome = actions.has("block")
      ? "blocked"
      : actions.has("redact")
      ? "redacted"
      : actions.has("flag")
      ? "flagged"
      : "passed"
    return { outcome, rules }
  }
}

/** Two logs' guardrails as one: a call's input side and its output side. */
export const mergeLogged = (a: LoggedGuardrails | null | undefined, b: LoggedGuardrails | null | undefined) => {
  if (a == null) return b ?? null
  if (b == null || b.rules.length === 0) return a
  const rank = ["passed", "flagged", "redacted", "blocked"] as const
  const outcome = rank[Math.max(rank.indexOf(a.outcome), rank.indexOf(b.outcome))] ?? "passed"
  return { outcome, rules: [...a.rules, ...b.rules] }
}

// ---------------------------------------------------------------------------------------------------
// Tightening: what a developer may do to a key's guardrails.

const RANK: Readonly<Record<GuardrailAction, number>> = { off: 0, flag: 1, redact: 2, block: 3 }

/**
 * The parts of `before` that `after` loosens: an action lowered, a PII type or a direction dropped
 * from an active rule, a filter removed, changed or lowered. Empty when `after` is as strict or stricter.
 */
export const loosenedParts = (before: GuardrailPolicy, after: GuardrailPolicy): ReadonlyArray<string> => {
  const parts: Array<string> = []
  const active = activePolicy(before) !== undefined
  if (
    RANK[after.pii.action] < RANK[before.pii.action] ||
    (before.pii.action !== "off" && before.pii.types.some((type) => !after.pii.types.includes(type)))
  ) parts.push("pii")
  if (RANK[after.injection.action] < RANK[before.injection.action]) parts.push("injection")
  const kept = before.filters.filter((filter) => filter.action !== "off").every((filter) =>
    after.filters.some((other) =>
      other.label === filter.label && other.pattern === filter.pattern && RANK[other.action] >= RANK[filter.action]
    )
  )
  if (!kept) parts.push("filters")
  if (active && before.apply_to.some((direction) => !after.apply_to.includes(direction))) parts.push("apply_to")
  return parts
}

// ---------------------------------------------------------------------------------------------------
// Calls: the policy a key's call runs under, read from the JSON its key's row and account's row keep.

const parsePolicy = (text: string): GuardrailPolicy => ({ ...allOff, ...(JSON.parse(text) as GuardrailPolicy) })
const parseOverride = (text: string): GuardrailOverride => JSON.parse(text) as GuardrailOverride

/**
 * The compiled policy of an account's JSON and a key's override JSON (either null), remembered per
 * distinct pair: a call pays two map lookups of strings its key cache holds (their hashes kept by the
 * engine), not a compile. Forgotten whole past 1,000 pairs.
 */
export const policyOfRows: (accountJson: string | null, keyJson: string | null) => ActivePolicy | undefined = (() => {
  const known = new Map<string, Map<string, ActivePolicy | undefined>>()
  let size = 0
  return (accountJson, keyJson) => {
    if (accountJson === null && keyJson === null) return undefined
    const account = accountJson ?? ""
    const key = keyJson ?? ""
    const byKey = known.get(account)
    if (byKey?.has(key) === true) return byKey.get(key)
    const policy = activePolicy(
      effectivePolicy(
        accountJson === null ? null : parsePolicy(accountJson),
        keyJson === null ? null : parseOverride(keyJson)
      )
    )
    if (size >= 1_000) {
      known.clear()
      size = 0
    }
    const entries = known.get(account) ?? new Map<string, ActivePolicy | undefined>()
    entries.set(key, policy)
    known.set(account, entries)
    size++
    return policy
  }
})()
