import { describe, expect, it } from "vitest"
import {
  formatBucket,
  formatCostMyr,
  formatCount,
  formatDateTime,
  formatMicroMyrExact,
  formatMyrTick,
  fromLocalInput
} from "../../web/src/format.js"

/** The dashboard's money and time formatting (web/src/format.ts), as a person reads it. */
describe("formatCostMyr: every amount shown, exact, never rounded to the sen", () => {
  it.each([
    [0, "RM 0.00"],
    [1, "RM 0.000001"],
    [139, "RM 0.000139"],
    [1_200, "RM 0.0012"],
    [2_930, "RM 0.00293"],
    // Under a sen: the digits, never "RM 0.00" or "RM 0.01".
    [4_999, "RM 0.004999"],
    [5_000, "RM 0.005"],
    [10_000, "RM 0.01"],
    [14_999, "RM 0.014999"],
    [1_500_000, "RM 1.50"],
    [1_234_567, "RM 1.234567"],
    [10_000_000, "RM 10.00"],
    [1_234_567_890, "RM 1,234.56789"],
    [-1, "−RM 0.000001"],
    [-139, "−RM 0.000139"],
    [-5_000, "−RM 0.005"],
    [-2_500_000, "−RM 2.50"],
    [-1_234_567_891, "−RM 1,234.567891"],
    [500_000_000_000_000, "RM 500,000,000.00"],
    // The largest exact integer still prints every digit.
    [Number.MAX_SAFE_INTEGER, "RM 9,007,199,254.740991"]
  ])("%d → %s", (micro, text) => {
    expect(formatCostMyr(micro)).toBe(text)
  })
})

describe("formatMicroMyrExact: the exact amount for a tooltip", () => {
  it.each([
    [0, "0 micro-MYR (RM 0.000000)"],
    [311, "311 micro-MYR (RM 0.000311)"],
    [10_000_000, "10,000,000 micro-MYR (RM 10.000000)"],
    [1_234_567_891, "1,234,567,891 micro-MYR (RM 1,234.567891)"],
    [-1_000_001, "−1,000,001 micro-MYR (−RM 1.000001)"],
    // The largest exact integer still prints every digit.
    [Number.MAX_SAFE_INTEGER, "9,007,199,254,740,991 micro-MYR (RM 9,007,199,254.740991)"]
  ])("%d → %s", (micro, text) => {
    expect(formatMicroMyrExact(micro)).toBe(text)
  })
})

describe("formatMyrTick: chart axes", () => {
  it.each([
    [0, "0"],
    [311, "0.00031"],
    [5_000, "0.005"],
    [10_000, "0.01"],
    [12_345_678, "12.35"],
    [-12_345_678, "−12.35"]
  ])("%d → %s", (micro, text) => {
    expect(formatMyrTick(micro)).toBe(text)
  })
})

describe("dates", () => {
  it("an instant reads in the reader's zone: the same instant is another day in Kuala Lumpur and New York", () => {
    const instant = "2026-11-22T20:30:00Z"
    expect(formatDateTime(instant, "Asia/Kuala_Lumpur")).toBe("23 Nov 2026, 4:30 am")
    expect(formatDateTime(instant, "America/New_York")).toBe("22 Nov 2026, 3:30 pm")
  })

  it("a usage bucket keeps the business zone's date and hour, whatever the browser's offset", () => {
    // Midnight in Kuala Lumpur is 16:00 UTC the day before: the label must still say the 23rd.
    expect(formatBucket("2026-11-23T00:00:00+08:00", "day")).toBe("23 Nov 2026")
    expect(formatBucket("2026-11-23T14:00:00+08:00", "hour")).toBe("23 Nov, 14:00")
    expect(formatBucket("2026-01-01T00:00:00-05:00", "day")).toBe("1 Jan 2026")
    expect(formatBucket("not a bucket", "day")).toBe("not a bucket")
  })

  it("a datetime-local value is the instant it names in the browser's zone, and empty is no filter", () => {
    expect(fromLocalInput("")).toBeUndefined()
    expect(fromLocalInput("nonsense")).toBeUndefined()
    const local = new Date(2026, 10, 22, 9, 15)
    expect(fromLocalInput("2026-11-22T09:15")).toBe(local.toISOString())
  })

  it("counts group thousands", () => {
    expect(formatCount(1_234_567)).toBe("1,234,567")
  })
})
