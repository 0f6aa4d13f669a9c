import { describe, expect, it } from "@effect/vitest"
import { TOPUP_OPTIONS_SEN } from "../../src/Billing/Api.js"
import { newlyRefunded, splitGross, taxOn } from "../../src/Invoices/Tax.js"

/**
 * Service tax on top-ups and the net part of Stripe's gross refunds (docs/money.md, "Service tax"), as
 * tables of cases on the pure functions: no database.
 */

describe("service tax on a top-up: T = A × r / 10000, half up to the sen", () => {
  const table: ReadonlyArray<readonly [amountSen: number, rateBps: number, taxSen: number]> = [
    // Every amount the checkout offers, at 8% (Malaysia's service tax on digital services)…
    [1000, 800, 80],
    [2500, 800, 200],
    [5000, 800, 400],
    [10000, 800, 800],
    [25000, 800, 2000],
    [50000, 800, 4000],
    // …at 6% (the rate before March 2024)…
    [1000, 600, 60],
    [2500, 600, 150],
    [50000, 600, 3000],
    // …and rates that leave a fraction: half goes up, less than half down.
    [2500, 650, 163], // 162.5
    [1000, 655, 66], // 65.5
    [1000, 654, 65], // 65.4
    [1000, 656, 66], // 65.6
    // 1 sen: 0.08 sen of tax rounds to none; at 50% half a sen rounds up.
    [1, 800, 0],
    [1, 5000, 1],
    [3, 5000, 2],
    [1, 10000, 1],
    // No tax charged: nothing changes.
    [1000, 0, 0],
    [50000, 0, 0]
  ]
  it.each(table)("%i sen at %i bps: %i sen of tax", (amountSen, rateBps, taxSen) => {
    expect(taxOn(amountSen, rateBps)).toEqual({ amountSen, taxSen, totalSen: amountSen + taxSen, rateBps })
  })

  it("every checkout option at 8% costs 1.08 times its amount exactly", () => {
    for (const amount of TOPUP_OPTIONS_SEN) expect(taxOn(amount, 800).totalSen).toBe(amount * 108 / 100)
  })

  it("stays exact where A × r passes 2^53", () => {
    expect(taxOn(1e15, 800).taxSen).toBe(8e13)
    expect(taxOn(1e15 + 6, 800).taxSen).toBe(8e13) // 80_000_000_000_000.48 rounds down
  })
})

describe("the net part of a gross refund: tax R × T / (A + T) half up, net R minus it", () => {
  const paid = taxOn(1000, 800) // RM 10.00 + RM 0.80 = RM 10.80

  const table: ReadonlyArray<readonly [grossSen: number, netSen: number, taxSen: number]> = [
    [0, 0, 0],
    [1, 1, 0], // 1 sen: 0.074 of it is tax, which rounds to none
    [13, 12, 1], // 0.963 → 1
    [6, 6, 0], // 0.444 → 0
    [7, 6, 1], // 0.5185 → 1
    [540, 500, 40], // half: RM 5.40 is RM 5.00 and RM 0.40
    [1079, 999, 80], // 79.93 → 80
    [1080, 1000, 80], // the whole payment: exactly A and T
    [5000, 1000, 80] // more than was paid is capped at what was
  ]
  it.each(table)("%i sen refunded of 1080: %i net, %i tax", (grossSen, netSen, taxSen) => {
    expect(splitGross(grossSen, paid)).toEqual({ netSen, taxSen })
  })

  it("for every partial refund of every size the parts add up and never pass A or T", () => {
    const total = paid.totalSen
    let previous = { netSen: 0, taxSen: 0 }
    for (let gross = 0; gross <= total; gross++) {
      const split = splitGross(gross, paid)
      expect(split.netSen + split.taxSen).toBe(gross)
      expect(split.netSen).toBeGreaterThanOrEqual(previous.netSen)
      expect(split.taxSen).toBeGreaterThanOrEqual(previous.taxSen)
      expect(split.netSen).toBeLessThanOrEqual(paid.amountSen)
      expect(split.taxSen).toBeLessThanOrEqual(paid.taxSen)
      previous = split
    }
  })

  it("refunds in steps of every size move, in all, exactly the net and tax of a whole refund", () => {
    const wrong: Array<unknown> = []
    for (const payment of TOPUP_OPTIONS_SEN.map((amount) => taxOn(amount, 800))) {
      const steps = [1, 2, 3, 7, 13, 19, 37, 101, 333, 1000, Math.ceil(payment.totalSen / 2), payment.totalSen]
      for (const step of steps) {
        let before = 0
        let net = 0
        let tax = 0
        while (before < payment.totalSen) {
          const after = Math.min(payment.totalSen, before + step)
          const moved = newlyRefunded(before, after, payment)
          if (moved.grossSen !== after - before || moved.netSen < 0 || moved.taxSen < 0) {
            wrong.push({ amount: payment.amountSen, step, before, after, moved })
          }
          net += moved.netSen
          tax += moved.taxSen
          before = after
        }
        if (net !== payment.amountSen || tax !== payment.taxSen) {
          wrong.push({ amount: payment.amountSen, step, net, tax })
        }
      }
    }
    expect(wrong).toEqual([])
  })

  it("without tax the whole refund is net, as before service tax existed", () => {
    const untaxed = taxOn(2500, 0)
    expect(splitGross(1234, untaxed)).toEqual({ netSen: 1234, taxSen: 0 })
    expect(newlyRefunded(1000, 2500, untaxed)).toEqual({ grossSen: 1500, netSen: 1500, taxSen: 0 })
  })
})
