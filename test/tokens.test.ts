import { describe, expect, it } from "@effect/vitest"
import { countTokens } from "gpt-tokenizer"
import { countMessages, countText } from "../src/Domain/Tokens.js"

const exact = (text: string) => countTokens(text, { disallowedSpecial: new Set<string>() })

/**
 * Token counting (issue 13): exact for ordinary text, in time linear in the
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
    const varied = Array.from({ length: 8_000_000 / 8 }, (_, i) => (i * 2654435761 % 4294967296).toString(36).slice(0, 8)).join("")
    const sample = varied.slice(0, 60_000)
    const perChar = countText(sample) / sample.length
    expect(countText(varied) / (perChar * varied.length)).toBeGreaterThan(0.95)
    expect(countText(varied) / (perChar * varied.length)).toBeLessThan(1.2)
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
    const messages = Array.from({ length: 40 }, () => ({ role: "user" as const, content: "lorem ipsum ".repeat(10_000) }))
    const perMessage = exact("lorem ipsum ".repeat(1_000)) * 10
    const count = countMessages(messages)
    expect(count).toBeGreaterThan(40 * perMessage * 0.95)
    expect(count).toBeLessThan(40 * perMessage * 1.2)
  })
})
