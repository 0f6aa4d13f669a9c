import { describe, expect, it } from "@effect/vitest"
import { Option } from "effect"
import {
  decodeEmbeddings,
  EMBEDDING_DIMENSIONS,
  shortened,
  simulatedVector,
  simulatedVectors,
  toBase64
} from "../../src/Providers/EmbeddingVectors.js"

/**
 * Embedding vectors without a network: the simulated model's (deterministic unit vectors), shortened ones
 * renormalised as OpenAI's `dimensions` are, the base64 float32 encoding the openai SDK decodes, and an
 * upstream's answer read strictly.
 */

const norm = (vector: ReadonlyArray<number>) => Math.sqrt(vector.reduce((sum, x) => sum + x * x, 0))
const dot = (a: ReadonlyArray<number>, b: ReadonlyArray<number>) => a.reduce((sum, x, i) => sum + x * (b[i] ?? 0), 0)

/** Base64 as a client decodes it: little-endian float32s. */
const decodedBase64 = (text: string): Array<number> => {
  const bytes = Buffer.from(text, "base64")
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  return Array.from({ length: bytes.byteLength / 4 }, (_, i) => view.getFloat32(i * 4, true))
}

describe("simulatedVector", () => {
  it("is the same for the same text, a unit vector of 1536 floats in [-1, 1]", () => {
    const first = simulatedVector("Kuala Lumpur")
    expect(first).toHaveLength(EMBEDDING_DIMENSIONS)
    expect(EMBEDDING_DIMENSIONS).toBe(1536)
    expect(simulatedVector("Kuala Lumpur")).toEqual(first)
    expect(norm(first)).toBeCloseTo(1, 6)
    expect(first.every((x) => Number.isFinite(x) && x >= -1 && x <= 1)).toBe(true)
    // Each component is a float32 value, as a model's are: base64 and floats say the same.
    expect(first.every((x) => Math.fround(x) === x)).toBe(true)
  })

  it("differs from text to text and from a text to a token array, but not between equal token arrays", () => {
    const kl = simulatedVector("Kuala Lumpur")
    const jb = simulatedVector("Johor Bahru")
    // Two independent random unit vectors of 1536 dimensions: their cosine is within a few 1/sqrt(1536) of 0.
    expect(Math.abs(dot(kl, jb))).toBeLessThan(0.15)
    expect(simulatedVector([42, 7, 9000])).toEqual(simulatedVector([42, 7, 9000]))
    expect(simulatedVector([42, 7, 9000])).not.toEqual(simulatedVector([42, 7, 9001]))
    expect(simulatedVector([42, 7])).not.toEqual(simulatedVector([42, 7, 0]))
    expect(simulatedVector("")).not.toEqual(simulatedVector([]))
  })

  it("has the size asked, and at a smaller size is the full vector shortened", () => {
    const full = simulatedVector("Penang")
    for (const dimensions of [1, 3, 256, 1024, 3072]) {
      const small = simulatedVector("Penang", dimensions)
      expect(small).toHaveLength(dimensions)
      expect(norm(small)).toBeCloseTo(1, 6)
      if (dimensions <= EMBEDDING_DIMENSIONS) {
        const cut = shortened(full, dimensions)
        for (const [i, x] of small.entries()) expect(x).toBeCloseTo(cut[i] ?? NaN, 6)
      }
    }
  })

  it("makes 2048 vectors of 1536 in well under a second", () => {
    const items = Array.from({ length: 2048 }, (_, i) => `item ${i}: a sentence about the weather in Ipoh`)
    simulatedVectors(items.slice(0, 16))
    const started = performance.now()
    const vectors = simulatedVectors(items)
    const took = performance.now() - started
    expect(vectors).toHaveLength(2048)
    expect(vectors[2047]).toEqual(simulatedVector(items[2047] ?? ""))
    // About 50 ms on the development machine; the bound leaves room for a shared, slower one.
    expect(took).toBeLessThan(1_000)
  })
})

