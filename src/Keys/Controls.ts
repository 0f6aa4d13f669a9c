import { PermissionDenied } from "../Domain/Errors.js"

/**
 * A control an owner or admin can put on a key, which a developer may then tighten but not loosen
 * (docs/api/teams.md, "Roles that hold").
 */
export const CONTROLS = [
  "disabled",
  "monthly_spend_limit_myr",
  "rate_limit_rpm",
  "rate_limit_concurrent",
  "guardrails"
] as const
export type Control = typeof CONTROLS[number]

/** A key's controls as they stand: micro-MYR for the budget, null for none (the operator's default for rate limits). */
export interface ControlsNow {
  readonly disabled: boolean
  readonly monthlySpendLimitMicroMyr: number | null
  readonly rateLimitRpm: number | null
  readonly rateLimitConcurrent: number | null
}

/** A change to them, as PATCH gives it: absent stays, null lifts (the budget in micro-MYR). */
export interface ControlsChange {
  readonly disabled?: boolean | undefined
  readonly monthlySpendLimitMicroMyr?: number | null | undefined
  readonly rateLimitRpm?: number | null | undefined
  readonly rateLimitConcurrent?: number | null | undefined
}

/** A limit is looser when lifted, or raised; a limit nobody set is the loosest there is. */
const looser = (now: number | null, asked: number | null | undefined): boolean =>
  asked !== undefined && now !== null && (asked === null || asked > now)

/** The controls `change` would loosen of those in `held` (set by an owner or admin), in the contract's field names. */
export const loosened = (
  now: ControlsNow,
  held: ReadonlyArray<string>,
  change: ControlsChange
): ReadonlyArray<Control> =>
  CONTROLS.filter((control) => {
    if (!held.includes(control)) return false
    switch (control) {
      case "disabled":
        return now.disabled && change.disabled === false
      case "monthly_spend_limit_myr":
        return looser(now.monthlySpendLimitMicroMyr, change.monthlySpendLimitMicroMyr)
      case "rate_limit_rpm":
        return looser(now.rateLimitRpm, change.rateLimitRpm)
      case "rate_limit_concurrent":
        return looser(now.rateLimitConcurrent, change.rateLimitConcurrent)
      case "guardrails":
        // A policy is compared part by part, against the account's too (docs/api/guardrails.md, "Policies").
        return false
    }
  })

/**
 * What an owner's or admin's change does to the record of who set each control: one it sets (a limit, a
 * disabling) becomes theirs; one it lifts (null, enabling) is free again. A developer's change records nothing.
 */
export const recordedControls = (
  change: ControlsChange
): { readonly add: ReadonlyArray<Control>; readonly drop: ReadonlyArray<Control> } => {
  const given: ReadonlyArray<readonly [Control, boolean | number | null | undefined]> = [
    ["disabled", change.disabled === undefined ? undefined : change.disabled || null],
    ["monthly_spend_limit_myr", change.monthlySpendLimitMicroMyr],
    ["rate_limit_rpm", change.rateLimitRpm],
    ["rate_limit_concurrent", change.rateLimitConcurrent]
  ]
  return {
    add: given.filter(([, value]) => value !== undefined && value !== null).map(([control]) => control),
    drop: given.filter(([, value]) => value === null).map(([control]) => control)
  }
}

/** The refusal of a developer's change that loosens what an owner or admin set, naming the fields. */
export const loosenedRefusal = (keyId: string, controls: ReadonlyArray<string>) =>
  new PermissionDenied({
    message: `An owner or admin set ${controls.map((c) => `'${c}'`).join(", ")} on key '${keyId}': ` +
      "a developer may tighten it but not loosen it.",
    guidance: "Ask an owner or admin of the account to change it.",
    action: "/api-keys"
  })
