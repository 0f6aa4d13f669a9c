import { describe, expect, it } from "@effect/vitest"
import { countTokens } from "gpt-tokenizer"
import { countMessages, countText, countTexts, EXACT_CHARS } from "../../src/Domain/Tokens.js"
import { countUpstreamMessages } from "../../src/Providers/ContentTokens.js"
import { wordsOf } from "../support/Words.js"

const exact = (text: string) => countTokens(text, { disallowedSpecial: new Set<string>() })

/**
 * Token counting: exact for ordinary text, in time linear in the
 * length for a word without whitespace (byte-pair encoding one huge piece is
 * quadratic), and bounded for texts longer than it counts exactly.
 */
describe("countText", () => {
  it.each([
    ["prose", "The quick brown fox jumps over the lazy dog. ".repeat(200)],
    ["code", "const x = { a: [1, 2, 3], b: \"<|endoftext|>\" }\n".repeat(100)],
    ["unicode", "Selamat pagi 😀 漢字 — café\n".repeat(100)],
    ["empty", ""]
  ])("counts %s exactly", (_, text) => {
    expect(countText(text)).toBe(exact(text))
  })

  it.each([
    ["letters", "a".repeat(8_000)],
    ["random letters", Array.from({ length: 8_000 }, (_, i) => "qwertyuiopasdfghjklzxcvbnm"[(i * 7919) % 26]).join("")],
    ["punctuation", "!?#".repeat(3_000)],
    ["whitespace", " ".repeat(8_000)],
    ["emoji", "😀🎉".repeat(4_000)]
  ])("counts a long run of %s in slices: within a token a slice of the exact count", (_, text) => {
    const slices = Math.ceil(text.length / 64)
    expect(Math.abs(countText(text) - exact(text))).toBeLessThanOrEqual(slices)
  })

  it("counts a 1 MB one-word prompt and an 8 MB text in bounded time (minutes before the fix)", () => {
    const word = "a".repeat(1_000_000)
    // 8 characters a token, as the exact count of a shorter run of the same letter gives.
    expect(countText(word) / 125_000).toBeGreaterThanOrEqual(1)
    expect(countText(word) / 125_000).toBeLessThan(1.1)
    const varied = Array.from(
      { length: 8_000_000 / 8 },
      (_, i) => (i * 2654435761 % 4294967296).toString(36).slice(0, 8)
    ).join("")
    const sample = varied.slice(0, 30_000)
    const perChar = countText(sample) / sample.length
    expect(countText(varied) / (perChar * varied.length)).toBeGreaterThan(0.95)
    expect(countText(varied) / (perChar * varied.length)).toBeLessThan(1.25)
  })

  it("a long text cannot hide costly parts from the sampled windows: cheap text where fixed windows would fall does not lower the estimate", () => {
    // Strata of 16 Ki characters: cheap prose in the middle of each (where fixed windows sat), costly symbols around it.
    const cheap = "the cat sat on the mat ".repeat(60)
    const costly = Array.from({ length: 7_500 }, (_, i) => String.fromCodePoint(0x4e00 + (i * 7919) % 20_000)).join("")
    const text = Array.from({ length: 64 }, () => costly + cheap + costly).join("").slice(0, 64 * 16_384)
    const truth = countMessages([{ role: "user", content: text }])
    const slices = Array.from({ length: 64 }, (_, i) => text.slice(i * 16_384, (i + 1) * 16_384))
    // Each slice is short enough to be counted exactly (long runs in slices): the reference.
    const exactTotal = slices.reduce((sum, slice) => sum + countText(slice), 0)
    expect(truth / exactTotal).toBeGreaterThan(0.8)
    expect(truth / exactTotal).toBeLessThan(1.25)
    // The same text always gets the same count.
    expect(countMessages([{ role: "user", content: text }])).toBe(truth)
  })

  it("counts many long messages as one bounded text", () => {
    const messages = Array.from(
      { length: 40 },
      () => ({ role: "user" as const, content: "lorem ipsum ".repeat(10_000) })
    )
    const perMessage = exact("lorem ipsum ".repeat(1_000)) * 10
    const count = countMessages(messages)
    expect(count).toBeGreaterThan(40 * perMessage * 0.95)
    expect(count).toBeLessThan(40 * perMessage * 1.2)
  })
})

const cjk = (length: number, seed: number) =>
  Array.from({ length }, (_, i) => String.fromCodePoint(0x4e00 + ((i + seed) * 7919) % 20_000)).join("")
const punctuation = (length: number) => Array.from({ length }, (_, i) => "!?#$%&*+-/<=>@^~|"[(i * 7919) % 17]).join("")
/** The exact count of texts of any length: each in pieces short enough that `countText` counts them exactly. */
const exactAll = (texts: ReadonlyArray<string>) =>
  texts.reduce((sum, text) => {
    let total = 0
    for (let start = 0; start < text.length; start += EXACT_CHARS) {
      total += countText(text.slice(start, start + EXACT_CHARS))
    }
    return sum + total
  }, 0)

