import { randomBytes } from "node:crypto"

/**
 * The one place identifiers and secrets are drawn from: all come from the
 * operating system's cryptographic random source, base62-encoded.
 */
const ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

export const randomBase62 = (length: number): string => {
  let out = ""
  while (out.length < length) {
    // 248 = 4 * 62: rejecting bytes at or above it keeps every character equally likely.
    for (const byte of randomBytes(length * 2)) {
      if (byte < 248 && out.length < length) out += ALPHABET[byte % 62]
    }
  }
  return out
}

export const newId = (prefix: string): string => `${prefix}_${randomBase62(24)}`
