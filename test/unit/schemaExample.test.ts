import { describe, expect, it } from "@effect/vitest"
import { z } from "zod"
import { exampleOf } from "../../src/Providers/SchemaExample.js"

/** The simulated model's tool arguments and structured answers: valid against the schema it was given. */
describe("values from JSON schemas", () => {
  const schemas: ReadonlyArray<readonly [string, z.ZodType]> = [
    [
      "an object of scalars",
      z.object({ name: z.string(), age: z.number().int().min(18).max(99), active: z.boolean() })
    ],
    [
      "enums, literals and bounds",
      z.object({ unit: z.enum(["c", "f"]), kind: z.literal("weather"), ratio: z.number().gt(2).lt(3) })
    ],
    [
      "formats and lengths",
      z.object({ at: z.iso.datetime(), mail: z.email(), id: z.uuid(), code: z.string().min(12).max(14) })
    ],
    ["arrays, nested", z.object({ rows: z.array(z.object({ cells: z.array(z.number()).min(3) })).min(2).max(2) })],
    [
      "nullable, optional and unions",
      z.object({ note: z.string().nullable(), tag: z.string().optional(), v: z.union([z.number(), z.string()]) })
    ],
    ["multiples", z.object({ step: z.number().int().multipleOf(5).min(7) })]
  ]
  for (const [name, schema] of schemas) {
    it(name, () => {
      const value = exampleOf(z.toJSONSchema(schema))
      expect(schema.safeParse(value).success, JSON.stringify(value)).toBe(true)
    })
  }

  it("local $refs are followed", () => {
    const value = exampleOf({
      type: "object",
      properties: { home: { $ref: "#/$defs/place" } },
      $defs: { place: { type: "object", properties: { city: { type: "string", enum: ["Ipoh"] } } } }
    })
    expect(value).toEqual({ home: { city: "Ipoh" } })
  })

  it("a schema asking for enormous values is answered within bounds, not by running out of memory", () => {
    const value = exampleOf({
      type: "object",
      properties: {
        text: { type: "string", minLength: 1_000_000_000 },
        grid: {
          type: "array",
          minItems: 1_000_000_000,
          items: { type: "array", minItems: 1_000_000_000, items: { type: "number" } }
        }
      }
    }) as { readonly text: string; readonly grid: ReadonlyArray<ReadonlyArray<number>> }
    expect(value.text.length).toBeLessThanOrEqual(4096)
    expect(value.grid.length).toBeLessThanOrEqual(64)
  })
})
