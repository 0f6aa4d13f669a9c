import { Effect } from "effect"
import { InvalidRequest } from "../../Domain/Errors.js"
import { unstorable } from "../../Domain/Strict.js"
import { countText } from "../../Domain/Tokens.js"
import { breathe, LARGE_BODY_CHARS } from "../../Request/Breathe.js"
import type { EmbeddingsRequest } from "./EmbeddingsApi.js"
import { MAX_ITEM_TOKENS, MAX_ITEMS } from "./EmbeddingsApi.js"

/**
 * An embeddings request's items, checked before anything is held (docs/api/embeddings.md, "Limits"): at
 * least one and at most 2048, none empty, none over 8192 tokens, no text with U+0000 or an unpaired
 * surrogate. A refusal names the item (`input[3]`), or `input` when the input is one item.
 */

/** One item: a text or a token array. */
export type EmbeddingItem = string | ReadonlyArray<number>

export interface CountedItems {
  readonly items: ReadonlyArray<EmbeddingItem>
  /** Each item's field, for a refusal (a guardrail's too). */
  readonly paths: ReadonlyArray<string>
  /** Our count of the items' tokens: what is held for, and billed when the upstream does not say. */
  readonly tokens: number
}

/** The items of `input`, in order: a lone text or token array is one item. */
const itemsOf = (input: EmbeddingsRequest["input"]): { items: ReadonlyArray<EmbeddingItem>; single: boolean } => {
  if (typeof input === "string") return { items: [input], single: true }
  if (input.length > 0 && typeof input[0] === "number") return { items: [input as ReadonlyArray<number>], single: true }
  return { items: input as ReadonlyArray<EmbeddingItem>, single: false }
}

const refuse = (message: string, param: string) => Effect.fail(new InvalidRequest({ message, param }))

export const countedItems = Effect.fnUntraced(function*(input: EmbeddingsRequest["input"]) {
  const { items, single } = itemsOf(input)
  if (items.length === 0) return yield* refuse("input must hold at least one item.", "input")
  if (items.length > MAX_ITEMS) {
    return yield* refuse(`input holds ${items.length} items; at most ${MAX_ITEMS} are embedded at once.`, "input")
  }
  const paths = items.map((_, i) => single ? "input" : `input[${i}]`)
  let tokens = 0
  let counted = 0
  for (const [i, item] of items.entries()) {
    const path = paths[i]!
    if (item.length === 0) return yield* refuse(`${path} is empty; every item needs text or tokens.`, path)
    let itemTokens = item.length
    if (typeof item === "string") {
      const problem = unstorable(item)
      if (problem !== undefined) return yield* refuse(`${path} ${problem}.`, path)
      // A text longer than four characters a token at the most could hold is over the bound unread.
      if (item.length > MAX_ITEM_TOKENS * 64) {
        return yield* refuse(`${path} is longer than ${MAX_ITEM_TOKENS} tokens.`, path)
      }
      itemTokens = countText(item)
      counted += item.length
      // Counting a large body ends with turns of the event loop (docs/security.md, "Bounded work per request").
      if (counted > LARGE_BODY_CHARS) {
        yield* breathe
        counted = 0
      }
    }
    if (itemTokens > MAX_ITEM_TOKENS) {
      return yield* refuse(`${path} has ${itemTokens} tokens; an item may have at most ${MAX_ITEM_TOKENS}.`, path)
    }
    tokens += itemTokens
  }
  return { items, paths, tokens } satisfies CountedItems
})
