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

const placesOf = (amount: MicroMyr, places: number, round: (n: number) => number): string => {
  const step = 10 ** (6 - places)
  const units = round(amount / step)
  const sign = units < 0 ? "-" : ""
  const abs = Math.abs(units)
  const scale = 10 ** places
  const whole = Math.trunc(abs / scale)
  return places === 0 ? `${sign}${whole}` : `${sign}${whole}.${String(abs % scale).padStart(places, "0")}`
}

/** A balance in words: `places` decimals rounded down, so it never reads as more than there is (RM 4.998 is "4.99"). */
export const myrDown = (amount: MicroMyr, places = 2): string => placesOf(amount, places, Math.floor)

/** An upper bound in words ("below RM X"): `places` decimals rounded up, so what is below it is below what it reads. */
export const myrUp = (amount: MicroMyr, places = 2): string => placesOf(amount, places, Math.ceil)

/** An amount as it was set: two decimals, more only when it has them (5 is "5.00", 4.9965 is "4.9965"). */
export const myrAsSet = (amount: MicroMyr): string => {
  const exact = toMyrString(amount)
  return exact.replace(/(\.\d\d\d*?)0+$/, "$1")
}
