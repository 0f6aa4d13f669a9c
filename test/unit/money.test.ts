import { describe, expect, it } from "@effect/vitest"
import { fromMyr, fromSen, microMyr, toMyrNumber, toMyrString } from "../../src/Domain/Money.js"

describe("money conversions", () => {
  it("MYR numbers become integer micro-MYR without float drift", () => {
    expect(fromMyr(0.1)).toBe(100_000)
    expect(fromMyr(12.5)).toBe(12_500_000)
    expect(fromMyr(0.0000014)).toBe(1)
    expect(fromMyr(1_000_000_000)).toBe(1_000_000_000_000_000)
  })

  it("sen become micro-MYR", () => {
    expect(fromSen(1000)).toBe(10_000_000)
    expect(fromSen(50000)).toBe(500_000_000)
  })

  it("cost_myr is a 6-place decimal string, signs included", () => {
    expect(toMyrString(microMyr(1234))).toBe("0.001234")
    expect(toMyrString(microMyr(0))).toBe("0.000000")
    expect(toMyrString(microMyr(10_000_000))).toBe("10.000000")
    expect(toMyrString(microMyr(-2_500_001))).toBe("-2.500001")
  })

  it("_myr numbers are exact for any micro-MYR amount", () => {
    expect(toMyrNumber(microMyr(12_345_678))).toBe(12.345678)
    expect(toMyrNumber(microMyr(-100_000))).toBe(-0.1)
  })

  it("refuses amounts that are not safe integers", () => {
    expect(() => microMyr(1.5)).toThrow(RangeError)
    expect(() => microMyr(2 ** 53)).toThrow(RangeError)
  })
})
