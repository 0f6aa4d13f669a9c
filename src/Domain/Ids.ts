import { randomBytes } from "node:crypto"

/**
 * The one place identifiers and secrets are drawn from: all come from the
 * operating system's cryptographic random source, base62-encoded.
 */
const ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

/** Random bytes drawn 4 KiB at a time: one system call per about a hundred ids, not one per id. */
const POOL_BYTES = 4096
let pool = randomBytes(POOL_BYTES)
let next = 0

const randomByte = (): number => {
  if (next === POOL_BYTES) {
    pool = randomBytes(POOL_BYTES)
    next = 0
  }
  return pool[next++]!
}

export const randomBase62 = (length: number): string => {
  let out = ""
  while (out.length < length) {
    const byte = randomByte()
    // 248 = 4 * 62: rejecting bytes at or above it keeps every character equally likely.
    if (byte < 248) out += ALPHABET[byte % 62]
  }
  return out
}

export const newId = (prefix: string): string => `${prefix}_${randomBase62(24)}`