describe("shortened", () => {
  it("keeps the first components, renormalised to unit length", () => {
    expect(shortened([3, 4, 12], 2)).toEqual([0.6, 0.8])
    const cut = shortened(simulatedVector("Melaka"), 512)
    expect(cut).toHaveLength(512)
    expect(norm(cut)).toBeCloseTo(1, 9)
  })

  it("returns a vector no longer than asked as it is, and an all-zero prefix as zeros", () => {
    const vector = [0.6, 0.8]
    expect(shortened(vector, 2)).toBe(vector)
    expect(shortened(vector, 5)).toBe(vector)
    expect(shortened([0, 0, 1], 2)).toEqual([0, 0])
  })
})

describe("toBase64", () => {
  it("is the float32 values little-endian: decoded, the vector itself", () => {
    const vector = simulatedVector("Kota Kinabalu", 64)
    const text = toBase64(vector)
    expect(Buffer.from(text, "base64").byteLength).toBe(64 * 4)
    expect(decodedBase64(text)).toEqual(vector)
    expect(decodedBase64(toBase64([1, -0.5, 0.25]))).toEqual([1, -0.5, 0.25])
    // 1.0f is 00 00 80 3f little-endian.
    expect(Buffer.from(toBase64([1]), "base64")).toEqual(Buffer.from([0x00, 0x00, 0x80, 0x3f]))
  })
})

describe("decodeEmbeddings", () => {
  const answer = (data: unknown, usage: unknown = { prompt_tokens: 5, total_tokens: 5 }) =>
    JSON.stringify({ object: "list", data, model: "text-embedding-3-small", usage })
  const withUsage = (usage: unknown) =>
    JSON.stringify({ object: "list", data: [entry(0, [1])], model: "m", ...(usage === "absent" ? {} : { usage }) })
  const entry = (index: unknown, embedding: unknown) => ({ object: "embedding", index, embedding })

  it("places each vector by its index, whatever the order sent, and reads prompt_tokens", () => {
    const decoded = decodeEmbeddings(answer([entry(1, [0, 1]), entry(0, [1, 0])]), 2, undefined)
    expect(decoded?.vectors).toEqual([[1, 0], [0, 1]])
    expect(decoded?.inputTokens).toEqual(Option.some(5))
  })

  it("shortens vectors longer than the dimensions asked, renormalised", () => {
    const decoded = decodeEmbeddings(answer([entry(0, [3, 4, 12])]), 1, 2)
    expect(decoded?.vectors).toEqual([[0.6, 0.8]])
  })

  it("reads no usage, or a usage it cannot use, as none", () => {
    for (const usage of ["absent", null, {}, { prompt_tokens: -1 }, { prompt_tokens: 1.5 }, { prompt_tokens: "5" }]) {
      expect(decodeEmbeddings(withUsage(usage), 1, undefined)?.inputTokens, JSON.stringify(usage)).toEqual(
        Option.none()
      )
    }
  })

  const malformed: ReadonlyArray<readonly [string, string, number, number | undefined]> = [
    ["no JSON", "{\"data\": [", 1, undefined],
    ["no data", JSON.stringify({ object: "list" }), 1, undefined],
    ["data not a list", JSON.stringify({ data: { 0: [1] } }), 1, undefined],
    ["fewer vectors than items", answer([entry(0, [1])]), 2, undefined],
    ["more vectors than items", answer([entry(0, [1]), entry(1, [1])]), 1, undefined],
    ["an index twice", answer([entry(0, [1]), entry(0, [1])]), 2, undefined],
    ["an index out of range", answer([entry(0, [1]), entry(2, [1])]), 2, undefined],
    ["no index", answer([{ object: "embedding", embedding: [1] }]), 1, undefined],
    ["a fractional index", answer([entry(0.5, [1])]), 1, undefined],
    ["an empty vector", answer([entry(0, [])]), 1, undefined],
    ["a vector of strings", answer([entry(0, ["0.5"])]), 1, undefined],
    ["a null component", answer([entry(0, [0.5, null])]), 1, undefined],
    ["a base64 string", answer([entry(0, toBase64([1, 0]))]), 1, undefined],
    ["vectors of two lengths", answer([entry(0, [1, 0]), entry(1, [1])]), 2, undefined],
    ["vectors shorter than asked", answer([entry(0, [1, 0])]), 1, 3]
  ]
  for (const [what, text, count, dimensions] of malformed) {
    it(`refuses an answer with ${what}`, () => {
      expect(decodeEmbeddings(text, count, dimensions)).toBeUndefined()
    })
  }
})
