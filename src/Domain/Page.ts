import { Schema } from "effect"

const IntFromString = (min: number, max: number) => Schema.NumberFromString.pipe(Schema.int(), Schema.between(min, max))

/** 1-based `page` and `limit` (1–200, default 50) of every dashboard list. */
export const PageParams = Schema.Struct({
  page: Schema.optionalWith(IntFromString(1, 1_000_000), { default: () => 1 }),
  limit: Schema.optionalWith(IntFromString(1, 200), { default: () => 50 })
})
