/** `RELIABILITY_SMOKE=1`: the smaller variant of each reliability scenario, which CI runs. */
export const SMOKE = process.env["RELIABILITY_SMOKE"] === "1"
