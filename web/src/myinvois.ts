/**
 * MyInvois' state codes and their names (docs/api/invoices.md, "The billing profile"), as STATE_CODES in
 * src/Invoices/Api.ts has them: the bundle takes no server module, so the list is copied here, and
 * contract.typetest.ts fails while the copy differs from the server's.
 */
import type { StateCode } from "./api"

export const STATE_NAMES = {
  "01": "Johor",
  "02": "Kedah",
  "03": "Kelantan",
  "04": "Melaka",
  "05": "Negeri Sembilan",
  "06": "Pahang",
  "07": "Pulau Pinang",
  "08": "Perak",
  "09": "Perlis",
  "10": "Selangor",
  "11": "Terengganu",
  "12": "Sabah",
  "13": "Sarawak",
  "14": "Wilayah Persekutuan Kuala Lumpur",
  "15": "Wilayah Persekutuan Labuan",
  "16": "Wilayah Persekutuan Putrajaya",
  "17": "Not Applicable"
} as const satisfies Record<StateCode, string>

/** The codes in their order, 01 to 17 (an object lists "10" to "17", integer-like keys, before "01"). */
export const STATE_CODES: ReadonlyArray<StateCode> = (Object.keys(STATE_NAMES) as Array<StateCode>).sort()
