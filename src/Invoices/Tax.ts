/**
 * Service tax on top-ups, in integer sen (docs/money.md, "Service tax"). Prices and top-up amounts exclude
 * tax; the wallet is credited the net amount only, and Stripe's refunds and disputes (gross) move it by their
 * net part only.
 */

/** `numerator / denominator` rounded half up, for non-negative integers, exactly (BigInt past 2^53). */
const divideHalfUp = (numerator: number, denominator: number): number => {
  if (Number.isSafeInteger(numerator * 2) && Number.isSafeInteger(denominator * 2)) {
    return Math.floor((numerator * 2 + denominator) / (denominator * 2))
  }
  const n = BigInt(numerator)
  const d = BigInt(denominator)
  return Number((n * 2n + d) / (d * 2n))
}

export interface TaxedAmount {
  /** What the wallet is credited: the top-up as chosen. */
  readonly amountSen: number
  readonly taxSen: number
  /** What the buyer pays: amount plus tax. */
  readonly totalSen: number
  readonly rateBps: number
}

/** The tax on a top-up of `amountSen` at `rateBps` basis points: T = A × r / 10000, half up to the sen. */
export const taxOn = (amountSen: number, rateBps: number): TaxedAmount => {
  const taxSen = rateBps === 0 ? 0 : divideHalfUp(amountSen * rateBps, 10_000)
  return { amountSen, taxSen, totalSen: amountSen + taxSen, rateBps }
}

export interface GrossSplit {
  readonly netSen: number
  readonly taxSen: number
}

/**
 * The parts of a cumulative gross amount `grossSen` refunded or disputed on a payment of net A and tax T:
 * the tax part is R × T / (A + T) half up, the net part R minus it. `grossSen` is capped at A + T (Stripe
 * never returns more than was paid), so the net part never passes A.
 */
export const splitGross = (grossSen: number, paid: Pick<TaxedAmount, "amountSen" | "taxSen">): GrossSplit => {
  const total = paid.amountSen + paid.taxSen
  const gross = Math.min(Math.max(grossSen, 0), total)
  const taxSen = paid.taxSen === 0 || total === 0 ? 0 : divideHalfUp(gross * paid.taxSen, total)
  return { netSen: gross - taxSen, taxSen }
}

/** The part of a cumulative refund that is new: what moves now, as the difference of two cumulative splits. */
export const newlyRefunded = (
  beforeGrossSen: number,
  nowGrossSen: number,
  paid: Pick<TaxedAmount, "amountSen" | "taxSen">
): GrossSplit & { readonly grossSen: number } => {
  const before = splitGross(beforeGrossSen, paid)
  const after = splitGross(nowGrossSen, paid)
  return {
    grossSen: after.netSen + after.taxSen - before.netSen - before.taxSen,
    netSen: after.netSen - before.netSen,
    taxSen: after.taxSen - before.taxSen
  }
}
