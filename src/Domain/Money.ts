import { Schema } from "effect"

/**
 * Integer micro-MYR: the only unit money is stored and computed in.
 * 1 MYR = 1,000,000 micro-MYR; 1 sen = 10,000 micro-MYR.
 */
export const MicroMyr = Schema.Int.pipe(Schema.brand("MicroMyr"))
export type MicroMyr = typeof MicroMyr.Type

export const MICRO_PER_MYR = 1_000_000
export const MICRO_PER_SEN = 10_000

export const microMyr = (n: number): MicroMyr => {
  if (!Number.isSafeInteger(n)) throw new RangeError(`micro-MYR must be a safe integer, got ${n}`)
  return n as MicroMyr
}

/** MYR amounts from the API (numbers) become micro-MYR, rounded to the nearest micro-MYR. */
export const fromMyr = (myr: number): MicroMyr => microMyr(Math.round(myr * MICRO_PER_MYR))

export const fromSen = (sen: number): MicroMyr => microMyr(sen * MICRO_PER_SEN)

/** `_myr` number fields: exact for every amount a 6-decimal string can express. */
export const toMyrNumber = (amount: MicroMyr): number => Number(toMyrString(amount))

/** `cost_myr`: a decimal string with 6 places, e.g. "0.001234". */
export const toMyrString = (amount: MicroMyr): string => {
  const sign = amount < 0 ? "-" : ""
  const abs = Math.abs(amount)
  const whole = Math.trunc(abs / MICRO_PER_MYR)
  const fraction = String(abs % MICRO_PER_MYR).padStart(6, "0")
  return `${sign}${whole}.${fraction}`
}
