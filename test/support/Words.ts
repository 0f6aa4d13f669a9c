/**
 * `length` characters of words of pseudo-random letters from `seed`: text the tokenizer's cache of pieces it has
 * seen does not help with. With `spaced`, runs of 200 spaces between some words (cheap in tokens, so that megabytes
 * stay under a model's context window).
 */
export const wordsOf = (length: number, seed: number, spaced = false): string => {
  let text = ""
  let state = seed * 2654435761 + 1
  while (text.length < length) {
    state = (state * 1103515245 + 12345) % 2147483648
    text += `${state.toString(36).slice(0, 3 + (state % 7))} `
    if (spaced && state % 3 === 0) text += " ".repeat(200)
  }
  return text.slice(0, length)
}
