import { createHash } from "node:crypto"

/**
 * The response cache's key (docs/api/cache.md, "The cache key"): SHA-256 over the endpoint, the account, the
 * key's environment, the guardrail policy the call runs under, and the request body as canonical JSON: object
 * keys sorted, numbers written the one way JavaScript writes them (`1.0` and `1`, `1e2` and `100` are one
 * number), no whitespace, and the fields that do not change the answer left out.
 */

/** Top-level fields that do not change the answer: two requests that differ only in them share an answer. */
export const IGNORED_FIELDS: ReadonlySet<string> = new Set([
  "stream",
  "stream_options",
  "user",
  "metadata",
  "store",
  "max_total_cost_myr"
])

/** Deeper than this, a body is not cached (its canonical form is not worth the walk). */
const MAX_DEPTH = 64

const number = (value: number): string => Number.isFinite(value) ? (Object.is(value, -0) ? "0" : String(value)) : "null"

/** `value` as canonical JSON, skipping `ignored` keys at the top; undefined when it nests deeper than `MAX_DEPTH`. */
export const canonicalJson = (value: unknown, ignored: ReadonlySet<string> = new Set()): string | undefined => {
  const parts: Array<string> = []
  const write = (item: unknown, depth: number, top: boolean): boolean => {
    if (depth > MAX_DEPTH) return false
    if (item === null || item === undefined) {
      parts.push("null")
      return true
    }
    switch (typeof item) {
      case "number":
        parts.push(number(item))
        return true
      case "string":
        parts.push(JSON.stringify(item))
        return true
      case "boolean":
        parts.push(item ? "true" : "false")
        return true
      case "object":
        break
      default:
        parts.push("null")
        return true
    }
    if (Array.isArray(item)) {
      parts.push("[")
      for (let i = 0; i < item.length; i++) {
        if (i > 0) parts.push(",")
        if (!write(item[i], depth + 1, false)) return false
      }
      parts.push("]")
      return true
    }
    const record = item as Record<string, unknown>
    const keys = Object.keys(record).filter((key) => record[key] !== undefined && !(top && ignored.has(key))).sort()
    parts.push("{")
    for (let i = 0; i < keys.length; i++) {
      const key = keys[i]!
      if (i > 0) parts.push(",")
      parts.push(JSON.stringify(key), ":")
      if (!write(record[key], depth + 1, false)) return false
    }
    parts.push("}")
    return true
  }
  return write(value, 0, true) ? parts.join("") : undefined
}

/** What a cache key is made of. */
export interface CacheKeyParts {
  readonly endpoint: string
  readonly accountId: string
  readonly environment: "live" | "test"
  /** The guardrail policy the call runs under, as its rows hold it (null: none): a policy changes the answer. */
  readonly policy: unknown
  readonly body: unknown
}

/** The key, hex; undefined when the body cannot be cached (too deep). */
export const cacheKeyOf = (parts: CacheKeyParts): string | undefined => {
  const body = canonicalJson(parts.body, IGNORED_FIELDS)
  if (body === undefined) return undefined
  return createHash("sha256")
    .update(`${parts.endpoint}\n${parts.accountId}\n${parts.environment}\n${canonicalJson(parts.policy) ?? ""}\n`)
    .update(body)
    .digest("hex")
}
