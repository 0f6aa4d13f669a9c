import { Schema } from "effect"
import type { MicroMyr } from "../Domain/Money.js"
import { microMyr } from "../Domain/Money.js"

/** Micro-MYR per million tokens of one upstream model. */
export const ModelPrice = Schema.Struct({
  inputPerMillion: Schema.Int.pipe(Schema.nonNegative()),
  cachedInputPerMillion: Schema.Int.pipe(Schema.nonNegative()),
  outputPerMillion: Schema.Int.pipe(Schema.nonNegative())
})
export type ModelPrice = typeof ModelPrice.Type

/**
 * The price table (docs/money.md, "The money rules"): per upstream model, plus per search and
 * per fetched page. A model missing from `models` is priced as `fallback`.
 */
export const PriceTable = Schema.Struct({
  models: Schema.Record({ key: Schema.String, value: ModelPrice }),
  fallback: ModelPrice,
  perSearchMicroMyr: Schema.Int.pipe(Schema.nonNegative()),
  perPageMicroMyr: Schema.Int.pipe(Schema.nonNegative())
})
export type PriceTable = typeof PriceTable.Type

/** The documented defaults: OpenAI's list prices at RM 4.20 to the US dollar. */
export const DEFAULT_PRICES: PriceTable = {
  models: {
    "gpt-4.1-mini": { inputPerMillion: 1_680_000, cachedInputPerMillion: 420_000, outputPerMillion: 6_720_000 },
    "o4-mini": { inputPerMillion: 4_620_000, cachedInputPerMillion: 1_155_000, outputPerMillion: 18_480_000 },
    // Embeddings are billed per input token; they have no output.
    "text-embedding-3-small": { inputPerMillion: 84_000, cachedInputPerMillion: 84_000, outputPerMillion: 0 }
  },
  fallback: { inputPerMillion: 4_620_000, cachedInputPerMillion: 1_155_000, outputPerMillion: 18_480_000 },
  perSearchMicroMyr: 21_000,
  perPageMicroMyr: 4_200
}

export const priceOf = (table: PriceTable, model: string): ModelPrice => table.models[model] ?? table.fallback

/** Token usage as billed: `outputTokens` includes reasoning tokens, which are billed as output. */
export interface BilledUsage {
  readonly inputTokens: number
  readonly cachedTokens: number
  readonly outputTokens: number
  readonly searches: number
  readonly pages: number
}

/** Tokens priced at one model: a part of a call that more than one model answered (a fallback's planning call). */
export interface ModelTokens {
  readonly model: string
  readonly inputTokens: number
  readonly cachedTokens: number
  readonly outputTokens: number
  /** The share of their price billed, in basis points (a team's own provider key's fee); absent: the whole. */
  readonly shareBps?: number | undefined
}

/** The whole of a price in basis points: a call billed at nenas's own prices. */
export const FULL_SHARE_BPS = 10_000

/** A part's tokens at its model's prices: micro-MYR per million tokens, summed (whole, as every count is). */
const partPrice = (table: PriceTable, part: ModelTokens): number => {
  const price = priceOf(table, part.model)
  const cached = Math.min(part.cachedTokens, part.inputTokens)
  return (part.inputTokens - cached) * price.inputPerMillion + cached * price.cachedInputPerMillion +
    part.outputTokens * price.outputPerMillion
}

/**
 * The cost of tokens priced each at its model's prices (`tokenShareBps` of it: a team's own provider key's fee,
 * docs/api/provider-keys.md, "Billing"), rounded up once to the next micro-MYR, plus searches and pages at
 * their full prices.
 */
export const costOfParts = (
  table: PriceTable,
  parts: ReadonlyArray<ModelTokens>,
  searches: number,
  pages: number,
  tokenShareBps: number = FULL_SHARE_BPS
): MicroMyr => {
  let tokens = 0
  // Parts at a share, summed exactly in integers (a product past 2^53 would not be in floating point), then
  // rounded up once with the rest.
  let shared = 0n
  for (const part of parts) {
    const share = part.shareBps ?? tokenShareBps
    if (share === FULL_SHARE_BPS) tokens += partPrice(table, part)
    else shared += BigInt(Math.ceil(partPrice(table, part))) * BigInt(share)
  }
  const tokensMicroMyr = shared === 0n
    ? Math.ceil(tokens / 1_000_000)
    : Number(
      (BigInt(Math.ceil(tokens)) * BigInt(FULL_SHARE_BPS) + shared + 9_999_999_999n) / 10_000_000_000n
    )
  return microMyr(tokensMicroMyr + searches * table.perSearchMicroMyr + pages * table.perPageMicroMyr)
}

/** The cost of a usage, rounded up to the next micro-MYR. */
export const costOf = (table: PriceTable, model: string, usage: BilledUsage): MicroMyr =>
  costOfParts(table, [{ model, ...usage }], usage.searches, usage.pages)

/** Input counted by our tokenizer may differ from the upstream's: the estimate adds 10% and 16 tokens. */
export const withSafetyMargin = (inputTokens: number): number => Math.ceil(inputTokens * 1.1) + 16