/**
 * One budget per request (docs/security.md, "Bounded work per request"): a request's
 * texts are counted exactly while they hold at most EXACT_CHARS characters in
 * all; beyond, the sampled estimate stays within [0.95, 1.35] of the exact
 * count for text of one kind, and never far below it (0.9) where costly text
 * hides among cheap text (there it errs high, up to several times). Where the windows fall changes with each process
 * (a secret key), so these bounds hold for every placement, not one.
 */
describe("countTexts: one budget for a request's texts", () => {
  it.each([
    ["one text at the bound", [wordsOf(EXACT_CHARS, 1)]],
    ["many short texts at the bound", Array.from({ length: 64 }, (_, i) => wordsOf(EXACT_CHARS / 64, i))],
    ["unicode and code", ["Selamat pagi 😀 漢字 — café\n".repeat(400), "const x = { a: [1, 2] }\n".repeat(800)]],
    ["no texts", []]
  ])("exact at or below the bound: %s", (_, texts) => {
    expect(texts.reduce((sum, text) => sum + text.length, 0)).toBeLessThanOrEqual(EXACT_CHARS)
    expect(countTexts(texts)).toBe(texts.reduce((sum, text) => sum + exact(text), 0))
  })

  it.each([
    ["random words, one text", [wordsOf(300_000, 2)]],
    ["random words, 200 messages", Array.from({ length: 200 }, (_, i) => wordsOf(1_500, i))],
    ["just over the bound", [wordsOf(EXACT_CHARS, 3), "one more word"]],
    ["prose", ["The quick brown fox jumps over the lazy dog. ".repeat(8_000)]],
    ["code", ["const x = { a: [1, 2, 3], b: \"<|endoftext|>\" }\n".repeat(4_000)]],
    ["Chinese", [cjk(120_000, 5)]],
    ["mixed messages", Array.from({ length: 60 }, (_, i) => (i % 3 === 0 ? cjk(2_000, i) : wordsOf(3_000, i)))]
  ])("above the bound, within [0.95, 1.35] of the exact count: %s", (_, texts) => {
    const truth = exactAll(texts)
    const estimate = countTexts(texts)
    expect(estimate / truth).toBeGreaterThanOrEqual(0.95)
    expect(estimate / truth).toBeLessThanOrEqual(1.35)
    // The same texts always get the same count.
    expect(countTexts(texts)).toBe(estimate)
  })

  it.each([
    // Text of several UTF-8 bytes a character that no window read is added at the most it can cost.
    ["a Chinese block hidden in spaces", [" ".repeat(300_000) + cjk(4_000, 1) + " ".repeat(300_000)]],
    ["a Chinese message among long runs of spaces", [" ".repeat(200_000), cjk(3_000, 2), " ".repeat(200_000)]],
    // ASCII has no such sign: a block at least two strata long always holds windows, so it is never missed.
    ["a punctuation block two strata long in spaces", [
      " ".repeat(300_000) + punctuation(25_000) + " ".repeat(300_000)
    ]],
    ["costly text at every stratum's edges", [
      Array.from({ length: 64 }, () => cjk(300, 9) + "the cat sat ".repeat(700) + cjk(300, 7)).join("")
    ]]
  ])("costly text hidden among cheap text is never counted far below it, and errs high: %s", (_, texts) => {
    const truth = exactAll(texts)
    const estimate = countTexts(texts)
    expect(estimate / truth).toBeGreaterThanOrEqual(0.9)
    // Windows that disagree widen the estimate (two standard errors), and unread text of several bytes a character is added at its most.
    expect(estimate / truth).toBeLessThanOrEqual(6)
  })

  it("115 long messages (7.5 MB) in well under the time they took exactly (28 s before the fix)", () => {
    const texts = Array.from({ length: 115 }, (_, i) => wordsOf(65_000, i))
    countTexts(texts)
    const started = performance.now()
    const count = countTexts(texts)
    expect(performance.now() - started).toBeLessThan(250)
    const perChar = exactAll(texts.slice(0, 2)) / 130_000
    expect(count / (perChar * 115 * 65_000)).toBeGreaterThan(0.95)
    expect(count / (perChar * 115 * 65_000)).toBeLessThan(1.35)
  })

  it("chat messages and text turns count alike under the one budget", () => {
    const messages = Array.from(
      { length: 120 },
      (_, i) => ({ role: i % 2 === 0 ? "user" as const : "assistant" as const, content: wordsOf(2_000, i) })
    )
    expect(countUpstreamMessages(messages)).toBe(countMessages(messages))
  })
})
