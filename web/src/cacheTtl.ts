/**
 * A key's response cache TTL as its field holds it (docs/api/cache.md, "Turning it on"): whole seconds from
 * 60 to 86400, or empty for none (`null`: calls are cached only when they ask). No DOM, so the tests run it in Node.
 */
import { ApiError } from "./transport.js"

export const CACHE_TTL_MIN = 60
export const CACHE_TTL_MAX = 86_400

/** The field's value read: the TTL to send, or why it cannot be sent (checked before sending, as the service checks it). */
export const parseCacheTtl = (text: string): { readonly ttl: number | null } | { readonly problem: string } => {
  const value = text.trim()
  if (value === "") return { ttl: null }
  const ttl = /^\d+$/.test(value) ? Number(value) : Number.NaN
  if (!Number.isSafeInteger(ttl)) return { problem: "Whole seconds only, from 60 to 86400; or empty for none." }
  if (ttl < CACHE_TTL_MIN) return { problem: `At least ${CACHE_TTL_MIN} seconds (or empty for none).` }
  if (ttl > CACHE_TTL_MAX) return { problem: `At most ${CACHE_TTL_MAX} seconds (a day).` }
  return { ttl }
}

/** The service's message when a 400 refused the TTL (its `param` names `cache_ttl_seconds`); null for any other failure. */
export const cacheTtlRefusal = (cause: unknown): string | null =>
  cause instanceof ApiError && cause.status === 400 && cause.body.param === "cache_ttl_seconds"
    ? cause.body.message
    : null

/** How the keys list shows a key's TTL: `cache 300 s`. */
export const formatCacheTtl = (ttl: number): string => `cache ${ttl} s`
