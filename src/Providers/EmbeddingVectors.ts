import { Option } from "effect"
import { createCipheriv, createHash } from "node:crypto"
import { endianness } from "node:os"

/**
 * Embedding vectors: the simulated model's (derived from the item alone), an upstream's read from its
 * answer and shortened to the size asked, and written as OpenAI's `encoding_format: "base64"` sends them.
 */

/** The simulated model's size, and `text-embedding-3-small`'s. */
export const EMBEDDING_DIMENSIONS = 1536

const ZERO_IV = Buffer.alloc(16)
/** What the keystream encrypts (zeros: the keystream itself), and scratch for the raw components; one vector at a time. */
let zeros = Buffer.alloc(EMBEDDING_DIMENSIONS * 4)
let scratch = new Float64Array(EMBEDDING_DIMENSIONS)

/** The item's SHA-256, texts and token arrays apart (a text never hashes like a token array). */
const digestOf = (item: string | ReadonlyArray<number>): Buffer => {
  const hash = createHash("sha256")
  if (typeof item === "string") return hash.update("text\0").update(item, "utf8").digest()
  const tokens = Buffer.allocUnsafe(item.length * 4)
  for (let i = 0; i < item.length; i++) tokens.writeUInt32LE((item[i] ?? 0) >>> 0, i * 4)
  return hash.update("tokens\0").update(tokens).digest()
}

/**
 * A deterministic unit vector of `dimensions` floats for `item`: the same item always gets the same vector.
 * Its components are the AES-256-CTR keystream under the item's SHA-256 (one native call per item, where a
 * hash per 16 components took ten times as long), as signed 32-bit integers scaled into [-1, 1], then
 * L2-normalised and rounded to float32, as a model's floats are (so the float and base64 answers agree).
 * Its first `d` components renormalised are the vector at `d`, as OpenAI's shortened embeddings are.
 */
export const simulatedVector = (
  item: string | ReadonlyArray<number>,
  dimensions: number = EMBEDDING_DIMENSIONS
): Array<number> => {
  if (scratch.length < dimensions) {
    scratch = new Float64Array(dimensions)
    zeros = Buffer.alloc(dimensions * 4)
  }
  const stream = createCipheriv("aes-256-ctr", digestOf(item), ZERO_IV).update(zeros.subarray(0, dimensions * 4))
  let sum = 0
  for (let i = 0; i < dimensions; i++) {
    const component = (stream.readInt32LE(i * 4) + 0.5) / 2_147_483_648
    scratch[i] = component
    sum += component * component
  }
  const scale = 1 / Math.sqrt(sum)
  const vector: Array<number> = []
  for (let i = 0; i < dimensions; i++) vector.push(Math.fround((scratch[i] ?? 0) * scale))
  return vector
}

/** One simulated vector per item, in order. */
export const simulatedVectors = (
  items: ReadonlyArray<string | ReadonlyArray<number>>,
  dimensions: number = EMBEDDING_DIMENSIONS
): Array<Array<number>> => items.map((item) => simulatedVector(item, dimensions))

/**
 * The first `dimensions` components, renormalised to unit length (OpenAI's `dimensions`): for an upstream
 * that answers longer vectors than asked. A vector no longer than that is returned as it is.
 */
export const shortened = (vector: ReadonlyArray<number>, dimensions: number): ReadonlyArray<number> => {
  if (vector.length <= dimensions) return vector
  let sum = 0
  for (let i = 0; i < dimensions; i++) sum += (vector[i] ?? 0) ** 2
  // An all-zero prefix has no direction: kept as zeros rather than divided into NaN.
  const length = sum > 0 ? Math.sqrt(sum) : 1
  const kept: Array<number> = []
  for (let i = 0; i < dimensions; i++) kept.push((vector[i] ?? 0) / length)
  return kept
}

const BIG_ENDIAN = endianness() === "BE"

/** The vector as `encoding_format: "base64"` sends it: its float32 values, little-endian, in base64. */
export const toBase64 = (vector: ReadonlyArray<number>): string => {
  const bytes = Buffer.from(Float32Array.from(vector).buffer)
  if (BIG_ENDIAN) bytes.swap32()
  return bytes.toString("base64")
}

/** An embeddings answer as read: a vector per item, in order, and the upstream's `usage.prompt_tokens`. */
export interface DecodedEmbeddings {
  readonly vectors: ReadonlyArray<ReadonlyArray<number>>
  readonly inputTokens: Option.Option<number>
}

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

/** A non-empty array of finite numbers, or `undefined`. */
const floatsOf = (value: unknown): ReadonlyArray<number> | undefined => {
  if (!Array.isArray(value) || value.length === 0) return undefined
  for (const component of value) {
    if (typeof component !== "number" || !Number.isFinite(component)) return undefined
  }
  return value as ReadonlyArray<number>
}

const promptTokensOf = (usage: unknown): Option.Option<number> => {
  const tokens = isRecord(usage) ? usage["prompt_tokens"] : undefined
  return typeof tokens === "number" && Number.isSafeInteger(tokens) && tokens >= 0
    ? Option.some(tokens)
    : Option.none()
}

/**
 * An OpenAI `/embeddings` answer to `count` items read strictly, or `undefined` when it is not one: `data`
 * holds exactly one entry per item, each with its `index` (0 to `count - 1`, each once; placed by it, whatever
 * the order sent) and an `embedding` of finite numbers, all of one length; with `dimensions` asked, none
 * shorter, and longer ones shortened (`shortened`).
 */
export const decodeEmbeddings = (
  text: string,
  count: number,
  dimensions: number | undefined
): DecodedEmbeddings | undefined => {
  let body: unknown
  try {
    body = JSON.parse(text)
  } catch {
    return undefined
  }
  const data = isRecord(body) ? body["data"] : undefined
  if (!Array.isArray(data) || data.length !== count) return undefined
  const vectors: Array<ReadonlyArray<number> | undefined> = new Array(count).fill(undefined)
  let size: number | undefined
  for (const entry of data) {
    const index = isRecord(entry) ? entry["index"] : undefined
    if (typeof index !== "number" || !Number.isInteger(index) || index < 0 || index >= count) return undefined
    if (vectors[index] !== undefined) return undefined
    const floats = floatsOf(isRecord(entry) ? entry["embedding"] : undefined)
    if (floats === undefined || (size !== undefined && floats.length !== size)) return undefined
    if (dimensions !== undefined && floats.length < dimensions) return undefined
    size = floats.length
    vectors[index] = dimensions === undefined ? floats : shortened(floats, dimensions)
  }
  return {
    vectors: vectors as ReadonlyArray<ReadonlyArray<number>>,
    inputTokens: promptTokensOf(isRecord(body) ? body["usage"] : undefined)
  }
}
